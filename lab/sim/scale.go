package sim

import (
	"github.com/cuesched/cuesched/shared/config"

	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// SCALE (issue #28): a farm of Options.Hosts hosts (default 10,000, about
// 400k cores, a tenth of them GPU hosts) in 3 allocations, 60 shows
// subscribed to all three, 600 jobs and Options.Frames waiting frames
// (default 1,000,000), seeded in bulk (farmseed.Hosts, the frames in COPYs);
// then Options.Schedulers instances fill it cold and keep it full. It
// reports what issue #28 asks, beside the same run on a tenth of the farm
// (the per-frame database cost must stay within 1.2x of it) and at 2 and 3
// instances.
//
// The figures of the product and of the simulator are kept apart:
// PostgreSQL statements are counted per role (the simulator's pool - the
// Cuebot emulator, the monitor, the audit - logs in as scaleLabRole, the
// schedulers and the sidecar as the database owner), PostgreSQL CPU per
// backend's role, and, with Options.SchedulerBin, each scheduler is a child
// process of the deployed binary whose RSS (VmHWM) and CPU are its own;
// without it the schedulers share this process with the sidecar and the
// fakes, and the heap their code allocated stands for their memory.

const (
	scaleHosts   = 10000
	scaleFrames  = 1_000_000
	scaleShows   = 60
	scaleJobs    = 600
	scaleLabRole = "cuesched_lab"
	// scaleSustain is how long the full farm is watched for lifecycles/s.
	scaleSustain = 30 * time.Second
	// scaleSettle is how long after the shortest run time (from the
	// schedulers' start) the sustained window opens.
	scaleSettle = 5 * time.Second
	// scaleFillLimit is the cold fill's deadline (the goal is 60 s).
	scaleFillLimit = 5 * time.Minute
)

var (
	scaleBaseline = Variant{Name: "tenth farm"}
	// Several schedulers split the work by allocation (scheduler.work_split),
	// as a facility running several instances should.
	scaleTwo   = Variant{Name: "2 schedulers", Config: splitByAllocation}
	scaleThree = Variant{Name: "3 schedulers", Config: splitByAllocation}
)

func splitByAllocation(c *config.Config) { c.Scheduler.WorkSplit = config.WorkSplitAllocation }

// scaleWorkSplit sets the scheduler.work_split of a SCALE run of n
// schedulers and returns it. Several instances split the work by
// allocation, as the 2- and 3-scheduler variants do, unless --work-split
// chose: without a split they all plan the same clusters (SPLIT's "no
// split" run measures that), and --schedulers 3 alone measured the races,
// not the farm (37% of planned bookings lost, the fill 193 s against the
// variant's 74 s).
func (w *World) scaleWorkSplit(n int) string {
	if n > 1 && w.Opts.WorkSplit == "" {
		w.Configure(splitByAllocation)
	}
	return w.finishConfig(config.Default()).Scheduler.WorkSplit
}

// scaleSize is the farm of one SCALE run.
func (w *World) scaleSize() (hosts, frames, schedulers int) {
	hosts, frames = w.Opts.Hosts, w.Opts.Frames
	if hosts <= 0 {
		hosts = w.Opts.scale(scaleHosts)
	}
	if frames <= 0 {
		frames = w.Opts.scale(scaleFrames)
	}
	schedulers = max(w.Opts.Schedulers, 1)
	switch w.Variant.Name {
	case scaleBaseline.Name:
		hosts, frames = max(hosts/10, 10), max(frames/10, 1000)
	case scaleTwo.Name:
		schedulers = 2
	case scaleThree.Name:
		schedulers = 3
	}
	return hosts, frames, schedulers
}

func runScale(ctx context.Context, w *World) error {
	nHosts, nFrames, nScheds := w.scaleSize()
	split := w.scaleWorkSplit(nScheds)
	// The variants run one after another in this process: give the heap
	// an earlier run left back to the system first, so this run's RSS is
	// its own and not what the Go runtime kept from the last one.
	debug.FreeOSMemory()
	seedStart := time.Now()
	cores, err := w.seedScale(ctx, nHosts, nFrames)
	if err != nil {
		return err
	}
	seedSecs := time.Since(seedStart).Seconds()
	w.Note("%d hosts, %d cores, 3 allocations, %d shows, %d jobs, %d waiting frames, %d scheduler(s) (scheduler.work_split %s); seeded in %.0f s",
		nHosts, cores, scaleShows, scaleJobs, nFrames, nScheds, split, seedSecs)
	w.Metric("seconds to seed", seedSecs, Info, 0, "s")

	// The simulator's own connections log in as another role, so that
	// pg_stat_statements tells its statements from the product's.
	if err := w.labRole(ctx); err != nil {
		return err
	}
	w.ScaleMode()
	// Run times long beside a good fill, so the cold fill measures
	// booking; once full, frames end and are replaced at about
	// running frames / 90 s per second.
	runMin := scaleRunTime(nHosts)
	w.RunTimes(runMin, 2*runMin)
	if _, err := w.Pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		w.Note("pg_stat_statements: %v", err)
	}
	// Planning time too: a statement planned again on every call (a custom
	// plan) costs PostgreSQL's CPU that total_exec_time does not show.
	// For the sessions opened from here on: the schedulers', the sidecar's.
	if _, err := w.Pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{w.dbName}.Sanitize()+` SET pg_stat_statements.track_planning = on`); err != nil {
		w.Note("pg_stat_statements.track_planning: %v", err)
	}
	if _, err := w.Pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		w.Note("pg_stat_statements_reset: %v", err)
	}
	cpu0 := processCPU()
	heap0 := heapInUse()
	if err := w.Start(ctx, nScheds); err != nil {
		return err
	}
	children := len(w.childPIDs()) > 0
	if children {
		w.Note("the schedulers run as child processes of %s (cuesched scheduler); the sidecar, the fakes and the monitor in this one", w.Opts.SchedulerBin)
	}
	fillCPU0 := takeCPU()
	start := time.Now()
	samples := &scaleSamples{}
	w.Sample(func(ctx context.Context, t float64) { samples.take(ctx, w) })

	full := w.WaitFor(ctx, scaleFillLimit, func() bool { return w.LaunchedFill() >= 0.95 })
	fillSecs := time.Since(start).Seconds()
	fillCPU1 := takeCPU()
	if !full {
		w.Note("95%% not reached in %s (%.0f%%)", scaleFillLimit, w.LaunchedFill()*100)
	}
	heapFull := heapInUse()
	childHeapFull := w.childHeap()
	filled := w.Fake.Totals()
	// The statistics are still the seeded farm's: no frame RUNNING. On a
	// 1M-frame farm the ~90k started are below autovacuum's analyze
	// threshold (10% of the table), so the planner keeps believing that
	// no frame runs, and the completion path's frame UPDATE (pk_frame,
	// str_state = 'RUNNING', version) walks the state index over every
	// running frame: 270 ms of CPU a completion at 10,000 hosts, the
	// emulated Cuebot's bound once full. A farm that has been running has
	// statistics of a running farm; the sustained window measures that.
	if _, err := w.Pool.Exec(ctx, `ANALYZE`); err != nil {
		return err
	}
	// Sustained lifecycles: launches and completions over a window once
	// full (or once the fill deadline passed) and once the first frames
	// have had time to end.
	if err := Sleep(ctx, time.Until(start.Add(runMin+scaleSettle))); err != nil {
		return err
	}
	t0 := w.Fake.Totals()
	pipe0 := w.pipeline()
	emu0 := w.Emu.Stats()
	if err := Sleep(ctx, scaleSustain); err != nil {
		return err
	}
	t1 := w.Fake.Totals()
	emu1 := w.Emu.Stats()
	owners := heapOwners()
	rssEnd := procStatus(0, "VmRSS")
	w.Note("once full, over the %s window: %s", scaleSustain, w.pipeline().since(pipe0))
	cpu1 := processCPU()
	var childCPU float64
	var childHWM []int64
	for _, pid := range w.childPIDs() {
		childCPU += procCPU(pid)
		childHWM = append(childHWM, procStatus(pid, "VmHWM"))
	}
	childHeapEnd := w.childHeap()
	elapsed := time.Since(start).Seconds()
	launchRate := float64(t1.Launched-t0.Launched) / scaleSustain.Seconds()
	endRate := float64(t1.Ended-t0.Ended) / scaleSustain.Seconds()

	w.Metric("cold fill: seconds to 95% of bookable cores running", fillSecs, AtMost, 60, "s")
	w.fillBound(ctx, fillCPU0, fillCPU1, fillSecs, 60)
	w.Metric("fill at the end", math.Round(w.LaunchedFill()*1000)/10, Info, 0, "%")
	w.Metric("frames started per second during the fill", float64(filled.Launched)/fillSecs, Info, 0, "")
	w.Metric("sustained lifecycles/s once full (launches)", launchRate, Info, 0, "")
	w.Metric("sustained completions/s once full", endRate, Info, 0, "")
	// What the scheduler can re-book is what Cuebot's completion path
	// (emulated) has released in the database, not what the render nodes
	// finished: the launches follow this rate, not the one above.
	releaseRate := float64(emu1.Completed-emu0.Completed) / scaleSustain.Seconds()
	w.Metric("completions/s once full through the Cuebot emulator (procs released in the database)",
		releaseRate, Info, 0, "")
	// The window's completions are set by the workload: a frame runs
	// runMin to twice it, so what ends in the window was booked in the
	// run's first seconds, and a faster start shows more of it. What the
	// product controls is re-booking what was released.
	if releaseRate > 0 {
		w.Note("once full, what ends is the workload's: frames run %s to %s, so the window's completions are frames booked in the run's first %.0f s; launches are %.0f%% of the procs released in it",
			runMin, 2*runMin, (scaleSettle + scaleSustain).Seconds(), 100*launchRate/releaseRate)
	}
	rss := samples.maxRSS()
	if children {
		// The deployed scheduler's own memory: each child's peak RSS
		// (VmHWM, the kernel's high-water mark over its whole life).
		var worst int64
		var each []string
		for _, b := range childHWM {
			worst = max(worst, b)
			each = append(each, fmt.Sprintf("%d", b>>20))
		}
		w.Metric("scheduler RSS, max per scheduler process (VmHWM)", float64(worst>>20), AtMost, 1024, " MiB")
		w.Note("scheduler processes' peak RSS: %s MiB; Go heap in use at full: %s MiB, at the end of the window: %s MiB",
			strings.Join(each, ", "), mibList(childHeapFull), mibList(childHeapEnd))
		w.Metric("simulator process RSS, max (sidecar, fake RQD, Cuebot emulator, monitor)", float64(rss>>20), Info, 0, " MiB")
		var heapAtFull int64
		for _, b := range childHeapFull {
			heapAtFull = max(heapAtFull, b)
		}
		w.Metric("scheduler Go heap in use at full, per host (host cache + in flight; upper bound)",
			float64(heapAtFull)/float64(nHosts), Info, 0, " B")
	} else {
		w.Metric("process RSS, max (schedulers + sidecar + fakes in one process)", float64(rss>>20), AtMost, 1024, " MiB")
		w.Metric("Go heap growth per host, scheduler start to full (host cache + in flight; upper bound)",
			float64(max(heapFull-heap0, 0))/float64(nHosts), Info, 0, " B")
		// The process holds every scheduler, the sidecar and the fakes: the
		// heap each one's code allocated tells the schedulers' own share.
		// The goal is RSS <= 1 GiB; at GOGC=100 a Go heap peaks near twice
		// what is live, so a scheduler of its own would hold about twice this.
		w.Metric("Go heap in use allocated by scheduler code, per scheduler, end of the window (RSS goal 1 GiB = twice this)",
			float64(owners["scheduler"]>>20)/float64(nScheds), AtMost, 512, " MiB")
	}
	w.Note("at the end of the window: process RSS %d MiB; Go heap in use by the code that allocated it (sampled heap profile): "+
		"schedulers %d MiB, sidecar %d MiB, simulator (fake RQD, Cuebot emulator, monitor, seeding) %d MiB, other (runtime, pools' own goroutines) %d MiB",
		rssEnd>>20, owners["scheduler"]>>20, owners["sidecar"]>>20, owners["simulator"]>>20, owners["other"]>>20)
	w.Metric("host-cache staleness p99 (WAL lag)", samples.p99Staleness(), Info, 0, "s")
	w.Metric("replication slot lag p99", samples.p99SlotLag()/1024, Info, 0, " KiB")

	launched := float64(t1.Launched)
	st, err := w.statements(ctx)
	if err != nil {
		w.Note("pg_stat_statements: %v", err)
	} else if launched > 0 {
		p := st.product
		w.Metric("product statements per dispatched frame", p.calls/launched, Info, 0, "")
		w.Metric("product rows per dispatched frame", p.rows/launched, Info, 0, "")
		w.Metric("product buffer hits per dispatched frame", p.hits/launched, Info, 0, "")
		w.Metric("product DB time per dispatched frame", p.ms/launched, Info, 0, " ms")
		if p.plans > 0 {
			w.Metric("product planning time per dispatched frame (beside the DB time above)", p.planMs/launched, Info, 0, " ms")
		}
		// PostgreSQL's JIT on the product's statements (jit = on by
		// default): a statement the planner over-estimates is compiled on
		// every call, which can cost far more than the statement.
		w.Note("product statements JIT-compiled: %.0f functions, %.0f ms of compilation", p.jitFns, p.jitMs)
		w.Metric("simulator statements per dispatched frame (Cuebot emulator, monitor)", st.lab.calls/launched, Info, 0, "")
		if st.jobsMean >= 0 {
			w.Metric("job query (pendingSQL) mean", st.jobsMean, Info, 0, " ms")
		}
		if st.layersMean >= 0 {
			w.Metric("layer query (layersSQL) mean", st.layersMean, Info, 0, " ms")
		}
		if st.waitingMean >= 0 {
			w.Metric("waiting-frames count (scheduler_waiting_frames) mean", st.waitingMean, Info, 0, " ms")
			w.Note("waiting-frames count: %.0f calls (queue.waiting_stats_interval)", st.waitingCalls)
		}
		if st.layersPlanMean >= 0 {
			w.Metric("layer query (layersSQL) planning a call", st.layersPlanMean, Info, 0, " ms")
			w.Metric("layer query (layersSQL) calls planned", st.layersPlanned*100, Info, 0, "%")
		}
		for _, top := range st.top {
			w.Note("product statement: %s", top)
		}
	}
	planned := w.Counter("scheduler_bookings_planned_total", "", "")
	lost := w.Counter("scheduler_bookings_lost_total", "", "")
	if planned > 0 {
		w.Metric("races lost (share of planned bookings)", lost/planned*100, Info, 0, "%")
	} else {
		w.Note("races lost: no scheduler_bookings_planned_total in this build (branch scale-shard adds it)")
	}
	// CPU: the Go processes, and PostgreSQL's backends by who they serve.
	goCPU := (cpu1 - cpu0).Seconds()
	pgProduct, pgLab := w.backendCPU(ctx)
	if children {
		w.Metric("CPU: scheduler processes", childCPU/elapsed*100, Info, 0, "% of a core")
		w.Metric("CPU: simulator process (sidecar, fake RQD, emulator, monitor)", goCPU/elapsed*100, Info, 0, "% of a core")
	} else {
		w.Metric("CPU: Go process (schedulers, sidecar, fake RQD, emulator, monitor)", goCPU/elapsed*100, Info, 0, "% of a core")
	}
	w.Metric("CPU: PostgreSQL serving the product", pgProduct/elapsed*100, Info, 0, "% of a core")
	w.Metric("CPU: PostgreSQL serving the simulator", pgLab/elapsed*100, Info, 0, "% of a core")
	if children {
		w.Note("CPU shares of the whole run (%.0f s)", elapsed)
	} else {
		w.Note("CPU shares of the whole run (%.0f s); the Go process's own split, from a pprof of COLDFILL at 10,000 hosts: fake RQD ~6%%, lab/sim ~11%%, the rest the product", elapsed)
	}
	return nil
}

