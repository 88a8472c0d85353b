package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkEndToEnd measures frames per second through the whole system
// (scheduler with its host cache and accounting loops, sidecar, fake RQD,
// Cuebot emulator) on a farm of CUESCHED_BENCH_HOSTS hosts (1,500) and
// CUESCHED_BENCH_FRAMES waiting frames (20,000), next to pgbench running
// the dispatcher's booking transaction (ClaimSQL, whose per-frame-host
// form the dispatcher runs, + HostSQL, as many
// frames per transaction as the scheduler's phase 1 averaged, on one host
// each, as many clients as the scheduler has concurrent passes) on an
// identical farm in the same run.
//
// Metrics: frames/s is end to end (until every frame has run and been
// completed and released); dispatch_frames/s is the scheduler alone (every
// frame started, nothing completing meanwhile), the like-for-like number
// for the pgbench ratio. The end-to-end loop also runs Cuebot's completion
// path (the emulator's statements), which pgbench's booking transaction does
// not: dbalone_completion_frames/s is the emulator completing pgbench's
// frames with nothing else running (phase 4); pgbench_loop_frames/s is
// pgbench of the loop's whole SQL (phase 5: each booking transaction, then
// its frames completed with the emulator's statements, no scheduler,
// sidecar, Redis or fakes), pgbench-loop-vs-pgbench-ratio the best
// e2e-vs-pgbench-ratio a scheduler costing nothing could reach on the
// machine, and e2e-vs-pgbench-loop-ratio what the scheduler, the sidecar,
// Redis, the emulator's Go and the fakes leave of it (issue #28's goal,
// at least 0.30). stmts/frame, rows/frame and
// blocks/frame are the scheduler's own Postgres statements, rows returned
// or affected and shared-buffer accesses per dispatched frame from
// pg_stat_statements (the scheduler connects as its own role so its
// statements are told apart from the emulator's and the sidecar's), in the
// scheduler-alone phase. Each
// phase logs the scheduler's CUESCHED_BENCH_STMTS (12) statements with the
// most calls (calls, rows, blocks, total and mean time, the first
// CUESCHED_BENCH_STMT_CHARS (80) characters of the text): run with -v.
//
// The scheduler-alone phase runs CUESCHED_BENCH_REPEAT (3) times with
// today's defaults and as often with round 1's configuration (Round1),
// interleaved: dispatch_frames/s and stmts/frame are the medians of the
// defaults, round1_dispatch_frames/s and round1_stmts/frame those of round
// 1, dispatch-vs-round1-ratio their quotient (the smart defaults must not
// cost dispatch speed: the ratio is at least 1).
func BenchmarkEndToEnd(b *testing.B) {
	hosts := envInt("CUESCHED_BENCH_HOSTS", 1500)
	frames := envInt("CUESCHED_BENCH_FRAMES", 20000)
	for i := 0; i < b.N; i++ {
		runEndToEndBench(b, hosts, frames)
	}
}

// BenchmarkFrameCost is the scheduler's database cost per dispatched
// frame against the farm's size (#28: at ten times the hosts, within 1.2x
// of the cost at 1,000): EndToEnd's scheduler-alone phase (today's
// defaults, every frame fits at once, none completes) on farms of
// CUESCHED_BENCH_COST_HOSTS hosts (1000,3000,10000) with
// CUESCHED_BENCH_COST_FRAMES_PER_HOST (10) waiting frames a host, so the
// jobs grow with the farm (10,000 hosts: 100,000 frames in 500 jobs). Each
// farm is ANALYZEd once seeded, as a running farm's autovacuum keeps its
// statistics.
//
// Metrics per farm: db_us/frame is the scheduler's statement time
// (pg_stat_statements total_exec_time, its own role) per frame started;
// stmts/frame, rows/frame and blocks/frame as in EndToEnd; frames/s the
// dispatch rate; x-vs-<smallest>-hosts-ratio is db_us/frame against the
// smallest farm's in the same run. The report draws each against the
// number of hosts: a cost that does not grow with the farm is a flat line.
func BenchmarkFrameCost(b *testing.B) {
	var sizes []int
	for _, f := range strings.Split(envString("CUESCHED_BENCH_COST_HOSTS", "1000,3000,10000"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("CUESCHED_BENCH_COST_HOSTS: %q is not a host count", f)
		}
		sizes = append(sizes, n)
	}
	sort.Ints(sizes)
	perHost := envInt("CUESCHED_BENCH_COST_FRAMES_PER_HOST", 10)
	var base float64
	for _, hosts := range sizes {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				// The end poll walks the frames already started: every
				// 250 ms it stays off the scheduler's share of the box.
				r := runPhase(b, phase{hosts: hosts, frames: hosts * perHost, analyze: true, poll: 250 * time.Millisecond})
				us := 1000 * r.dbMs / float64(r.frames)
				if hosts == sizes[0] {
					base = us
				}
				b.ReportMetric(us, "db_us/frame")
				b.ReportMetric(float64(r.calls)/float64(r.frames), "stmts/frame")
				b.ReportMetric(float64(r.rows)/float64(r.frames), "rows/frame")
				b.ReportMetric(float64(r.blocks)/float64(r.frames), "blocks/frame")
				b.ReportMetric(float64(r.frames)/r.dispatched.Seconds(), "frames/s")
				if base > 0 { // not when -bench left the smallest farm out
					b.ReportMetric(us/base, fmt.Sprintf("x-vs-%d-hosts-ratio", sizes[0]))
				}
				b.ReportMetric(0, "ns/op")
			}
		})
	}
}

