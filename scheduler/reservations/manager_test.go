package reservations_test

import (
	"sync"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/reservations"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

// A layer blocked for long enough, wide enough, gets one reservation, on
// the fitting host with the fewest running procs, with a ready time
// projected from its procs' layer history; Admit then keeps other layers
// off it except as EASY backfills.
func TestGrantOnTheHostThatDrainsSoonest(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"a", "b", "c"} {
		h.host(n, 64)
	}
	h.host("small", 32) // serves the layer, cannot fit its frame
	flood := h.job("flood", 50, farmseed.LayerSpec{Name: "render", Frames: 200, NotThreadable: true})
	h.fill(flood, 0, "a", 64)
	h.fill(flood, 64, "b", 60)
	h.fill(flood, 124, "c", 62)
	// The flood's frames run 10 s on average: b's must end ~10 s from now.
	h.exec(`UPDATE layer_usage SET int_clock_time_success = 100, int_frame_success_count = 10 WHERE pk_layer = $1`, flood.Layers[0].ID)
	j, wide := h.wide("wide", 64, 3)
	m, reg := h.manager("i1")

	// Not blocked long enough: nothing.
	h.blocked(m, wide, 0)
	h.tick(m)
	if rs := h.list(); len(rs) != 0 {
		t.Fatalf("granted before the bucket filled: %+v", rs)
	}
	h.blocked(m, wide, 2*time.Second)
	before := time.Now()
	h.tick(m)
	after := time.Now()
	rs := h.list()
	if len(rs) != 1 {
		t.Fatalf("reservations = %+v, want one", rs)
	}
	r := rs[0]
	if r.Host != h.hosts["b"] || r.HostName != "b" || r.Layer != wide.ID || r.Job != j.ID || r.JobName != "wide" || r.Show != h.show.ID ||
		r.Alloc != h.alloc || r.Cores != 6400 || r.MemKB != 16*farmseed.GB || r.GrantedBy != "i1" {
		t.Fatalf("reservation = %+v, want host b (fewest procs) for the wide layer", r)
	}
	// b must run its frame once its last-dispatched proc has run the
	// flood's average (10 s): ready at that proc's dispatch + 10 s, less
	// at most the round's own length (the tick's clock is read before the
	// drain query's), or at once if the machine was slow enough for the
	// procs to be overdue. Bounds from the procs' dispatch times, not from
	// the wall clock, so a slow machine cannot fail it.
	var dispatched time.Time
	if err := h.pool.QueryRow(h.ctx, `SELECT max(ts_dispatched) FROM proc WHERE pk_host = $1`, h.hosts["b"]).Scan(&dispatched); err != nil {
		t.Fatal(err)
	}
	due := dispatched.Add(10 * time.Second)
	lo := due.Add(-after.Sub(before) - time.Millisecond)
	hi := due.Add(time.Millisecond)
	if after.After(hi) {
		hi = after
	}
	if r.ReadyAt.Before(lo) || r.ReadyAt.After(hi) {
		t.Errorf("ready at %v, want within [%v, %v]: 10 s (the flood's average runtime) after b's last proc was dispatched", r.ReadyAt, lo, hi)
	}
	if d := r.ExpiresAt.Sub(before); d < 50*time.Minute || d > 70*time.Minute {
		t.Errorf("expires in %v, want the 1 h timeout", d)
	}
	if got, ok := m.Board().Lookup(r.Host); !ok || got.Layer != wide.ID {
		t.Errorf("own grant not in the snapshot: %+v %v", got, ok)
	}
	if promread.Value(t, reg, "scheduler_reservations_granted_total") != 1 {
		t.Error("granted_total not 1")
	}
	// One reservation per layer: the next round grants nothing more.
	h.blocked(m, wide, 2*time.Second)
	h.tick(m)
	if rs := h.list(); len(rs) != 1 {
		t.Fatalf("a layer holding a reservation got another: %+v", rs)
	}

	// Admit: the owner yes; another layer only as a backfill ending by
	// the ready time; other hosts yes.
	now := time.Now()
	other := h.layer(flood)
	if !m.Admit(r.Host, wide, now) {
		t.Error("owner not admitted on its host")
	}
	if m.Admit(r.Host, other, now) {
		t.Error("a layer without runtime history admitted on a reserved host")
	}
	other.RuntimeHigh = 2 * time.Second
	if !m.Admit(r.Host, other, now) {
		t.Error("a backfill ending well before the ready time refused")
	}
	other.RuntimeHigh = time.Minute
	if m.Admit(r.Host, other, now) {
		t.Error("a backfill ending after the ready time admitted")
	}
	if !m.Admit(h.hosts["a"], other, now) {
		t.Error("a layer refused on a host nobody reserved")
	}
	if m.Admit(r.Host, other, r.ExpiresAt.Add(-time.Second)) || !m.Admit(r.Host, other, r.ExpiresAt.Add(time.Second)) {
		t.Error("an expired reservation must admit anyone, a live one not")
	}

	// The owner books it: the reservation ends.
	m.OwnerBooked(h.ctx, r.Host, wide.ID)
	if rs := h.list(); len(rs) != 0 {
		t.Fatalf("owner booked, reservations = %+v", rs)
	}
	if _, ok := m.Board().Lookup(r.Host); ok {
		t.Error("ended reservation still in the snapshot")
	}
	if promread.Value(t, reg, "scheduler_reservations_ended_total", "reason", reservations.EndBooked) != 1 {
		t.Error("ended_total{booked} not 1")
	}
}

