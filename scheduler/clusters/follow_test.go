package clusters_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/shared/replication"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// recorder collects a Follower's Changes.
type recorder struct {
	mu  sync.Mutex
	got []clusters.Change
}

func (r *recorder) Notify(c clusters.Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, c)
}

// next waits for the next Change after the first n.
func (r *recorder) next(t *testing.T, n int) clusters.Change {
	t.Helper()
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for {
		r.mu.Lock()
		if len(r.got) > n {
			c := r.got[n]
			r.mu.Unlock()
			return c
		}
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no change #%d from the WAL", n+1)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tap adapts a Follower to a replication consumer (what the host cache
// does for it in the scheduler).
type tap struct{ f *clusters.Follower }

func (a tap) Snapshot(ctx context.Context, q replication.SnapshotQuerier) error {
	return a.f.TapSnapshot(ctx, q)
}

func (a tap) Apply(_ context.Context, txn *replication.Transaction) error {
	a.f.TapApply(txn)
	return nil
}

var slotSeq atomic.Int64

// follow streams the host cache's publication into a Follower until the
// test ends.
func follow(t *testing.T, w *world, sink clusters.Notifier) {
	t.Helper()
	slot := fmt.Sprintf("clusters_test_%d_%d", time.Now().UnixNano()%1_000_000_000, slotSeq.Add(1))
	s, err := replication.New(replication.Config{
		ConnString: w.pool.Config().ConnString(), Slot: slot, Kind: replication.TemporarySlot,
		Publications: []string{"cuesched_hostcache"}, StatusInterval: 100 * time.Millisecond,
	}, tap{clusters.NewFollower(sink, nil)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("stream: %v", err)
		}
	})
}

// The Follower reports what changes the cluster set or a show's chances
// and nothing of the updates Cuebot makes while it books (counters of
// subscriptions, folders and jobs, idle values of hosts, a show's other
// columns). Each statement is its own transaction and transactions arrive
// in commit order, so a noisy update that was reported would show up
// before the next marker.
func TestFollowerReportsWhatMatters(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	job, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "j", Show: w.a, Facility: w.f1,
		Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	folder, err := w.seed.Folder(ctx, w.a, "capped", 10, -1)
	if err != nil {
		t.Fatal(err)
	}
	var subA, hostH1 string
	if err := w.pool.QueryRow(ctx, `SELECT pk_subscription FROM subscription WHERE pk_show = $1 AND pk_alloc = $2`, w.a.ID, w.general).Scan(&subA); err != nil {
		t.Fatal(err)
	}
	if err := w.pool.QueryRow(ctx, `SELECT pk_host FROM host WHERE str_name = 'h1'`).Scan(&hostH1); err != nil {
		t.Fatal(err)
	}

	rec := &recorder{}
	follow(t, w, rec)
	n := 0
	if c := rec.next(t, n); !c.Reload {
		t.Fatalf("first change %+v, want the snapshot's reload", c)
	}
	n++
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := w.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	expect := func(what string, want clusters.Change) {
		t.Helper()
		got := rec.next(t, n)
		n++
		// Each carries the id of the transaction that made it, for the
		// feed to wait until it is visible.
		if len(got.XIDs) != 1 || got.XIDs[0] == 0 {
			t.Fatalf("%s: change %+v carries transaction ids %v, want its one transaction", what, got, got.XIDs)
		}
		got.XIDs = nil
		norm := func(c clusters.Change) string {
			for _, s := range [][]string{c.Shows, c.CapShows, c.Folders, c.Jobs} {
				slices.Sort(s)
			}
			c.Shows, c.CapShows = slices.Compact(c.Shows), slices.Compact(c.CapShows)
			return fmt.Sprintf("%+v", c)
		}
		if norm(got) != norm(want) {
			t.Fatalf("%s: change %s, want %s", what, norm(got), norm(want))
		}
	}

	// Noise, then a marker (an allocation change reloads).
	exec(`UPDATE subscription SET int_cores = int_cores + 100 WHERE pk_subscription = $1`, subA)
	exec(`UPDATE host SET int_cores_idle = int_cores_idle - 100 WHERE pk_host = $1`, hostH1)
	exec(`UPDATE job_resource SET int_cores = int_cores + 100, int_max_rss = 12345 WHERE pk_job = $1`, job.ID)
	exec(`UPDATE folder_resource SET int_cores = int_cores + 100 WHERE pk_folder = $1`, folder)
	exec(`UPDATE show SET str_comment_email = 'x@y' WHERE pk_show = $1`, w.a.ID)
	exec(`UPDATE alloc SET b_billable = false WHERE pk_alloc = $1`, w.gpu)
	expect("noise then an allocation change", clusters.Change{Reload: true})

	exec(`UPDATE subscription SET int_burst = int_burst + 100 WHERE pk_subscription = $1`, subA)
	expect("burst raised", clusters.Change{Shows: []string{w.a.ID}, CapShows: []string{w.a.ID}})
	exec(`UPDATE subscription SET int_size = int_size + 100 WHERE pk_subscription = $1`, subA)
	expect("size raised", clusters.Change{Shows: []string{w.a.ID}, CapShows: []string{w.a.ID}})
	exec(`UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, w.b.ID)
	expect("show flipped", clusters.Change{Reload: true, Shows: []string{w.b.ID}})
	exec(`UPDATE show SET b_active = false WHERE pk_show = $1`, w.a.ID)
	expect("show deactivated", clusters.Change{Reload: true, Shows: []string{w.a.ID}})
	exec(`UPDATE job_resource SET int_max_cores = int_max_cores + 100 WHERE pk_job = $1`, job.ID)
	expect("job cap", clusters.Change{Jobs: []string{job.ID}})
	exec(`UPDATE folder_resource SET int_max_gpus = 3 WHERE pk_folder = $1`, folder)
	expect("folder cap", clusters.Change{Folders: []string{folder}})
	exec(`UPDATE host SET pk_alloc = $2 WHERE pk_host = $1`, hostH1, w.gpu)
	expect("host moved", clusters.Change{Reload: true})
	exec(`INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type) VALUES ('t-new', $1, 'fresh', 'MANUAL')`, hostH1)
	expect("host tag", clusters.Change{Reload: true})
	exec(`DELETE FROM subscription WHERE pk_subscription = $1`, subA)
	expect("subscription removed", clusters.Change{Reload: true, Shows: []string{w.a.ID}, CapShows: []string{w.a.ID}})
	exec(`INSERT INTO facility (pk_facility, str_name) VALUES ('f-new', 'fnew')`)
	expect("facility", clusters.Change{Reload: true})
}

// gauge reads one counter by label.
func counterWith(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
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
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					v += m.GetCounter().GetValue()
				}
			}
		}
	}
	return v
}

// The safety reload counts what it finds that no WAL change reported as
// drift (added and removed clusters); what the WAL reported, flushed or
// still waiting to be flushed, is not drift.
func TestSafetyReloadCountsDrift(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	f, err := clusters.NewFeed(ctx, w.pool, clusters.FeedOptions{
		Load: clusters.LoadOptions{FacilityID: w.f1}, ScanInterval: time.Hour, ReloadInterval: time.Hour, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	drift := func() (added, removed float64) {
		return counterWith(t, reg, "scheduler_cluster_set_drift_total", "change", "added"),
			counterWith(t, reg, "scheduler_cluster_set_drift_total", "change", "removed")
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := w.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if swapped, err := f.Reload(ctx); err != nil || swapped {
		t.Fatalf("Reload of an unchanged set = %v, %v", swapped, err)
	}
	if a, r := drift(); a != 0 || r != 0 {
		t.Fatalf("drift %v/%v on an unchanged set", a, r)
	}

	// Missed: show b flipped with nobody telling the feed. Show b
	// subscribes to f1.general: alloc:general, hostname:h1, manual:urgent,
	// hardware:avx.
	exec(`UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, w.b.ID)
	if swapped, err := f.Reload(ctx); err != nil || !swapped {
		t.Fatalf("Reload after a missed flip = %v, %v", swapped, err)
	}
	if a, r := drift(); a != 4 || r != 0 {
		t.Fatalf("drift added/removed = %v/%v, want 4/0", a, r)
	}

	// Reported and flushed: not drift.
	exec(`UPDATE show SET b_scheduler_managed = false WHERE pk_show = $1`, w.b.ID)
	f.Notify(clusters.Change{Reload: true, Shows: []string{w.b.ID}})
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := counterWith(t, reg, "scheduler_cluster_reloads_total", "trigger", "wal"); got != 1 {
		t.Fatalf("%v WAL reloads, want 1", got)
	}
	if swapped, err := f.Reload(ctx); err != nil || swapped {
		t.Fatalf("safety Reload after the WAL reload = %v, %v", swapped, err)
	}
	if a, r := drift(); a != 4 || r != 0 {
		t.Fatalf("drift added/removed = %v/%v after a reported change, want still 4/0", a, r)
	}

	// Reported but not flushed yet when the safety reload runs: not drift
	// either (the flush that follows finds the set current).
	exec(`UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, w.b.ID)
	f.Notify(clusters.Change{Reload: true, Shows: []string{w.b.ID}})
	if swapped, err := f.Reload(ctx); err != nil || !swapped {
		t.Fatalf("safety Reload with a change pending = %v, %v", swapped, err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if a, r := drift(); a != 4 || r != 0 {
		t.Fatalf("drift added/removed = %v/%v with the change pending, want still 4/0", a, r)
	}

	// A missed host tag changes the manual clusters of shows a and b (both
	// subscribe to h1's allocation): two changed clusters.
	exec(`INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type)
		SELECT 't-fresh', pk_host, 'fresh', 'MANUAL' FROM host WHERE str_name = 'h1'`)
	if swapped, err := f.Reload(ctx); err != nil || !swapped {
		t.Fatalf("Reload after a missed host tag = %v, %v", swapped, err)
	}
	a, r := drift()
	if c := counterWith(t, reg, "scheduler_cluster_set_drift_total", "change", "changed"); a != 4 || r != 0 || c != 2 {
		t.Fatalf("drift added/removed/changed = %v/%v/%v, want 4/0/2", a, r, c)
	}

	// Missed removals count too: show a deactivated behind the feed's back.
	before := len(f.Clusters())
	exec(`UPDATE show SET b_active = false WHERE pk_show = $1`, w.a.ID)
	if swapped, err := f.Reload(ctx); err != nil || !swapped {
		t.Fatalf("Reload after a missed deactivation = %v, %v", swapped, err)
	}
	removed := before - len(f.Clusters())
	if a, r := drift(); a != 4 || r != float64(removed) || removed == 0 {
		t.Fatalf("drift added/removed = %v/%v, want 4/%d", a, r, removed)
	}
	if got := counterWith(t, reg, "scheduler_cluster_reloads_total", "trigger", "safety"); got != 6 {
		t.Fatalf("%v safety reloads, want 6", got)
	}
}

// A WAL change to a show ends the sleeps of its clusters, and a pass of
// theirs in flight does not go to sleep afterwards; other shows' clusters
// keep sleeping.
func TestNotifyWakesTheShowsClusters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a1 := clusters.New("f", "a", []clusters.Tag{{Name: "x", Type: clusters.Manual}})
	a2 := clusters.New("f", "a", []clusters.Tag{{Name: "y", Type: clusters.Manual}})
	b1 := clusters.New("f", "b", []clusters.Tag{{Name: "x", Type: clusters.Manual}})
	reg := prometheus.NewRegistry()
	f := clusters.NewStaticFeed([]*clusters.Cluster{a1, a2, b1}, clusters.FeedOptions{Registerer: reg})
	var out []*clusters.Cluster
	for range 3 {
		c, err := f.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	var inflight *clusters.Cluster
	for _, c := range out {
		if c.Key() == a2.Key() {
			inflight = c
			continue
		}
		f.Done(c, time.Hour)
	}
	f.Notify(clusters.Change{Shows: []string{"a"}})
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	f.Done(inflight, time.Hour) // ended after the change: no sleep
	got := map[string]bool{}
	for range 2 {
		short, cancel := context.WithTimeout(ctx, testenv.Patience(2*time.Second))
		c, err := f.Next(short)
		cancel()
		if err != nil {
			t.Fatalf("show a's clusters not handed out after the change: %v (got %v)", err, got)
		}
		got[c.Key()] = true
	}
	if !got[a1.Key()] || !got[a2.Key()] {
		t.Fatalf("handed out %v, want both clusters of show a", got)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if c, err := f.Next(short); err == nil {
		t.Fatalf("%s handed out; show b's cluster should still sleep", c)
	}
	if v := testCounter(t, reg, "scheduler_clusters_wal_woken_total"); v != 1 {
		t.Fatalf("scheduler_clusters_wal_woken_total = %v, want 1 (a1; a2 was in flight)", v)
	}
}
