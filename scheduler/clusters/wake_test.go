package clusters_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
)

type flag struct{ moved atomic.Bool }

func (f *flag) Moved() bool { return f.moved.Load() }

// A cluster sleeping with a watch is handed out as soon as the watch moved
// and the feed is poked, long before its sleep ends; a cluster sleeping
// without one, or whose watch did not move, keeps sleeping.
func TestFeedWatchCutsTheSleepShort(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs := static(3)
	reg := prometheus.NewRegistry()
	f := clusters.NewStaticFeed(cs, clusters.FeedOptions{Registerer: reg})
	var got []*clusters.Cluster
	for range cs {
		c, err := f.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c)
	}
	var w0, w1 flag
	f.DoneWatch(got[0], time.Hour, &w0)
	f.DoneWatch(got[1], time.Hour, &w1)
	f.Done(got[2], time.Hour)

	next := make(chan *clusters.Cluster, 1)
	nctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		c, err := f.Next(nctx)
		if err == nil {
			next <- c
		}
	}()
	select {
	case c := <-next:
		t.Fatalf("%s handed out while every cluster sleeps", c)
	case <-time.After(50 * time.Millisecond):
	}
	w1.moved.Store(true)
	f.Poke()
	select {
	case c := <-next:
		if c.Key() != got[1].Key() {
			t.Fatalf("woke %s, want the cluster whose watch moved (%s)", c, got[1])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a moved watch did not end the sleep")
	}
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if c, err := f.Next(short); err == nil {
		t.Fatalf("%s handed out, but only one watch moved", c)
	}
	if v := testCounter(t, reg, "scheduler_clusters_woken_total"); v != 1 {
		t.Fatalf("woken_total = %v", v)
	}
}

func testCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() == name {
			var v float64
			for _, m := range fam.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			return v
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// The wake-up queue's gauges: scheduler_clusters_ready counts the clusters
// Next could hand out now (awake, not in flight, not sleeping or woken by
// their watch), scheduler_clusters_in_flight those handed out.
func TestFeedQueueGauges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs := static(3)
	reg := prometheus.NewRegistry()
	f := clusters.NewStaticFeed(cs, clusters.FeedOptions{Registerer: reg})
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s", name)
		return 0
	}
	check := func(ready, inFlight float64) {
		t.Helper()
		if r, i := gauge("scheduler_clusters_ready"), gauge("scheduler_clusters_in_flight"); r != ready || i != inFlight {
			t.Fatalf("ready %v in flight %v, want %v and %v", r, i, ready, inFlight)
		}
	}
	check(3, 0)
	a, err := f.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check(1, 2)
	var w flag
	f.DoneWatch(a, time.Hour, &w)
	check(1, 1)
	w.moved.Store(true) // woken: ready again, though its sleep has not ended
	check(2, 1)
	f.Done(b, 0)
	check(3, 0)
}