// Only wide layers reserve: a frame below half of the largest serving
// host's cores never does, and neither does a layer whose job stopped
// wanting hosts.
func TestNarrowAndStoppedLayersDoNotReserve(t *testing.T) {
	h := newHarness(t)
	h.host("big", 128)
	h.host("a", 64)
	flood := h.job("flood", 50, farmseed.LayerSpec{Name: "render", Frames: 200, NotThreadable: true})
	h.fill(flood, 0, "big", 128)
	h.fill(flood, 128, "a", 64)
	_, narrow := h.wide("narrow", 48, 2) // 48 < 128/2
	_, wide := h.wide("wide", 64, 2)
	m, reg := h.manager("i1")
	h.exec(`UPDATE job SET b_paused = true WHERE pk_job = $1`, wide.JobID)
	h.blocked(m, narrow, 2*time.Second)
	h.blocked(m, wide, 2*time.Second)
	h.tick(m)
	if rs := h.list(); len(rs) != 0 {
		t.Fatalf("reservations = %+v, want none (narrow; paused)", rs)
	}
	if promread.Value(t, reg, "scheduler_reservations_refused_total", "reason", "narrow") < 1 ||
		promread.Value(t, reg, "scheduler_reservations_refused_total", "reason", "no_demand") < 1 {
		t.Error("refusals not counted as narrow and no_demand")
	}
	h.exec(`UPDATE job SET b_paused = false WHERE pk_job = $1`, wide.JobID)
	h.blocked(m, wide, 2*time.Second)
	h.tick(m)
	if rs := h.list(); len(rs) != 1 || rs[0].Host != h.hosts["a"] {
		t.Fatalf("reservations = %+v, want the 64-core host for the resumed wide layer", rs)
	}
}

// A held reservation ends when its owner's job is paused, killed or
// finished, when its layer has no waiting frame left, and on timeout.
func TestReservationEndsWithItsDemand(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"a", "b", "c", "d"} {
		h.host(n, 64)
	}
	flood := h.job("flood", 50, farmseed.LayerSpec{Name: "render", Frames: 300, NotThreadable: true})
	for i, n := range []string{"a", "b", "c", "d"} {
		h.fill(flood, i*64, n, 64)
	}
	m, reg := h.manager("i1")
	grant := func(l *jobs.Layer) reservations.Reservation {
		t.Helper()
		h.blocked(m, l, 2*time.Second)
		h.tick(m)
		for _, r := range h.list() {
			if r.Layer == l.ID {
				return r
			}
		}
		t.Fatalf("layer %s got no reservation", l.JobName)
		return reservations.Reservation{}
	}
	gone := func(l *jobs.Layer, reason string) {
		t.Helper()
		h.tick(m)
		for _, r := range h.list() {
			if r.Layer == l.ID {
				t.Fatalf("%s: reservation %+v still held", reason, r)
			}
		}
		if promread.Value(t, reg, "scheduler_reservations_ended_total", "reason", reason) != 1 {
			t.Errorf("ended_total{%s} != 1", reason)
		}
	}

	_, paused := h.wide("paused", 64, 2)
	grant(paused)
	h.exec(`UPDATE job SET b_paused = true WHERE pk_job = $1`, paused.JobID)
	gone(paused, reservations.EndPaused)

	_, killed := h.wide("killed", 64, 2)
	grant(killed)
	// Cuebot's kill: frames eaten, job FINISHED.
	h.exec(`UPDATE job SET str_state = 'FINISHED' WHERE pk_job = $1`, killed.JobID)
	gone(killed, reservations.EndJobDone)

	_, done := h.wide("satisfied", 64, 2)
	grant(done)
	h.exec(`UPDATE layer_stat SET int_waiting_count = 0 WHERE pk_layer = $1`, done.ID)
	gone(done, reservations.EndSatisfied)

	// Timeout: a manager with a short one.
	mt, regT := h.manager("i2", func(c *reservations.Config) { c.Timeout = 300 * time.Millisecond })
	_, slow := h.wide("slow", 64, 2)
	h.blocked(mt, slow, 2*time.Second)
	h.tick(mt)
	rs := h.list()
	if len(rs) != 1 || rs[0].Layer != slow.ID {
		t.Fatalf("reservations = %+v, want the slow layer's", rs)
	}
	other := h.layer(flood)
	// Admit is asked at the grant's own time (Redis time), not "now": on a
	// loaded machine the 300 ms may be gone by the time this line runs.
	if mt.Admit(rs[0].Host, other, rs[0].GrantedAt) {
		t.Fatal("a live reservation admitted a non-owner")
	}
	// Expired: no longer binding, even before the sweep.
	if !mt.Admit(rs[0].Host, other, rs[0].ExpiresAt) {
		t.Error("an expired reservation still refuses")
	}
	for time.Now().Before(rs[0].ExpiresAt.Add(10 * time.Millisecond)) {
		time.Sleep(50 * time.Millisecond)
	}
	// Any instance sweeps it: here the other manager.
	h.tick(m)
	if rs := h.list(); len(rs) != 0 {
		t.Fatalf("expired reservation not swept: %+v", rs)
	}
	if promread.Value(t, reg, "scheduler_reservations_ended_total", "reason", reservations.EndTimeout) != 1 {
		t.Error("ended_total{timeout} != 1")
	}
	_ = regT
}

