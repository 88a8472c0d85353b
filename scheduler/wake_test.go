package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// Freed capacity wakes exactly the clusters and layers waiting for it.
// Two allocation clusters of one show, each with one 1-core host and a
// layer of 1-core frames: both hosts fill up, both layers miss and back off
// for an hour, both clusters sleep an hour. When the proc on the first
// host is released in SQL (as Cuebot's unbook does it), the host cache
// learns it from the WAL and the first layer is booked again: only the
// wake-up can do that before the hour is out, whatever the machine's speed.
// The second cluster and its layer are not woken.
func TestFreedCapacityWakesOnlyItsCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, 0)
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	other := must(w.seed.Alloc(ctx, w.facility, "spi.other", "other"))
	must(w.seed.Subscribe(ctx, w.show, other, 100, 100))
	hostA := must(w.seed.Host(ctx, farmseed.HostSpec{Name: "ha", Alloc: w.alloc, AllocTag: "general", Cores: 1}))
	must(w.seed.Host(ctx, farmseed.HostSpec{Name: "hb", Alloc: other, AllocTag: "other", Cores: 1}))
	jobA, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "ja", Show: w.show, Facility: w.facility,
		Layers: []farmseed.LayerSpec{{Name: "la", Tags: []string{"general"}, Frames: 3, NotThreadable: true}}})
	if err != nil {
		t.Fatal(err)
	}
	jobB, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "jb", Show: w.show, Facility: w.facility,
		Layers: []farmseed.LayerSpec{{Name: "lb", Tags: []string{"other"}, Frames: 3, NotThreadable: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := farmseed.SeedAccounting(ctx, w.pool, w.pub, w.show.ID); err != nil {
		t.Fatal(err)
	}
	clusterA := allocCluster(w)
	clusterB := clusters.New(w.facility, w.show.ID, []clusters.Tag{{Name: "other", Type: clusters.Alloc, AllocID: other}})
	layerA, layerB := jobA.Layers[0].ID, jobB.Layers[0].ID

	cfg := testConfig(w)
	cfg.Queue.ClusterSaturatedSleep = config.Duration(time.Hour)
	cfg.Queue.LayerBackoffMin = config.Duration(time.Hour)
	cfg.Queue.LayerBackoffMax = config.Duration(time.Hour)
	cfg.Queue.ActiveScanInterval = config.Duration(50 * time.Millisecond)
	s := w.scheduler(t, cfg, scheduler.Deps{NoAccounting: true}, true)
	runUntilEnd(t, s)

	procOf := func(layer string) (string, int) {
		t.Helper()
		var id string
		var n int
		if err := w.pool.QueryRow(ctx, `SELECT COALESCE(max(pk_proc), ''), count(*) FROM proc WHERE pk_layer = $1`, layer).Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		return id, n
	}
	contains := func(xs []string, x string) bool {
		for _, v := range xs {
			if v == x {
				return true
			}
		}
		return false
	}
	// Both hosts full, both layers backed off in their clusters.
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for {
		_, na := procOf(layerA)
		_, nb := procOf(layerB)
		if na == 1 && nb == 1 && contains(s.Backoff.Held(clusterA.Key()), layerA) && contains(s.Backoff.Held(clusterB.Key()), layerB) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("setup: procs a=%d b=%d, held a=%v b=%v", na, nb, s.Backoff.Held(clusterA.Key()), s.Backoff.Held(clusterB.Key()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // let both clusters settle into their sleep
	released := s.Backoff.Released()

	// Cuebot unbooks the proc on host a (its unbook transaction, reduced to
	// what the host cache reads). The test server runs with
	// synchronous_commit=off, which delays the WAL the walsender may send by
	// up to wal_writer_delay; Cuebot commits with the default (on), so this
	// transaction does too.
	procA, _ := procOf(layerA)
	start := time.Now()
	release := func() error {
		tx, err := w.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
			WITH p AS (DELETE FROM proc WHERE pk_proc = $1
			           RETURNING pk_host, int_cores_reserved, int_mem_reserved, int_gpus_reserved, int_gpu_mem_reserved)
			UPDATE host h SET int_cores_idle = h.int_cores_idle + p.int_cores_reserved,
			       int_mem_idle = h.int_mem_idle + p.int_mem_reserved, int_gpus_idle = h.int_gpus_idle + p.int_gpus_reserved,
			       int_gpu_mem_idle = h.int_gpu_mem_idle + p.int_gpu_mem_reserved
			  FROM p WHERE h.pk_host = p.pk_host`, procA); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	for {
		if id, n := procOf(layerA); n == 1 && id != procA {
			break
		}
		if time.Since(start) > testenv.Patience(20*time.Second) {
			t.Fatal("the freed host was not rebooked (the backoff and the sleep are an hour: only the wake-up can)")
		}
		time.Sleep(time.Millisecond)
	}
	latency := time.Since(start)
	t.Logf("host a rebooked %s after its proc was released", latency.Round(time.Millisecond))
	var onA string
	if err := w.pool.QueryRow(ctx, `SELECT pk_host FROM proc WHERE pk_layer = $1`, layerA).Scan(&onA); err != nil || onA != hostA {
		t.Fatalf("new proc on %s (%v), want host a", onA, err)
	}

	// Give a wrongly woken cluster b time to run, then check it was not.
	time.Sleep(300 * time.Millisecond)
	if got := s.Backoff.Released() - released; got != 1 {
		t.Fatalf("%d backoffs released early, want 1 (layer a only)", got)
	}
	if !contains(s.Backoff.Held(clusterB.Key()), layerB) {
		t.Fatal("layer b was released by capacity freed in another cluster")
	}
	if _, nb := procOf(layerB); nb != 1 {
		t.Fatalf("layer b has %d procs", nb)
	}
}

// A cluster whose waiting work is held back by a cap wakes when its show's
// procs are released (the sidecar's release script publishes the show):
// a 1-core job cap, three 1-core frames on an 8-core host, a saturated
// sleep and layer backoffs of an hour. The first frame books, the next
// pass finds the job at its cap and sleeps. Cuebot's unbook of the proc
// and the sidecar's release (publisher.Release, the same script) give the
// cap its core back: only the release wake-up can book the second frame
// before the hour is out, whatever the machine's speed.
func TestReleaseWakesCappedCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, 0)
	if _, err := w.seed.Host(ctx, farmseed.HostSpec{Name: "h", Alloc: w.alloc, AllocTag: "general", Cores: 8}); err != nil {
		t.Fatal(err)
	}
	job, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "capped", Show: w.show, Facility: w.facility, MaxCores: 1,
		Layers: []farmseed.LayerSpec{{Name: "l", Tags: []string{"general"}, Frames: 3, NotThreadable: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := farmseed.SeedAccounting(ctx, w.pool, w.pub, w.show.ID); err != nil {
		t.Fatal(err)
	}
	layer := job.Layers[0].ID

	cfg := testConfig(w)
	cfg.Queue.ClusterSaturatedSleep = config.Duration(time.Hour)
	cfg.Queue.LayerBackoffMin = config.Duration(time.Hour)
	cfg.Queue.LayerBackoffMax = config.Duration(time.Hour)
	cfg.Queue.ActiveScanInterval = config.Duration(50 * time.Millisecond)
	cfg.Queue.ClusterReleaseWakeMin = config.Duration(20 * time.Millisecond)
	reg := prometheus.NewRegistry()
	s := w.scheduler(t, cfg, scheduler.Deps{NoAccounting: true, Registerer: reg}, true)
	runUntilEnd(t, s)
	procs := func() []string {
		t.Helper()
		var ids []string
		if err := w.pool.QueryRow(ctx, `SELECT COALESCE(array_agg(pk_proc), '{}') FROM proc WHERE pk_layer = $1`, layer).Scan(&ids); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	capped := func() float64 { return promread.ValueOr0(t, reg, "scheduler_passes_total", "reason", "capped") }
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for len(procs()) != 1 || capped() < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("setup: procs %v, capped passes %v", procs(), capped())
		}
		time.Sleep(5 * time.Millisecond)
	}
	first := procs()[0]
	if _, err := w.pool.Exec(ctx, `
		WITH p AS (DELETE FROM proc WHERE pk_proc = $1 RETURNING pk_host, int_cores_reserved, int_mem_reserved)
		UPDATE host h SET int_cores_idle = h.int_cores_idle + p.int_cores_reserved, int_mem_idle = h.int_mem_idle + p.int_mem_reserved
		  FROM p WHERE h.pk_host = p.pk_host`, first); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if r, err := w.pub.Release(ctx, first); err != nil || r.Released != 1 {
		t.Fatalf("release: %+v, %v", r, err)
	}
	for {
		if ids := procs(); len(ids) == 1 && ids[0] != first {
			break
		}
		if time.Since(start) > testenv.Patience(20*time.Second) {
			t.Fatalf("the capped job was not booked again after its proc's release (the sleep is an hour: only the release wake-up can); procs %v", procs())
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("capped job booked again %s after its proc's release", time.Since(start).Round(time.Millisecond))
	if n := promread.ValueOr0(t, reg, "scheduler_release_notices_total"); n < 1 {
		t.Errorf("scheduler_release_notices_total = %v after a release", n)
	}
}
