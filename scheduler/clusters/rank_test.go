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

// With PassesPerCluster, a cluster in flight is handed out again only
// while its passes said there is more work (More), only when no other
// cluster is ready, never beyond the limit, and, with OnePerAlloc, not
// while another show's cluster of the allocation waits for its turn; its
// last pass ending clears the mark, and a pass that booked ends a sleep
// another pass of the cluster set meanwhile.
func TestFeedPassesPerCluster(t *testing.T) {
	a := New("fac", "a", []Tag{{Name: "general", Type: Alloc, AllocID: "x"}})
	b := New("fac", "b", []Tag{{Name: "general", Type: Alloc, AllocID: "y"}})
	f := NewStaticFeed([]*Cluster{a, b}, FeedOptions{PassesPerCluster: 2})
	take := func() *Cluster {
		f.mu.Lock()
		defer f.mu.Unlock()
		c, _ := f.pick(time.Now())
		return c
	}
	if c := take(); c != a {
		t.Fatalf("first = %v, want a", c)
	}
	f.More(a, true)
	// b is ready: it goes before a second pass of a.
	if c := take(); c != b {
		t.Fatalf("second = %v, want b (a fresh cluster before an extra pass)", c)
	}
	if c := take(); c != a {
		t.Fatalf("third = %v, want a second pass of a (it has more work)", c)
	}
	if c := take(); c != nil {
		t.Fatalf("fourth = %v, want nothing (a at PassesPerCluster, b without More)", c)
	}
	// One of a's passes ends asleep; the other booked: a is awake again,
	// and its last pass ending cleared More.
	f.DonePass(a, time.Hour, nil, false)
	f.DonePass(a, 0, nil, true)
	f.Done(b, time.Hour)
	if c := take(); c != a {
		t.Fatalf("after a booked: %v, want a (its booking pass ends the other's sleep)", c)
	}
	if c := take(); c != nil {
		t.Fatalf("%v handed out: a's More ended with its passes", c)
	}
	f.More(a, false)
	f.Done(a, 0)

	// OnePerAlloc: another show's cluster of the allocation waiting for
	// its turn stops extra passes, so the allocation is released.
	h1 := New("fac", "hi", []Tag{{Name: "general", Type: Alloc, AllocID: "z"}})
	h2 := New("fac", "lo", []Tag{{Name: "general", Type: Alloc, AllocID: "z"}})
	g := NewStaticFeed([]*Cluster{h1, h2}, FeedOptions{PassesPerCluster: 3, OnePerAlloc: true})
	g.mu.Lock()
	first, _ := g.pick(time.Now())
	g.mu.Unlock()
	g.More(first, true)
	g.mu.Lock()
	c, _ := g.pick(time.Now())
	g.mu.Unlock()
	if c != nil {
		t.Fatalf("extra pass of %s handed out while %s waits for allocation z", c.ShowID, h2.ShowID)
	}
	// The waiting cluster asleep: the extra pass is allowed.
	other := h2
	if first == h2 {
		other = h1
	}
	g.mu.Lock()
	g.sleeping[other.key] = nap{until: time.Now().Add(time.Hour)}
	c, _ = g.pick(time.Now())
	g.mu.Unlock()
	if c != first {
		t.Fatalf("with the other show asleep: %v, want an extra pass of %s", c, first.ShowID)
	}
}