// scaleRunTime is the shortest frame run time (the longest is twice it):
// 60 s per 2,000 hosts, so that at the booking rates of this 2-core box
// frames do not end before the fill is judged (at 10,000 hosts a minute's
// frames ended as fast as they were booked, and the farm never filled);
// the sustained rates are read once the first frames have ended.
func scaleRunTime(hosts int) time.Duration {
	return time.Duration(max(1, (hosts+1999)/2000)) * time.Minute
}

// seedScale seeds the farm and returns its cores.
func (w *World) seedScale(ctx context.Context, nHosts, nFrames int) (int, error) {
	type allocSpec struct{ name, tag string }
	allocs := []allocSpec{{"sim.general", "general"}, {"sim.fx", "fx"}, {"sim.gpu", "gpu"}}
	ids := make([]string, len(allocs))
	for i, a := range allocs {
		var err error
		if ids[i], err = w.Seed.Alloc(ctx, w.Facility, a.name, a.tag); err != nil {
			return 0, err
		}
	}
	sizes := []int{16, 32, 48, 64, 40}
	allocCores := make([]int, len(allocs))
	specs := make([]farmseed.HostSpec, 0, nHosts)
	for i := 0; i < nHosts; i++ {
		h := farmseed.HostSpec{Name: fmt.Sprintf("s%06d", i)}
		a := 0
		switch {
		case i%10 == 9: // a tenth: GPU hosts, 8 cores and 2 GPUs
			a = 2
			h.Cores, h.GPUs, h.GPUMemKB = 8, 2, 32*gb
		case i%10 >= 6:
			a = 1
			h.Cores = sizes[i%len(sizes)]
		default:
			h.Cores = sizes[i%len(sizes)]
		}
		h.Alloc, h.AllocTag, h.MemKB = ids[a], allocs[a].tag, int64(h.Cores)*4*gb
		allocCores[a] += h.Cores
		specs = append(specs, h)
	}
	if _, err := w.Seed.Hosts(ctx, specs...); err != nil {
		return 0, err
	}
	cores := 0
	for _, c := range allocCores {
		cores += c
	}
	shows := make([]farmseed.Show, scaleShows)
	for i := range shows {
		var err error
		if shows[i], err = w.Seed.Show(ctx, fmt.Sprintf("show%02d", i), true); err != nil {
			return 0, err
		}
		for a := range allocs {
			// Each show's share of every allocation, bursting to all of it.
			if _, err := w.Seed.Subscribe(ctx, shows[i], ids[a], allocCores[a]/scaleShows, allocCores[a]); err != nil {
				return 0, err
			}
		}
	}
	// 600 jobs, 10 per show, in batches of 60 (one COPY of frames each).
	perJob := max(nFrames/scaleJobs, 1)
	var batch []farmseed.JobSpec
	for j := 0; j < scaleJobs; j++ {
		show := shows[j%scaleShows]
		var layer farmseed.LayerSpec
		switch j % 10 {
		case 9:
			layer = farmseed.LayerSpec{Name: "gpu", Tags: []string{"gpu"}, Frames: perJob, Cores: 4, MemKB: 8 * gb, GPUs: 1, GPUMemKB: 8 * gb}
		case 6, 7, 8:
			layer = farmseed.LayerSpec{Name: "fx", Tags: []string{"fx"}, Frames: perJob, Cores: 4, MemKB: 8 * gb}
		default:
			layer = farmseed.LayerSpec{Name: "render", Tags: []string{"general"}, Frames: perJob, Cores: 4, MemKB: 8 * gb}
		}
		batch = append(batch, farmseed.JobSpec{Name: fmt.Sprintf("scale%04d", j), Show: show, Facility: w.Facility,
			Priority: 50 + j%10, MaxCores: farmseed.Uncapped, Layers: []farmseed.LayerSpec{layer}})
		if len(batch) == scaleShows || j == scaleJobs-1 {
			if _, err := w.Seed.Jobs(ctx, batch...); err != nil {
				return 0, err
			}
			batch = batch[:0]
		}
	}
	if _, err := w.Pool.Exec(ctx, `ANALYZE`); err != nil {
		return 0, err
	}
	return cores, nil
}

