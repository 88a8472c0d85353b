package reservations

import (
	"testing"
	"time"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
)

// The bucket is a leaky bucket of net blocked time: it fills while the
// layer is blocked, drains while it places, is capped at the threshold,
// and a layer is a candidate only while full and blocked now.
func TestBucketsLeak(t *testing.T) {
	t.Parallel()
	bs := newBuckets(10*time.Second, time.Minute)
	c := clusters.New("f", "s", []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: "a"}})
	l := &jobs.Layer{ID: "L", Name: "wide"}
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	level := func(s float64) float64 {
		lv, _ := bs.level("L", at(s))
		return lv.Seconds()
	}

	bs.observe(c, l, matcher.OutcomePlaced, at(0))
	if _, ok := bs.level("L", at(0)); ok {
		t.Fatal("a layer that only placed is tracked")
	}
	bs.observe(c, l, matcher.OutcomeBlocked, at(0))
	bs.observe(c, l, matcher.OutcomeBlocked, at(6))
	if got := level(6); got != 6 {
		t.Fatalf("level after 6 s blocked = %v", got)
	}
	// Placing drains it as fast.
	bs.observe(c, l, matcher.OutcomePlaced, at(6))
	bs.observe(c, l, matcher.OutcomeBlocked, at(8))
	if got := level(8); got != 4 {
		t.Fatalf("level after 2 s placing = %v, want 4", got)
	}
	// A neither-nor outcome holds the level.
	bs.observe(c, l, matcher.OutcomeOther, at(9))
	bs.observe(c, l, matcher.OutcomeBlocked, at(20))
	if got := level(20); got != 5 {
		t.Fatalf("level = %v, want 5 (1 s blocked, then held)", got)
	}
	if n := len(bs.full(at(20))); n != 0 {
		t.Fatalf("%d candidates below the threshold", n)
	}
	// Between observations the last outcome holds: blocked keeps filling,
	// capped at the threshold.
	if got := level(40); got != 10 {
		t.Fatalf("level 20 s later = %v, want the threshold 10", got)
	}
	cs := bs.full(at(40))
	if len(cs) != 1 || cs[0].layer.ID != "L" || cs[0].cluster != c {
		t.Fatalf("candidates = %+v, want the layer", cs)
	}
	// Not observed for longer than the horizon: no longer a candidate
	// (its job may be paused); forgotten after ten horizons.
	if n := len(bs.full(at(20 + 61))); n != 0 {
		t.Fatalf("%d candidates unobserved past the horizon", n)
	}
	bs.full(at(20 + 601))
	if bs.size() != 0 {
		t.Fatal("a bucket unobserved for ten horizons is kept")
	}
}
