package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/scheduler/accounting"
	"github.com/cuesched/cuesched/shared/appname"
	"github.com/cuesched/cuesched/shared/cli"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/metrics"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/sidecar"
)

// Summary is the outcome of a demo run.
type Summary struct {
	Elapsed         time.Duration
	Final           Counts
	Launches        int
	UniqueFrames    int
	DoubleLaunches  int
	BurstViolations []string
	Drifts          int
	Drained         bool
	UnmanagedMoved  int // frames of Cuebot-managed shows we touched (must be 0)
	// Chart is the PNG written at the end ("" if none).
	Chart string

	timeline *timeline
}

// OK reports whether the run showed what the demo promises.
func (s Summary) OK(untilDrained bool) bool {
	return (!untilDrained || s.Drained) && s.DoubleLaunches == 0 && len(s.BurstViolations) == 0 &&
		s.Drifts == 0 && s.UnmanagedMoved == 0 && s.Launches == s.UniqueFrames
}

// ErrGuarantees is Run's error when the farm ran but did not hold its
// promises (the summary says which).
var ErrGuarantees = errors.New("the run did not hold its guarantees (see the summary)")

// Run starts the environment and the farm's processes, reports progress
// until the queue drains (UntilDrained), Duration passes or ctx ends, and
// prints a summary. It returns an error when the run did not hold its
// promises (frames launched twice, a burst exceeded, Redis drift at the end,
// a Cuebot-managed show touched, or not drained when asked to drain).
func Run(ctx context.Context, o Options) error {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	fmt.Fprintln(o.Out, "cuesched-lab demo: starting an embedded farm")
	e, err := Start(ctx, o)
	if err != nil {
		return err
	}
	defer e.Close()

	// The wide job is "submitted" a few seconds into the run, when the
	// farm is full (watch resumes it): paused until then.
	if e.Farm.WideJob != "" {
		if _, err := e.Pool.Exec(ctx, `UPDATE job SET b_paused = true WHERE str_name = $1`, e.Farm.WideJob); err != nil {
			return fmt.Errorf("pause the wide job: %w", err)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The scheduler and the sidecar each have their registry and
	// /metrics endpoint, as the deployed daemons do (two scrape targets).
	schedReg, sidecarReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	reg := prometheus.Gatherers{schedReg, sidecarReg}
	var endpoints MetricsEndpoints
	for _, m := range []struct {
		addr string
		reg  *prometheus.Registry
		url  *string
	}{
		{o.SchedulerMetricsAddr, schedReg, &endpoints.Scheduler},
		{o.SidecarMetricsAddr, sidecarReg, &endpoints.Sidecar},
	} {
		addr := m.addr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		msrv, err := metrics.Serve(addr, m.reg, metrics.NewHealth(), o.Logger, metrics.ServeOptions{})
		if err != nil {
			return fmt.Errorf("metrics endpoint %s: %w", addr, err)
		}
		defer func() {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			_ = msrv.Shutdown(sctx)
		}()
		*m.url = msrv.Addr()
	}
	if o.PrometheusConfig != "" {
		if err := WritePrometheusConfig(o.PrometheusConfig, endpoints, o.RulesDir); err != nil {
			return err
		}
	}
	if o.MetricsReady != nil {
		if err := o.MetricsReady(endpoints); err != nil {
			return err
		}
	}

	// Cuebot's completion path and the fake RQD.
	emu := cuebotemu.New(e.Pool, o.Logger.Named("cuebot"))
	fake, err := fakerqd.Start(fakerqd.Config{
		Default: fakerqd.Behavior{RunTimeFunc: func(rf *rqdpb.RunFrame) time.Duration {
			name := rf.GetFrameName()
			if i := strings.IndexByte(name, '-'); i >= 0 {
				name = name[i+1:]
			}
			return e.Farm.RunTime(name)
		}},
		OnComplete: emu.FakeRQDCallback(runCtx, nil),
	})
	if err != nil {
		return err
	}
	defer fake.Stop()
	fmt.Fprintf(o.Out, "  fake RQD answering for %d hosts on %s\n", len(e.Farm.HostNames), fake.Addr())

	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: e.RedisURL, PoolSize: 32})
	if err != nil {
		return err
	}
	defer rdb.Close()

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	// The sidecar (it creates its slot, so start it first).
	// The daemons name their connections as in production, so `cuesched
	// status` finds them (cuesched-sidecar/demo, cuesched-scheduler/demo).
	sidecarURL, err := cli.WithAppName(e.DBURL, appname.RoleSidecar, "demo")
	if err != nil {
		return err
	}
	schedURL, err := cli.WithAppName(e.DBURL, appname.RoleScheduler, "demo")
	if err != nil {
		return err
	}
	sc, err := sidecar.New(sidecar.Config{DatabaseURL: sidecarURL, SlotName: "cuesched_sidecar_demo", CreateSlot: true,
		Logger: o.Logger.Named("sidecar"), Registerer: sidecarReg}, rdb)
	if err != nil {
		return err
	}
	// The sidecar stops last (its own context): on a stop before the
	// queue drained, the scheduler and the emulator stop first, then the
	// sidecar applies the releases already in the WAL, so the audit sees
	// a settled farm.
	sidecarCtx, sidecarCancel := context.WithCancel(ctx)
	defer sidecarCancel()
	var sidecarWG sync.WaitGroup
	sidecarWG.Add(1)
	go func() {
		defer sidecarWG.Done()
		if err := sc.Run(sidecarCtx); err != nil && sidecarCtx.Err() == nil {
			errs <- fmt.Errorf("sidecar: %w", err)
		}
	}()

	// The scheduler, configured for a responsive demo.
	cfg := config.Default()
	cfg.Database.URL = schedURL
	cfg.Accounting.RedisURL = e.RedisURL
	cfg.Accounting.RecomputeInterval = config.Duration(15 * time.Second)
	cfg.Accounting.LimitReseedInterval = config.Duration(30 * time.Second)
	cfg.Queue.ClusterEmptySleep = config.Duration(500 * time.Millisecond)
	cfg.Queue.ClusterSaturatedSleep = config.Duration(200 * time.Millisecond)
	cfg.Queue.ActiveScanInterval = config.Duration(500 * time.Millisecond)
	cfg.Queue.LayerBackoffMax = config.Duration(2 * time.Second)
	cfg.Scheduler.Facility = "spi"
	// One instance splitting by allocation owns every share after its first
	// step and books as with "none"; it shows the work-split metrics (the
	// dashboard's "Several instances" row) on the demo farm.
	cfg.Scheduler.WorkSplit = config.WorkSplitAllocation
	// A demo lasts a minute or two: wide frames reserve a host after 5 s
	// of being blocked (not 5 min), and the waiting-frame gauge on
	// /metrics is counted every 5 s (not 30 s).
	cfg.Queue.Reservations.BlockedFor = config.Duration(5 * time.Second)
	cfg.Queue.Reservations.RefreshInterval = config.Duration(250 * time.Millisecond)
	cfg.Queue.WaitingStatsInterval = config.Duration(5 * time.Second)
	sched, err := scheduler.New(runCtx, cfg, scheduler.Deps{
		Redis: rdb, RQDResolve: fake.Resolve, Logger: o.Logger.Named("scheduler"), Registerer: schedReg,
	})
	if err != nil {
		return err
	}
	defer sched.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := sched.Run(runCtx); err != nil && runCtx.Err() == nil {
			errs <- fmt.Errorf("scheduler: %w", err)
		}
	}()
	fmt.Fprintln(o.Out, "  scheduler, sidecar and Cuebot emulator running")
	fmt.Fprintln(o.Out)
	writeEnv(o.Out, e, endpoints, o.PrometheusConfig, !o.Keep)
	fmt.Fprintln(o.Out)

	sum, runErr := watch(runCtx, o, e, rdb, fake, errs, cfg.Queue.GPUProtection, reg)
	if sum.Drained {
		// The queue drained in Postgres; give the sidecar the moment it
		// needs to apply the last releases to Redis before the audit.
		if err := waitSidecarCaughtUp(runCtx, e, sc, 60*time.Second); err != nil {
			fmt.Fprintf(o.Out, "warning: %v\n", err)
		}
	}
	// --keep leaves the farm up (scheduler, sidecar, fake RQD, emulator)
	// once the run ends on its own; the audit then runs beside them on
	// the drained farm.
	keep := o.Keep && runErr == nil && ctx.Err() == nil
	if !keep {
		cancel()
		wg.Wait()
		if !sum.Drained && ctx.Err() == nil {
			// Stopped mid-flight (--duration): bookings and completions
			// have stopped; let the sidecar apply what the WAL holds.
			if err := waitSidecarCaughtUp(ctx, e, sc, 60*time.Second); err != nil {
				fmt.Fprintf(o.Out, "warning: %v\n", err)
			}
		}
		sidecarCancel()
		sidecarWG.Wait()
	}

	// Final audit: Redis against SUM(proc) once everything has stopped.
	actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer acancel()
	pub, err := publisher.New(rdb, publisher.Options{})
	if err == nil {
		rep, aerr := accounting.Audit(actx, e.Pool, pub)
		if aerr != nil {
			err = aerr
		} else {
			sum.Drifts = len(rep.Drifts)
			if sum.Drifts > 0 {
				rep.Write(o.Out)
			}
		}
	}
	if err != nil {
		fmt.Fprintf(o.Out, "audit failed: %v\n", err)
		sum.Drifts = -1
	}
	sum.Final, _ = Sample(actx, e.Pool)
	sum.Chart = o.ChartPath
	if sum.Chart == "" {
		sum.Chart = filepath.Join(os.TempDir(), "cuesched-demo-"+time.Now().Format("20060102-150405")+".png")
	}
	if err := writeChartFile(sum.Chart, sum.timeline, e); err != nil {
		fmt.Fprintf(o.Out, "chart: %v\n", err)
		sum.Chart = ""
	}
	printSummary(o, e, sum, reg)
	var verdict error
	switch {
	case runErr != nil:
		verdict = runErr
	case !sum.OK(o.UntilDrained):
		verdict = ErrGuarantees
	}
	if keep {
		fmt.Fprintln(o.Out)
		fmt.Fprintln(o.Out, "the farm stays up (--keep): scheduler, sidecar, fake RQD and Cuebot emulator keep running until Ctrl-C")
		writeEnv(o.Out, e, endpoints, o.PrometheusConfig, false)
		<-ctx.Done()
		cancel()
		wg.Wait()
		sidecarCancel()
		sidecarWG.Wait()
		fmt.Fprintln(o.Out, "stopped")
	}
	return verdict
}