// labRole moves the world's own pool (the Cuebot emulator, the monitor,
// the audit) to a role of its own, so pg_stat_statements and the backends'
// CPU tell its load from the product's.
func (w *World) labRole(ctx context.Context) error {
	if _, err := w.Pool.Exec(ctx, `DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '`+scaleLabRole+`') THEN
			CREATE ROLE `+scaleLabRole+` LOGIN SUPERUSER;
		END IF; END $$`); err != nil {
		return fmt.Errorf("lab role: %w", err)
	}
	pc, err := pgxpool.ParseConfig(w.DBURL)
	if err != nil {
		return err
	}
	pc.ConnConfig.User = scaleLabRole
	pc.ConnConfig.RuntimeParams["application_name"] = "cuesched-lab/simulator"
	pc.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	old := w.Pool
	w.Pool = pool
	w.Seed = &farmseed.Seeder{DB: pool}
	old.Close()
	return nil
}

// stmtSums: jitMs is the time PostgreSQL spent compiling statements
// (JIT: generation, inlining, optimisation, emission), jitFns the functions
// it compiled.
type stmtSums struct{ calls, rows, hits, ms, planMs, plans, jitMs, jitFns float64 }

type scaleStatements struct {
	product, lab         stmtSums
	jobsMean, layersMean float64 // ms; -1 when not found
	// waitingMean and waitingCalls: the waiting-frames count
	// (scheduler_waiting_frames, package explain); -1 when not found.
	waitingMean, waitingCalls float64
	// layersPlanMean is layersSQL's planning time a plan (ms) and
	// layersPlanned the share of its calls that were planned (-1: not found).
	layersPlanMean, layersPlanned float64
	top                           []string
}

