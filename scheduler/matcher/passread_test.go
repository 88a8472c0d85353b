package matcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/matchertest"
)

// TestPassReadAtTheJobsTurn: a job takes its layers from its pass's read
// (no query of its own), leaving out a layer backed off since the read;
// a job this process booked since the read queries its own, since the read
// may predate the booking (its frames, running counts and live cores).
func TestPassReadAtTheJobsTurn(t *testing.T) {
	ctx := context.Background()
	f := matchertest.OneAlloc(ctx, t)
	fac, show, alloc, seed := f.Facility, f.Show, f.Alloc, f.Seed
	var js []jobs.Job
	var seeded []farmseed.Job
	for _, name := range []string{"j1", "j2"} {
		j, err := seed.Job(ctx, farmseed.JobSpec{Name: name, Show: show, Facility: fac,
			Layers: []farmseed.LayerSpec{{Name: "a", Tags: []string{"general"}, Frames: 2}, {Name: "b", Tags: []string{"general"}, Frames: 2}}})
		if err != nil {
			t.Fatal(err)
		}
		seeded = append(seeded, j)
		js = append(js, jobs.Job{ID: j.ID, Name: name})
	}
	c := clusters.New(fac, show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: alloc}})
	db := &matchertest.LayerQueries{Pool: f.Pool}
	hosts := &matchertest.NoHosts{}
	backoff := jobs.NewBackoff(time.Minute, time.Hour)
	m := matcher.New(db, hosts, nil, matcher.Config{Attempts: 1, Policy: sizing.Policy{CoreUnit: 100}},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: backoff})

	read, err := m.PassLayers(ctx, c, js)
	if err != nil || db.N.Load() != 1 || len(read.Layers) != 2 {
		t.Fatalf("pass read: %v, %d queries, layers of %d jobs; want 1 query, 2 jobs", err, db.N.Load(), len(read.Layers))
	}
	// Since the read, j1's layer a backed off in the cluster.
	backoff.MissedWatch(c.Key(), seeded[0].Layers[0].ID, nil)
	out, err := m.ProcessInTurn(ctx, c, js[0], matcher.Turn{Read: read})
	if err != nil || out.Layers != 1 || hosts.Checkouts.Load() != 1 || db.N.Load() != 1 {
		t.Fatalf("j1: %+v, %v; %d checkouts, %d queries; want layer b alone from the read (1 checkout, no query)",
			out, err, hosts.Checkouts.Load(), db.N.Load())
	}
	// Since the read, this process booked j2 (another cluster's pass).
	m.BookedJob(js[1].ID)
	out, err = m.ProcessInTurn(ctx, c, js[1], matcher.Turn{Read: read})
	if err != nil || out.Layers != 2 || db.N.Load() != 2 {
		t.Fatalf("j2 booked since the read: %+v, %v; %d queries; want its own query (2) and both layers", out, err, db.N.Load())
	}
	// A read taken after that booking is fresh for j2 (whose layers are
	// both backed off now: they just found no host).
	again, err := m.PassLayers(ctx, c, js[1:])
	if err != nil {
		t.Fatal(err)
	}
	if out, err := m.ProcessInTurn(ctx, c, js[1], matcher.Turn{Read: again}); err != nil || out.Layers != 0 || db.N.Load() != 3 {
		t.Fatalf("j2 after a fresh read: %+v, %v; %d queries; want the read used (3 queries in all), its layers held", out, err, db.N.Load())
	}
}