// Two schedulers racing to reserve: the grant script lets exactly one win
// each host, and the caps hold across instances.
func TestTwoSchedulersRaceForOneHost(t *testing.T) {
	h := newHarness(t)
	h.host("a", 64)
	h.host("b", 64)
	flood := h.job("flood", 50, farmseed.LayerSpec{Name: "render", Frames: 200, NotThreadable: true})
	h.fill(flood, 0, "a", 60) // a drains soonest: both pick it
	h.fill(flood, 60, "b", 64)
	_, w1 := h.wide("w1", 64, 2)
	_, w2 := h.wide("w2", 64, 2)
	// Both rounds read the (empty) board before either grants, so both
	// pick host a and the grant script alone decides the winner. Without
	// the rendezvous a round delayed past the other's grant (a loaded
	// machine) would see a reserved and take b, with no race at all.
	meet := newRendezvous(t, h.cache, 2)
	m1, reg1 := h.managerOver("i1", meet)
	m2, reg2 := h.managerOver("i2", meet)
	h.blocked(m1, w1, 2*time.Second)
	h.blocked(m2, w2, 2*time.Second)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, m := range []*reservations.Manager{m1, m2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := m.Tick(h.ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	rs := h.list()
	if len(rs) != 1 || rs[0].Host != h.hosts["a"] {
		t.Fatalf("reservations = %+v, want exactly one, of host a", rs)
	}
	lost := promread.Value(t, reg1, "scheduler_reservations_refused_total", "reason", string(reservations.HostReserved)) +
		promread.Value(t, reg2, "scheduler_reservations_refused_total", "reason", string(reservations.HostReserved))
	if lost != 1 {
		t.Errorf("host_reserved refusals = %v, want 1 (the loser)", lost)
	}
	// The loser's next round takes the other host; both snapshots agree
	// after a refresh.
	winner, loser, lw := m1, m2, w2
	if rs[0].GrantedBy == "i2" {
		winner, loser, lw = m2, m1, w1
	}
	h.blocked(loser, lw, 2*time.Second)
	h.tick(loser)
	h.tick(winner)
	if rs := h.list(); len(rs) != 2 {
		t.Fatalf("reservations = %+v, want two", rs)
	}
	for _, m := range []*reservations.Manager{m1, m2} {
		if n := len(m.Board().Snapshot()); n != 2 {
			t.Errorf("a snapshot holds %d reservations, want 2", n)
		}
	}

	// Caps across instances: with max_grants 2 held, a third layer waits.
	m3, reg3 := h.manager("i3", func(c *reservations.Config) { c.MaxGrants = 2 })
	h.host("c", 64)
	h.fill(flood, 124, "c", 64)
	_, w3 := h.wide("w3", 64, 2)
	h.blocked(m3, w3, 2*time.Second)
	h.tick(m3)
	if rs := h.list(); len(rs) != 2 {
		t.Fatalf("reservations = %+v, want still two (max_grants 2)", rs)
	}
	if promread.Value(t, reg3, "scheduler_reservations_refused_total", "reason", string(reservations.MaxGrants)) < 1 {
		t.Error("max_grants refusal not counted")
	}
	// Many rounds racing over the same free host never double-grant.
	if n, _ := h.rdb.SCard(h.ctx, publisher.ResvIndexKey).Result(); n != 2 {
		t.Errorf("index holds %d hosts, want 2", n)
	}
}
