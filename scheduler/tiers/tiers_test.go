package tiers_test

import (
	"context"
	"testing"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/tiers"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestTier(t *testing.T) {
	for _, c := range []struct {
		u    tiers.Usage
		want float64
	}{
		{tiers.Usage{Size: 100, Cores: 0}, 0},
		{tiers.Usage{Size: 0, Cores: 0}, 0},
		{tiers.Usage{Size: 100, Cores: 50}, 0.5},
		{tiers.Usage{Size: 4, Cores: 8}, 2},
		{tiers.Usage{Size: 0, Cores: 1}, 100},
		{tiers.Usage{Size: -1, Cores: 2}, 200},
	} {
		if got := c.u.Tier(); got != c.want {
			t.Errorf("%+v.Tier() = %v, want %v", c.u, got, c.want)
		}
	}
}

// The board reads the subscriptions from the accounting store: an
// allocation cluster ranks by its subscription, a cluster of other tags by
// the show's sum over its subscriptions; Touch re-reads one subscription.
func TestBoardRanksFromRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: testenv.NewRedisDB(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	set := func(show, alloc string, size, cores int) {
		t.Helper()
		if err := rdb.HSet(ctx, publisher.SubKey(show, alloc), "size", size, "burst", size*2, "int_cores", cores).Err(); err != nil {
			t.Fatal(err)
		}
	}
	set("big", "a1", 300, 150)  // 0.5
	set("big", "a2", 100, 150)  // 1.5; show-wide 300/400 = 0.75
	set("small", "a1", 100, 80) // 0.8
	ac := func(show, alloc string) *clusters.Cluster {
		return clusters.New("f", show, []clusters.Tag{{Name: alloc, Type: clusters.Alloc, AllocID: alloc}})
	}
	cs := []*clusters.Cluster{ac("big", "a1"), ac("big", "a2"), ac("small", "a1"), ac("unseeded", "a1")}
	b := tiers.New(rdb, func() []tiers.Sub { return tiers.SubsOf(cs) }, tiers.Options{})
	if r := b.Rank(cs[0]); r != 0 {
		t.Fatalf("rank before the first refresh = %v, want 0", r)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	manual := clusters.New("f", "big", []clusters.Tag{{Name: "desk", Type: clusters.Manual}})
	for _, c := range []struct {
		c    *clusters.Cluster
		want float64
	}{{cs[0], 0.5}, {cs[1], 1.5}, {cs[2], 0.8}, {cs[3], 0}, {manual, 0.75}} {
		if got := b.Rank(c.c); got != c.want {
			t.Errorf("Rank(%s) = %v, want %v", c.c, got, c.want)
		}
	}
	set("small", "a1", 100, 20)
	if got := b.Rank(cs[2]); got != 0.8 {
		t.Fatalf("rank changed without a refresh: %v", got)
	}
	b.Touch(ctx, tiers.Sub{Show: "small", Alloc: "a1"})
	if got := b.Rank(cs[2]); got != 0.2 {
		t.Fatalf("after Touch: %v, want 0.2", got)
	}
	if got := b.Rank(cs[0]); got != 0.5 {
		t.Fatalf("Touch of another subscription changed big/a1: %v", got)
	}
}