// statements reads pg_stat_statements of the scenario's database since the
// reset at Start, split by role.
func (w *World) statements(ctx context.Context) (scaleStatements, error) {
	out := scaleStatements{jobsMean: -1, layersMean: -1, layersPlanMean: -1, layersPlanned: -1, waitingMean: -1}
	rows, err := w.Pool.Query(ctx, `SELECT r.rolname = $1, s.calls::float8, s.rows::float8, s.shared_blks_hit::float8,
		s.total_exec_time, s.mean_exec_time, s.total_plan_time, s.plans::float8,
		s.jit_functions::float8, s.jit_generation_time + s.jit_inlining_time + s.jit_optimization_time + s.jit_emission_time,
		left(regexp_replace(s.query, '\s+', ' ', 'g'), 400)
		FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid
		JOIN pg_database d ON d.oid = s.dbid AND d.datname = current_database()
		ORDER BY s.total_exec_time DESC`, scaleLabRole)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var lab bool
		var calls, nrows, hits, total, mean, planTotal, plans, jitFns, jitMs float64
		var q string
		if err := rows.Scan(&lab, &calls, &nrows, &hits, &total, &mean, &planTotal, &plans, &jitFns, &jitMs, &q); err != nil {
			return out, err
		}
		sum := &out.product
		if lab {
			sum = &out.lab
		}
		sum.calls += calls
		sum.rows += nrows
		sum.hits += hits
		sum.ms += total
		sum.planMs += planTotal
		sum.plans += plans
		sum.jitFns += jitFns
		sum.jitMs += jitMs
		if lab {
			continue
		}
		q = strings.TrimSpace(q)
		switch {
		case out.jobsMean < 0 && strings.Contains(q, "WITH live AS"):
			out.jobsMean = mean
		case out.waitingMean < 0 && strings.HasPrefix(q, "WITH gpuwant AS"):
			out.waitingMean, out.waitingCalls = mean, calls
		case out.layersMean < 0 && strings.HasPrefix(q, "WITH lay AS MATERIALIZED"):
			out.layersMean = mean
			if plans > 0 && calls > 0 {
				out.layersPlanMean, out.layersPlanned = planTotal/plans, plans/calls
			}
		}
		if len(out.top) < 5 {
			out.top = append(out.top, fmt.Sprintf("%.0f ms in %.0f calls (%.2f ms each), planned %.0f times (%.0f ms): %.90s",
				total, calls, mean, plans, planTotal, q))
		}
	}
	return out, rows.Err()
}

