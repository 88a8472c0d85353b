package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/scheduler/accounting"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
	"github.com/cuesched/cuesched/sidecar"
)

// Env is the embedded PostgreSQL and Redis every scenario of a battery
// shares (each scenario gets its own database and a flushed Redis DB).
type Env struct {
	env   *testenv.Env
	pg    *testenv.Postgres
	redis *testenv.Redis
	seq   atomic.Int64
}

// StartEnv starts PostgreSQL (wal_level=logical) and Redis.
func StartEnv(ctx context.Context) (*Env, error) {
	e := &Env{env: testenv.NewEnv()}
	var err error
	if e.pg, err = e.env.Postgres(ctx); err != nil {
		e.env.Close()
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	if e.redis, err = e.env.Redis(ctx); err != nil {
		e.env.Close()
		return nil, fmt.Errorf("start Redis: %w", err)
	}
	return e, nil
}

// Close stops them.
func (e *Env) Close() { e.env.Close() }

// World is one scenario run: a fresh Cuebot database, a flushed Redis DB,
// and, once started, the fake RQD, the Cuebot emulator, the sidecar and the
// scheduler instances, with the invariant monitor sampling the farm.
type World struct {
	Name    string
	Opts    Options
	Variant Variant

	DBURL    string
	Pool     *pgxpool.Pool
	RDB      redis.UniversalClient
	Pub      *publisher.Publisher
	Seed     *farmseed.Seeder
	Facility string

	env      *Env
	dbName   string
	log      hclog.Logger
	rngMu    sync.Mutex
	rng      *rand.Rand
	base     []func(*config.Config)
	runMin   time.Duration
	runMax   time.Duration
	runtime  sync.Map // layer id -> runSpan
	launches sync.Map // frame id -> *atomic.Int64 (launches seen, for the run-time draw)
	outcome  sync.Map // layer id -> Outcome
	mem      memWorld

	Fake *fakerqd.Server
	Emu  *cuebotemu.Emulator

	// scale is set by the scale scenarios (ScaleMode): product intervals,
	// a bounded fake RQD history, the fill read from the fake's counters.
	scale     bool
	hostCap   map[string][2]int32 // host name -> centicores, GPUs (read at Start)
	farmCores int64               // centicores of every host at Start

	cancel  context.CancelFunc
	runCtx  context.Context // the load's context (Start to stop)
	wg      sync.WaitGroup  // the sidecar
	monWG   sync.WaitGroup  // the legacy dispatcher
	monStop context.CancelFunc
	monDone chan struct{}
	sidecar *sidecar.Sidecar
	sCancel context.CancelFunc
	scheds  []*instance
	// schedRole, if set, is the role the schedulers connect as, so
	// pg_stat_statements tells their statements from the emulator's, the
	// sidecar's and the monitor's (SchedulerRole).
	schedRole string
	// childDir holds the child schedulers' configuration files and logs.
	childDir string
	started  time.Time
	mon      *monitor

	mu      sync.Mutex
	metrics []Metric
	notes   []string
	fill    []Point
}

type instance struct {
	s      *scheduler.Scheduler
	reg    *prometheus.Registry
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan struct{}
	dead   bool
	// child and metricsURL are set instead of s, reg and pool for a
	// scheduler run as a child process (startChild).
	child      *exec.Cmd
	metricsURL string
}

func newWorld(ctx context.Context, env *Env, o Options, name string, v Variant) (*World, error) {
	n := env.seq.Add(1)
	w := &World{Name: name, Opts: o, Variant: v, env: env, rng: rand.New(rand.NewSource(o.Seed)),
		runMin: 500 * time.Millisecond, runMax: 1500 * time.Millisecond}
	w.log = hclog.NewNullLogger()
	if o.Verbose && o.Progress != nil {
		w.log = hclog.New(&hclog.LoggerOptions{Name: strings.ToLower(name), Level: hclog.Info, Output: progressWriter(o.Progress)})
	}
	w.dbName = fmt.Sprintf("sim%d_%d_%s", os.Getpid(), n, strings.ToLower(name))
	if err := env.pg.CreateDatabase(ctx, w.dbName, ""); err != nil {
		return nil, err
	}
	w.DBURL = env.pg.URL(w.dbName)
	if err := cuebotdb.Setup(ctx, w.DBURL); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(w.DBURL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 16
	if w.Pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, err
	}
	w.RDB, err = publisher.NewClient(publisher.ClientConfig{URL: env.redis.URL(0), PoolSize: 32})
	if err != nil {
		return nil, err
	}
	if err := w.RDB.FlushDB(ctx).Err(); err != nil {
		return nil, err
	}
	if w.Pub, err = publisher.New(w.RDB, publisher.Options{}); err != nil {
		return nil, err
	}
	w.Seed = &farmseed.Seeder{DB: w.Pool}
	if w.Facility, err = w.Seed.Facility(ctx, "sim"); err != nil {
		return nil, err
	}
	return w, nil
}

type progressWriter func(string)

func (p progressWriter) Write(b []byte) (int, error) {
	p(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// Rand returns a number from the world's seeded source.
func (w *World) Rand(f func(*rand.Rand) int) int {
	w.rngMu.Lock()
	defer w.rngMu.Unlock()
	return f(w.rng)
}

// Configure adds a change to the scenario's base configuration (applied
// before the variant's).
func (w *World) Configure(f func(*config.Config)) { w.base = append(w.base, f) }

// RunTimes sets the default frame run time range.
func (w *World) RunTimes(min, max time.Duration) { w.runMin, w.runMax = min, max }

// LayerRunTime fixes the run time of one layer's frames.
func (w *World) LayerRunTime(layerID string, d time.Duration) {
	w.runtime.Store(layerID, runSpan{d, d})
}

// LayerRunTimes gives one layer's frames run times drawn in [min, max), as
// RunTimes does for the rest: frames launched together end spread out.
func (w *World) LayerRunTimes(layerID string, min, max time.Duration) {
	w.runtime.Store(layerID, runSpan{min, max})
}

// runSpan is a range of run times; min == max fixes them.
type runSpan struct{ min, max time.Duration }

// runTimeOf is how long a launched frame runs: a draw in its layer's run
// span or in [runMin, runMax), a function of the seed, the frame (job and
// frame name) and which launch of it this is. The draw does not depend on
// the order launches reach the fake RQD, so a seed gives every frame the
// same run times however the machine's load interleaves them.
func (w *World) runTimeOf(rf *rqdpb.RunFrame) time.Duration {
	span := runSpan{w.runMin, w.runMax}
	if v, ok := w.runtime.Load(rf.GetLayerId()); ok {
		span = v.(runSpan)
	}
	if span.max <= span.min {
		return span.min
	}
	n, _ := w.launches.LoadOrStore(rf.GetFrameId(), new(atomic.Int64))
	attempt := n.(*atomic.Int64).Add(1)
	return span.min + time.Duration(frameDraw(w.Opts.Seed, rf.GetJobName(), rf.GetFrameName(), attempt)%uint64(span.max-span.min))
}

// frameDraw hashes (seed, job, frame, attempt) to a uniform 64-bit value.
func frameDraw(seed int64, job, frame string, attempt int64) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(seed))
	h.Write(b[:])
	h.Write([]byte(job))
	h.Write([]byte{0})
	h.Write([]byte(frame))
	binary.LittleEndian.PutUint64(b[:], uint64(attempt))
	h.Write(b[:])
	// FNV's low bits mix poorly for short inputs: finish with splitmix64.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Outcome decides how a frame of a layer ends, given the memory it was
// booked with (KB): exit status 0 (success), 1 (a failure Cuebot retries
// until int_max_retries, then DEAD) or 33 (a memory kill: Cuebot retries
// it whatever its retries and raises the layer's memory), with the max RSS
// reported.
type Outcome func(reservedKB int64) (exitStatus int32, maxRSSKB int64)

// LayerOutcome sets how the frames of one layer end (default: success).
func (w *World) LayerOutcome(layerID string, o Outcome) { w.outcome.Store(layerID, o) }

// minMemoryIncrease is Cuebot's default int_min_memory_increase (2 GB,
// service.int_min_memory_increase).
const minMemoryIncrease = 2 * 1048576

// complete hands a fake RQD completion to the Cuebot emulator as Cuebot's
// completion path sees it: a frame the hosts' memory guard killed is first
// marked exit status 33 (Cuebot's memory guard does so before its kill),
// a layer with an Outcome ends as it says. After a memory failure the
// layer's memory is raised as Cuebot's FrameCompleteHandler does before
// the retry (retryFrameWithRaisedMemory): to the memory the killed proc
// had reserved plus int_min_memory_increase, never lowered.
func (w *World) complete(ctx context.Context) func(fakerqd.FrameCompletion) {
	cb := w.Emu.FakeRQDCallback(ctx, func(fakerqd.FrameCompletion, error) {})
	return func(fc fakerqd.FrameCompletion) {
		v, hasOutcome := w.outcome.Load(fc.LayerID)
		if !hasOutcome && !fc.MemoryKilled {
			cb(fc)
			return
		}
		var reserved int64
		if err := w.Pool.QueryRow(ctx, `SELECT int_mem_reserved FROM frame WHERE pk_frame = $1`, fc.FrameID).Scan(&reserved); err != nil {
			cb(fc)
			return
		}
		memoryFailure := fc.MemoryKilled
		if fc.MemoryKilled {
			w.recordKill(fc)
			if _, err := w.Emu.MarkMemoryKill(ctx, fc.FrameID); err != nil && ctx.Err() == nil {
				w.Note("mark memory kill: %v", err)
			}
		} else {
			fc.ExitStatus, fc.MaxRSSKB = v.(Outcome)(reserved)
			fc.ExitSignal = 0
			memoryFailure = fc.ExitStatus == cuebotemu.ExitMemoryFailure
		}
		cb(fc)
		if memoryFailure {
			_, _ = w.Pool.Exec(ctx, `UPDATE layer SET int_mem_min = $2 WHERE pk_layer = $1 AND int_mem_min < $2`,
				fc.LayerID, reserved+minMemoryIncrease)
		}
	}
}

// Metric records a measured value with its threshold.
func (w *World) Metric(name string, value float64, op Op, threshold float64, unit string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.metrics = append(w.metrics, Metric{Name: name, Value: value, Op: op, Threshold: threshold, Unit: unit})
}

// Note adds a line to the scenario's report.
func (w *World) Note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.notes = append(w.notes, fmt.Sprintf(format, args...))
}

// ScaleMode makes the world measure the product at scale rather than
// check it closely at small sizes: the scheduler runs with the product's
// own recompute and cluster reload intervals (not the sim's 15 s and 2 s),
// the fake RQD keeps only its latest launches, and LaunchedFill reads the
// fake's counters. Call it before Start.
func (w *World) ScaleMode() { w.scale = true }

func (w *World) config() config.Config {
	cfg := config.Default()
	cfg.Database.URL = w.DBURL
	cfg.Accounting.RedisURL = w.env.redis.URL(0)
	if w.scale {
		return w.configScale(cfg)
	}
	cfg.Accounting.RecomputeInterval = config.Duration(15 * time.Second)
	cfg.Accounting.LimitReseedInterval = config.Duration(5 * time.Second)
	cfg.Accounting.LeaderPollInterval = config.Duration(200 * time.Millisecond)
	cfg.Queue.ClusterEmptySleep = config.Duration(300 * time.Millisecond)
	cfg.Queue.ClusterSaturatedSleep = config.Duration(200 * time.Millisecond)
	cfg.Queue.ActiveScanInterval = config.Duration(300 * time.Millisecond)
	cfg.Queue.LayerBackoffMin = config.Duration(100 * time.Millisecond)
	cfg.Queue.LayerBackoffMax = config.Duration(time.Second)
	// The fail-fast backoff on the sim's time scale (runs of a second).
	cfg.Queue.FailFastInterval = config.Duration(500 * time.Millisecond)
	cfg.Queue.FailFastRunTime = config.Duration(5 * time.Second)
	cfg.Queue.FailFastBackoffMin = config.Duration(time.Second)
	cfg.Queue.FailFastBackoffMax = config.Duration(4 * time.Second)
	cfg.Queue.ClusterReloadInterval = config.Duration(2 * time.Second)
	cfg.Queue.LotterySeed = w.Opts.Seed
	cfg.Queue.WaitingStatsInterval = 0
	cfg.Metrics.Listen = ""
	cfg.Scheduler.Facility = "sim"
	// Memory sizing on the sim's time scale (frames of a second): a
	// layer's history read is reused for 250 ms, not 30 s.
	cfg.Sizing.HistoryTTL = config.Duration(250 * time.Millisecond)
	return w.finishConfig(cfg)
}

// configScale is the product's configuration, with only what the embedded
// farm needs (no metrics listener, the sim facility, the seed's lottery):
// the product's own intervals, the waiting-frames count
// (queue.waiting_stats_interval) included.
func (w *World) configScale(cfg config.Config) config.Config {
	cfg.Queue.LotterySeed = w.Opts.Seed
	cfg.Metrics.Listen = ""
	cfg.Scheduler.Facility = "sim"
	return w.finishConfig(cfg)
}

func (w *World) finishConfig(cfg config.Config) config.Config {
	if w.Opts.WorkSplit != "" {
		cfg.Scheduler.WorkSplit = w.Opts.WorkSplit
	}
	for _, f := range w.base {
		f(&cfg)
	}
	if w.Variant.Config != nil {
		w.Variant.Config(&cfg)
	}
	return cfg
}

// loadCapacity reads every host's cores and GPUs, for the fake RQD's
// per-launch over-booking check and the fill's denominator.
func (w *World) loadCapacity(ctx context.Context) error {
	rows, err := w.Pool.Query(ctx, `SELECT str_name, int_cores, int_gpus FROM host`)
	if err != nil {
		return err
	}
	defer rows.Close()
	w.hostCap = map[string][2]int32{}
	w.farmCores = 0
	for rows.Next() {
		var name string
		var cores, gpus int32
		if err := rows.Scan(&name, &cores, &gpus); err != nil {
			return err
		}
		w.hostCap[name] = [2]int32{cores, gpus}
		w.farmCores += int64(cores)
	}
	return rows.Err()
}

// capacity is the fake RQD's Config.Capacity: the host's cores and GPUs
// as seeded (hosts added after Start are not checked there).
func (w *World) capacity(host string) (int32, int32, bool) {
	c, ok := w.hostCap[host]
	return c[0], c[1], ok
}

// LaunchedFill is the cores of the frames running on the fake render nodes
// ÷ the farm's cores at Start, read from the fake's counters in O(1): what
// the render nodes run, not what PostgreSQL has booked (a proc whose
// launch is still in flight does not count).
func (w *World) LaunchedFill() float64 {
	if w.Fake == nil || w.farmCores <= 0 {
		return 0
	}
	return float64(w.Fake.Totals().Centicores) / float64(w.farmCores)
}

// Start starts the fake RQD, the emulator, the sidecar, n scheduler
// instances (Options.Schedulers when n is 0) and the monitor.
func (w *World) Start(ctx context.Context, n int) error {
	if n <= 0 {
		n = max(w.Opts.Schedulers, 1)
	}
	rctx, cancel := context.WithCancel(ctx)
	w.cancel, w.runCtx = cancel, rctx
	w.Emu = cuebotemu.New(w.Pool, w.log.Named("cuebot"))
	if err := w.loadCapacity(ctx); err != nil {
		return err
	}
	def := fakerqd.Behavior{RunTimeFunc: w.runTimeOf, MaxRSSFunc: w.rssOf}
	hosts, err := w.hostBehaviors(ctx, def)
	if err != nil {
		return err
	}
	fc := fakerqd.Config{
		Default:    def,
		Hosts:      hosts,
		OnComplete: w.complete(rctx),
		Capacity:   w.capacity,
	}
	if w.scale {
		fc.HistoryLimit = 10000
	}
	w.Fake, err = fakerqd.Start(fc)
	if err != nil {
		return err
	}
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	w.sCancel = scancel
	w.sidecar, err = sidecar.New(sidecar.Config{DatabaseURL: w.DBURL, SlotName: w.dbName + "_sidecar", CreateSlot: true,
		Logger: w.log.Named("sidecar"), Registerer: prometheus.NewRegistry()}, w.RDB)
	if err != nil {
		return err
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		_ = w.sidecar.Run(sctx)
	}()
	for i := 0; i < n; i++ {
		if err := w.startScheduler(rctx, i); err != nil {
			return err
		}
	}
	w.started = time.Now()
	w.mon = newMonitor(w)
	mctx, mstop := context.WithCancel(rctx)
	w.monStop, w.monDone = mstop, make(chan struct{})
	go func() {
		defer close(w.monDone)
		w.mon.run(mctx)
	}()
	return nil
}

func (w *World) startScheduler(ctx context.Context, i int) error {
	cfg := w.config()
	cfg.Scheduler.InstanceName = fmt.Sprintf("sim%d", i)
	url := w.DBURL
	if w.schedRole != "" {
		url = strings.Replace(url, "postgres@", w.schedRole+"@", 1)
		cfg.Database.URL = url
	}
	if w.Opts.SchedulerBin != "" && w.scale {
		return w.startChild(ctx, i, cfg)
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(cfg.Database.PoolSize)
	pc.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("cuesched-lab/sim%d", i)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	s, err := scheduler.New(ctx, cfg, scheduler.Deps{Pool: pool, Redis: w.RDB, RQDResolve: w.Fake.Resolve,
		Logger: w.log.Named(fmt.Sprintf("scheduler%d", i)), Registerer: reg})
	if err != nil {
		pool.Close()
		return err
	}
	ictx, cancel := context.WithCancel(ctx)
	in := &instance{s: s, reg: reg, pool: pool, cancel: cancel, done: make(chan struct{})}
	w.scheds = append(w.scheds, in)
	go func() {
		defer close(in.done)
		_ = s.Run(ictx)
	}()
	return nil
}

// SchedulerRole makes the schedulers Start runs connect as a role of their
// own (created here, dropped with the database's cluster role at close),
// so SchedulerStatements counts their statements only. Call before Start.
func (w *World) SchedulerRole(ctx context.Context) error {
	role := fmt.Sprintf("simsched_%s", strings.ReplaceAll(w.dbName, "-", "_"))
	if _, err := w.Pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN SUPERUSER`); err != nil {
		return err
	}
	if _, err := w.Pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}
	w.schedRole = role
	return nil
}

// SchedulerStatements is the statements the schedulers ran in this
// database (pg_stat_statements; SchedulerRole first).
func (w *World) SchedulerStatements(ctx context.Context) int64 {
	return w.Int(ctx, `SELECT COALESCE(sum(calls),0)::bigint FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
		WHERE r.rolname = $1 AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, w.schedRole)
}

// Gauges returns a gauge's value in each live scheduler instance.
func (w *World) Gauges(name string) []float64 {
	var out []float64
	for _, in := range w.scheds {
		if in.dead {
			continue
		}
		if v, ok := in.gauge(name); ok {
			out = append(out, v)
		}
	}
	return out
}

// Leader returns the index of the scheduler instance leading the
// accounting loops, or -1.
func (w *World) Leader() int {
	for i, in := range w.scheds {
		if in.dead {
			continue
		}
		if in.child != nil {
			if v, ok := in.gauge("scheduler_accounting_leader"); ok && v == 1 {
				return i
			}
			continue
		}
		if in.s.Accounting != nil && in.s.Accounting.IsLeader() {
			return i
		}
	}
	return -1
}

// Kill stops scheduler i the way kill -9 would look to the others: its
// passes are abandoned and its database sessions (and the advisory lock of
// a loop leader) are closed at once.
func (w *World) Kill(i int) {
	in := w.scheds[i]
	in.dead = true
	if in.child != nil {
		in.cancel()
		_ = in.child.Process.Kill()
		<-in.done
		return
	}
	in.cancel()
	in.pool.Reset()
	<-in.done
	in.s.Close()
	in.pool.Close()
}

// StopSampling stops the monitor (the samplers and the fill curve) and
// waits for it, so a scenario may read what its samplers wrote.
func (w *World) StopSampling() {
	if w.monStop != nil {
		w.monStop()
		<-w.monDone
	}
}

// series calls f with every series of the metric name in every scheduler
// instance's registry.
func (w *World) series(name string, f func(m *dto.Metric)) {
	for _, in := range w.scheds {
		if in.dead && in.child != nil {
			continue // a killed child's counters went with it
		}
		fams, err := in.gather()
		if err != nil {
			continue
		}
		for _, fam := range fams {
			if fam.GetName() == name {
				for _, m := range fam.GetMetric() {
					f(m)
				}
			}
		}
	}
}

// Counter sums a counter of every scheduler instance's registry over the
// series whose labels include label=value (label "" sums every series).
func (w *World) Counter(name, label, value string) float64 {
	var sum float64
	w.series(name, func(m *dto.Metric) {
		ok := label == ""
		for _, l := range m.GetLabel() {
			ok = ok || (l.GetName() == label && l.GetValue() == value)
		}
		if ok {
			sum += m.GetCounter().GetValue()
		}
	})
	return sum
}

// histCount sums the observation count of a histogram over every
// scheduler instance's registry.
func (w *World) histCount(name string) float64 {
	var n float64
	w.series(name, func(m *dto.Metric) { n += float64(m.GetHistogram().GetSampleCount()) })
	return n
}

// CounterBy sums a counter of every scheduler instance's registry by the
// value of one label.
func (w *World) CounterBy(name, label string) map[string]float64 {
	out := map[string]float64{}
	w.series(name, func(m *dto.Metric) {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	})
	return out
}

// Elapsed is the time since Start.
func (w *World) Elapsed() time.Duration { return time.Since(w.started) }

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Patient stretches a must-happen deadline by Options.Patience (at least 1).
func (w *World) Patient(d time.Duration) time.Duration {
	return time.Duration(float64(d) * max(w.Opts.Patience, 1))
}

// WaitFor polls cond until it holds (true) or timeout passes (false).
func (w *World) WaitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || Sleep(ctx, 50*time.Millisecond) != nil {
			return false
		}
	}
}

