package clusters

import (
	"testing"
	"time"
)

// With a Rank, the ready cluster of the lowest rank is handed out first,
// and with OnePerAlloc a second show's cluster of the same allocation waits
// until the first is back; clusters of other allocations and of other tag
// types are not held.
func TestFeedRankAndOnePerAlloc(t *testing.T) {
	alloc := func(show, a string) *Cluster {
		return New("fac", show, []Tag{{Name: "general", Type: Alloc, AllocID: a}})
	}
	hi, lo := alloc("show-hi", "a1"), alloc("show-lo", "a1")
	other := alloc("show-x", "a2")
	manual := New("fac", "show-hi", []Tag{{Name: "desk", Type: Manual}})
	rank := map[string]float64{hi.Key(): 2, lo.Key(): 0.5, other.Key(): 9, manual.Key(): 3}
	f := NewStaticFeed([]*Cluster{hi, lo, other, manual}, FeedOptions{
		Rank: func(c *Cluster) float64 { return rank[c.Key()] }, OnePerAlloc: true,
	})
	take := func() *Cluster {
		f.mu.Lock()
		defer f.mu.Unlock()
		c, _ := f.pick(time.Now())
		return c
	}
	var got []string
	for c := take(); c != nil; c = take() {
		got = append(got, c.ShowID+"/"+string(c.Type()))
	}
	want := []string{"show-lo/ALLOC", "show-hi/MANUAL", "show-x/ALLOC"}
	if len(got) != len(want) {
		t.Fatalf("handed out %v, want %v (show-hi's allocation cluster held while show-lo's is in flight)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("handed out %v, want %v", got, want)
		}
	}
	// show-lo comes back asleep: now show-hi's turn on a1.
	f.Done(lo, time.Hour)
	if c := take(); c != hi {
		t.Fatalf("after show-lo's pass: %v, want show-hi's allocation cluster", c)
	}
	// Both back, show-lo awake: the lower rank goes first again.
	f.Done(hi, 0)
	f.WakeAll()
	if c := take(); c != lo {
		t.Fatalf("both ready: %v, want show-lo (rank 0.5 < 2)", c)
	}
}

// Without OnePerAlloc the ranks only order; without a Rank the feed is
// round-robin as before.
func TestFeedRankOrdersOnly(t *testing.T) {
	a := New("fac", "a", []Tag{{Name: "general", Type: Alloc, AllocID: "x"}})
	b := New("fac", "b", []Tag{{Name: "general", Type: Alloc, AllocID: "x"}})
	f := NewStaticFeed([]*Cluster{a, b}, FeedOptions{Rank: func(c *Cluster) float64 {
		if c == b {
			return 0
		}
		return 1
	}})
	f.mu.Lock()
	first, _ := f.pick(time.Now())
	second, _ := f.pick(time.Now())
	f.mu.Unlock()
	if first != b || second != a {
		t.Fatalf("handed out %v then %v, want b then a", first, second)
	}
}