// backendCPU sums the CPU seconds of this database's PostgreSQL backends
// (from /proc) by whom they serve: the simulator's role, or the product
// (schedulers, sidecar). Backends that already exited are not counted.
func (w *World) backendCPU(ctx context.Context) (product, lab float64) {
	rows, err := w.Pool.Query(ctx, `SELECT pid, usename = $1 FROM pg_stat_activity WHERE datname = current_database()`, scaleLabRole)
	if err != nil {
		return 0, 0
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		var isLab bool
		if rows.Scan(&pid, &isLab) != nil {
			continue
		}
		secs := procCPU(pid)
		if isLab {
			lab += secs
		} else {
			product += secs
		}
	}
	return product, lab
}

// procCPU is a process's user+system CPU seconds (0 if unreadable).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childHeap is each child scheduler's Go heap in use
// (go_memstats_heap_inuse_bytes from its /metrics).
func (w *World) childHeap() []int64 {
	var out []int64
	for _, in := range w.scheds {
		if in.child == nil || in.dead {
			continue
		}
		v, _ := in.gauge("go_memstats_heap_inuse_bytes")
		out = append(out, int64(v))
	}
	return out
}

func mibList(b []int64) string {
	var parts []string
	for _, v := range b {
		parts = append(parts, fmt.Sprintf("%d", v>>20))
	}
	return strings.Join(parts, ", ")
}

