package matcher_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

// Seat packing: a layer of a node-locked limit (2 seats) whose host h3
// already holds a seat fills h3 first, then takes one new host while a
// seat is free; once both seats are held by full hosts the next pass waits
// for the limit without booking elsewhere (scheduler_layer_holds_total
// {reason="seat"}). Without packing the same layer books where the host
// order puts it.
func TestSeatPackingPrefersSeatHosts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHarness(t, 10)
	for i := 0; i < 4; i++ {
		h.host(8, "")
	}
	lim := h.str(h.seed.Limit(ctx, "houdini", 2))
	if err := h.seed.LimitPerHost(ctx, lim, true); err != nil {
		t.Fatal(err)
	}
	var h3 string
	if err := h.pool.QueryRow(ctx, `SELECT pk_host FROM host WHERE str_name = 'h3'`).Scan(&h3); err != nil {
		t.Fatal(err)
	}
	// h3 holds a seat (a proc booked before this pass).
	if err := h.pub.Client().HSet(ctx, publisher.SeatKey(lim), h3, 1).Err(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := matcher.New(h.pool, h.hosts, h.disp, matcher.Config{Attempts: 10, FramesPerLayer: 20, Policy: h.policy, SeatPacking: true},
		matcher.Options{Registerer: reg, Backoff: h.backoff, Permits: h.permits, Seats: h.pub})
	ls := layer(20)
	ls.Limits = []string{lim}
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{ls}})
	if _, err := m.Process(ctx, h.cluster, j); err != nil {
		t.Fatal(err)
	}
	per := h.procsPerHost(j.ID)
	if per["h3"] != 8 || len(per) != 2 {
		t.Fatalf("frames per host %v, want h3 filled (8) and one new host", per)
	}
	seats, err := h.pub.SeatHosts(ctx, lim)
	if err != nil || len(seats) != 2 {
		t.Fatalf("seats %v, %v; want 2", seats, err)
	}
	// Both seats held by full hosts: the next pass books nothing and says
	// the limit holds it.
	for _, l := range h.backoff.Held(h.cluster.Key()) {
		h.backoff.Booked(h.cluster.Key(), l)
	}
	if _, err := m.Process(ctx, h.cluster, j); err != nil {
		t.Fatal(err)
	}
	if after := h.procsPerHost(j.ID); len(after) != 2 || after["h3"] != 8 {
		t.Fatalf("after the seats filled: %v", after)
	}
	if got := promread.Value(t, reg, "scheduler_layer_holds_total", "reason", "seat"); got < 1 {
		t.Errorf("seat holds = %v, want >= 1", got)
	}
}
