package loop

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/matchertest"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestPassesOfAClusterTakeDisjointJobs: passes of one cluster in flight
// together (queue.stream.passes_per_cluster) never hold the same job: each
// pending query leaves out the jobs the others hold; a pass that finds
// every pending job held ends busy, without a sleep; released jobs are
// found again.
func TestPassesOfAClusterTakeDisjointJobs(t *testing.T) {
	ctx := context.Background()
	f := matchertest.OneAlloc(ctx, t)
	fac, show, alloc, seed, pool := f.Facility, f.Show, f.Alloc, f.Seed, f.Pool
	if _, err := seed.Host(ctx, farmseed.HostSpec{Name: "h1", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 64 * farmseed.GB}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"j1", "j2", "j3"} {
		if _, err := seed.Job(ctx, farmseed.JobSpec{Name: name, Show: show, Facility: fac,
			Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2}}}); err != nil {
			t.Fatal(err)
		}
	}
	c := clusters.New(fac, show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: alloc}})
	p := New(pool, nil, nil, Config{MaxJobsPerPass: 2}, Options{})
	query := func() jobs.PendingQuery {
		return jobs.PendingQuery{ShowID: c.ShowID, FacilityID: c.FacilityID, Tags: c.TagNames(), Limit: 2}
	}
	names := func(js []jobs.Job) []string {
		var out []string
		for _, j := range js {
			out = append(out, j.Name)
		}
		slices.Sort(out)
		return out
	}

	q1 := query()
	a, err := p.takeJobs(ctx, c, &q1)
	if err != nil || len(a) != 2 || len(q1.Exclude) != 0 {
		t.Fatalf("first pass took %v (excluding %v), %v; want 2 jobs", names(a), q1.Exclude, err)
	}
	q2 := query()
	b, err := p.takeJobs(ctx, c, &q2)
	if err != nil || len(b) != 1 || len(q2.Exclude) != 2 {
		t.Fatalf("second pass took %v (excluding %v), %v; want the third job", names(b), q2.Exclude, err)
	}
	if all := names(append(append([]jobs.Job(nil), a...), b...)); !slices.Equal(all, []string{"j1", "j2", "j3"}) {
		t.Fatalf("passes hold %v, want each job once", all)
	}
	// Every job held: a third pass is busy, and sleeps on nothing.
	if r := p.Pass(ctx, c); r.Reason != Busy || r.Sleep != 0 || r.Dispatched != 0 {
		t.Fatalf("pass with every job held = %+v, want busy without a sleep", r)
	}
	p.releaseJobs(c, a)
	q3 := query()
	again, err := p.takeJobs(ctx, c, &q3)
	if err != nil || !slices.Equal(names(again), names(a)) {
		t.Fatalf("after the first pass ended: %v, %v; want %v again", names(again), err, names(a))
	}
	p.releaseJobs(c, again)
	p.releaseJobs(c, b)
	if len(p.working) != 0 {
		t.Fatalf("jobs still held after every pass ended: %v", p.working)
	}
}

// TestPassReadsLayersOnce: a pass of three jobs reads their layers in one
// statement (matcher.PassLayers), not one per job, and every job still
// works each of its layers (issue #28: statements per frame).
func TestPassReadsLayersOnce(t *testing.T) {
	ctx := context.Background()
	f := matchertest.OneAlloc(ctx, t)
	fac, show, alloc, seed := f.Facility, f.Show, f.Alloc, f.Seed
	if _, err := seed.Host(ctx, farmseed.HostSpec{Name: "h1", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 64 * farmseed.GB}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"j1", "j2", "j3"} {
		if _, err := seed.Job(ctx, farmseed.JobSpec{Name: name, Show: show, Facility: fac,
			Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2}, {Tags: []string{"general"}, Frames: 2}}}); err != nil {
			t.Fatal(err)
		}
	}
	c := clusters.New(fac, show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: alloc}})
	db := &matchertest.LayerQueries{Pool: f.Pool}
	hosts := &matchertest.NoHosts{}
	m := matcher.New(db, hosts, nil, matcher.Config{Attempts: 1, Policy: sizing.Policy{CoreUnit: 100}},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: jobs.NewBackoff(time.Minute, time.Hour)})
	p := New(db, nil, m, Config{MaxJobsPerPass: 3}, Options{})
	r := p.Pass(ctx, c)
	if r.Jobs != 3 || r.Reason != Saturated {
		t.Fatalf("pass = %+v, want 3 jobs and no host (saturated)", r)
	}
	if n := db.N.Load(); n != 1 {
		t.Fatalf("%d layer queries for a pass of 3 jobs, want 1", n)
	}
	if n := hosts.Checkouts.Load(); n != 6 {
		t.Fatalf("%d checkouts, want one per layer of the 3 jobs (6)", n)
	}
}
