package scheduler_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/rollout"
	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// walConfig makes every periodic path an hour long (the cluster set's
// safety reload, the awake scan, the sleeps, the accounting's limit reseed
// and recompute), so only what the WAL reports can make the scheduler
// notice a change during a test.
func walConfig(w *world) config.Config {
	cfg := testConfig(w)
	q := &cfg.Queue
	q.ClusterReloadInterval = config.Duration(time.Hour)
	q.ActiveScanInterval = config.Duration(time.Hour)
	q.ClusterEmptySleep = config.Duration(time.Hour)
	q.ClusterSaturatedSleep = config.Duration(time.Hour)
	q.LayerBackoffMin = config.Duration(20 * time.Millisecond)
	q.LayerBackoffMax = config.Duration(100 * time.Millisecond)
	cfg.Accounting.LimitReseedInterval = config.Duration(time.Hour)
	cfg.Accounting.RecomputeInterval = config.Duration(time.Hour)
	cfg.Accounting.LeaderPollInterval = config.Duration(100 * time.Millisecond)
	return cfg
}

// metric sums a counter family over the series whose labels include
// every pair of want.
func metric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, fam := range fams {
		if fam.GetName() != name {
			continue
		}
	series:
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, x := range want {
				if labels[k] != x {
					continue series
				}
			}
			v += m.GetCounter().GetValue()
		}
	}
	return v
}

// runScheduler runs s until the test ends and waits for its booking gate
// (host cache snapshot, Redis bootstrapped by its accounting leader).
func runScheduler(t *testing.T, s *scheduler.Scheduler) {
	t.Helper()
	runUntilEnd(t, s)
	wctx, wcancel := context.WithTimeout(context.Background(), testenv.Patience(20*time.Second))
	defer wcancel()
	if err := s.HostCache.WaitReady(wctx); err != nil {
		t.Fatalf("host cache not ready: %v", err)
	}
	if err := s.Accounting.WaitReady(wctx); err != nil {
		t.Fatalf("accounting not bootstrapped: %v", err)
	}
}