// Int runs a query returning one integer (0 on error, noted).
func (w *World) Int(ctx context.Context, sql string, args ...any) int64 {
	var n int64
	if err := w.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil && ctx.Err() == nil {
		w.Note("query failed: %v", err)
	}
	return n
}

// Sample registers a function the monitor calls at every tick (t: seconds
// since Start).
// Call it after Start.
func (w *World) Sample(f func(ctx context.Context, t float64)) { w.mon.add(f) }

// stop ends the load: schedulers stop, then the fake RQD (frames still
// running never complete), then the sidecar catches up with the WAL.
func (w *World) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	for _, in := range w.scheds {
		if !in.dead {
			<-in.done
		}
	}
	w.StopSampling()
	w.monWG.Wait()
	if w.Fake != nil {
		w.Fake.Stop()
	}
}

// checkInvariants records the global invariants as metrics.
func (w *World) checkInvariants(ctx context.Context) {
	if w.Fake == nil || w.mon == nil {
		return
	}
	w.Metric("frames launched twice", float64(len(w.Fake.DoubleLaunches())), Equal, 0, "")
	over, overs := w.Fake.Overbooked()
	w.Metric("launches past a host's cores/GPUs (fake RQD, every launch)", float64(over), Equal, 0, "")
	for _, o := range overs {
		w.Note("violation: frame %s took host %s to %d/%d centicores, %d/%d GPUs", o.FrameID, o.Host,
			o.Centicores, o.CapCenticores, o.GPUs, o.CapGPUs)
	}
	m := w.mon.snapshot()
	if w.scale {
		w.Note("monitor: %d proc-table scans taking %.1f s in all", m.scans, m.scanTime.Seconds())
	}
	w.Metric("host over cores/mem/GPUs (samples)", float64(m.hostOver), Equal, 0, "")
	w.Metric("bookings past a cap (samples)", float64(m.capOver), Equal, 0, "")
	w.Metric("negative Redis counters (samples)", float64(m.negative), Equal, 0, "")
	for _, v := range m.examples {
		w.Note("violation: %s", v)
	}
	w.Metric("PostgreSQL deadlocks (pg_stat_database)", float64(w.deadlocks(ctx)), Equal, 0, "")
	// Every committed proc DELETE released, then Redis against SUM(proc).
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
	defer cancel()
	drift := -1.0
	if err := w.sidecarCaughtUp(actx); err != nil {
		w.Note("audit skipped: %v", err)
	} else if rep, err := accounting.Audit(actx, w.Pool, w.Pub); err != nil {
		w.Note("audit failed: %v", err)
	} else {
		drift = float64(len(rep.Drifts))
		for i, d := range rep.Drifts {
			if i == 5 {
				break
			}
			w.Note("drift: %+v", d)
		}
	}
	w.Metric("accounting drift (Redis vs SUM(proc))", drift, Equal, 0, "")
}

