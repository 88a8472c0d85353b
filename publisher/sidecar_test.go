package publisher_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
)

// The sidecar's release: the checkpoint read in the same round trip is
// handed to the caller before the reply is used, the records read with it
// come back in order (nil without a record), a replay changes nothing, a
// flushed script cache is reloaded once, and a batch above the chunk size
// goes through ReleaseBatch. Its own Redis server: the script cache is
// server-wide, and a parallel test reloading it between the SCRIPT FLUSH
// and the release made the release succeed at its first attempt.
func TestReleaseBatchObserved(t *testing.T) {
	f := newPrivateFixture(t, publisher.Options{ReleaseChunk: 3})
	f.seedShow()
	if err := f.pub.Load(f.ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"p1", "p2"} {
		if _, err := f.pub.Book(f.ctx, booking(p, 150)); err != nil {
			t.Fatal(err)
		}
	}
	type seen struct {
		lsn uint64
		ok  bool
	}
	var calls []seen
	note := func(stored uint64, ok bool) error { calls = append(calls, seen{stored, ok}); return nil }
	rels := []publisher.Release{{ProcID: "p1"}, {ProcID: "px"}, {ProcID: "p2"}}
	res, err := f.pub.ReleaseBatchObserved(f.ctx, 0x1000, rels, note)
	if err != nil || !res.Applied || res.Released != 2 || res.NeverBooked != 1 || res.StoredLSN != 0x1000 {
		t.Fatalf("ReleaseBatchObserved = %+v, %v", res.ReleaseResult, err)
	}
	if len(calls) != 1 || calls[0].ok {
		t.Fatalf("checkpoint calls = %+v, want one without a checkpoint", calls)
	}
	if len(res.Records) != 3 || res.Records[1] != nil || res.Records[0] == nil || res.Records[2] == nil {
		t.Fatalf("records = %+v", res.Records)
	}
	want := publisher.ProcRecord{Show: "S", Keys: [5]string{publisher.SubKey("S", "A"), publisher.FolderKey("F"),
		publisher.JobKey("J"), publisher.LayerKey("L"), publisher.PointKey("D", "S")}, Centi: "150", GPUs: "0"}
	if *res.Records[0] != want {
		t.Errorf("record of p1 = %+v, want %+v", *res.Records[0], want)
	}
	f.expectCores(0)

	// A replay: nothing applied, the stored checkpoint reported.
	calls = nil
	res, err = f.pub.ReleaseBatchObserved(f.ctx, 0x1000, rels, note)
	if err != nil || res.Applied || res.StoredLSN != 0x1000 {
		t.Fatalf("replay = %+v, %v", res.ReleaseResult, err)
	}
	if len(calls) != 1 || !calls[0].ok || calls[0].lsn != 0x1000 {
		t.Fatalf("checkpoint calls = %+v", calls)
	}

	// The caller's verdict on the checkpoint stops the call.
	stop := errors.New("lost data")
	if _, err := f.pub.ReleaseBatchObserved(f.ctx, 0x1100, nil, func(uint64, bool) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("err = %v, want the checkpoint callback's", err)
	}

	// A restarted Redis has no scripts: reloaded, the pipeline sent again.
	if err := f.rdb.ScriptFlush(f.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, booking("p3", 100)); err != nil {
		t.Fatal(err)
	}
	if err := f.rdb.ScriptFlush(f.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	calls = nil
	res, err = f.pub.ReleaseBatchObserved(f.ctx, 0x2000, []publisher.Release{{ProcID: "p3"}}, note)
	if err != nil || !res.Applied || res.Released != 1 || res.Records[0] == nil {
		t.Fatalf("after SCRIPT FLUSH = %+v, %v", res, err)
	}
	if len(calls) != 2 {
		t.Errorf("checkpoint calls after SCRIPT FLUSH = %+v, want one per attempt", calls)
	}

	// Above the chunk size: one checkpoint read, then ReleaseBatch.
	var big []publisher.Release
	for i := 0; i < 4; i++ {
		p := fmt.Sprintf("q%d", i)
		if _, err := f.pub.Book(f.ctx, booking(p, 100)); err != nil {
			t.Fatal(err)
		}
		big = append(big, publisher.Release{ProcID: p})
	}
	calls = nil
	res, err = f.pub.ReleaseBatchObserved(f.ctx, 0x3000, big, note)
	if err != nil || !res.Applied || res.Released != 4 || res.Records != nil || len(calls) != 1 || calls[0].lsn != 0x2000 {
		t.Fatalf("large batch = %+v, %v (calls %+v)", res, err, calls)
	}
	if _, err := f.pub.ReleaseBatchObserved(f.ctx, 0, nil, note); err == nil {
		t.Error("LSN 0 accepted")
	}
	f.expectCores(0)
}

// The sidecar's managed-show set is written in LSN order unless forced.
func TestSaveSidecarState(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	get := func() string {
		v, _ := f.rdb.Get(f.ctx, publisher.SidecarShowsKey).Result()
		return v
	}
	at := func(lsn uint64, shows string) string { return publisher.FormatLSN(lsn) + "\n" + shows }
	for _, c := range []struct {
		state   string
		force   bool
		written bool
		stored  string
	}{
		{at(0x20, "a"), false, true, at(0x20, "a")},
		{at(0x10, "b"), false, false, at(0x20, "a")},
		{at(0x20, "c"), false, false, at(0x20, "a")},
		{at(0x30, "d"), false, true, at(0x30, "d")},
		{at(0x10, "e"), true, true, at(0x10, "e")},
	} {
		w, err := f.pub.SaveSidecarState(f.ctx, c.state, c.force)
		if err != nil || w != c.written || get() != c.stored {
			t.Fatalf("save %q force=%v: written %v err %v, stored %q; want written %v, stored %q", c.state, c.force, w, err, get(), c.written, c.stored)
		}
	}
	if _, err := f.pub.SaveSidecarState(f.ctx, "garbage\nx", false); err == nil {
		t.Error("a state without an LSN was saved")
	}
}

// The reservation scripts' typed API: grant, refusal, end by a non-owner
// (kept), end by the owner.
func TestReservationScripts(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	r := publisher.NewReservations(f.rdb)
	g := publisher.ReservationGrant{Host: "H", HostName: "h", Layer: "L", Job: "J", Show: "S", Alloc: "A", Centicores: 100,
		ReadyAt: time.Now().Add(time.Minute), Timeout: time.Hour, GrantedBy: "me", MaxGrants: 8, MaxAmong: 8, Fitting: []string{"H"}}
	rep, err := r.GrantReservation(f.ctx, g)
	if err != nil || !rep.Granted || rep.Refusal != "" || !rep.ExpiresAt.After(rep.GrantedAt) {
		t.Fatalf("grant = %+v, %v", rep, err)
	}
	g.Layer = "L2"
	if rep, err := r.GrantReservation(f.ctx, g); err != nil || rep.Granted || rep.Refusal != "host_reserved" {
		t.Fatalf("second grant = %+v, %v", rep, err)
	}
	if e, err := r.EndReservation(f.ctx, "H", "L2"); err != nil || e.Ended || !e.NotOwner || e.Owner != "L" {
		t.Fatalf("end by non-owner = %+v, %v", e, err)
	}
	if e, err := r.EndReservation(f.ctx, "H", "L"); err != nil || !e.Ended || e.Owner != "L" {
		t.Fatalf("end by owner = %+v, %v", e, err)
	}
	if e, err := r.EndReservation(f.ctx, "H", ""); err != nil || e.Ended || e.NotOwner {
		t.Fatalf("end of nothing = %+v, %v", e, err)
	}
}