func writeChartFile(path string, tl *timeline, e *Env) error {
	if tl == nil || len(tl.points) < 2 {
		return errors.New("too few samples to draw")
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = writeChart(f, tl, "cuesched-lab demo: "+e.Farm.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeEnv prints what to paste into another terminal to look at the
// running farm with the real tools.
func writeEnv(out io.Writer, e *Env, m MetricsEndpoints, promConfig string, keepHint bool) {
	job := e.Farm.LimitedJob
	if job == "" && len(e.Farm.JobNames) > 0 {
		job = e.Farm.JobNames[0]
	}
	fmt.Fprintln(out, "  look at the farm from another terminal while it runs (paste these):")
	fmt.Fprintf(out, "    export CUESCHED_DATABASE_URL='%s'\n", e.DBURL)
	fmt.Fprintf(out, "    export CUESCHED_ACCOUNTING_REDIS_URL='%s'\n", e.RedisURL)
	fmt.Fprintln(out, "    bin/cuesched status --no-audit        # instances, leader, slots, seeded shows, reservations")
	fmt.Fprintf(out, "    bin/cuesched explain %s   # why its frames wait, per layer\n", job)
	fmt.Fprintln(out, "    bin/cuesched show list                # shows, booked cores against their bursts")
	fmt.Fprintln(out, "    bin/cuesched accounting audit         # Redis against SUM(proc)")
	fmt.Fprintf(out, "    curl -s http://%s/metrics | grep scheduler_waiting_frames\n", m.Scheduler)
	fmt.Fprintf(out, "    curl -s http://%s/metrics | grep sidecar_releases_total\n", m.Sidecar)
	writePrometheusHint(out, m, promConfig)
	if keepHint {
		fmt.Fprintln(out, "  (the farm is torn down when the run ends; --keep leaves it up until Ctrl-C)")
	}
}

type showSubs struct {
	show  string
	alloc string
	key   string
}

// watch samples progress until a stop condition and returns the summary.
// Every 500 ms it reads the frame counts and the subscriptions' booked
// cores; every 2 s it asks explain why the waiting frames wait.
func watch(ctx context.Context, o Options, e *Env, rdb redis.UniversalClient, fake *fakerqd.Server, errs <-chan error,
	gpuProtection bool, reg prometheus.Gatherer) (Summary, error) {
	start := time.Now()
	var subs []showSubs
	tl := &timeline{subs: map[string]*subUse{}}
	for _, sh := range e.Farm.Shows {
		if !sh.Managed {
			continue
		}
		tl.shows = append(tl.shows, sh.Name)
		for alloc, sb := range sh.Subs {
			subs = append(subs, showSubs{show: sh.Name, alloc: alloc, key: publisher.SubKey(sh.ID, e.Farm.Allocs[alloc])})
			tl.subs[sh.Name+"/"+alloc] = &subUse{size: sb[0] / 100, burst: sb[1] / 100}
		}
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].show+subs[i].alloc < subs[j].show+subs[j].alloc })
	unmanagedBefore, _ := unmanagedWaiting(ctx, e)

	sum := Summary{timeline: tl}
	violations := map[string]bool{}
	const every = 500 * time.Millisecond
	tick := time.NewTicker(every)
	defer tick.Stop()
	var deadline <-chan time.Time
	if o.Duration > 0 {
		deadline = time.After(o.Duration)
	}
	lastLines := 0
	prevDone, prevAt := 0, start
	rate := 0.0
	var (
		runErr    error
		why       *Waiting
		whyAt     time.Time
		lastPrint time.Time
	)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-errs:
			runErr = err
			break loop
		case <-deadline:
			break loop
		case <-o.Stop:
			break loop
		case <-tick.C:
		}
		c, err := Sample(ctx, e.Pool)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			continue
		}
		now := time.Now()
		if e.Farm.WideJob != "" && tl.wideAt == 0 && now.Sub(start) >= cmp.Or(o.WideAfter, wideAfter) {
			if _, err := e.Pool.Exec(ctx, `UPDATE job SET b_paused = false WHERE str_name = $1`, e.Farm.WideJob); err == nil {
				tl.wideAt = now.Sub(start).Seconds()
				if !o.Interactive {
					fmt.Fprintf(o.Out, "submitted %s: %d wide frames (24 cores each)\n", e.Farm.WideJob, wideFrames)
				}
			}
		}
		fresh := false
		if why == nil || now.Sub(whyAt) >= 2*time.Second {
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			w, err := SampleWaiting(wctx, e.Pool, gpuProtection)
			wcancel()
			if err == nil {
				why, whyAt, fresh = &w, now, true
			}
		}
		done := c.Succeeded + c.Dead
		if dt := now.Sub(prevAt).Seconds(); dt >= 1 {
			rate = float64(done-prevDone) / dt
			prevDone, prevAt = done, now
		}
		pt := point{T: now.Sub(start).Seconds(), Done: done, Running: c.Running, Cores: map[string]float64{}, Waiting: why, fresh: fresh}
		head := fmt.Sprintf("elapsed %5.1fs   waiting %6d   running %5d   done %6d (dead %d)   %6.1f frames/s",
			pt.T, c.Waiting, c.Running, done, c.Dead, rate)
		lines := []string{head,
			fmt.Sprintf("managed shows: [%s] %d left", bar(e.Farm.Frames-c.ManagedLeft-unmanagedBefore, e.Farm.Frames-unmanagedBefore, 40), c.ManagedLeft),
		}
		whyLine := "waiting: (asking explain)"
		if why != nil {
			whyLine = fmt.Sprintf("waiting %d: %s", why.Total, why.Line(why.ByHold, true))
		}
		lines = append(lines, whyLine)
		// Per show: what holds it, then its subscriptions against their bursts.
		type subRow struct {
			alloc              string
			cores, burst, size int64
		}
		rows := map[string][]subRow{}
		if h, err := subsPipeline(ctx, rdb, subs); err == nil {
			for i, s := range subs {
				cores, burst, size := h[i][0], h[i][1], h[i][2]
				rows[s.show] = append(rows[s.show], subRow{s.alloc, cores, burst, size})
				pt.Cores[s.show] += float64(cores)
				if burst > 0 && cores > burst {
					violations[fmt.Sprintf("%s/%s: %d > burst %d", s.show, s.alloc, cores, burst)] = true
				}
				u := tl.subs[s.show+"/"+s.alloc]
				if size > 0 {
					u.size = size
				}
				if u.size > 0 && cores > u.size {
					u.above += every
					u.peak = max(u.peak, float64(cores)/float64(u.size))
					u.peakCores = max(u.peakCores, cores)
				}
			}
		}
		for _, show := range tl.shows {
			held := "nothing waits"
			if why != nil && len(why.ByShow[show]) > 0 {
				n := 0
				for _, v := range why.ByShow[show] {
					n += v
				}
				held = fmt.Sprintf("waiting %d: %s", n, why.Line(why.ByShow[show], false))
			}
			lines = append(lines, fmt.Sprintf("  %-9s %s", show, held))
			for _, r := range rows[show] {
				mark := ""
				if r.burst > 0 && r.cores > r.burst {
					mark = "  EXCEEDED"
				}
				lines = append(lines, fmt.Sprintf("    %-8s %5d / %5d cores of burst [%s]%s", r.alloc, r.cores, r.burst, bar(int(r.cores), int(r.burst), 20), mark))
			}
		}
		if unmanagedBefore > 0 {
			lines = append(lines, fmt.Sprintf("  %-9s %d waiting: left to Cuebot (not scheduler-managed; no Cuebot dispatches in the demo)", unmanagedName(e), unmanagedBefore))
		}
		fams, _ := reg.Gather()
		tl.peakBackfills = max(tl.peakBackfills, metricSum(fams, "scheduler_reservations_backfills", nil))
		tl.peakReservations = max(tl.peakReservations, metricSum(fams, "scheduler_reservations_held", nil))
		tl.points = append(tl.points, pt)
		if o.Interactive {
			if lastLines > 0 {
				fmt.Fprintf(o.Out, "\033[%dA", lastLines)
			}
			for _, l := range lines {
				fmt.Fprintf(o.Out, "\033[K%s\n", l)
			}
			// A shorter view than the last one: clear what is left below.
			fmt.Fprint(o.Out, "\033[J")
			lastLines = len(lines)
		} else if now.Sub(lastPrint) >= 5*time.Second {
			// Without a terminal (CI, a pipe): one plain line, with the
			// top waiting reason.
			top := "(asking explain)"
			if why != nil {
				top = why.Top()
			}
			fmt.Fprintf(o.Out, "%s   top waiting reason: %s\n", head, top)
			lastPrint = now
		}
		if o.UntilDrained && c.ManagedLeft == 0 && c.Procs == 0 {
			sum.Drained = true
			break loop
		}
	}
	sum.Elapsed = time.Since(start)
	seen := map[string]int{}
	for _, l := range fake.Launches() {
		if l.Started && l.RunFrame != nil {
			seen[l.RunFrame.GetFrameId()]++
			sum.Launches++
		}
	}
	sum.UniqueFrames = len(seen)
	sum.DoubleLaunches = len(fake.DoubleLaunches())
	for v := range violations {
		sum.BurstViolations = append(sum.BurstViolations, v)
	}
	sort.Strings(sum.BurstViolations)
	after, _ := unmanagedWaiting(context.Background(), e)
	sum.UnmanagedMoved = unmanagedBefore - after
	return sum, runErr
}

