package matcher_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// layerCounter counts the layer queries that reach the database.
type layerCounter struct {
	*pgxpool.Pool
	n atomic.Int32
}

func (d *layerCounter) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "lay AS") {
		d.n.Add(1)
	}
	return d.Pool.Query(ctx, sql, args...)
}

// noHost has no host for anyone and counts the checkouts (one per layer
// worked).
type noHost struct{ n atomic.Int32 }

func (h *noHost) Checkout(context.Context, matcher.HostRequest) (sizing.Host, error) {
	h.n.Add(1)
	return sizing.Host{}, matcher.ErrNoCandidate
}

func (h *noHost) Checkin(sizing.Host) {}

// TestPassReadAtTheJobsTurn: a job takes its layers from its pass's read
// (no query of its own), leaving out a layer backed off since the read;
// a job this process booked since the read queries its own, since the read
// may predate the booking (its frames, running counts and live cores).
func TestPassReadAtTheJobsTurn(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	seed := &farmseed.Seeder{DB: pool}
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	fac := must(seed.Facility(ctx, "f1"))
	show, err := seed.Show(ctx, "show", true)
	if err != nil {
		t.Fatal(err)
	}
	alloc := must(seed.Alloc(ctx, fac, "f1.general", "general"))
	must(seed.Subscribe(ctx, show, alloc, 100, 100))
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
	db := &layerCounter{Pool: pool}
	hosts := &noHost{}
	backoff := jobs.NewBackoff(time.Minute, time.Hour)
	m := matcher.New(db, hosts, nil, matcher.Config{Attempts: 1, Policy: sizing.Policy{CoreUnit: 100}},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: backoff})

	read, err := m.PassLayers(ctx, c, js)
	if err != nil || db.n.Load() != 1 || len(read.Layers) != 2 {
		t.Fatalf("pass read: %v, %d queries, layers of %d jobs; want 1 query, 2 jobs", err, db.n.Load(), len(read.Layers))
	}
	// Since the read, j1's layer a backed off in the cluster.
	backoff.MissedWatch(c.Key(), seeded[0].Layers[0].ID, nil)
	out, err := m.ProcessInTurn(ctx, c, js[0], matcher.Turn{Read: read})
	if err != nil || out.Layers != 1 || hosts.n.Load() != 1 || db.n.Load() != 1 {
		t.Fatalf("j1: %+v, %v; %d checkouts, %d queries; want layer b alone from the read (1 checkout, no query)",
			out, err, hosts.n.Load(), db.n.Load())
	}
	// Since the read, this process booked j2 (another cluster's pass).
	m.BookedJob(js[1].ID)
	out, err = m.ProcessInTurn(ctx, c, js[1], matcher.Turn{Read: read})
	if err != nil || out.Layers != 2 || db.n.Load() != 2 {
		t.Fatalf("j2 booked since the read: %+v, %v; %d queries; want its own query (2) and both layers", out, err, db.n.Load())
	}
	// A read taken after that booking is fresh for j2 (whose layers are
	// both backed off now: they just found no host).
	again, err := m.PassLayers(ctx, c, js[1:])
	if err != nil {
		t.Fatal(err)
	}
	if out, err := m.ProcessInTurn(ctx, c, js[1], matcher.Turn{Read: again}); err != nil || out.Layers != 0 || db.n.Load() != 3 {
		t.Fatalf("j2 after a fresh read: %+v, %v; %d queries; want the read used (3 queries in all), its layers held", out, err, db.n.Load())
	}
}