func (w *world) procs(t *testing.T, show string) int {
	t.Helper()
	var n int
	if err := w.pool.QueryRow(context.Background(), `SELECT count(*) FROM proc WHERE pk_show = $1`, show).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond with a patient deadline.
func waitFor(t *testing.T, what string, nominal time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Patience(nominal))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A show flipped to managed while a scheduler runs is booked as soon as
// its loop leader has seeded it, with the cluster set's safety reload, the
// awake scan and every sleep an hour long: the flip reaches the cluster
// feed through the WAL (the host cache's stream), its clusters are added
// and let through at once, and their passes, answered "not seeded" until
// the seed, look again shortly instead of sleeping.
func TestFlipIsBookedWithoutAReload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, 2)
	flipme, err := w.seed.Show(ctx, "flipme", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Subscribe(ctx, flipme, w.alloc, 10, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "t-job", Show: flipme, Facility: w.facility,
		Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 3, NotThreadable: true}}}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	s := w.scheduler(t, walConfig(w), scheduler.Deps{Registerer: reg}, true)
	runScheduler(t, s)
	hasClusters := func() bool {
		for _, c := range s.Feed.Clusters() {
			if c.ShowID == flipme.ID {
				return true
			}
		}
		return false
	}
	if hasClusters() {
		t.Fatal("the unmanaged show has clusters before the flip")
	}

	tool, err := rollout.New(w.pool, rollout.Options{Publisher: w.pub, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	// Forced: no sidecar runs here (its check is the only refusal).
	res, err := tool.Flip(ctx, rollout.FlipRequest{Show: "flipme", On: true, Force: true}, &out)
	if err != nil || !res.Changed {
		t.Fatalf("flip: %v (changed %v)\n%s", err, res != nil && res.Changed, out.String())
	}
	// Nothing of the show can be booked before the flip has happened and
	// the leader has seeded the show.
	if n := w.procs(t, flipme.ID); n != 0 {
		t.Fatalf("%d procs of the show right after the flip, before any seed", n)
	}
	waitFor(t, "the flipped show's clusters in the cluster set", 10*time.Second, hasClusters)
	if _, err := tool.WaitSeeded(ctx, res.Show, true, testenv.Patience(60*time.Second), &out); err != nil {
		t.Fatalf("wait seeded: %v\n%s", err, out.String())
	}
	waitFor(t, "a booking of the flipped show", 20*time.Second, func() bool { return w.procs(t, flipme.ID) > 0 })

	if n := metric(t, reg, "scheduler_cluster_reloads_total", map[string]string{"trigger": "safety"}); n != 0 {
		t.Fatalf("%v safety reloads: the flip must have come through the WAL", n)
	}
	if n := metric(t, reg, "scheduler_cluster_reloads_total", map[string]string{"trigger": "wal", "result": "swapped"}); n < 1 {
		t.Fatalf("%v WAL reloads swapped the set, want at least the flip's", n)
	}
	if n := metric(t, reg, "scheduler_active_scans_total", nil); n < 2 {
		t.Fatalf("%v awake scans, want the first one and the WAL flush's", n)
	}
	t.Logf("passes by reason: not_seeded %v, booked %v",
		metric(t, reg, "scheduler_passes_total", map[string]string{"reason": "not_seeded"}),
		metric(t, reg, "scheduler_passes_total", map[string]string{"reason": "booked"}))
}

// A show held at its subscription burst, with frames waiting, books more as
// soon as the burst is raised in Postgres: the WAL reports the change, the
// scheduler copies the show's caps to Redis and wakes its clusters. The
// cluster's sleep, the safety reload, the awake scan and the accounting's
// limit reseed are all an hour long, and no sidecar runs: only that path
// can book the new frames.
func TestBurstRaiseIsUsedWithoutAReload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, 0)
	if _, err := w.seed.Host(ctx, farmseed.HostSpec{Name: "big", Alloc: w.alloc, AllocTag: "general", Cores: 16}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE subscription SET int_burst = 200 WHERE pk_show = $1`, w.show.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "j", Show: w.show, Facility: w.facility,
		Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 8, NotThreadable: true}}}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	s := w.scheduler(t, walConfig(w), scheduler.Deps{Registerer: reg}, true)
	runScheduler(t, s)
	// Two 1-core frames fill the 2-core burst; the cluster then goes to
	// sleep for an hour (at the burst in Redis, or left out by the job
	// query at its burst).
	atBurst := func() float64 {
		return metric(t, reg, "scheduler_passes_total", map[string]string{"reason": "alloc_full"}) +
			metric(t, reg, "scheduler_passes_total", map[string]string{"reason": "capped"})
	}
	waitFor(t, "the show at its burst", 20*time.Second, func() bool { return w.procs(t, w.show.ID) == 2 && atBurst() > 0 })
	woken := metric(t, reg, "scheduler_clusters_wal_woken_total", nil)

	if _, err := w.pool.Exec(ctx, `UPDATE subscription SET int_burst = 500 WHERE pk_show = $1`, w.show.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bookings up to the raised burst", 20*time.Second, func() bool { return w.procs(t, w.show.ID) == 5 })

	if n := metric(t, reg, "scheduler_cluster_reloads_total", map[string]string{"trigger": "safety"}); n != 0 {
		t.Fatalf("%v safety reloads", n)
	}
	if n := metric(t, reg, "scheduler_accounting_reseed_cycles_total", map[string]string{"kind": "limit"}); n != 0 {
		t.Fatalf("%v periodic limit reseeds ran", n)
	}
	if n := metric(t, reg, "scheduler_accounting_reseed_cycles_total", map[string]string{"kind": "show_limit", "result": "ok"}); n < 1 {
		t.Fatalf("%v caps copies for the WAL's change, want at least 1", n)
	}
	if n := metric(t, reg, "scheduler_clusters_wal_woken_total", nil); n <= woken {
		t.Fatalf("scheduler_clusters_wal_woken_total stayed at %v: the sleeping cluster was not woken by the WAL", n)
	}
	// And no more than the new burst.
	time.Sleep(200 * time.Millisecond)
	if n := w.procs(t, w.show.ID); n != 5 {
		t.Fatalf("%d procs, want 5 (burst 5 cores)", n)
	}
}
