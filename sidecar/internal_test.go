package sidecar

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestStateEncoding(t *testing.T) {
	st := managedState{lsn: 0x1A2B3C, shows: map[string]bool{"b-show": true, "a-show": true}}
	enc := st.encode()
	if want := "00000000001A2B3C\na-show\nb-show"; enc != want {
		t.Fatalf("encode = %q, want %q", enc, want)
	}
	got, err := decodeState(enc)
	if err != nil || got.lsn != st.lsn || len(got.shows) != 2 || !got.shows["a-show"] || !got.shows["b-show"] {
		t.Fatalf("decode = %+v, %v", got, err)
	}
	empty, err := decodeState(managedState{lsn: 5, shows: map[string]bool{}}.encode())
	if err != nil || empty.lsn != 5 || len(empty.shows) != 0 {
		t.Fatalf("empty set round trip = %+v, %v", empty, err)
	}
	if _, err := decodeState("not-an-lsn\nx"); err == nil {
		t.Fatal("garbage state decoded")
	}
}

func TestTransientRedisErrors(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{io.EOF, true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{redis.ErrClosed, false},
		{errors.New("LOADING Redis is loading the dataset in memory"), true}, // not a redis.Error: transport-level
	}
	for _, c := range cases {
		if got := transientRedisError(c.err); got != c.want {
			t.Errorf("transientRedisError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestReasonLabels(t *testing.T) {
	for reason, want := range map[string]string{
		"new replication slot and no checkpoint in Redis": "new_slot",
		"no checkpoint in Redis (new or emptied Redis)":   "no_checkpoint",
		"Redis checkpoint 0/1 is behind the slot's":       "checkpoint_behind",
		"Redis checkpoint 0/9 is ahead of the database's": "checkpoint_ahead",
		"TRUNCATE of proc: releases are not streamed":     "truncate",
		"Redis lost data: checkpoint missing":             "redis_lost_data",
		"something else entirely":                         "other",
	} {
		if got := reasonLabel(reason); got != want {
			t.Errorf("reasonLabel(%q) = %q, want %q", reason, got, want)
		}
	}
}
