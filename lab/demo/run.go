package demo

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/cuesched/cuesched/shared/config"
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

	lastPrint time.Time
}

// OK reports whether the run showed what the demo promises.
func (s Summary) OK(untilDrained bool) bool {
	return (!untilDrained || s.Drained) && s.DoubleLaunches == 0 && len(s.BurstViolations) == 0 &&
		s.Drifts == 0 && s.UnmanagedMoved == 0 && s.Launches == s.UniqueFrames
}

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

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := prometheus.NewRegistry()

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
	sc, err := sidecar.New(sidecar.Config{DatabaseURL: e.DBURL, SlotName: "cuesched_sidecar_demo", CreateSlot: true,
		Logger: o.Logger.Named("sidecar"), Registerer: reg}, rdb)
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := sc.Run(runCtx); err != nil && runCtx.Err() == nil {
			errs <- fmt.Errorf("sidecar: %w", err)
		}
	}()

	// The scheduler, configured for a responsive demo.
	cfg := config.Default()
	cfg.Database.URL = e.DBURL
	cfg.Accounting.RedisURL = e.RedisURL
	cfg.Accounting.RecomputeInterval = config.Duration(15 * time.Second)
	cfg.Accounting.LimitReseedInterval = config.Duration(30 * time.Second)
	cfg.Queue.ClusterEmptySleep = config.Duration(500 * time.Millisecond)
	cfg.Queue.ClusterSaturatedSleep = config.Duration(200 * time.Millisecond)
	cfg.Queue.ActiveScanInterval = config.Duration(500 * time.Millisecond)
	cfg.Queue.LayerBackoffMax = config.Duration(2 * time.Second)
	cfg.Scheduler.Facility = "spi"
	sched, err := scheduler.New(runCtx, cfg, scheduler.Deps{
		Redis: rdb, RQDResolve: fake.Resolve, Logger: o.Logger.Named("scheduler"), Registerer: reg,
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

	sum, runErr := watch(runCtx, o, e, rdb, fake, errs)
	if sum.Drained {
		// The queue drained in Postgres; give the sidecar the moment it
		// needs to apply the last releases to Redis before the audit.
		if err := waitSidecarCaughtUp(runCtx, e, sc, 60*time.Second); err != nil {
			fmt.Fprintf(o.Out, "warning: %v\n", err)
		}
	}
	cancel()
	wg.Wait()

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
	printSummary(o, e, sum)
	if runErr != nil {
		return runErr
	}
	if !sum.OK(o.UntilDrained) {
		return errors.New("the run did not hold its guarantees (see the summary)")
	}
	return nil
}

type showSubs struct {
	show  string
	alloc string
	key   string
}

// watch samples progress until a stop condition and returns the summary.
func watch(ctx context.Context, o Options, e *Env, rdb redis.UniversalClient, fake *fakerqd.Server, errs <-chan error) (Summary, error) {
	start := time.Now()
	var subs []showSubs
	for _, sh := range e.Farm.Shows {
		if !sh.Managed {
			continue
		}
		for alloc := range sh.Subs {
			subs = append(subs, showSubs{show: sh.Name, alloc: alloc, key: publisher.SubKey(sh.ID, e.Farm.Allocs[alloc])})
		}
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].show+subs[i].alloc < subs[j].show+subs[j].alloc })
	unmanagedBefore, _ := unmanagedWaiting(ctx, e)

	var sum Summary
	violations := map[string]bool{}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	var deadline <-chan time.Time
	if o.Duration > 0 {
		deadline = time.After(o.Duration)
	}
	lastLines := 0
	prevDone, prevAt := 0, start
	rate := 0.0
	var runErr error
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
		case <-tick.C:
		}
		c, err := Sample(ctx, e.Pool)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			continue
		}
		done := c.Succeeded + c.Dead
		if dt := time.Since(prevAt).Seconds(); dt >= 1 {
			rate = float64(done-prevDone) / dt
			prevDone, prevAt = done, time.Now()
		}
		lines := []string{
			fmt.Sprintf("elapsed %5.1fs   waiting %6d   running %5d   done %6d (dead %d)   %6.1f frames/s",
				time.Since(start).Seconds(), c.Waiting, c.Running, done, c.Dead, rate),
			fmt.Sprintf("managed shows: [%s] %d left", bar(e.Farm.Frames-c.ManagedLeft-unmanagedBefore, e.Farm.Frames-unmanagedBefore, 40), c.ManagedLeft),
		}
		for _, s := range subs {
			h, err := rdb.HMGet(ctx, s.key, "int_cores", "burst").Result()
			if err != nil || len(h) < 2 {
				continue
			}
			cores, burst := toInt(h[0]), toInt(h[1])
			mark := ""
			if burst > 0 && cores > burst {
				mark = "  EXCEEDED"
				violations[fmt.Sprintf("%s/%s: %d > burst %d", s.show, s.alloc, cores, burst)] = true
			}
			lines = append(lines, fmt.Sprintf("  %-9s %-8s %5d / %5d cores of burst [%s]%s", s.show, s.alloc, cores, burst, bar(int(cores), int(burst), 20), mark))
		}
		if o.Interactive {
			if lastLines > 0 {
				fmt.Fprintf(o.Out, "\033[%dA", lastLines)
			}
			for _, l := range lines {
				fmt.Fprintf(o.Out, "\033[K%s\n", l)
			}
			lastLines = len(lines)
		} else if time.Since(prevPrint(&sum)) >= 2*time.Second {
			fmt.Fprintln(o.Out, lines[0])
			sum.lastPrint = time.Now()
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

func prevPrint(s *Summary) time.Time { return s.lastPrint }

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

func printSummary(o Options, e *Env, s Summary) {
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
}
