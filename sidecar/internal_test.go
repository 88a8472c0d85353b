package sidecar

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/shared/replication"
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

// TestJobCapsPrunedWhenTheJobEnds: the job-cap cache (what was last written
// for a job, so unchanged caps are not rewritten) loses a job when the job
// finishes, is deleted, or the job table is truncated; it used to keep
// every job the sidecar ever saw.
func TestJobCapsPrunedWhenTheJobEnds(t *testing.T) {
	c := &consumer{c: newCaches()}
	cols := []replication.Column{{Name: "pk_job"}, {Name: "pk_show"}, {Name: "pk_folder"}, {Name: "pk_dept"}, {Name: "str_state"}}
	b := replication.NewRowBuilder(cols)
	row := func(job, state string) replication.Row {
		return b.Row(replication.Value(job), replication.Value("show"), replication.Value("folder"), replication.Value("dept"), replication.Value(state))
	}
	for _, j := range []string{"j1", "j2", "j3", "j4"} {
		c.c.jobCaps[j] = [3]int64{100, 1, 50}
		c.planJob(&replication.Change{Op: replication.Insert, New: row(j, "PENDING")})
	}
	c.planJob(&replication.Change{Op: replication.Update, New: row("j1", "PENDING")})
	if _, ok := c.c.jobCaps["j1"]; !ok {
		t.Fatal("a pending job's caps were dropped")
	}
	c.planJob(&replication.Change{Op: replication.Update, New: row("j1", "FINISHED")})
	c.planJob(&replication.Change{Op: replication.Delete, Old: replication.NewRow(cols[:1], []replication.Datum{replication.Value("j2")})})
	if _, ok := c.c.jobCaps["j1"]; ok {
		t.Error("finished job still cached")
	}
	if _, ok := c.c.jobCaps["j2"]; ok {
		t.Error("deleted job still cached")
	}
	if len(c.c.jobCaps) != 2 {
		t.Errorf("job caps = %v, want j3 and j4", c.c.jobCaps)
	}
	c.planJob(&replication.Change{Op: replication.Truncate})
	if len(c.c.jobCaps) != 0 {
		t.Errorf("job caps after TRUNCATE job = %v", c.c.jobCaps)
	}
}
