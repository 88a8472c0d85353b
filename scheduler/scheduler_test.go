package scheduler_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/loop"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type world struct {
	pool     *pgxpool.Pool
	seed     *farmseed.Seeder
	pub      *publisher.Publisher
	rdbURL   string
	facility string
	alloc    string
	show     farmseed.Show
}

func newWorld(t *testing.T, hosts int) *world {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return newWorldOn(t, pool, hosts)
}

// newWorldOn seeds a facility, a managed show subscribed to one allocation
// and hosts in the database of pool.
func newWorldOn(t *testing.T, pool *pgxpool.Pool, hosts int) *world {
	t.Helper()
	ctx := context.Background()
	var err error
	w := &world{pool: pool, seed: &farmseed.Seeder{DB: pool}, rdbURL: testenv.NewRedisDB(t)}
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: w.rdbURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	if w.pub, err = publisher.New(rdb, publisher.Options{}); err != nil {
		t.Fatal(err)
	}
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	w.facility = must(w.seed.Facility(ctx, "spi"))
	if w.show, err = w.seed.Show(ctx, "show", true); err != nil {
		t.Fatal(err)
	}
	w.alloc = must(w.seed.Alloc(ctx, w.facility, "spi.general", "general"))
	must(w.seed.Subscribe(ctx, w.show, w.alloc, 100, 100))
	for i := 0; i < hosts; i++ {
		must(w.seed.Host(ctx, farmseed.HostSpec{Name: "h" + string(rune('a'+i)), Alloc: w.alloc, AllocTag: "general", Cores: 4}))
	}
	return w
}

func (w *world) job(t *testing.T, name string, frames int) {
	t.Helper()
	if _, err := w.seed.Job(context.Background(), farmseed.JobSpec{Name: name, Show: w.show, Facility: w.facility,
		Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: frames, NotThreadable: true}}}); err != nil {
		t.Fatal(err)
	}
	if err := farmseed.SeedAccounting(context.Background(), w.pool, w.pub, w.show.ID); err != nil {
		t.Fatal(err)
	}
}

func testConfig(w *world) config.Config {
	cfg := config.Default()
	cfg.Database.URL = "postgres://unused"
	cfg.Accounting.RedisURL = w.rdbURL
	cfg.Scheduler.Facility = "spi"
	cfg.RQD.DryRun = true
	cfg.Queue.ClusterEmptySleep = config.Duration(time.Hour)
	cfg.Queue.ClusterSaturatedSleep = config.Duration(time.Minute)
	return cfg
}

