package publisher_test

import (
	"errors"
	"sort"
	"testing"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

// A node-locked limit of 2 seats: two hosts take a seat each, a third host
// is refused with a *SeatError (nothing charged) while a host holding a
// seat books more frames on it; the seat is given back exactly once, when
// the host's last proc under the limit is released (a replayed release and
// a rollback change nothing more), and the third host then gets it.
func TestBookNodeLockedSeats(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	seats := []publisher.Seat{{Limit: "LIC", Max: 2}}
	book := func(proc, host string) error {
		b := booking(proc, 100)
		b.HostID, b.Seats = host, seats
		_, err := f.pub.Book(f.ctx, b)
		return err
	}
	held := func() []string {
		t.Helper()
		hs, err := f.pub.SeatHosts(f.ctx, "LIC")
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(hs)
		return hs
	}
	for _, pb := range [][2]string{{"a1", "A"}, {"b1", "B"}, {"a2", "A"}, {"a3", "A"}} {
		if err := book(pb[0], pb[1]); err != nil {
			t.Fatalf("book %s on %s: %v", pb[0], pb[1], err)
		}
	}
	err := book("c1", "C")
	var se *publisher.SeatError
	if !errors.As(err, &se) || se.Limit != "LIC" || se.Held != 2 || se.Max != 2 || se.Host != "C" {
		t.Fatalf("third host: err = %v (%+v), want a SeatError 2/2", err, se)
	}
	f.expectCores(4)
	if got := held(); len(got) != 2 || got[0] != "A" || got[1] != "B" {
		t.Fatalf("seats held by %v, want [A B]", got)
	}
	// B's only proc ends: its seat is free; twice changes nothing more.
	for i := 0; i < 2; i++ {
		if _, err := f.pub.Release(f.ctx, "b1"); err != nil {
			t.Fatal(err)
		}
	}
	if got := held(); len(got) != 1 || got[0] != "A" {
		t.Fatalf("after B's release: %v, want [A]", got)
	}
	// A keeps its seat until its last proc goes (one release, one rollback).
	if _, err := f.pub.Release(f.ctx, "a1", "a2"); err != nil {
		t.Fatal(err)
	}
	if got := held(); len(got) != 1 {
		t.Fatalf("A released 2 of 3 procs: seats %v, want [A]", got)
	}
	if err := book("c1", "C"); err != nil {
		t.Fatalf("C with a free seat: %v", err)
	}
	if err := book("d1", "D"); !errors.As(err, &se) {
		t.Fatalf("D with both seats held: %v", err)
	}
	if _, err := f.pub.Rollback(f.ctx, "a3"); err != nil {
		t.Fatal(err)
	}
	if got := held(); len(got) != 1 || got[0] != "C" {
		t.Fatalf("after A's last proc: %v, want [C]", got)
	}
	if n, _ := f.rdb.HGet(f.ctx, publisher.SeatKey("LIC"), "C").Int64(); n != 1 {
		t.Errorf("C's procs under the limit = %d, want 1", n)
	}
	// Seats need the host; a max of 0 refuses every host.
	b := booking("e1", 100)
	b.Seats = seats
	if _, err := f.pub.Book(f.ctx, b); err == nil {
		t.Error("a node-locked booking without a host id was accepted")
	}
	b.HostID, b.Seats = "E", []publisher.Seat{{Limit: "ZERO", Max: 0}}
	if _, err := f.pub.Book(f.ctx, b); !errors.As(err, &se) || se.Max != 0 {
		t.Errorf("limit 0: err = %v, want a SeatError", err)
	}
	if got := promread.Value(t, f.reg, "scheduler_accounting_bookings_total", "result", "seat"); got != 3 {
		t.Errorf("seat refusals metric = %v, want 3", got)
	}
}