// scaleSamples are what the monitor's ticks sample once a second.
type scaleSamples struct {
	mu        sync.Mutex
	last      time.Time
	rss       []int64
	staleness []float64
	slotLag   []float64
}

func (s *scaleSamples) take(ctx context.Context, w *World) {
	s.mu.Lock()
	due := time.Since(s.last) >= time.Second
	if due {
		s.last = time.Now()
	}
	s.mu.Unlock()
	if !due {
		return
	}
	rss := procStatus(0, "VmRSS")
	worst := w.cacheStaleness()
	lag := -1.0
	if err := w.Pool.QueryRow(ctx, `SELECT COALESCE(max(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)), 0)::float8
		FROM pg_replication_slots WHERE database = current_database()`).Scan(&lag); err != nil {
		lag = -1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rss = append(s.rss, rss)
	s.staleness = append(s.staleness, worst)
	if lag >= 0 {
		s.slotLag = append(s.slotLag, lag)
	}
}

// cacheStaleness is the largest host-cache staleness (WAL lag, seconds) of
// the live schedulers (scheduler_host_cache_staleness_seconds).
func (w *World) cacheStaleness() float64 {
	var worst float64
	for _, v := range w.Gauges("scheduler_host_cache_staleness_seconds") {
		worst = max(worst, v)
	}
	return worst
}

func (s *scaleSamples) maxRSS() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var m int64
	for _, v := range s.rss {
		m = max(m, v)
	}
	return m
}

