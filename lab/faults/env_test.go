package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farm"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// envOpts sizes one fault-test farm.
type envOpts struct {
	Seed           int64
	Hosts, Frames  int
	RunMin, RunMax time.Duration
	// Schedulers and Sidecars are how many of each run (default 1 and 1).
	Schedulers, Sidecars int
	// SidecarParams are extra connection parameters of the sidecars
	// (k=v&k=v), e.g. wal_sender_timeout=2s for a quick takeover from a
	// frozen owner.
	SidecarParams string
	// OrphanAfter is how long a proc may exist without its frame running
	// on (or completing from) the fake RQD before the emulated Cuebot
	// clears it as orphaned (default 3 s).
	OrphanAfter time.Duration
	Unmanaged   float64
	// Timeout bounds the whole test.
	Timeout time.Duration
	// NoCapSampling disables the cap checks of the sampler (tests that
	// change caps while procs run); the sign checks remain.
	NoCapSampling bool
	// RedisOverCountOK skips the sampler's Redis cap check (Postgres' and
	// the sign checks remain): a Redis rolled back to an older snapshot
	// holds records of procs released since, so its counters over-count
	// (refusing bookings, never over-booking) until the re-bootstrap or
	// its follow-up reconcile drops them.
	RedisOverCountOK bool
	// UnmanagedTouched: a show left to Cuebot at the start may be
	// dispatched (a test flips it to the scheduler).
	UnmanagedTouched bool
	// StrictRecords adds the booking-record check to the sampler (every
	// proc of a managed show has its record in Redis at every instant),
	// for runs without faults.
	StrictRecords bool
	// Fixture, when set, seeds the database instead of the generated farm
	// (exact fixtures for the bad-input tests); it must create facility
	// "spi". Frames then run RunMin.
	Fixture func(e *env)
	// Setup runs after the farm is seeded, before any process starts.
	Setup func(e *env)
	// VIP puts one more proxy in front of Postgres that every client goes
	// through, the "virtual IP" a failover moves (env.vip).
	VIP bool
	// Sentinel runs Redis as a Sentinel group (testenv.SentinelGroup: a
	// primary, a replica, three Sentinels); every process and the harness
	// find the primary through the Sentinels (env.sg). The per-process
	// Redis proxies are then unused (no Redis cut).
	Sentinel bool
	// Queue overrides keys of the processes' queue section (the harness
	// paces them fast: cluster_empty_sleep 200ms, ...); a test measuring
	// a booking gap runs the production sleeps.
	Queue map[string]string
}

func (o *envOpts) defaults() {
	if o.Seed == 0 {
		// The default suite uses one farm whose shape drains in about 5 s
		// undisturbed (some seeds give a long tail: one layer serialized
		// by a tight cap); the full suite draws a new farm every round.
		o.Seed = 8
		if fullMode() {
			o.Seed = rand.Int64N(1 << 40)
		}
	}
	if o.Hosts == 0 {
		o.Hosts = 20
	}
	if o.Frames == 0 {
		o.Frames = 200
	}
	if o.RunMin == 0 {
		o.RunMin, o.RunMax = 200*time.Millisecond, 700*time.Millisecond
		if fullMode() {
			o.RunMin, o.RunMax = 300*time.Millisecond, time.Second
		}
	}
	if o.Schedulers == 0 {
		o.Schedulers = 1
	}
	if o.Sidecars == 0 {
		o.Sidecars = 1
	}
	if o.OrphanAfter == 0 {
		o.OrphanAfter = 3 * time.Second
	}
	if o.Unmanaged == 0 {
		o.Unmanaged = 0.1
	}
	if o.Timeout == 0 {
		o.Timeout = 4 * time.Minute
	}
}

// daemon is a cuesched process with its own TCP proxies in front of
// Postgres and Redis, so a test can partition it alone.
type daemon struct {
	*process
	role       string
	pgProxy    *testenv.Proxy
	redisProxy *testenv.Proxy
	config     string
}

