package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
	"github.com/cuesched/cuesched/sidecar"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// syncBuffer collects logs from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// env is one farm: Postgres with the Cuebot schema, Redis, a fake RQD whose
// completions go through the Cuebot emulator, and the sidecar.
type env struct {
	t     testing.TB
	ctx   context.Context
	dbURL string
	pool  *pgxpool.Pool
	rdb   redis.UniversalClient
	pub   *publisher.Publisher
	fake  *fakerqd.Server
	emu   *cuebotemu.Emulator
	logs  *syncBuffer
	log   hclog.Logger
	farm  *farm

	emuErrMu sync.Mutex
	emuErrs  []error
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, logs: &syncBuffer{}}
	e.log = hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: e.logs})
	t.Cleanup(func() {
		if t.Failed() {
			s := e.logs.String()
			if len(s) > 12000 {
				s = s[len(s)-12000:]
			}
			t.Logf("logs:\n%s", s)
		}
	})
	e.dbURL = cuebotdb.Database(t)
	pc, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = emulatorConns
	e.pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pool.Close)
	e.rdb, err = publisher.NewClient(publisher.ClientConfig{URL: testenv.NewRedisDB(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.rdb.Close() })
	e.pub, err = publisher.New(e.rdb, publisher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.emu = cuebotemu.New(e.pool, e.log)
	e.fake, err = fakerqd.Start(fakerqd.Config{
		Default: fakerqd.Behavior{RunTimeFunc: runTime},
		OnComplete: e.emu.FakeRQDCallback(ctx, func(fc fakerqd.FrameCompletion, err error) {
			e.emuErrMu.Lock()
			e.emuErrs = append(e.emuErrs, fmt.Errorf("complete %s on %s: %w", fc.FrameName, fc.Host, err))
			e.emuErrMu.Unlock()
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.fake.Stop)
	return e
}

// emulatorConns is the Cuebot emulator's pool: at most this many
// completions are in the database at once.
const emulatorConns = 24

// runTime gives each frame 10-50 ms, derived from its id so reruns match.
func runTime(rf *rqdpb.RunFrame) time.Duration {
	var h uint32
	for _, c := range rf.GetFrameId() {
		h = h*31 + uint32(c)
	}
	return time.Duration(10+h%40) * time.Millisecond
}

// startSidecar runs the release publisher on a fresh permanent slot.
func (e *env) startSidecar() {
	e.t.Helper()
	slot := "e2e_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "_")
	sc, err := sidecar.New(sidecar.Config{DatabaseURL: e.dbURL, SlotName: slot, CreateSlot: true,
		StatusInterval: 200 * time.Millisecond, CheckpointInterval: 100 * time.Millisecond,
		StandbyRetry: 100 * time.Millisecond, Logger: e.log, Registerer: prometheus.NewRegistry()}, e.rdb)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	// Registered after the database, so it runs before the drop.
	e.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && ctx.Err() == nil {
				e.t.Errorf("sidecar: %v", err)
			}
		case <-time.After(30 * time.Second):
			e.t.Errorf("sidecar did not stop")
		}
		dctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		for i := 0; i < 50; i++ {
			if _, err := e.pool.Exec(dctx, `SELECT pg_drop_replication_slot($1)`, slot); err == nil || strings.Contains(err.Error(), "does not exist") {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for !sc.Status().Active {
		if time.Now().After(deadline) {
			e.t.Fatalf("sidecar not active: %+v", sc.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// schedulerConfig is the default configuration with sleeps shrunk to test
// scale.
func schedulerConfig() config.Config {
	cfg := config.Default()
	q := &cfg.Queue
	q.ClusterEmptySleep = config.Duration(200 * time.Millisecond)
	q.ClusterSaturatedSleep = config.Duration(30 * time.Millisecond)
	q.ActiveScanInterval = config.Duration(50 * time.Millisecond)
	q.ClusterReloadInterval = config.Duration(time.Second)
	q.LayerBackoffMin = config.Duration(20 * time.Millisecond)
	q.LayerBackoffMax = config.Duration(200 * time.Millisecond)
	q.HostQuarantine = config.Duration(200 * time.Millisecond)
	q.Stream.ClusterBufferSize = 3
	q.Stream.JobBufferSize = 3
	cfg.RQD.RequestTimeout = config.Duration(5 * time.Second)
	cfg.Metrics.Listen = ""
	// The accounting loops run often, so they race the hot path all along.
	cfg.Accounting.RecomputeInterval = config.Duration(300 * time.Millisecond)
	cfg.Accounting.LimitReseedInterval = config.Duration(500 * time.Millisecond)
	cfg.Accounting.LeaderPollInterval = config.Duration(100 * time.Millisecond)
	return cfg
}

// startScheduler runs one scheduler instance until the test ends.
func (e *env) startScheduler(name string) *prometheus.Registry {
	e.t.Helper()
	cfg := schedulerConfig()
	cfg.Scheduler.Facility = "spi"
	reg := prometheus.NewRegistry()
	s, err := scheduler.New(e.ctx, cfg, scheduler.Deps{
		Pool: e.pool, Redis: e.rdb,
		RQDResolve: e.fake.Resolve, Logger: e.log.Named(name), Registerer: reg,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("scheduler %s: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			e.t.Errorf("scheduler %s did not stop", name)
		}
		s.Close()
	})
	return reg
}

// counters sums a counter family by one label.
func counters(t testing.TB, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					key = lp.GetValue()
				}
			}
			out[key] += m.GetCounter().GetValue()
		}
	}
	return out
}

func (e *env) count(sql string, args ...any) int64 {
	e.t.Helper()
	var n int64
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// violationsSQL lists, in one snapshot, everything that must never be true:
// a managed show's procs above a subscription burst, a folder or job above
// its core cap (only a folder cap of -1 is unlimited; a job cap of 0 or less
// allows nothing), a limit_record with more running frames than its max, a
// host with negative idle resources, and any trace of dispatch in an
// unmanaged show.
const violationsSQL = `
SELECT 'subscription ' || s.pk_show || '/' || s.pk_alloc, SUM(p.int_cores_reserved)::bigint, MAX(s.int_burst)::bigint
FROM proc p JOIN host h ON h.pk_host = p.pk_host
JOIN subscription s ON s.pk_show = p.pk_show AND s.pk_alloc = h.pk_alloc
JOIN show sh ON sh.pk_show = p.pk_show AND sh.b_scheduler_managed
GROUP BY s.pk_show, s.pk_alloc HAVING SUM(p.int_cores_reserved) > MAX(s.int_burst)
UNION ALL
SELECT 'folder ' || j.pk_folder, SUM(p.int_cores_reserved)::bigint, MAX(fr.int_max_cores)::bigint
FROM proc p JOIN job j ON j.pk_job = p.pk_job JOIN folder_resource fr ON fr.pk_folder = j.pk_folder
WHERE fr.int_max_cores <> -1
GROUP BY j.pk_folder HAVING SUM(p.int_cores_reserved) > MAX(fr.int_max_cores)
UNION ALL
SELECT 'job ' || p.pk_job, SUM(p.int_cores_reserved)::bigint, MAX(jr.int_max_cores)::bigint
FROM proc p JOIN job_resource jr ON jr.pk_job = p.pk_job
GROUP BY p.pk_job HAVING SUM(p.int_cores_reserved) > MAX(jr.int_max_cores)
UNION ALL
SELECT 'job gpus ' || p.pk_job, SUM(p.int_gpus_reserved)::bigint, MAX(jr.int_max_gpus)::bigint
FROM proc p JOIN job_resource jr ON jr.pk_job = p.pk_job
GROUP BY p.pk_job HAVING SUM(p.int_gpus_reserved) > 0 AND SUM(p.int_gpus_reserved) > MAX(jr.int_max_gpus)
UNION ALL
SELECT 'limit ' || lr.str_name, count(*)::bigint, MAX(lr.int_max_value)::bigint
FROM frame f JOIN layer_limit ll ON ll.pk_layer = f.pk_layer JOIN limit_record lr ON lr.pk_limit_record = ll.pk_limit_record
WHERE f.str_state = 'RUNNING'
GROUP BY lr.pk_limit_record, lr.str_name HAVING count(*) > MAX(lr.int_max_value)
UNION ALL
SELECT 'host ' || h.str_name, LEAST(h.int_cores_idle, h.int_mem_idle, h.int_gpus_idle, h.int_gpu_mem_idle)::bigint, 0::bigint
FROM host h WHERE h.int_cores_idle < 0 OR h.int_mem_idle < 0 OR h.int_gpus_idle < 0 OR h.int_gpu_mem_idle < 0
UNION ALL
SELECT 'unmanaged frame ' || f.str_name || ' ' || f.str_state, COALESCE(f.int_version, 0)::bigint, 0::bigint
FROM frame f JOIN job j ON j.pk_job = f.pk_job JOIN show sh ON sh.pk_show = j.pk_show
WHERE NOT sh.b_scheduler_managed AND (f.str_state <> 'WAITING' OR COALESCE(f.int_version, 0) <> 0)
UNION ALL
SELECT 'unmanaged proc ' || p.pk_proc, 0::bigint, 0::bigint
FROM proc p JOIN show sh ON sh.pk_show = p.pk_show WHERE NOT sh.b_scheduler_managed`

// sampler checks violationsSQL continuously until stopped.
type sampler struct {
	mu         sync.Mutex
	violations []string
	samples    int
	stop       chan struct{}
	done       chan struct{}
}

func (e *env) startSampler() *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			rows, err := e.pool.Query(e.ctx, violationsSQL)
			if err != nil {
				if e.ctx.Err() == nil {
					s.add("sampler query: " + err.Error())
				}
				return
			}
			for rows.Next() {
				var what string
				var got, limit int64
				if err := rows.Scan(&what, &got, &limit); err != nil {
					s.add("sampler scan: " + err.Error())
					break
				}
				s.add(fmt.Sprintf("%s: %d > %d", what, got, limit))
			}
			rows.Close()
			s.mu.Lock()
			s.samples++
			s.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return s
}

func (s *sampler) add(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.violations) < 50 {
		s.violations = append(s.violations, v)
	}
}

// finish stops the sampler and fails the test on any violation.
func (s *sampler) finish(t testing.TB) {
	t.Helper()
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.violations) > 0 {
		t.Fatalf("invariants violated (%d samples):\n%s", s.samples, strings.Join(s.violations, "\n"))
	}
	if s.samples < 10 {
		t.Fatalf("only %d samples taken", s.samples)
	}
	t.Logf("%d invariant samples, no violation", s.samples)
}

// waitDrained waits until every frame of the managed shows has succeeded
// and every proc is gone.
func (e *env) waitDrained(timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(testenv.Patience(timeout))
	for {
		left := e.count(`SELECT count(*) FROM frame f JOIN job j ON j.pk_job = f.pk_job JOIN show s ON s.pk_show = j.pk_show
			WHERE s.b_scheduler_managed AND f.str_state <> 'SUCCEEDED'`)
		procs := e.count(`SELECT count(*) FROM proc`)
		if left == 0 && procs == 0 {
			return
		}
		if time.Now().After(deadline) {
			var states []string
			rows, _ := e.pool.Query(e.ctx, `SELECT f.str_state || ' ' || count(*) FROM frame f GROUP BY f.str_state`)
			for rows.Next() {
				var s string
				_ = rows.Scan(&s)
				states = append(states, s)
			}
			rows.Close()
			e.t.Fatalf("queue not drained after %s: %d managed frames not SUCCEEDED, %d procs; frame states %v", timeout, left, procs, states)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkEnd asserts the end state: every managed frame started exactly once
// (or exactly once successfully, when failures are expected), nothing of
// the unmanaged show touched, hosts whole again, Redis equal to SUM(proc)
// (zero) with no booking record left, and the emulator error-free.
func (e *env) checkEnd(allowFailedLaunches bool) {
	e.t.Helper()
	started := map[string]int{}
	failed := 0
	for _, l := range e.fake.Launches() {
		if l.Started {
			started[l.RunFrame.GetFrameId()]++
		} else {
			failed++
		}
	}
	if failed > 0 && !allowFailedLaunches {
		e.t.Errorf("%d launches failed", failed)
	}
	rows, err := e.pool.Query(e.ctx, `SELECT f.pk_frame, f.str_name, f.int_retries FROM frame f JOIN job j ON j.pk_job = f.pk_job
		JOIN show s ON s.pk_show = j.pk_show WHERE s.b_scheduler_managed`)
	if err != nil {
		e.t.Fatal(err)
	}
	type fr struct {
		id, name string
		retries  int64
	}
	frames, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fr, error) {
		var f fr
		err := r.Scan(&f.id, &f.name, &f.retries)
		return f, err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(frames) != e.farm.managedFrames {
		e.t.Fatalf("%d managed frames, seeded %d", len(frames), e.farm.managedFrames)
	}
	for _, f := range frames {
		if started[f.id] != 1 {
			e.t.Errorf("frame %s started %d times", f.name, started[f.id])
		}
		if f.retries != 0 {
			e.t.Errorf("frame %s has %d retries", f.name, f.retries)
		}
	}
	if d := e.fake.DoubleLaunches(); len(d) != 0 {
		e.t.Errorf("frames launched twice concurrently: %v", d)
	}
	if n := e.count(`SELECT count(*) FROM host WHERE int_cores_idle <> int_cores OR int_mem_idle <> int_mem
		OR int_gpus_idle <> int_gpus OR int_gpu_mem_idle <> int_gpu_mem`); n != 0 {
		e.t.Errorf("%d hosts not whole again", n)
	}
	if n := e.count(`SELECT count(*) FROM frame f JOIN job j ON j.pk_job = f.pk_job JOIN show s ON s.pk_show = j.pk_show
		WHERE NOT s.b_scheduler_managed AND (f.str_state <> 'WAITING' OR f.int_version <> 0)`); n != 0 {
		e.t.Errorf("%d frames of the unmanaged show touched", n)
	}
	e.emuErrMu.Lock()
	if len(e.emuErrs) > 0 {
		e.t.Errorf("emulator errors: %v", e.emuErrs)
	}
	e.emuErrMu.Unlock()
	e.waitRedisMatchesProcs(15 * time.Second)
}

// waitRedisMatchesProcs waits until every Redis accounting counter equals
// the Postgres SUM(proc) of its key (releases arrive through the sidecar
// asynchronously) and no booking record is left for a proc that is gone.
func (e *env) waitRedisMatchesProcs(timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(testenv.Patience(timeout))
	var diff []string
	for {
		diff = e.redisDiff()
		if len(diff) == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("Redis differs from SUM(proc):\n%s", strings.Join(diff, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) redisDiff() []string {
	want := map[string]int64{}
	rows, err := e.pool.Query(e.ctx, `SELECT p.pk_proc, p.pk_show, h.pk_alloc, j.pk_folder, p.pk_job, p.pk_layer, j.pk_dept, p.int_cores_reserved
		FROM proc p JOIN host h ON h.pk_host = p.pk_host JOIN job j ON j.pk_job = p.pk_job
		JOIN show s ON s.pk_show = p.pk_show WHERE s.b_scheduler_managed`)
	if err != nil {
		e.t.Fatal(err)
	}
	live := map[string]bool{}
	for rows.Next() {
		var proc, show, alloc, folder, job, layer, dept string
		var cores int64
		if err := rows.Scan(&proc, &show, &alloc, &folder, &job, &layer, &dept, &cores); err != nil {
			e.t.Fatal(err)
		}
		live[proc] = true
		c := publisher.ChargeCores(cores)
		want[publisher.SubKey(show, alloc)] += c
		want[publisher.FolderKey(folder)] += c
		want[publisher.JobKey(job)] += c
		want[publisher.LayerKey(layer)] += c
		want[publisher.PointKey(dept, show)] += c
	}
	rows.Close()
	var diff []string
	seen := map[string]bool{}
	for _, pat := range []string{"acct:sub:*", "acct:folder:*", "acct:job:*", "acct:layer:*", "acct:point:*"} {
		keys, err := e.rdb.Keys(e.ctx, pat).Result()
		if err != nil {
			e.t.Fatal(err)
		}
		for _, k := range keys {
			seen[k] = true
			got, err := e.rdb.HGet(e.ctx, k, "int_cores").Int64()
			if err == redis.Nil {
				got = 0
			} else if err != nil {
				e.t.Fatal(err)
			}
			if got != want[k] {
				diff = append(diff, fmt.Sprintf("%s int_cores = %d, SUM(proc) = %d", k, got, want[k]))
			}
		}
	}
	for k, v := range want {
		if !seen[k] && v != 0 {
			diff = append(diff, fmt.Sprintf("%s missing, SUM(proc) = %d", k, v))
		}
	}
	for _, sh := range e.farm.managedShows {
		procs, err := e.pub.ShowProcs(e.ctx, sh)
		if err != nil {
			e.t.Fatal(err)
		}
		for _, p := range procs {
			if !live[p] {
				diff = append(diff, "booking record of gone proc "+p)
			}
		}
	}
	return diff
}

// farm is the scenario: two managed shows and an unmanaged one, three
// allocations with subscriptions whose bursts bind, a capped folder, a job
// cap, a job GPU cap, a limit_record shared across shows, hosts with manual
// tags, GPUs, another OS and thread modes.
type farm struct {
	managedShows  []string
	managedFrames int
	hostsByAlloc  map[string][]string
	// fastHosts carry the MANUAL tag "fast"; one layer runs only there.
	fastHosts []string
}

func (e *env) seedFarm(scale int) {
	e.t.Helper()
	ctx := e.ctx
	s := &farmseed.Seeder{DB: e.pool}
	rng := rand.New(rand.NewSource(42))
	must := func(v string, err error) string {
		e.t.Helper()
		if err != nil {
			e.t.Fatal(err)
		}
		return v
	}
	f := &farm{hostsByAlloc: map[string][]string{}}
	fac := must(s.Facility(ctx, "spi"))
	other := must(s.Facility(ctx, "lax"))
	general := must(s.Alloc(ctx, fac, "spi.general", "general"))
	gpu := must(s.Alloc(ctx, fac, "spi.gpu", "gpu"))
	himem := must(s.Alloc(ctx, fac, "spi.himem", "himem"))
	laxGeneral := must(s.Alloc(ctx, other, "lax.general", "laxgen"))

	show := func(name string, managed bool) farmseed.Show {
		sh, err := s.Show(ctx, name, managed)
		if err != nil {
			e.t.Fatal(err)
		}
		if managed {
			f.managedShows = append(f.managedShows, sh.ID)
		}
		return sh
	}
	aurora, borealis, cuebot := show("aurora", true), show("borealis", true), show("cuebotshow", false)
	sub := func(sh farmseed.Show, alloc string, size, burst int) { must(s.Subscribe(ctx, sh, alloc, size, burst)) }
	sub(aurora, general, 10*scale, 14*scale)
	sub(aurora, gpu, 4*scale, 6*scale)
	sub(aurora, laxGeneral, 100, 100)
	sub(borealis, general, 8*scale, 10*scale)
	sub(borealis, himem, 12*scale, 16*scale)
	sub(cuebot, general, 100*scale, 100*scale)

	host := func(alloc, tag string, i int, spec farmseed.HostSpec) {
		spec.Name = fmt.Sprintf("%s%02d", tag, i)
		spec.Alloc, spec.AllocTag = alloc, tag
		must(s.Host(ctx, spec))
		f.hostsByAlloc[tag] = append(f.hostsByAlloc[tag], spec.Name)
	}
	for i := 0; i < 5*scale; i++ {
		spec := farmseed.HostSpec{Cores: 8, MemKB: 32 * farmseed.GB, ThreadMode: i % 3}
		if i%4 == 0 {
			spec.Tags = []farmseed.HostTag{{Name: "fast", Type: "MANUAL"}}
			f.fastHosts = append(f.fastHosts, fmt.Sprintf("general%02d", i))
		}
		host(general, "general", i, spec)
	}
	for i := 0; i < 2*scale; i++ {
		host(gpu, "gpu", i, farmseed.HostSpec{Cores: 8, MemKB: 64 * farmseed.GB, GPUs: 2, GPUMemKB: 16 * farmseed.GB, OS: "rocky9"})
	}
	for i := 0; i < 2*scale; i++ {
		host(himem, "himem", i, farmseed.HostSpec{Cores: 16, MemKB: 256 * farmseed.GB})
	}
	host(laxGeneral, "laxgen", 0, farmseed.HostSpec{Cores: 64})

	capped := must(s.Folder(ctx, aurora, "capped", 3, -1))
	lic := must(s.Limit(ctx, "licence", 2))
	frames := func(n int) int { return n*scale + rng.Intn(3) }
	job := func(js farmseed.JobSpec) {
		js.Facility = fac
		if js.Show.Name == "" {
			js.Show = aurora
		}
		j, err := s.Job(ctx, js)
		if err != nil {
			e.t.Fatal(err)
		}
		if js.Show.ID != cuebot.ID {
			f.managedFrames += j.FrameCount()
		}
	}
	job(farmseed.JobSpec{Name: "a-render", Priority: 50, Layers: []farmseed.LayerSpec{
		{Name: "render", Tags: []string{"general"}, Frames: frames(12), NotThreadable: true, MemKB: 2 * farmseed.GB},
		{Name: "comp", Tags: []string{"general", "fast"}, Frames: frames(6), Cores: 2, MemKB: 4 * farmseed.GB, Chunk: 2},
	}})
	job(farmseed.JobSpec{Name: "a-fast", Priority: 45, Layers: []farmseed.LayerSpec{
		{Name: "preview", Tags: []string{"fast"}, Frames: frames(4), NotThreadable: true, MemKB: farmseed.GB},
	}})
	job(farmseed.JobSpec{Name: "a-capped", Priority: 40, Folder: capped, Layers: []farmseed.LayerSpec{
		{Name: "sim", Tags: []string{"general"}, Frames: frames(8), NotThreadable: true, MemKB: farmseed.GB},
	}})
	job(farmseed.JobSpec{Name: "a-gpu", Priority: 30, OS: "rocky9", MaxGPUs: 3, Layers: []farmseed.LayerSpec{
		{Name: "ml", Tags: []string{"gpu"}, Frames: frames(6), NotThreadable: true, GPUs: 1, GPUMemKB: 4 * farmseed.GB, MemKB: 8 * farmseed.GB},
	}})
	job(farmseed.JobSpec{Name: "a-licensed", Priority: 20, Layers: []farmseed.LayerSpec{
		{Name: "lic", Tags: []string{"general"}, Frames: frames(5), NotThreadable: true, Limits: []string{lic}},
	}})
	job(farmseed.JobSpec{Name: "b-capped-job", Show: borealis, Priority: 60, MaxCores: 4, Layers: []farmseed.LayerSpec{
		{Name: "frames", Tags: []string{"general"}, Frames: frames(10), NotThreadable: true},
	}})
	job(farmseed.JobSpec{Name: "b-himem", Show: borealis, Priority: 10, Started: time.Now().Add(-3 * time.Hour), Layers: []farmseed.LayerSpec{
		{Name: "big", Tags: []string{"himem"}, Frames: frames(6), Cores: 4, MemKB: 96 * farmseed.GB},
	}})
	job(farmseed.JobSpec{Name: "b-licensed", Show: borealis, Priority: 20, Layers: []farmseed.LayerSpec{
		{Name: "lic", Tags: []string{"general", "himem"}, Frames: frames(5), NotThreadable: true, Limits: []string{lic}},
	}})
	job(farmseed.JobSpec{Name: "c-cuebot", Show: cuebot, Priority: 99, Layers: []farmseed.LayerSpec{
		{Name: "render", Tags: []string{"general"}, Frames: frames(10), NotThreadable: true},
	}})
	e.farm = f
}