// The wide job: its frames, and when it is resumed.
const (
	wideFrames = 4
	wideAfter  = 4 * time.Second
)

// unmanagedName names the Cuebot-managed shows.
func unmanagedName(e *Env) string {
	var ns []string
	for _, sh := range e.Farm.Shows {
		if !sh.Managed {
			ns = append(ns, sh.Name)
		}
	}
	return strings.Join(ns, ",")
}

// subsPipeline reads int_cores, burst and size of every subscription in
// one round trip.
func subsPipeline(ctx context.Context, rdb redis.UniversalClient, subs []showSubs) ([][3]int64, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(subs))
	for i, s := range subs {
		cmds[i] = pipe.HMGet(ctx, s.key, "int_cores", "burst", "size")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([][3]int64, len(subs))
	for i, c := range cmds {
		v := c.Val()
		if len(v) == 3 {
			out[i] = [3]int64{toInt(v[0]), toInt(v[1]), toInt(v[2])}
		}
	}
	return out, nil
}

// waitSidecarCaughtUp waits until the sidecar's Redis checkpoint covers the
// WAL written so far, i.e. every committed proc DELETE has been released.
func waitSidecarCaughtUp(ctx context.Context, e *Env, sc *sidecar.Sidecar, timeout time.Duration) error {
	var target pglogrepl.LSN
	if err := e.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan((*lsnText)(&target)); err != nil {
		return fmt.Errorf("read the WAL position: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for sc.Status().Checkpoint < target {
		if time.Now().After(deadline) {
			return fmt.Errorf("the sidecar did not catch up within %s (checkpoint %s, WAL %s)", timeout, sc.Status().Checkpoint, target)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// lsnText scans a pg_lsn rendered as text.
type lsnText pglogrepl.LSN

func (l *lsnText) Scan(src any) error {
	s, ok := src.(string)
	if !ok {
		return fmt.Errorf("lsn: unexpected %T", src)
	}
	v, err := pglogrepl.ParseLSN(s)
	*l = lsnText(v)
	return err
}

func unmanagedWaiting(ctx context.Context, e *Env) (int, error) {
	var n int
	err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM frame f JOIN job j USING (pk_job) JOIN show s ON s.pk_show = j.pk_show
		WHERE NOT s.b_scheduler_managed AND f.str_state = 'WAITING'`).Scan(&n)
	return n, err
}

func toInt(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func printSummary(o Options, e *Env, s Summary, reg prometheus.Gatherer) {
	c := s.Final
	fmt.Fprintln(o.Out)
	fmt.Fprintln(o.Out, "summary")
	fmt.Fprintf(o.Out, "  farm:                 %s\n", e.Farm)
	fmt.Fprintf(o.Out, "  elapsed:              %s\n", s.Elapsed.Round(time.Millisecond))
	done := c.Succeeded + c.Dead
	fmt.Fprintf(o.Out, "  frames:               %d succeeded, %d dead, %d running, %d waiting\n", c.Succeeded, c.Dead, c.Running, c.Waiting)
	if s.Elapsed > 0 {
		fmt.Fprintf(o.Out, "  throughput:           %.1f frames/s\n", float64(done)/s.Elapsed.Seconds())
	}
	fmt.Fprintf(o.Out, "  launches on RQD:      %d for %d distinct frames (retries of failed frames count again)\n", s.Launches, s.UniqueFrames)
	fmt.Fprintf(o.Out, "  double launches:      %d\n", s.DoubleLaunches)
	if len(s.BurstViolations) == 0 {
		fmt.Fprintln(o.Out, "  subscription bursts: never exceeded (sampled every 500 ms)")
	} else {
		fmt.Fprintf(o.Out, "  subscription bursts: EXCEEDED: %s\n", strings.Join(s.BurstViolations, "; "))
	}
	switch {
	case s.Drifts == 0:
		fmt.Fprintln(o.Out, "  Redis vs SUM(proc):   no drift (accounting audit)")
	case s.Drifts < 0:
		fmt.Fprintln(o.Out, "  Redis vs SUM(proc):   audit failed")
	default:
		fmt.Fprintf(o.Out, "  Redis vs SUM(proc):   %d differences\n", s.Drifts)
	}
	fmt.Fprintf(o.Out, "  Cuebot-managed show:  %d frames touched (must be 0)\n", s.UnmanagedMoved)
	if o.UntilDrained {
		if s.Drained {
			fmt.Fprintln(o.Out, "  queue:                drained")
		} else {
			fmt.Fprintln(o.Out, "  queue:                NOT drained")
		}
	}
	fmt.Fprintln(o.Out)
	fmt.Fprintln(o.Out, "the story of the run")
	if s.timeline != nil {
		writeStory(o.Out, s.timeline, reg, e.Farm.WideJob)
	}
	if s.Chart != "" {
		fmt.Fprintf(o.Out, "  chart:                %s (cores in use per show, waiting frames by reason)\n", s.Chart)
	}
}