func (s *scaleSamples) p99Staleness() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return p99(s.staleness)
}

func (s *scaleSamples) p99SlotLag() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return p99(s.slotLag)
}

func p99(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	c := append([]float64(nil), v...)
	sort.Float64s(c)
	return c[min(len(c)-1, int(math.Ceil(0.99*float64(len(c))))-1)]
}

// heapInUse is the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// heapOwners attributes the live heap to the code that allocated it: the
// innermost frame of each allocation's stack that belongs to the
// schedulers (scheduler/, publisher/), the sidecar (sidecar/) or the
// simulator (lab/, shared/testkit/) names its owner; shared packages and
// libraries are charged to whoever called them, and an allocation with
// none of these on its stack (the runtime, a pool's own goroutines) is
// "other". The heap profile is sampled; sizes are unsampled as pprof does.
func heapOwners() map[string]int64 {
	// The profile is as of the last completed collection: two make it
	// current.
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, false)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, false); ok {
			recs = recs[:n]
			break
		}
	}
	rate := float64(runtime.MemProfileRate)
	out := map[string]int64{}
	for i := range recs {
		r := &recs[i]
		bytes, objs := r.InUseBytes(), r.InUseObjects()
		if bytes <= 0 || objs <= 0 {
			continue
		}
		scale := 1.0
		if rate > 1 {
			scale = 1 / (1 - math.Exp(-float64(bytes)/float64(objs)/rate))
		}
		out[heapOwner(r.Stack())] += int64(float64(bytes) * scale)
	}
	return out
}

