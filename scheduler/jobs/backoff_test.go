package jobs_test

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuesched/cuesched/scheduler/jobs"
)

type flag struct{ moved atomic.Bool }

func (f *flag) Moved() bool { return f.moved.Load() }

// A watched backoff holds the layer until its watch moves, then releases
// it at once, long before its time; an unwatched layer and a layer whose
// watch did not move stay held. Early releases keep the doubling.
func TestBackoffReleasedByItsWatch(t *testing.T) {
	now := time.Unix(1000, 0)
	b := jobs.NewBackoff(time.Minute, time.Hour)
	b.SetClock(func() time.Time { return now })
	var wa, wb flag
	b.MissedWatch("c", "a", &wa)
	b.MissedWatch("c", "b", &wb)
	b.Missed("c", "timer-only")
	b.MissedWatch("other", "a", &wb)
	held := func(c string) []string {
		got := b.Held(c)
		slices.Sort(got)
		return got
	}
	if got := held("c"); !slices.Equal(got, []string{"a", "b", "timer-only"}) {
		t.Fatalf("Held = %v", got)
	}
	wa.moved.Store(true)
	now = now.Add(time.Second)
	if got := held("c"); !slices.Equal(got, []string{"b", "timer-only"}) {
		t.Fatalf("after a's watch moved: Held = %v, want a released", got)
	}
	if got := held("other"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("another cluster's entry for the layer released by a foreign watch: %v", got)
	}
	if b.Released() != 1 {
		t.Fatalf("Released = %d", b.Released())
	}
	// Missing again right away continues the doubling (the timer stays
	// the bound for a layer that keeps being woken for nothing).
	var wa2 flag
	if d := b.MissedWatch("c", "a", &wa2); d != 2*time.Minute {
		t.Fatalf("miss after an early release = %v, want 2m", d)
	}
	if got := held("c"); !slices.Contains(got, "a") {
		t.Fatalf("re-missed layer not held: %v", got)
	}
	// The old watch moving again does not release the new entry.
	if got := held("c"); !slices.Contains(got, "a") {
		t.Fatalf("stale watch released the layer: %v", got)
	}
	// The timer still ends everything.
	now = now.Add(3 * time.Minute)
	if got := held("c"); len(got) != 0 {
		t.Fatalf("Held after the timer = %v", got)
	}
	var nilB *jobs.Backoff
	if nilB.MissedWatch("c", "l", &wa) != 0 || nilB.Released() != 0 {
		t.Fatal("nil backoff")
	}
}

// A layer woken early that misses again every time stops being woken after
// MaxWastedWakes such rounds: its timer alone releases it until it books.
func TestBackoffIgnoresWatchesAfterWastedWakes(t *testing.T) {
	now := time.Unix(1000, 0)
	b := jobs.NewBackoff(time.Minute, time.Hour)
	b.SetClock(func() time.Time { return now })
	moved := &flag{}
	moved.moved.Store(true)
	for i := 0; i < jobs.MaxWastedWakes; i++ {
		b.MissedWatch("c", "l", moved)
		if got := b.Held("c"); len(got) != 0 {
			t.Fatalf("round %d: a moved watch did not release the layer", i)
		}
	}
	b.MissedWatch("c", "l", moved)
	if got := b.Held("c"); !slices.Equal(got, []string{"l"}) {
		t.Fatalf("after %d wasted wakes the watch still releases the layer", jobs.MaxWastedWakes)
	}
	// Booking resets it.
	b.Booked("c", "l")
	b.MissedWatch("c", "l", moved)
	if got := b.Held("c"); len(got) != 0 {
		t.Fatal("after a booking the watch is still ignored")
	}
}