func envString(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type benchFarm struct {
	show   farmseed.Show   // the first show (pgbench books as it)
	shows  []farmseed.Show // every managed show
	frames int
}

// seedBenchFarm: one facility, two allocations, one managed show with
// bursts above the farm's size, hosts with enough cores to take every frame
// at once (16 or more), jobs of two layers of 100 1-core frames.
func seedBenchFarm(tb testing.TB, pool *pgxpool.Pool, hosts, frames int) benchFarm {
	tb.Helper()
	ctx := context.Background()
	s := &farmseed.Seeder{DB: pool}
	must := func(v string, err error) string {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
		return v
	}
	fac := must(s.Facility(ctx, "spi"))
	allocs := []string{must(s.Alloc(ctx, fac, "spi.general", "general")), must(s.Alloc(ctx, fac, "spi.render", "render"))}
	tags := []string{"general", "render"}
	// CUESCHED_BENCH_SHOWS (1) managed shows share the farm, each
	// subscribed with a burst above it; jobs go to them in turn.
	var shows []farmseed.Show
	cores := max(16, (frames+hosts-1)/hosts)
	for i := 0; i < max(envInt("CUESCHED_BENCH_SHOWS", 1), 1); i++ {
		name := "bench"
		if i > 0 {
			name = fmt.Sprintf("bench%d", i)
		}
		show, err := s.Show(ctx, name, true)
		if err != nil {
			tb.Fatal(err)
		}
		for _, a := range allocs {
			must(s.Subscribe(ctx, show, a, hosts*cores, hosts*cores))
		}
		shows = append(shows, show)
	}
	for i := 0; i < hosts; i++ {
		must(s.Host(ctx, farmseed.HostSpec{Name: fmt.Sprintf("node%05d", i), Alloc: allocs[i%2], AllocTag: tags[i%2],
			Cores: cores, MemKB: int64(cores) * 4 * farmseed.GB}))
	}
	const perLayer = 100
	jobs := max(frames/(2*perLayer), 1)
	total := 0
	for j := 0; j < jobs; j++ {
		js, err := s.Job(ctx, farmseed.JobSpec{Name: fmt.Sprintf("job%04d", j), Show: shows[j%len(shows)], Facility: fac, Priority: j % 10,
			MaxCores: -1, Layers: []farmseed.LayerSpec{
				{Name: "render", Tags: []string{tags[j%2]}, Frames: perLayer, NotThreadable: true, MemKB: farmseed.GB},
				{Name: "comp", Tags: []string{tags[j%2]}, Frames: perLayer, NotThreadable: true, MemKB: farmseed.GB},
			}})
		if err != nil {
			tb.Fatal(err)
		}
		total += js.FrameCount()
	}
	return benchFarm{show: shows[0], shows: shows, frames: total}
}

// benchResult is one phase of the benchmark.
type benchResult struct {
	frames     int
	dispatched time.Duration // until every frame was started (end to end: launched on the fake RQD)
	drained    time.Duration // until every frame succeeded (end-to-end phase)
	calls      int64         // the scheduler's statements (pg_stat_statements)
	rows       int64
	blocks     int64
	dbMs       float64 // the scheduler's statements' execution time (pg_stat_statements total_exec_time)
	perBatch   int     // average frames per host batch
	perTx      int     // average frames per booking transaction (a batch may span several hosts)
}

// runBenchPhase runs one scheduler (production defaults) with the sidecar,
// the fake RQD and the Cuebot emulator over a fresh farm. With endToEnd the
// frames run 10-50 ms and the phase ends when the queue has drained;
// otherwise they run for an hour, nothing completes, and the phase ends
// when every frame has been started (the scheduler alone, with the farm
// big enough to take every frame at once).
func runBenchPhase(b *testing.B, hosts, frames int, endToEnd bool, mod func(*config.Config)) benchResult {
	return runPhase(b, phase{hosts: hosts, frames: frames, endToEnd: endToEnd, mod: mod})
}

// phase is one run of runPhase: the farm's size, whether frames complete
// (endToEnd), a change to today's defaults (mod), whether the seeded
// database is ANALYZEd before the scheduler starts (a bulk-seeded farm has
// no planner statistics; a running farm's autovacuum keeps them), and how
// often the phase's clock polls for its end (poll, 50 ms when 0).
type phase struct {
	hosts, frames int
	endToEnd      bool
	mod           func(*config.Config)
	analyze       bool
	poll          time.Duration
}

func runPhase(b *testing.B, ph phase) benchResult {
	hosts, frames, endToEnd, mod := ph.hosts, ph.frames, ph.endToEnd, ph.mod
	if ph.poll <= 0 {
		ph.poll = 50 * time.Millisecond
	}
	ctx := context.Background()
	e := newEnv(b)
	if !endToEnd {
		e.fake.SetDefault(fakerqd.Behavior{RunTime: time.Hour})
	}
	seedStart := time.Now()
	f := seedBenchFarm(b, e.pool, hosts, frames)
	if ph.analyze {
		if _, err := e.pool.Exec(ctx, `ANALYZE`); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("seeded %d hosts and %d frames in %s", hosts, f.frames, time.Since(seedStart).Round(time.Millisecond))
	e.farm = &farm{managedFrames: f.frames}
	for _, sh := range f.shows {
		e.farm.managedShows = append(e.farm.managedShows, sh.ID)
	}
	e.startSidecar()

	// The scheduler connects as its own role, so pg_stat_statements tells
	// its statements from the emulator's and the sidecar's.
	role := "sched_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	if _, err := e.pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN SUPERUSER`); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = e.pool.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = e.pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	if _, err := e.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		b.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(strings.Replace(e.dbURL, "postgres@", role+"@", 1))
	if err != nil {
		b.Fatal(err)
	}
	// Production defaults: the benchmark measures the scheduler as shipped,
	// unless CUESCHED_<SECTION>_<KEY> variables override a setting (to
	// compare a placement option with round 1's behaviour, e.g.
	// CUESCHED_QUEUE_SHOW_TIERS=false).
	cfg, err := config.Load("", os.Getenv)
	if err != nil {
		b.Fatal(err)
	}
	cfg.Metrics.Listen = ""
	cfg.Scheduler.Facility = "spi"
	if mod != nil {
		mod(&cfg)
	}
	pc.MaxConns = int32(cfg.Database.PoolSize)
	if os.Getenv("CUESCHED_BENCH_AUTO_EXPLAIN") != "" {
		// Diagnostics: plans of the scheduler's slow statements (and of the
		// triggers they fire) go to the server log. Point
		// CUESCHED_TEST_PG_URL at a server whose log you can read.
		pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			for _, q := range []string{"LOAD 'auto_explain'", "SET auto_explain.log_min_duration = '20ms'",
				"SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
				"SET auto_explain.log_nested_statements = on"} {
				if _, err := c.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		}
	}
	schedPool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	defer schedPool.Close()
	if _, err := e.pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		b.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	s, err := scheduler.New(ctx, cfg, scheduler.Deps{Pool: schedPool, Redis: e.rdb,
		RQDResolve: e.fake.Resolve, Logger: e.log.Named("bench"), Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	r := benchResult{frames: f.frames}
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	// The phase's clock reads the database on a connection of its own:
	// on e.pool its polls would queue behind the emulator's completions
	// (thousands wait for its connections in the end-to-end phase) and
	// see the end seconds late. Each poll is an EXISTS, which stops at
	// the first row still to do, every 50 ms (0.4% of the shortest phase).
	// In the end-to-end phase the database is read once the emulator has
	// completed every frame (its counters), and otherwise every 2 s (a
	// frame the counters miss cannot hang the phase): each poll walks the
	// frame table's dead versions of frames already started, and at every
	// 50 ms they were 6% of the database's CPU (9 ms each, 544 polls).
	poll, err := pgx.Connect(ctx, e.dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer poll.Close(context.Background())
	exists := func(sql string) bool {
		var v bool
		if err := poll.QueryRow(ctx, `SELECT EXISTS (`+sql+`)`).Scan(&v); err != nil {
			b.Fatal(err)
		}
		return v
	}
	lastRead := time.Now()
	for {
		if !endToEnd {
			if !exists(`SELECT 1 FROM frame WHERE str_state = 'WAITING' OR int_version = 0`) {
				r.dispatched = time.Since(start)
				break
			}
		} else {
			if r.dispatched == 0 && e.fake.Totals().Launched >= int64(f.frames) {
				r.dispatched = time.Since(start) // every frame launched at least once
			}
			st := e.emu.Stats()
			if st.Completed+st.Orphans >= uint64(f.frames) || time.Since(lastRead) >= 2*time.Second {
				lastRead = time.Now()
				if !exists(`SELECT 1 FROM proc`) && !exists(`SELECT 1 FROM frame WHERE str_state <> 'SUCCEEDED'`) {
					r.drained = time.Since(start)
					break
				}
			}
		}
		if time.Since(start) > 20*time.Minute {
			b.Fatalf("not done after 20 minutes: %d frames waiting", e.count(`SELECT count(*) FROM frame WHERE str_state = 'WAITING'`))
		}
		time.Sleep(ph.poll)
	}
	cancel()
	<-done

	if err := e.pool.QueryRow(ctx, `SELECT COALESCE(sum(calls),0)::bigint, COALESCE(sum(rows),0)::bigint,
		COALESCE(sum(shared_blks_hit + shared_blks_read),0)::bigint, COALESCE(sum(total_exec_time),0)::float8
		FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
		WHERE r.rolname = $1 AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`, role).Scan(&r.calls, &r.rows, &r.blocks, &r.dbMs); err != nil {
		b.Fatal(err)
	}
	if rows, err := e.pool.Query(ctx, `SELECT calls, rows, shared_blks_hit + shared_blks_read, round(total_exec_time)::bigint,
		mean_exec_time, left(regexp_replace(query, '\s+', ' ', 'g'), `+strconv.Itoa(envInt("CUESCHED_BENCH_STMT_CHARS", 80))+`)
		FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
		WHERE r.rolname = $1 ORDER BY calls DESC LIMIT `+strconv.Itoa(envInt("CUESCHED_BENCH_STMTS", 12)), role); err == nil {
		for rows.Next() {
			var c, n, bl, ms int64
			var mean float64
			var q string
			if rows.Scan(&c, &n, &bl, &ms, &mean, &q) == nil {
				b.Logf("  pg_stat_statements: calls=%d rows=%d blocks=%d time=%dms mean=%.3fms %s", c, n, bl, ms, mean, q)
			}
		}
		rows.Close()
	}
	batches := counters(b, reg, "scheduler_dispatch_batches_total", "stop")
	var nbatch float64
	for stop, n := range batches {
		if stop != dispatch.Failed.String() && stop != dispatch.HostStale.String() && stop != dispatch.NotSeeded.String() {
			nbatch += n
		}
	}
	r.perBatch = max(int(float64(f.frames)/max(nbatch, 1)+0.5), 1)
	ntx, _ := histMean(b, reg, "scheduler_dispatch_transaction_duration_seconds")
	r.perTx = max(int(float64(f.frames)/max(float64(ntx), 1)+0.5), 1)
	var means []string
	for _, h := range []string{"scheduler_dispatch_batch_duration_seconds", "scheduler_dispatch_transaction_duration_seconds",
		"scheduler_accounting_booking_duration_seconds", "scheduler_rqd_launch_duration_seconds", "scheduler_job_query_duration_seconds"} {
		if n, mean := histMean(b, reg, h); n > 0 {
			means = append(means, fmt.Sprintf("%s: n=%d mean=%.2fms", strings.TrimPrefix(h, "scheduler_"), n, mean*1000))
		}
	}
	b.Logf("  latencies: %s", strings.Join(means, "; "))
	b.Logf("  %d frames started in %s (%.0f frames/s), drained in %s; %.0f host batches (~%d frames each) in %d transactions (~%d frames each) %v",
		f.frames, r.dispatched.Round(time.Millisecond), float64(f.frames)/r.dispatched.Seconds(),
		r.drained.Round(time.Millisecond), nbatch, r.perBatch, ntx, r.perTx, batches)
	return r
}

// Round1 is round 1's configuration: every round-2 placement feature off
// (strict priority order, no show tiers, no per-job frame budget, first-fit
// placement without locality, no layer spread, no GPU protection, no
// reservations). The benchmark runs it beside today's defaults in the same
// run, on the same farm, interleaved.
func Round1(c *config.Config) {
	c.Queue.JobOrder = config.JobOrderStrict
	c.Queue.ShowTiers = false
	c.Queue.DispatchFramesPerJobLimit = 0
	c.Queue.Placement = config.PlacementBestFit
	c.Queue.Locality.Enabled = false
	c.Queue.LayerSpread.Enabled = false
	c.Queue.GPUProtection = false
	c.Queue.Reservations.Enabled = false
	c.Queue.HostsPerTransaction = 1
}

// median of a non-empty slice (the mean of the middle two for an even count).
func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func runEndToEndBench(b *testing.B, hosts, frames int) {
	// Phase 1, CUESCHED_BENCH_REPEAT (3) times each, today's defaults and
	// round 1's configuration interleaved, so both see the same machine:
	// the medians are compared.
	repeat := envInt("CUESCHED_BENCH_REPEAT", 3)
	var fps, stmts, r1fps, r1stmts []float64
	var solo benchResult
	for i := 0; i < repeat; i++ {
		b.Logf("phase 1 (%d/%d): the scheduler alone (every frame fits at once, none completes), today's defaults", i+1, repeat)
		r := runBenchPhase(b, hosts, frames, false, nil)
		if i == 0 {
			solo = r
		}
		fps = append(fps, float64(r.frames)/r.dispatched.Seconds())
		stmts = append(stmts, float64(r.calls)/float64(r.frames))
		b.Logf("phase 1 (%d/%d): the scheduler alone, round 1's configuration", i+1, repeat)
		r = runBenchPhase(b, hosts, frames, false, Round1)
		r1fps = append(r1fps, float64(r.frames)/r.dispatched.Seconds())
		r1stmts = append(r1stmts, float64(r.calls)/float64(r.frames))
	}
	b.Logf("dispatch frames/s: defaults %.0f, round 1 %.0f; statements/frame: defaults %.3f, round 1 %.3f",
		fps, r1fps, stmts, r1stmts)
	soloFPS := median(fps)
	b.ReportMetric(soloFPS, "dispatch_frames/s")
	b.ReportMetric(median(stmts), "stmts/frame")
	b.ReportMetric(median(r1fps), "round1_dispatch_frames/s")
	b.ReportMetric(median(r1stmts), "round1_stmts/frame")
	b.ReportMetric(soloFPS/median(r1fps), "dispatch-vs-round1-ratio")
	if os.Getenv("CUESCHED_BENCH_PHASE1_ONLY") != "" {
		b.ReportMetric(0, "ns/op")
		return
	}
	b.Log("phase 2: end to end (frames run 10-50 ms, the emulator completes them, the sidecar releases them)")
	e2e := runBenchPhase(b, hosts, frames, true, nil)
	b.Log("phase 3: pgbench running the booking transaction")
	// The same frames per transaction as the scheduler's, on one host
	// each (pgbench runs the one-host statements), at most a bench host's
	// 16 cores.
	pg := runPgbench(b, hosts, frames, min(solo.perTx, 16), config.Default().Queue.Stream.ClusterBufferSize*config.Default().Queue.Stream.JobBufferSize)
	pgbenchFPS := pg.fps
	b.Log("phase 4: the Cuebot emulator completing pgbench's frames, nothing else running")
	completionFPS := runCompletions(b, pg.url)
	b.Log("phase 5: pgbench running the loop's SQL (the booking transaction, then Cuebot's completion of its frames)")
	loopFPS := runLoopPgbench(b, hosts, frames, min(solo.perTx, 16), config.Default().Queue.Stream.ClusterBufferSize*config.Default().Queue.Stream.JobBufferSize).fps

	e2eFPS := float64(e2e.frames) / e2e.drained.Seconds()
	b.ReportMetric(e2eFPS, "frames/s")
	b.ReportMetric(pgbenchFPS, "pgbench_frames/s")
	b.ReportMetric(e2eFPS/pgbenchFPS, "e2e-vs-pgbench-ratio")
	b.ReportMetric(completionFPS, "dbalone_completion_frames/s")
	b.ReportMetric(loopFPS, "pgbench_loop_frames/s")
	b.ReportMetric(e2eFPS/loopFPS, "e2e-vs-pgbench-loop-ratio")
	b.ReportMetric(loopFPS/pgbenchFPS, "pgbench-loop-vs-pgbench-ratio")
	b.ReportMetric(soloFPS/pgbenchFPS, "dispatch-vs-pgbench-ratio")
	b.ReportMetric(float64(solo.rows)/float64(solo.frames), "rows/frame")
	b.ReportMetric(float64(solo.blocks)/float64(solo.frames), "blocks/frame")
	b.ReportMetric(float64(e2e.calls)/float64(e2e.frames), "e2e_stmts/frame")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkBookingBatch is the booking transaction's cost against its size:
// pgbench runs the dispatcher's own transaction (as in EndToEnd's phase 3)
// with batches of 3, 6, 10 and 20 frames of one layer on one host, on
// CUESCHED_BENCH_HOSTS hosts and CUESCHED_BENCH_FRAMES frames, the same
// number of clients each time. frames/s against the 6-frame batch (about
// a batch of today's defaults; round 1's configuration averages about 10)
// is x-vs-6-frames-ratio: how much of a booking's database cost is fixed
// per transaction (relation locks, the statements' start-up, the commit)
// rather than per frame (the frame and proc rows, Cuebot's frame triggers).
func BenchmarkBookingBatch(b *testing.B) {
	hosts := envInt("CUESCHED_BENCH_HOSTS", 1500)
	frames := envInt("CUESCHED_BENCH_FRAMES", 20000)
	clients := config.Default().Queue.Stream.ClusterBufferSize * config.Default().Queue.Stream.JobBufferSize
	var base float64
	for _, n := range []int{6, 3, 10, 20} {
		b.Run(fmt.Sprintf("frames=%d", n), func(b *testing.B) {
			var fps float64
			for i := 0; i < b.N; i++ {
				fps = runPgbench(b, hosts, frames, n, clients).fps
			}
			if n == 6 {
				base = fps
			}
			b.ReportMetric(fps, "frames/s")
			if base > 0 && n != 6 {
				b.ReportMetric(fps/base, "x-vs-6-frames-ratio")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// pgbenchRun is one pgbench run: frames booked per second, and the
// database it booked them in (its frames are RUNNING, with their procs).
type pgbenchRun struct {
	fps float64
	url string
}

// runPgbench seeds the same farm in another database and runs the
// dispatcher's booking transaction with pgbench (prepared statements,
// clients = the scheduler's pass concurrency), one batch of perBatch frames
// of one layer per transaction.
func runPgbench(b *testing.B, hosts, frames, perBatch, clients int) pgbenchRun {
	b.Helper()
	return pgbenchOn(b, hosts, frames, perBatch, clients, false)
}

// runLoopPgbench is runPgbench with Cuebot's side of the loop after each
// booking transaction: the transaction's frames completed one by one with
// the Cuebot emulator's own statements for a frame that succeeded
// (completionScript). It is the loop's SQL with no scheduler, no sidecar,
// no Redis and no fakes: pgbench of the same SQL as the end-to-end phase.
func runLoopPgbench(b *testing.B, hosts, frames, perBatch, clients int) pgbenchRun {
	b.Helper()
	return pgbenchOn(b, hosts, frames, perBatch, clients, true)
}

// completionScript is Cuebot's side of the loop for the frames booking
// transaction :b booked, as pgbench commands: for each (bench_batch.i 1 to
// perBatch, as many as the batch has) the statements the emulator sends
// for a frame that succeeded on a managed show's proc
// (cuebotemu.Succeeded), the values it computes in Go computed by
// pgbench's \set, the usage counters in one pipeline (the emulator's one
// round trip), the unbook in its own transaction.
func completionScript(perBatch int) string {
	p := cuebotemu.Succeeded()
	fill := func(sql string, args ...string) string {
		var pairs []string
		for i := len(args); i >= 1; i-- { // $10 before $1
			pairs = append(pairs, fmt.Sprintf("$%d", i), args[i-1])
		}
		return oneLine(strings.NewReplacer(pairs...).Replace(sql))
	}
	payload := `(json_build_object('show', :p_pk_show::text, 'alloc', :p_pk_alloc::text, 'folder', :p_pk_folder::text,
		'job', :p_pk_job::text, 'layer', :p_pk_layer::text, 'dept', :p_pk_dept::text,
		'cores', -(:p_int_cores_reserved::bigint / 100), 'gpus', -(:p_int_gpus_reserved::bigint))::text)`
	var sb strings.Builder
	sb.WriteString("SELECT count(*) AS n FROM bench_batch WHERE b = :b \\gset\n")
	for i := 1; i <= perBatch; i++ {
		fmt.Fprintf(&sb, "\\if :n >= %d\n", i)
		for _, l := range []string{
			fill(p.LoadProc, fmt.Sprintf("(SELECT pk_proc FROM bench_batch WHERE b = :b AND i = %d)", i)) + " \\gset p_",
			fill(p.LoadFrame, ":p_pk_frame") + " \\gset f_",
			fill(p.StopFrame, ":p_pk_frame", "'SUCCEEDED'", "0", strconv.Itoa(farmseed.GB), ":f_int_version", ":f_pk_layer", ":f_pk_job") + ";",
			fill(p.UsageClock, ":p_pk_frame") + " \\gset u_",
			`\set clk greatest(int(:u_clock), 1)`,
			`\set ct greatest(int(:clk * :u_cores / 100.0), 1)`,
			`\set gt :clk * :u_gpus`,
			`\startpipeline`,
			fill(p.Usage.Show, ":p_pk_show") + ";",
			fill(p.Usage.Job, ":f_pk_job", ":ct", ":gt", ":clk") + ";",
			fill(p.Usage.JobHigh, ":f_pk_job", ":clk") + ";",
			fill(p.Usage.Layer, ":f_pk_layer", ":ct", ":gt", ":clk") + ";",
			fill(p.Usage.LayerHigh, ":f_pk_layer", ":clk") + ";",
			fill(p.Usage.LayerLow, ":f_pk_layer", ":clk") + ";",
			`\endpipeline`,
			fill(p.FinishJob, ":f_pk_job") + ";",
			"BEGIN;",
			fill(p.Unbook, ":p_pk_proc", oneLine(payload)) + ";",
			"COMMIT;",
		} {
			sb.WriteString(l + "\n")
		}
		sb.WriteString("\\endif\n")
	}
	return sb.String()
}

func pgbenchOn(b *testing.B, hosts, frames, perBatch, clients int, complete bool) pgbenchRun {
	b.Helper()
	ctx := context.Background()
	url := cuebotdb.Database(b)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	f := seedBenchFarm(b, pool, hosts, frames)
	// Batches of perBatch frames of one layer, each on some host; hosts get
	// room for every batch so the guard never fails.
	for _, q := range []string{
		`UPDATE host SET int_cores_idle = 1000000000, int_mem_idle = 1000000000000`,
		`CREATE TABLE bench_batch AS
		 WITH f AS (
		     SELECT f.pk_frame, f.pk_layer, f.pk_job,
		            (row_number() OVER (PARTITION BY f.pk_layer ORDER BY f.int_dispatch_order) - 1) / ` + strconv.Itoa(perBatch) + ` AS lb,
		            row_number() OVER (PARTITION BY f.pk_layer ORDER BY f.int_dispatch_order) AS ord
		     FROM frame f WHERE f.str_state = 'WAITING')
		 SELECT dense_rank() OVER (ORDER BY pk_layer, lb) AS b, ord, (ord - 1) % ` + strconv.Itoa(perBatch) + ` + 1 AS i,
		        pk_frame, gen_random_uuid()::text AS pk_proc, pk_layer, pk_job
		 FROM f`,
		`CREATE TABLE bench_host AS SELECT row_number() OVER (ORDER BY str_name) - 1 AS i, pk_host, str_name FROM host`,
		`CREATE INDEX ON bench_batch (b, ord)`,
		`CREATE INDEX ON bench_batch (b, i)`,
		`CREATE SEQUENCE bench_seq`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	var nbatch int
	if err := pool.QueryRow(ctx, `SELECT max(b) FROM bench_batch`).Scan(&nbatch); err != nil {
		b.Fatal(err)
	}
	arr := func(col string) string {
		return `(SELECT array_agg(` + col + ` ORDER BY ord) FROM bench_batch WHERE b = :b)`
	}
	host := `(SELECT %s FROM bench_host WHERE i = :b %% ` + strconv.Itoa(hosts) + `)`
	one := `(SELECT %s FROM bench_batch WHERE b = :b LIMIT 1)`
	claim := strings.NewReplacer(
		"$10", `'{}'`,
		"$11", fmt.Sprintf(host, "pk_host"),
		"$12", fmt.Sprintf(one, "pk_layer"),
		"$13", fmt.Sprintf(one, "pk_job"),
		"$14", "262144",
		"$1", arr("pk_frame"),
		"$2", arr("pk_proc"),
		"$3", arr("0"),
		"$4", arr("100::bigint"),
		"$5", arr(strconv.Itoa(farmseed.GB)+"::bigint"),
		"$6", arr("0::bigint"),
		"$7", arr("0::bigint"),
		"$8", fmt.Sprintf(host, "str_name"),
		"$9", "'"+f.show.ID+"'",
	).Replace(dispatch.ClaimSQL)
	count := `(SELECT count(*) FROM bench_batch WHERE b = :b)`
	hostSQL := strings.NewReplacer("$1", fmt.Sprintf(host, "pk_host"), "$2", "100*"+count,
		"$3", strconv.Itoa(farmseed.GB)+"*"+count, "$4", "0", "$5", "0").Replace(dispatch.HostSQL)
	script := "SELECT nextval('bench_seq') AS b \\gset\nBEGIN;\n" + oneLine(claim) + ";\n" + oneLine(hostSQL) + ";\nCOMMIT;\n"
	if complete {
		script += completionScript(perBatch)
	}
	dir := b.TempDir()
	path := filepath.Join(dir, "dispatch.sql")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		b.Fatal(err)
	}
	bin, err := testenv.PostgresBinDir()
	if err != nil {
		b.Fatal(err)
	}
	perClient := max(nbatch/clients, 1)
	cmd := exec.Command(filepath.Join(bin, "pgbench"), "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", "2",
		"-t", strconv.Itoa(perClient), "-f", path, url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("pgbench: %v\n%s\nscript:\n%s", err, out, script)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil {
		b.Fatalf("pgbench output has no tps:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	var booked int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM proc`).Scan(&booked); err != nil {
		b.Fatal(err)
	}
	if complete {
		// Every frame booked went through Cuebot's side too: succeeded,
		// counted in the usage tables, its proc gone.
		var succeeded, showCount, jobCount, layerCount int64
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM frame WHERE str_state = 'SUCCEEDED'),
			(SELECT COALESCE(sum(int_frame_success_count), 0) FROM show_stats)::bigint,
			(SELECT COALESCE(sum(int_frame_success_count), 0) FROM job_usage)::bigint,
			(SELECT COALESCE(sum(int_frame_success_count), 0) FROM layer_usage)::bigint`).Scan(
			&succeeded, &showCount, &jobCount, &layerCount); err != nil {
			b.Fatal(err)
		}
		if booked != 0 || showCount != succeeded || jobCount != succeeded || layerCount != succeeded {
			b.Fatalf("pgbench left %d procs and completed %d frames, counted %d/%d/%d in show_stats/job_usage/layer_usage: the script does not do Cuebot's work\n%s",
				booked, succeeded, showCount, jobCount, layerCount, out)
		}
		booked = succeeded
	}
	// The batches the transactions took (bench_seq numbers them 1, 2, …):
	// a layer's last batch is smaller than perBatch.
	var want int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bench_batch WHERE b <= $1`, perClient*clients).Scan(&want); err != nil {
		b.Fatal(err)
	}
	if booked < want*9/10 {
		b.Fatalf("pgbench booked %d frames, expected about %d: the script does not do the dispatcher's work", booked, want)
	}
	fps := tps * float64(booked) / float64(perClient*clients)
	what := "booking"
	if complete {
		what = "booking and completion"
	}
	b.Logf("pgbench (%s): %d transactions of ~%d frames by %d clients: %.0f tps, %.0f frames/s", what, perClient*clients, perBatch, clients, tps, fps)
	return pgbenchRun{fps: fps, url: url}
}

// runCompletions is the other half of the loop's SQL without a scheduler:
// the Cuebot emulator completes (exit 0, max RSS = the booked memory, as
// the fake RQD reports) every frame pgbench started in the database at url,
// emulatorConns at a time as in the end-to-end phase. It returns frames
// completed per second, and fails unless every frame succeeded and every
// proc is gone.
func runCompletions(b *testing.B, url string) float64 {
	b.Helper()
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	pc.MaxConns = emulatorConns
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT p.pk_proc, p.pk_frame, h.str_name, p.int_mem_reserved
		FROM proc p JOIN host h ON h.pk_host = p.pk_host`)
	if err != nil {
		b.Fatal(err)
	}
	var work []cuebotemu.Completion
	for rows.Next() {
		c := cuebotemu.Completion{RunTime: 30 * time.Millisecond}
		if err := rows.Scan(&c.ProcID, &c.FrameID, &c.Host, &c.MaxRSSKB); err != nil {
			b.Fatal(err)
		}
		work = append(work, c)
	}
	if rows.Err() != nil {
		b.Fatal(rows.Err())
	}
	emu := cuebotemu.New(pool, nil)
	next := make(chan cuebotemu.Completion)
	errs := make(chan error, emulatorConns)
	start := time.Now()
	for range emulatorConns {
		go func() {
			var first error
			for c := range next {
				if err := emu.Complete(ctx, c); err != nil && first == nil {
					first = err
				}
			}
			errs <- first
		}()
	}
	for _, c := range work {
		next <- c
	}
	close(next)
	for range emulatorConns {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	took := time.Since(start)
	var left, succeeded int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM proc), (SELECT count(*) FROM frame WHERE str_state = 'SUCCEEDED')`).Scan(&left, &succeeded); err != nil {
		b.Fatal(err)
	}
	if left != 0 || succeeded != int64(len(work)) {
		b.Fatalf("the emulator completed %d of %d frames and left %d procs", succeeded, len(work), left)
	}
	fps := float64(len(work)) / took.Seconds()
	b.Logf("completions: %d frames by %d workers in %s: %.0f frames/s", len(work), emulatorConns, took.Round(time.Millisecond), fps)
	return fps
}

// histMean returns the count and mean of a histogram family.
func histMean(tb testing.TB, reg *prometheus.Registry, name string) (uint64, float64) {
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var n uint64
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	if n == 0 {
		return 0, 0
	}
	return n, sum / float64(n)
}

// oneLine joins a statement onto one line (pgbench reads a statement up to
// its semicolon, but backslash commands and comments are line based).
func oneLine(sql string) string {
	// pgbench reads one statement per line: drop "--" comments first.
	lines := strings.Split(sql, "\n")
	for i, l := range lines {
		if j := strings.Index(l, "--"); j >= 0 {
			lines[i] = l[:j]
		}
	}
	return strings.Join(strings.Fields(strings.Join(lines, "\n")), " ")
}