// deadlocks is pg_stat_database.deadlocks of the scenario's database (its
// own, so other scenarios' do not count), or -1 if it cannot be read. A
// backend reports its statistics when idle or when it exits, so the
// schedulers' connections are closed and the world's pool is emptied
// first, and the count is read once those backends have gone (at most
// 30 s; whatever has been reported by then is read).
func (w *World) deadlocks(ctx context.Context) int64 {
	for _, in := range w.scheds {
		if !in.dead && in.pool != nil {
			in.pool.Close()
		}
	}
	w.Pool.Reset()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for {
		var others int
		err := w.Pool.QueryRow(qctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
			  AND application_name NOT LIKE 'cuesched-sidecar%'`).Scan(&others)
		if err != nil || others == 0 {
			break
		}
		if Sleep(qctx, 100*time.Millisecond) != nil {
			break
		}
	}
	var n int64 = -1
	if err := w.Pool.QueryRow(qctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		w.Note("deadlock count unreadable: %v", err)
		return -1
	}
	return n
}

func (w *World) sidecarCaughtUp(ctx context.Context) error {
	var target string
	if err := w.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&target); err != nil {
		return err
	}
	for {
		var behind bool
		if err := w.Pool.QueryRow(ctx, `SELECT $1::pg_lsn > $2::pg_lsn`, target, w.sidecar.Status().Checkpoint.String()).Scan(&behind); err != nil {
			return err
		}
		if !behind {
			return nil
		}
		if err := Sleep(ctx, 50*time.Millisecond); err != nil {
			return errors.New("the sidecar did not catch up with the WAL")
		}
	}
}

func (w *World) close() {
	if w.sCancel != nil {
		w.sCancel()
	}
	w.wg.Wait()
	for _, in := range w.scheds {
		if !in.dead && in.s != nil {
			in.s.Close()
			in.pool.Close()
		}
	}
	if w.childDir != "" {
		_ = os.RemoveAll(w.childDir)
	}
	ctx := context.Background()
	if w.Pool != nil {
		_, _ = w.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
		w.Pool.Close()
	}
	if w.RDB != nil {
		_ = w.RDB.Close()
	}
	_ = w.env.pg.DropDatabase(ctx, w.dbName)
	if w.schedRole != "" {
		if c, err := pgx.Connect(ctx, w.env.pg.URL("postgres")); err == nil {
			_, _ = c.Exec(ctx, `DROP ROLE IF EXISTS `+w.schedRole)
			_ = c.Close(ctx)
		}
	}
}