// scheduler builds a scheduler over w. Without Deps.Hosts it uses the real
// replication-fed host cache when realCache is set, else the DB stand-in.
func (w *world) scheduler(t *testing.T, cfg config.Config, d scheduler.Deps, realCache ...bool) *scheduler.Scheduler {
	t.Helper()
	d.Pool = w.pool
	if d.Hosts == nil && len(realCache) == 0 {
		d.Hosts = farmseed.NewDBHosts(w.pool)
	}
	if d.Registerer == nil {
		d.Registerer = prometheus.NewRegistry()
	}
	s, err := scheduler.New(context.Background(), cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// runUntilEnd runs s until the test ends, then stops it and checks Run's
// error (before the cleanups that close what it uses).
func runUntilEnd(t *testing.T, s *scheduler.Scheduler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func allocCluster(w *world) *clusters.Cluster {
	return clusters.New(w.facility, w.show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: w.alloc}})
}

func TestPassOutcomes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	reg := prometheus.NewRegistry()
	s := w.scheduler(t, testConfig(w), scheduler.Deps{NoAccounting: true, Registerer: reg})
	c := allocCluster(w)
	ctx := context.Background()

	r := s.Loop.Pass(ctx, c)
	if r.Reason != loop.NoJobs || r.Sleep != time.Hour {
		t.Fatalf("empty cluster pass = %+v", r)
	}
	w.job(t, "j1", 6)
	r = s.Loop.Pass(ctx, c)
	if r.Reason != loop.Booked || r.Dispatched != 4 || r.Sleep != 0 || r.Jobs != 1 {
		t.Fatalf("pass with work = %+v, want 4 booked on the 4-core host", r)
	}
	// Delivered against planned: the pass offered the layer's 6 frames
	// and delivered 4; nothing is left in a queue.
	planned, delivered := promread.Value(t, reg, "scheduler_pass_planned_frames_total"),
		promread.Value(t, reg, "scheduler_pass_delivered_frames_total")
	if planned != 6 || delivered != 4 {
		t.Fatalf("planned %v delivered %v, want 6 and 4", planned, delivered)
	}
	for _, g := range []string{"scheduler_passes_in_flight", "scheduler_pass_jobs_in_flight", "scheduler_launch_queue_frames",
		"scheduler_compensation_queue_frames", "scheduler_clusters_in_flight"} {
		if v := gaugeValue(t, reg, g); v != 0 {
			t.Errorf("%s = %v after the pass, want 0", g, v)
		}
	}
	r = s.Loop.Pass(ctx, c)
	if r.Reason != loop.Saturated || r.Dispatched != 0 || r.Sleep != time.Minute {
		t.Fatalf("pass on a full farm = %+v", r)
	}
	var running int64
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM frame WHERE str_state = 'RUNNING'`).Scan(&running); err != nil || running != 4 {
		t.Fatalf("%d frames running (dry run books in Postgres), %v", running, err)
	}
}

// TestAllocAtBurstSleepsShort: a cluster whose allocation is at the show's
// burst gets its headroom back as the show's frames finish, which nothing
// wakes it for: it sleeps the saturated sleep, not the empty one, both when
// a pass runs into the burst and when the job query leaves the show out.
func TestAllocAtBurstSleepsShort(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	ctx := context.Background()
	if _, err := w.pool.Exec(ctx, `UPDATE subscription SET int_burst = 200 WHERE pk_show = $1`, w.show.ID); err != nil {
		t.Fatal(err)
	}
	w.job(t, "j1", 6)
	s := w.scheduler(t, testConfig(w), scheduler.Deps{})
	c := allocCluster(w)
	r := s.Loop.Pass(ctx, c)
	if r.Reason != loop.AllocFull || r.Dispatched != 2 || r.Sleep != time.Minute {
		t.Fatalf("first pass = %+v, want 2 frames booked up to the 2-core burst, then alloc_full with the saturated sleep (1m)", r)
	}
	// The job query leaves the show out at its burst: no bookable job, but
	// waiting work, so the short sleep again.
	r = s.Loop.Pass(ctx, c)
	if r.Reason != loop.Capped || r.Dispatched != 0 || r.Sleep != time.Minute {
		t.Fatalf("pass at burst = %+v, want capped with the saturated sleep (1m)", r)
	}
	// Nothing waiting at all: the empty sleep.
	if _, err := w.pool.Exec(ctx, `UPDATE job SET b_paused = true WHERE pk_show = $1`, w.show.ID); err != nil {
		t.Fatal(err)
	}
	r = s.Loop.Pass(ctx, c)
	if r.Reason != loop.NoJobs || r.Sleep != time.Hour {
		t.Fatalf("pass with nothing waiting = %+v, want no_jobs with the empty sleep (1h)", r)
	}
}

type countingGate struct {
	open  atomic.Bool
	waits atomic.Int64
}

func (g *countingGate) Wait(ctx context.Context) error {
	g.waits.Add(1)
	for !g.open.Load() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// Run books nothing while the gate is closed, then drains the work.
func TestRunWaitsForTheGate(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.job(t, "j1", 5)
	cfg := testConfig(w)
	cfg.Queue.ActiveScanInterval = config.Duration(20 * time.Millisecond)
	gate := &countingGate{}
	s := w.scheduler(t, cfg, scheduler.Deps{NoAccounting: true, Gate: gate})
	runUntilEnd(t, s)
	count := func() int64 {
		var n int64
		if err := w.pool.QueryRow(context.Background(), `SELECT count(*) FROM proc`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(150 * time.Millisecond)
	if n := count(); n != 0 || gate.waits.Load() == 0 {
		t.Fatalf("booked %d frames with the gate closed (waits %d)", n, gate.waits.Load())
	}
	gate.open.Store(true)
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for count() != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of 5 frames booked after the gate opened", count())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNewSchedulerErrors(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 0)
	cfg := testConfig(w)
	cfg.Scheduler.Facility = "atlantis"
	_, err := scheduler.New(context.Background(), cfg, scheduler.Deps{Pool: w.pool, Hosts: farmseed.NewDBHosts(w.pool), NoAccounting: true})
	if !errors.Is(err, clusters.ErrUnknownFacility) || !strings.Contains(err.Error(), "atlantis") {
		t.Fatalf("unknown facility: %v", err)
	}
}

// The real accounting service gates booking until it has bootstrapped
// Redis and the real host cache until it has its snapshot; then the
// scheduler launches on RQD.
func TestSchedulerWithAccountingLaunches(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	if _, err := w.seed.Job(context.Background(), farmseed.JobSpec{Name: "j", Show: w.show, Facility: w.facility,
		Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 3, NotThreadable: true}}}); err != nil {
		t.Fatal(err)
	}
	fake, err := fakerqd.Start(fakerqd.Config{Default: fakerqd.Behavior{RunTime: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	cfg := testConfig(w)
	cfg.RQD.DryRun = false
	cfg.Queue.ActiveScanInterval = config.Duration(20 * time.Millisecond)
	cfg.Accounting.LeaderPollInterval = config.Duration(50 * time.Millisecond)
	s := w.scheduler(t, cfg, scheduler.Deps{RQDResolve: fake.Resolve}, true)
	if s.Accounting == nil || s.HostCache == nil {
		t.Fatal("no accounting service or host cache")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(testenv.Patience(15 * time.Second))
	for len(fake.Running("ha")) != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d frames running on RQD, want 3", len(fake.Running("ha")))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNewSchedulerRefusesUnmigratedDatabase: a database without the
// rollout migrations is refused at start-up, naming what is missing and
// what to run, instead of failing at the first change the host cache's
// stream decodes.
func TestNewSchedulerRefusesUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	ctx := context.Background()
	if _, err := w.pool.Exec(ctx, `DELETE FROM cuesched_schema_migrations WHERE version = 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `DROP PUBLICATION cuesched_hostcache`); err != nil {
		t.Fatal(err)
	}
	// The real host cache (no Deps.Hosts) streams the publication.
	_, err := scheduler.New(ctx, testConfig(w), scheduler.Deps{Pool: w.pool, NoAccounting: true, Registerer: prometheus.NewRegistry()})
	if err == nil {
		t.Fatal("NewScheduler accepted a database without the rollout")
	}
	for _, want := range []string{"0003_", "cuesched_hostcache", "cuesched migrate up"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// flakyDB fails every query while down is set (a database restarting or
// failing over under the scheduler).
type flakyDB struct {
	jobs.DB
	down atomic.Bool
}

func (d *flakyDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if d.down.Load() {
		return nil, errors.New("dial tcp: connection refused")
	}
	return d.DB.Query(ctx, sql, args...)
}

// failingWorker reports every job's layers as stopped on an error.
type failingWorker struct{}

func (failingWorker) ProcessInTurn(ctx context.Context, c *clusters.Cluster, j jobs.Job, turn matcher.Turn) (matcher.Outcome, error) {
	if turn.Done != nil {
		turn.Done()
	}
	return matcher.Outcome{Failed: true}, nil
}

// TestErrorIsNotAnEmptyCluster: a pass whose query or booking fails on an
// error (a database restart, a failover) retries the cluster after a short
// jittered backoff that doubles per consecutive failure up to its cap,
// never after cluster_empty_sleep, and counts it; the first pass that works
// resets the backoff.
func TestErrorIsNotAnEmptyCluster(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.job(t, "j1", 2)
	cfg := testConfig(w)
	s := w.scheduler(t, cfg, scheduler.Deps{NoAccounting: true})
	c := allocCluster(w)
	ctx := context.Background()
	db := &flakyDB{DB: w.pool}
	reg := prometheus.NewRegistry()
	const lo, hi = 100 * time.Millisecond, 800 * time.Millisecond
	p := loop.New(db, s.Feed, s.Matcher, loop.Config{EmptySleep: time.Hour, SaturatedSleep: time.Minute,
		ErrorBackoffMin: lo, ErrorBackoffMax: hi}, loop.Options{Registerer: reg})

	db.down.Store(true)
	want := lo
	for i := 1; i <= 6; i++ {
		r := p.Pass(ctx, c)
		if r.Reason != loop.QueryError || r.Sleep < want/2 || r.Sleep > want {
			t.Fatalf("failed pass %d = %+v, want query_error sleeping in [%v, %v]", i, r, want/2, want)
		}
		want = min(want*2, hi)
	}
	if n := promread.Value(t, reg, "scheduler_pass_errors_total", "stage", "job_query"); n != 6 {
		t.Fatalf("scheduler_pass_errors_total{stage=job_query} = %v, want 6", n)
	}
	db.down.Store(false)
	if r := p.Pass(ctx, c); r.Reason != loop.Booked || r.Dispatched != 2 {
		t.Fatalf("pass after the database came back = %+v, want 2 booked", r)
	}
	db.down.Store(true)
	if r := p.Pass(ctx, c); r.Reason != loop.QueryError || r.Sleep > lo {
		t.Fatalf("first failure after a good pass = %+v, want the backoff reset to <= %v", r, lo)
	}

	// Jobs found, but every layer stopped on an error: "failed", the
	// error backoff, not the saturated sleep.
	w.job(t, "j2", 2)
	db.down.Store(false)
	pf := loop.New(db, s.Feed, failingWorker{}, loop.Config{EmptySleep: time.Hour, SaturatedSleep: time.Minute,
		ErrorBackoffMin: lo, ErrorBackoffMax: hi}, loop.Options{Registerer: prometheus.NewRegistry()})
	if r := pf.Pass(ctx, c); r.Reason != loop.Failed || r.Sleep > lo || r.Sleep < lo/2 {
		t.Fatalf("pass whose bookings failed = %+v, want failed with a backoff in [%v, %v]", r, lo/2, lo)
	}
}

func gaugeValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
