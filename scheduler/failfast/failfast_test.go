package failfast_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/scheduler/failfast"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The judgement, step by step against Cuebot's layer_usage counters: fast
// failures hold the layer (doubling), the hold keeps the layer and a job
// with nothing else waiting out of the pending queries, failures while
// held do not count against the probe, slow failures are not poison, and
// a success ends it.
func TestJudge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &farmseed.Seeder{DB: pool}
	fac, err := s.Facility(ctx, "f1")
	if err != nil {
		t.Fatal(err)
	}
	show, err := s.Show(ctx, "show", true)
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := s.Alloc(ctx, fac, "f1.general", "general")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Subscribe(ctx, show, alloc, 100, 100); err != nil {
		t.Fatal(err)
	}
	poison, err := s.Job(ctx, farmseed.JobSpec{Name: "poison", Show: show, Facility: fac, Priority: 50, MaxCores: farmseed.Uncapped,
		Layers: []farmseed.LayerSpec{{Name: "bad", Tags: []string{"general"}, Frames: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	layer := poison.Layers[0].ID
	cfg := failfast.Config{Failures: 5, Probe: 10, RunTime: 10 * time.Second, BackoffMin: time.Minute, BackoffMax: 3 * time.Minute}
	usage := func(fails, succ, clock int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE layer_usage SET int_frame_fail_count = $2, int_frame_success_count = $3, int_clock_time_fail = $4
			WHERE pk_layer = $1`, layer, fails, succ, clock); err != nil {
			t.Fatal(err)
		}
	}
	judge := func() []failfast.Held {
		t.Helper()
		h, err := failfast.Judge(ctx, pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	level := func() (int, bool) {
		t.Helper()
		var lvl int
		var held bool
		if err := pool.QueryRow(ctx, `SELECT int_level, COALESCE(ts_until > now(), false) FROM cuesched_layer_backoff WHERE pk_layer = $1`,
			layer).Scan(&lvl, &held); err != nil {
			t.Fatal(err)
		}
		return lvl, held
	}
	pending := func() int {
		t.Helper()
		js, err := jobs.Pending(ctx, pool, jobs.PendingQuery{ShowID: show.ID, FacilityID: fac, Tags: []string{"general"}})
		if err != nil {
			t.Fatal(err)
		}
		ls, err := jobs.Layers(ctx, pool, jobs.LayerQuery{JobID: poison.ID, Tags: []string{"general"}})
		if err != nil {
			t.Fatal(err)
		}
		if (len(js) == 0) != (len(ls) == 0) {
			t.Fatalf("pending jobs %d but layers %d: the lottery and the pass disagree", len(js), len(ls))
		}
		return len(js)
	}
	endHold := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE cuesched_layer_backoff SET ts_until = now() - interval '1 second' WHERE pk_layer = $1`, layer); err != nil {
			t.Fatal(err)
		}
	}

	if h := judge(); len(h) != 0 || pending() != 1 {
		t.Fatalf("first sight held %v", h)
	}
	usage(4, 0, 4)
	if h := judge(); len(h) != 0 {
		t.Fatalf("4 failures held %v", h)
	}
	usage(5, 0, 5)
	h := judge()
	if len(h) != 1 || h[0].Level != 1 || time.Until(h[0].Until) < 50*time.Second || time.Until(h[0].Until) > 70*time.Second {
		t.Fatalf("5 fast failures: %+v, want held at level 1 for a minute", h)
	}
	if pending() != 0 {
		t.Fatal("a held layer's job is still drawn")
	}
	// Stragglers fail while it is held: absorbed, not a second hold.
	usage(15, 0, 15)
	if h := judge(); len(h) != 0 {
		t.Fatalf("failures while held made another hold: %+v", h)
	}
	endHold()
	if pending() != 1 {
		t.Fatal("a hold that ended still holds")
	}
	if h := judge(); len(h) != 0 {
		t.Fatalf("the stragglers counted against the probe: %+v", h)
	}
	// A released layer is judged on a probe of 10 failed runs, not 5.
	usage(24, 0, 24)
	if h := judge(); len(h) != 0 {
		t.Fatalf("9 failures of the probe held %v", h)
	}
	usage(25, 0, 25)
	h = judge()
	if len(h) != 1 || h[0].Level != 2 || time.Until(h[0].Until) < 110*time.Second {
		t.Fatalf("the probe failed fast: %+v, want level 2 for two minutes", h)
	}
	endHold()
	usage(35, 0, 35)
	if h = judge(); len(h) != 1 || h[0].Level != 3 || time.Until(h[0].Until) > 190*time.Second {
		t.Fatalf("third hold: %+v, want level 3 capped at three minutes", h)
	}
	// Slow failures are not poison; a success ends it.
	endHold()
	usage(45, 0, 35+10*60)
	if h = judge(); len(h) != 0 {
		t.Fatalf("slow failures held: %+v", h)
	}
	if lvl, held := level(); lvl != 0 || held {
		t.Fatalf("after slow failures level %d held %v", lvl, held)
	}
	usage(50, 0, 35+10*60+5)
	if h = judge(); len(h) != 1 || h[0].Level != 1 {
		t.Fatalf("fast again: %+v", h)
	}
	endHold()
	usage(51, 1, 35+10*60+6)
	judge()
	if lvl, held := level(); lvl != 0 || held {
		t.Fatalf("after a success level %d held %v", lvl, held)
	}
	// Nothing left to run: the row goes.
	if _, err := pool.Exec(ctx, `UPDATE frame SET str_state = 'SUCCEEDED' WHERE pk_layer = $1`, layer); err != nil {
		t.Fatal(err)
	}
	judge()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM cuesched_layer_backoff`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows left for a finished layer (%v)", n, err)
	}
}