func heapOwner(stk []uintptr) string {
	const mod = "github.com/cuesched/cuesched/"
	frames := runtime.CallersFrames(stk)
	for {
		f, more := frames.Next()
		if rest, ok := strings.CutPrefix(f.Function, mod); ok {
			switch {
			case strings.HasPrefix(rest, "scheduler"), strings.HasPrefix(rest, "publisher"):
				return "scheduler"
			case strings.HasPrefix(rest, "sidecar"):
				return "sidecar"
			case strings.HasPrefix(rest, "lab/"), strings.HasPrefix(rest, "shared/testkit/"):
				return "simulator"
			}
		}
		if !more {
			return "other"
		}
	}
}

// compareScale judges the per-frame database cost of the full farm against
// the 1/10 farm's (issue #28: within 1.2x), on the default run's result.
func compareScale(rs []Result) {
	if len(rs) < 2 {
		return
	}
	get := func(r Result, name string) (float64, bool) {
		for _, m := range r.Metrics {
			if m.Name == name {
				return m.Value, true
			}
		}
		return 0, false
	}
	var small *Result
	for i := range rs {
		if rs[i].Variant == scaleBaseline.Name {
			small = &rs[i]
		}
	}
	if small == nil {
		return
	}
	for _, name := range []string{"product DB time per dispatched frame", "product buffer hits per dispatched frame",
		"product statements per dispatched frame"} {
		big, ok1 := get(rs[0], name)
		little, ok2 := get(*small, name)
		if !ok1 || !ok2 || little <= 0 {
			continue
		}
		m := Metric{Name: name + ": full farm / tenth farm", Value: math.Round(big/little*100) / 100, Op: AtMost, Threshold: 1.2}
		if name != "product DB time per dispatched frame" {
			m.Op = Info
		}
		rs[0].Metrics = append(rs[0].Metrics, m)
	}
	var lines []string
	for _, r := range rs {
		if v, ok := get(r, "product statements per dispatched frame"); ok {
			lines = append(lines, fmt.Sprintf("%s %.2f", orDefault(r.Variant, "default"), v))
		}
	}
	if len(lines) > 0 {
		rs[0].Notes = append(rs[0].Notes, "statements per frame by run: "+strings.Join(lines, "; "))
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// pipelineCounts are the schedulers' pass and batch counters at one time.
type pipelineCounts struct {
	passes, stops             map[string]float64
	planned, delivered        float64
	noCandidate, transactions float64
}

func (w *World) pipeline() pipelineCounts {
	return pipelineCounts{
		passes:       w.CounterBy("scheduler_passes_total", "reason"),
		stops:        w.CounterBy("scheduler_dispatch_batches_total", "stop"),
		planned:      w.Counter("scheduler_pass_planned_frames_total", "", ""),
		delivered:    w.Counter("scheduler_pass_delivered_frames_total", "", ""),
		noCandidate:  w.Counter("scheduler_no_candidate_iterations_total", "", ""),
		transactions: w.histCount("scheduler_dispatch_transaction_duration_seconds"),
	}
}

// since says what the pipeline did between p0 and p: passes by how they
// ended, host batches by stop, booking transactions, frames planned and
// delivered by the passes, and layers that found no host.
func (p pipelineCounts) since(p0 pipelineCounts) string {
	diff := func(a, b map[string]float64) string {
		var keys []string
		for k, v := range a {
			if v-b[k] > 0 {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, a[k]-b[k]))
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprintf("passes {%s}; host batches {%s} in %.0f transactions; pass frames planned %.0f, delivered %.0f; no-candidate layer iterations %.0f",
		diff(p.passes, p0.passes), diff(p.stops, p0.stops), p.transactions-p0.transactions,
		p.planned-p0.planned, p.delivered-p0.delivered, p.noCandidate-p0.noCandidate)
}