// cut partitions the daemon from Postgres and/or Redis; restore heals it.
func (d *daemon) cut(pg, rd bool) {
	if pg {
		d.pgProxy.Cut()
	}
	if rd {
		d.redisProxy.Cut()
	}
}

func (d *daemon) restore() {
	d.pgProxy.Restore()
	d.redisProxy.Restore()
}

// env is one farm: a private PostgreSQL cluster and Redis server, the
// Cuebot schema and a seeded farm, the fake RQD whose completions go
// through the Cuebot emulator, and the cuesched processes.
type env struct {
	t     *testing.T
	ctx   context.Context
	o     envOpts
	start time.Time
	dir   string
	bin   string

	pg       *testenv.Postgres
	rd       *testenv.Redis
	sg       *testenv.SentinelGroup
	dbURL    string
	redisURL string
	pool     *pgxpool.Pool
	rdb      redis.UniversalClient
	pub      *publisher.Publisher
	farm     *farm.Farm
	slot     string
	managed  atomic.Int64 // frames of managed shows (read by the progress sampler)
	// fixture is the exact farm when envOpts.Fixture built one.
	fixture *fixture
	// wasManaged lists shows a test flipped to Cuebot during the run
	// (their Redis keys legitimately remain).
	wasManaged map[string]bool
	// vip, with envOpts.VIP, is the database's address for every client
	// (the daemons' proxies and the test's pool): a failover moves it.
	vip *testenv.Proxy

	fake   *fakerqd.Server
	emu    *cuebotemu.Emulator
	comp   *completer
	reaper *reaper
	smp    *sampler

	mu         sync.Mutex
	schedulers []*daemon
	sidecars   []*daemon
	events     []string
	// disruptions are the times a scheduler process was killed (kill -9)
	// or cut from Postgres or Redis: a booking in flight in it at that
	// moment may be left in Redis (its rollback could not run or not reach
	// Redis) until the recompute's in-flight grace expires.
	disruptions []time.Time
	// unmanagedWindows: per show, the periods it was flipped to Cuebot.
	// The sidecar does not release procs of a show that is not managed, so
	// a record whose proc completed in such a window stays in Redis until
	// the recompute drops it after the in-flight grace.
	unmanagedWindows map[string][][2]time.Time
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	o.defaults()
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	bin := cueschedBinary(t)
	e := &env{t: t, ctx: ctx, o: o, start: time.Now(), dir: t.TempDir(), bin: bin, wasManaged: map[string]bool{},
		unmanagedWindows: map[string][][2]time.Time{}}
	t.Cleanup(cancel)
	e.note("seed %d: %d hosts, %d frames, run times %s-%s, %d schedulers, %d sidecars",
		o.Seed, o.Hosts, o.Frames, o.RunMin, o.RunMax, o.Schedulers, o.Sidecars)

	var err error
	// Cuebot's commits are durable: a crash of the test cluster must not
	// lose acknowledged commits (the harness default is synchronous_commit
	// off, which a crash would show as lost bookings and completions).
	e.pg, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{ExtraSettings: map[string]string{
		"synchronous_commit": "on", "max_connections": "300",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pg.Stop)
	if o.Sentinel {
		if e.sg, err = testenv.StartSentinelGroup(ctx, testenv.SentinelOptions{Databases: 2}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.sg.Stop)
		e.rd = e.sg.Servers[0]
	} else if e.rd, err = testenv.StartRedis(ctx, testenv.RedisOptions{Databases: 2}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.rd.Stop)
	if err := e.pg.CreateDatabase(ctx, "cue", ""); err != nil {
		t.Fatal(err)
	}
	e.dbURL = e.pg.URL("cue")
	if o.VIP {
		if e.vip, err = testenv.StartProxy(fmt.Sprintf("127.0.0.1:%d", e.pg.Port())); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.vip.Close)
		e.dbURL = fmt.Sprintf("postgres://postgres@%s/cue?sslmode=disable", e.vip.Addr())
	}
	e.redisURL = e.rd.URL(0)
	if err := cuebotdb.Setup(ctx, e.dbURL); err != nil {
		t.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 16
	pc.ConnConfig.ConnectTimeout = 3 * time.Second
	if e.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		t.Fatal(err)
	}
	cc := publisher.ClientConfig{URL: e.redisURL, PoolSize: 8}
	if e.sg != nil {
		cc.MasterName, cc.SentinelAddrs = e.sg.Master, e.sg.SentinelAddrs()
	}
	if e.rdb, err = publisher.NewClient(cc); err != nil {
		t.Fatal(err)
	}
	if e.pub, err = publisher.New(e.rdb, publisher.Options{}); err != nil {
		t.Fatal(err)
	}
	if o.Fixture != nil {
		o.Fixture(e)
	} else {
		e.farm, err = farm.Seed(ctx, e.pool, farm.Spec{Seed: o.Seed, Hosts: o.Hosts, Frames: o.Frames,
			RunTimeMin: o.RunMin, RunTimeMax: o.RunMax, Facility: "spi", UnmanagedShare: o.Unmanaged})
		if err != nil {
			t.Fatal(err)
		}
	}
	var managedFrames int64
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM frame f JOIN job j ON j.pk_job = f.pk_job
		JOIN show s ON s.pk_show = j.pk_show WHERE s.b_scheduler_managed`).Scan(&managedFrames); err != nil {
		t.Fatal(err)
	}
	e.managed.Store(managedFrames)
	// The guardrail (scheduler/accounting, cuesched status) recognises sidecar
	// slots by the migrations.SidecarSlotPrefix prefix (or by a walsender
	// named cuesched-sidecar/...).
	e.slot = fmt.Sprintf("%s_faults_%d", migrations.SidecarSlotPrefix, rand.Int64N(1<<40))

	e.emu = cuebotemu.New(e.pool, nil)
	e.comp = newCompleter(ctx, e.emu)
	e.fake, err = fakerqd.Start(fakerqd.Config{
		Default:    fakerqd.Behavior{RunTimeFunc: e.runTime},
		OnComplete: e.comp.onComplete,
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.Setup != nil {
		o.Setup(e)
	}
	e.reaper = newReaper(e, o.OrphanAfter)
	t.Cleanup(e.shutdown)
	return e
}

// runTime gives every frame its layer's run time (the farm chose them).
func (e *env) runTime(rf *rqdpb.RunFrame) time.Duration {
	if e.farm == nil {
		return e.o.RunMin
	}
	name := rf.GetFrameName()
	if i := strings.IndexByte(name, '-'); i >= 0 {
		name = name[i+1:]
	}
	return e.farm.RunTime(name)
}

// note records a timestamped event of the run (printed at the end).
func (e *env) note(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, fmt.Sprintf("%7.3fs  %s", time.Since(e.start).Seconds(), fmt.Sprintf(format, args...)))
}

// shutdown stops everything in dependency order and reports what the
// processes did wrong.
func (e *env) shutdown() {
	t := e.t
	e.mu.Lock()
	ds := append(append([]*daemon(nil), e.schedulers...), e.sidecars...)
	e.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range ds {
		d.restore()
		wg.Add(1)
		go func() { defer wg.Done(); d.terminate(30 * time.Second) }()
	}
	wg.Wait()
	for _, d := range ds {
		for _, p := range d.problems() {
			t.Errorf("%s", p)
		}
	}
	if e.smp != nil {
		e.smp.stop()
	}
	e.reaper.stop()
	e.comp.cancel()
	e.fake.Stop()
	for _, d := range ds {
		d.pgProxy.Close()
		d.redisProxy.Close()
	}
	e.rdb.Close()
	e.pool.Close()
	if t.Failed() || testing.Verbose() {
		e.mu.Lock()
		t.Logf("timeline:\n%s", strings.Join(e.events, "\n"))
		e.mu.Unlock()
	}
	if t.Failed() {
		for _, d := range ds {
			t.Logf("----- %s log (tail) -----\n%s", d.name, tail(d.logText(), 6000))
		}
	}
	if dir := os.Getenv("CUESCHED_FAULTS_KEEP_LOGS"); dir != "" {
		// Debugging aid: keep every process log and the timeline.
		prefix := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
		for _, d := range ds {
			_ = os.WriteFile(prefix+"."+d.name+".log", []byte(d.logText()), 0o644)
		}
		e.mu.Lock()
		_ = os.WriteFile(prefix+".timeline", []byte(strings.Join(e.events, "\n")+"\n"), 0o644)
		e.mu.Unlock()
	}
}

// metricsListen is every daemon's metrics.listen: the kernel picks the port
// when the process binds it (a port picked ahead by the test could be bound
// by another test's process first), and the process logs the address it
// bound (see daemon.metricsAddr).
const metricsListen = "127.0.0.1:0"

// metricsAddrRE finds the bound address in the metrics endpoint's start-up
// line (text or JSON log format).
var metricsAddrRE = regexp.MustCompile(`serving /metrics[^\n]*?"?addr"?[=:]"?(127\.0\.0\.1:[0-9]+)`)

// metricsAddr is where the daemon's current run serves /metrics: the
// address its log reports since its last start (a restarted process binds
// another port), waited for until ctx ends.
func (d *daemon) metricsAddr(ctx context.Context) (string, error) {
	header := "===== " + d.name + " start #"
	for {
		log := d.logText()
		if i := strings.LastIndex(log, header); i >= 0 {
			if m := metricsAddrRE.FindStringSubmatch(log[i:]); m != nil {
				return m[1], nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s: no metrics address in its log since its last start: %w", d.name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// newDaemon creates the proxies and the configuration file of one process.
func (e *env) newDaemon(role, name, pgParams string, extraYAML string) *daemon {
	t := e.t
	pgTarget := fmt.Sprintf("127.0.0.1:%d", e.pg.Port())
	if e.vip != nil {
		pgTarget = e.vip.Addr()
	}
	pgp, err := testenv.StartProxy(pgTarget)
	if err != nil {
		t.Fatal(err)
	}
	rdp, err := testenv.StartProxy(e.rd.Addr())
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{role: role, pgProxy: pgp, redisProxy: rdp}
	dbURL := fmt.Sprintf("postgres://postgres@%s/cue?sslmode=disable", pgp.Addr())
	if pgParams != "" {
		dbURL += "&" + pgParams
	}
	redisURL, sentinel := "redis://"+rdp.Addr()+"/0", ""
	if e.sg != nil {
		// The address is ignored with Sentinel; the URL keeps the DB.
		redisURL = "redis://127.0.0.1:1/0"
		sentinel = fmt.Sprintf("\n  sentinel_master: %s\n  sentinel_addrs: [%s]", e.sg.Master, strings.Join(e.sg.SentinelAddrs(), ", "))
	}
	cfg := fmt.Sprintf(`# %s %s (fault test)
database:
  url: %q
  pool_size: 12
  connect_timeout: 3s
accounting:
  redis_url: %q%s
  redis_pool_size: 16
  recompute_interval: 2s
  limit_reseed_interval: 3s
  leader_poll_interval: 200ms
queue:
%s
scheduler:
  facility: spi
  instance_name: %s
rqd:
  address_override: %q
  connect_timeout: 2s
  request_timeout: %s
sidecar:
  slot_name: %s
  standby_retry: 200ms
logging:
  level: %s
metrics:
  listen: %q
%s`, role, name, dbURL, redisURL, sentinel, e.queueYAML(), name, e.fake.Addr(), rqdRequestTimeout, e.slot, logLevel(), metricsListen, extraYAML)
	d.config = filepath.Join(e.dir, name+".yaml")
	if err := os.WriteFile(d.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// rqdRequestTimeout is every scheduler's rqd.request_timeout (launchBound).
const rqdRequestTimeout = 5 * time.Second

// queueYAML is the processes' queue section: the harness's fast pacing
// with envOpts.Queue on top.
func (e *env) queueYAML() string {
	q := map[string]string{
		"cluster_empty_sleep": "200ms", "cluster_saturated_sleep": "50ms", "cluster_reload_interval": "1s",
		"active_scan_interval": "100ms", "layer_backoff_min": "20ms", "layer_backoff_max": "300ms",
	}
	for k, v := range e.o.Queue {
		q[k] = v
	}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	lines := make([]string, len(keys))
	for i, k := range keys {
		lines[i] = "  " + k + ": " + q[k]
	}
	return strings.Join(lines, "\n")
}

func logLevel() string {
	if l := os.Getenv("CUESCHED_FAULTS_LOG"); l != "" {
		return l
	}
	return "info"
}

// startSidecar starts sidecar process i (the first creates the slot).
func (e *env) startSidecar(name string, create bool) *daemon {
	d := e.newDaemon("sidecar", name, e.o.SidecarParams, "")
	args := []string{"sidecar", "--config", d.config}
	if create {
		args = append(args, "--create-slot")
	}
	d.process = newProcess(e.t, e.bin, name, filepath.Join(e.dir, name+".log"), args...)
	if err := d.start(); err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.sidecars = append(e.sidecars, d)
	e.mu.Unlock()
	e.note("started %s", name)
	return d
}

// startScheduler starts a scheduler process.
func (e *env) startScheduler(name string, extraYAML string) *daemon {
	d := e.newDaemon("scheduler", name, "", extraYAML)
	d.process = newProcess(e.t, e.bin, name, filepath.Join(e.dir, name+".log"), "scheduler", "--config", d.config)
	if err := d.start(); err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.schedulers = append(e.schedulers, d)
	e.mu.Unlock()
	e.note("started %s", name)
	return d
}

// run starts the sidecars (the first creates the slot; the scheduler
// starts once it has, as in the demo), the schedulers and the monitors.
func (e *env) run() {
	e.t.Helper()
	for i := 0; i < e.o.Sidecars; i++ {
		e.startSidecar(fmt.Sprintf("sidecar-%d", i+1), i == 0)
		if i == 0 {
			e.waitSlotActive(30 * time.Second)
		}
	}
	e.smp = e.startSampler()
	for i := 0; i < e.o.Schedulers; i++ {
		e.startScheduler(fmt.Sprintf("sched-%c", 'a'+i), "")
	}
	e.reaper.run()
	e.progressLog(time.Second)
}

// crashScheduler is kill -9 of a scheduler (and its restart after
// restartAfter).
func (e *env) crashScheduler(d *daemon, restartAfter time.Duration) {
	at := d.crash(restartAfter)
	e.disrupted(at)
	e.note("kill -9 %s (restarted after %s)", d.name, restartAfter)
}

// disrupted records that a scheduler lost its booking path at time at.
func (e *env) disrupted(at time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.disruptions = append(e.disruptions, at)
}

// cut partitions a daemon (see daemon.cut), recording the disruption when
// it is a scheduler.
func (e *env) cut(d *daemon, pg, rd bool) {
	d.cut(pg, rd)
	if d.role == "scheduler" {
		e.disrupted(time.Now())
	}
	e.note("cut %s from postgres=%v redis=%v", d.name, pg, rd)
}

// waitSlotActive waits until some sidecar streams the slot.
func (e *env) waitSlotActive(timeout time.Duration) string {
	e.t.Helper()
	deadline := time.Now().Add(testenv.Patience(timeout))
	for {
		if h := e.slotHolder(); h != "" {
			return h
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no sidecar holds slot %s after %s", e.slot, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slotHolder is the instance name of the sidecar streaming the slot, ""
// when none does. A walsender still creating the slot (--create-slot: it
// waits for a consistent point, for the transactions running then to end)
// holds it in state 'startup', and the slot is not permanent yet: killed
// then, the slot goes with it. Only a walsender that began streaming
// (catchup, streaming) counts.
func (e *env) slotHolder() string {
	var name *string
	err := e.pool.QueryRow(e.ctx, `SELECT r.application_name FROM pg_replication_slots s
		LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid AND r.state IN ('catchup', 'streaming')
		WHERE s.slot_name = $1`, e.slot).Scan(&name)
	if err != nil || name == nil {
		return ""
	}
	return strings.TrimPrefix(*name, "cuesched-sidecar/")
}

// leader is the instance name of the scheduler holding the accounting loop
// lock, "" when none does.
func (e *env) leader() string {
	var names []string
	rows, err := e.pool.Query(e.ctx, `SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted`)
	if err != nil {
		return ""
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil && strings.HasPrefix(n, "cuesched-scheduler/") {
			names = append(names, strings.TrimPrefix(n, "cuesched-scheduler/"))
		}
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func (e *env) daemonNamed(name string) *daemon {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, d := range append(append([]*daemon(nil), e.schedulers...), e.sidecars...) {
		if d.name == name {
			return d
		}
	}
	return nil
}

// progress returns how many managed frames are done (SUCCEEDED or DEAD)
// and how many procs exist.
func (e *env) progress() (done, procs int, err error) {
	err = e.pool.QueryRow(e.ctx, `SELECT
		(SELECT count(*) FROM frame f JOIN job j ON j.pk_job = f.pk_job JOIN show s ON s.pk_show = j.pk_show
		  WHERE s.b_scheduler_managed AND f.str_state IN ('SUCCEEDED', 'DEAD', 'EATEN')),
		(SELECT count(*) FROM proc)`).Scan(&done, &procs)
	return done, procs, err
}

// waitProgress waits until at least frac of the managed frames are done,
// so a fault lands while frames flow.
func (e *env) waitProgress(frac float64, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(testenv.Patience(timeout))
	for {
		done, _, err := e.progress()
		if err == nil && float64(done) >= frac*float64(e.managed.Load()) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("only %d of %d managed frames done after %s (err %v)", done, e.managed.Load(), timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drained reports whether every managed frame is done and no proc is left.
func (e *env) drained() bool {
	done, procs, err := e.progress()
	return err == nil && int64(done) == e.managed.Load() && procs == 0
}

// waitDrained waits for the queue to drain.
func (e *env) waitDrained(timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(testenv.Patience(timeout))
	for !e.drained() {
		if time.Now().After(deadline) {
			var states []string
			rows, err := e.pool.Query(e.ctx, `SELECT f.str_state || ' ' || count(*) FROM frame f JOIN job j ON j.pk_job = f.pk_job
				JOIN show s ON s.pk_show = j.pk_show WHERE s.b_scheduler_managed GROUP BY f.str_state`)
			if err == nil {
				for rows.Next() {
					var s string
					_ = rows.Scan(&s)
					states = append(states, s)
				}
				rows.Close()
			}
			_, procs, _ := e.progress()
			e.t.Fatalf("queue not drained after %s: managed frames %v, %d procs", timeout, states, procs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.note("queue drained")
}

// progressLog samples progress every interval into the timeline (in the
// full suite, or with CUESCHED_FAULTS_PROGRESS=1).
func (e *env) progressLog(interval time.Duration) {
	if os.Getenv("CUESCHED_FAULTS_PROGRESS") == "" && !fullMode() {
		return
	}
	go func() {
		for e.ctx.Err() == nil {
			time.Sleep(interval)
			done, procs, err := e.progress()
			if err == nil {
				e.note("progress: %d/%d done, %d procs", done, e.managed.Load(), procs)
			}
			if err == nil && e.managed.Load()-int64(done) < 25 {
				rows, err := e.pool.Query(e.ctx, `SELECT s.str_name || ' ' || j.str_name || ' ' || l.str_name || ' ' || f.str_state || ' x' || count(*)::text
					FROM frame f JOIN layer l ON l.pk_layer = f.pk_layer JOIN job j ON j.pk_job = f.pk_job JOIN show s ON s.pk_show = j.pk_show
					WHERE s.b_scheduler_managed AND f.str_state NOT IN ('SUCCEEDED', 'DEAD') GROUP BY s.str_name, j.str_name, l.str_name, f.str_state ORDER BY 1`)
				if err == nil {
					var left []string
					for rows.Next() {
						var x string
						_ = rows.Scan(&x)
						left = append(left, x)
					}
					rows.Close()
					e.note("  left: %s", strings.Join(left, "; "))
				}
			}
			if err == nil && int64(done) == e.managed.Load() && procs == 0 {
				return
			}
		}
	}()
}
