package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cuesched/cuesched/shared/appname"
	"github.com/cuesched/cuesched/shared/cli"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/daemon"
	"github.com/cuesched/cuesched/shared/logging"
	"github.com/cuesched/cuesched/shared/metrics"
	"github.com/cuesched/cuesched/shared/redact"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
)

const fakeRQDUsage = `usage: cuesched-lab fake-rqd [--listen ADDR] [--hosts NAME,NAME…] [--run-time D|MIN..MAX]
                        [--complete [--database-url URL | --config FILE]]
                        [--metrics-listen ADDR] [--log-level LEVEL] [--log-format text|json]

A stand-in for every RQD of a farm, to rehearse a rollout on a staging copy
of a Cuebot database without render nodes. NOT for production: no frame
really runs anywhere.

One gRPC server answers rqd.RqdInterface for any render host (or only the
--hosts given; the others answer UNAVAILABLE, like a host that is down).
Point the scheduler at it with rqd.address_override in its configuration
set to the --listen address: the scheduler then names the host in the
x-cuesched-host metadata of each call.
Each LaunchFrame is logged (host, job, frame, cores, memory); an accepted
frame "runs" for --run-time, then ends with exit status 0.

--complete reports each finished frame back through Cuebot's tables the way
Cuebot does on a FrameCompleteReport (frame SUCCEEDED, usage counters, proc
DELETE, host idle resources given back): the scheduler's sidecar sees the
DELETE and releases the booking in Redis. A report the database refuses (a
restart, a failover) is retried, as RQD retries its completion reports,
with a backoff from 100ms doubling to 5s, until it is accepted; at a stop
the reports still pending get 30s more, then they are dropped (logged: the
frame stays RUNNING until Cuebot's orphan check clears it). Database: --database-url, else
$CUESCHED_DATABASE_URL, else the database.url of --config FILE (the
scheduler's file will do). Without --complete nothing is written: finished
frames stay RUNNING in the database with their procs.

SIGTERM or SIGINT stops it. With --complete, frames still running are then
cleared as Cuebot clears a frame whose host lost it (proc released, frame
back to WAITING with exit status 299), unless --clear-on-stop=false.
/metrics, /healthz and /readyz are served on --metrics-listen when given.

exit status: 0 stopped cleanly; 1 could not start or a stop went wrong; 2
bad usage.
`

// fakeRQDOptions are the parsed flags of "cuesched-lab fake-rqd".
type fakeRQDOptions struct {
	listen        string
	hosts         []string
	rtMin, rtMax  time.Duration
	complete      bool
	dbURL         string
	clearOnStop   bool
	metricsListen string
	logLevel      string
	logFormat     string
}

// runFakeRQD is "cuesched-lab fake-rqd".
func runFakeRQD(ctx context.Context, c *cli.Env, args []string) int {
	const name = "cuesched-lab fake-rqd"
	o, code := parseFakeRQD(c, name, args)
	if code >= 0 {
		return code
	}
	cfg := config.Default()
	cfg.Logging = config.Logging{Level: o.logLevel, Format: o.logFormat}
	cfg.Metrics.Listen = o.metricsListen
	d, err := daemon.New("fake-rqd", cfg, c.Stderr, metrics.Build{Version: version, Revision: revision})
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	var emu *cuebotemu.Emulator
	if o.complete {
		dsn, err := cli.WithAppName(o.dbURL, appname.RoleFakeRQD, cli.InstanceName(""))
		if err != nil {
			fmt.Fprintf(c.Stderr, "%s: %v\n", name, redact.Error(err, o.dbURL))
			return 2
		}
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			fmt.Fprintf(c.Stderr, "%s: database: %v\n", name, redact.Error(err, dsn))
			return 2
		}
		defer pool.Close()
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = pool.Ping(pctx)
		cancel()
		if err != nil {
			fmt.Fprintf(c.Stderr, "%s: database: %v\n", name, redact.Error(err, dsn))
			return 1
		}
		d.Health.SetCheck("database", func() error {
			pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			return pool.Ping(pctx)
		})
		emu = cuebotemu.New(pool, d.Logger)
	}
	f := &fakeFarm{o: o, log: d.Logger, emu: emu, stopping: make(chan struct{})}
	f.register(d.Registry)
	if err := d.Run(ctx, f.run); err != nil {
		d.Logger.Error("fake RQD stopped", "error", err)
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// parseFakeRQD parses the flags; code is -1 to go on, else the exit code
// (the message already printed).
func parseFakeRQD(c *cli.Env, name string, args []string) (o fakeRQDOptions, code int) {
	fs := cli.NewFlagSet(c, name, fakeRQDUsage)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8444", "gRPC address to serve RQD on (host:port); use :8444 to be reachable from other machines")
	hosts := fs.String("hosts", "", "comma-separated render host names to answer for (default: every host); the others answer UNAVAILABLE")
	runTime := fs.String("run-time", "5s..30s", "how long each frame runs: a duration (5s) or a uniform range MIN..MAX (5s..2m)")
	fs.BoolVar(&o.complete, "complete", false, "report finished frames through Cuebot's tables (needs a database)")
	cf := cli.AddConnFlags(fs, false)
	fs.BoolVar(&o.clearOnStop, "clear-on-stop", true, "with --complete, clear frames still running at stop (proc released, frame WAITING)")
	fs.StringVar(&o.metricsListen, "metrics-listen", "", "serve /metrics, /healthz and /readyz on this host:port (default: off)")
	fs.StringVar(&o.logLevel, "log-level", "info", "trace, debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json")
	if code, done := fs.ParseArgs(args); done {
		return o, code
	}
	if fs.NArg() > 0 {
		return o, fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	if strings.TrimSpace(o.listen) == "" {
		return o, fs.Fail("--listen: must be host:port")
	}
	if *hosts != "" {
		for _, h := range strings.Split(*hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				o.hosts = append(o.hosts, h)
			}
		}
		if len(o.hosts) == 0 {
			return o, fs.Fail("--hosts: no host name in %q", *hosts)
		}
	}
	var err error
	if o.rtMin, o.rtMax, err = parseRunTime(*runTime); err != nil {
		return o, fs.Fail("--run-time: %v", err)
	}
	if _, err := logging.ParseLevel(o.logLevel); err != nil {
		return o, fs.Fail("--log-level: %v", err)
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return o, fs.Fail("--log-format: %q is not text or json", o.logFormat)
	}
	switch {
	case o.complete:
		v, code := cf.Resolve(c, name, false)
		if code != 0 {
			return o, code
		}
		o.dbURL = v.DBURL
	case strings.TrimSpace(*cf.Config) != "":
		// Only --complete uses the database, but a bad file is named now
		// (a file always yields a database URL: its default).
		if _, code := cf.Resolve(c, name, false); code != 0 {
			return o, code
		}
	}
	return o, -1
}

// parseRunTime reads "D" or "MIN..MAX".
func parseRunTime(s string) (lo, hi time.Duration, err error) {
	a, b, isRange := strings.Cut(strings.TrimSpace(s), "..")
	if lo, err = time.ParseDuration(strings.TrimSpace(a)); err != nil {
		return 0, 0, fmt.Errorf("%q: want a duration (5s) or MIN..MAX (5s..2m)", s)
	}
	hi = lo
	if isRange {
		if hi, err = time.ParseDuration(strings.TrimSpace(b)); err != nil {
			return 0, 0, fmt.Errorf("%q: want a duration (5s) or MIN..MAX (5s..2m)", s)
		}
	}
	if lo < 0 || hi < lo {
		return 0, 0, fmt.Errorf("%q: durations must be >= 0 and MIN <= MAX", s)
	}
	return lo, hi, nil
}

// fakeFarm is one fake RQD with its logging, metrics and, with --complete,
// the Cuebot emulator that reports completions.
type fakeFarm struct {
	o   fakeRQDOptions
	log hclog.Logger
	emu *cuebotemu.Emulator            // nil without --complete
	srv atomic.Pointer[fakerqd.Server] // set once serving (read by /metrics)

	launches    *prometheus.CounterVec
	completions *prometheus.CounterVec
	retries     prometheus.Counter
	pending     prometheus.Gauge

	// stopping is closed when the stop begins: pending completion reports
	// then get retryDrain more before they are dropped.
	stopping chan struct{}
}

// Completion report retries (RQD keeps a finished frame's report and
// resends it until Cuebot accepts it).
const (
	retryMin   = 100 * time.Millisecond
	retryMax   = 5 * time.Second
	retryDrain = 30 * time.Second
)

func (f *fakeFarm) register(reg prometheus.Registerer) {
	f.launches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fakerqd_launches_total",
		Help: "LaunchFrame calls by the gRPC status code answered (OK = the frame runs).",
	}, []string{"code"})
	f.completions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fakerqd_completions_total",
		Help: "Finished frames by what the Cuebot emulator did with them: completed, orphan, stale, error, or not_reported without --complete.",
	}, []string{"result"})
	running := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fakerqd_running_frames",
		Help: "Frames currently running on the fake.",
	}, func() float64 {
		if srv := f.srv.Load(); srv != nil {
			return float64(srv.RunningCount())
		}
		return 0
	})
	f.retries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fakerqd_completion_retries_total",
		Help: "Completion reports sent again after the database refused them (as RQD resends a FrameCompleteReport Cuebot did not take).",
	})
	f.pending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fakerqd_pending_completions",
		Help: "Finished frames whose completion report has not been accepted yet.",
	})
	reg.MustRegister(f.launches, f.completions, running, f.retries, f.pending)
}

// behavior is what every answered host does.
func (f *fakeFarm) behavior() fakerqd.Behavior {
	lo, hi := f.o.rtMin, f.o.rtMax
	return fakerqd.Behavior{Mode: fakerqd.Succeed, RunTimeFunc: func(*rqdpb.RunFrame) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + rand.N(hi-lo+1)
	}}
}

// run serves until ctx ends, then stops the server and, with --complete
// and --clear-on-stop, clears the frames that were still running.
func (f *fakeFarm) run(ctx context.Context) error {
	// Completions in flight when the stop begins still reach the database.
	cbCtx := context.WithoutCancel(ctx)
	cfg := fakerqd.Config{
		Listen:     f.o.listen,
		NoHistory:  true,
		OnLaunch:   f.onLaunch,
		OnComplete: func(fc fakerqd.FrameCompletion) { f.onComplete(cbCtx, fc) },
	}
	if len(f.o.hosts) == 0 {
		cfg.Default = f.behavior()
	} else {
		cfg.Default = fakerqd.Behavior{Mode: fakerqd.Unreachable}
		cfg.Hosts = make(map[string]fakerqd.Behavior, len(f.o.hosts))
		for _, h := range f.o.hosts {
			cfg.Hosts[h] = f.behavior()
		}
	}
	srv, err := fakerqd.Start(cfg)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	f.srv.Store(srv)
	hosts := "every host"
	if len(f.o.hosts) > 0 {
		hosts = strings.Join(f.o.hosts, ",")
	}
	rt := f.o.rtMin.String()
	if f.o.rtMax != f.o.rtMin {
		rt += ".." + f.o.rtMax.String()
	}
	f.log.Info("fake RQD serving", "addr", srv.Addr(), "hosts", hosts, "run_time", rt, "complete", f.emu != nil)
	if f.emu == nil {
		f.log.Warn("completions are not reported (no --complete): finished frames stay RUNNING in the database")
	}

	<-ctx.Done()
	close(f.stopping)
	running := srv.Running("")
	srv.Stop() // no completion after this; the ones in flight have returned
	if f.emu == nil || !f.o.clearOnStop || len(running) == 0 {
		f.log.Info("fake RQD stopped", "frames_dropped", len(running))
		return nil
	}
	return f.clear(cbCtx, running)
}

// clear gives back the procs of frames the stop cut short.
func (f *fakeFarm) clear(ctx context.Context, running []*rqdpb.RunFrame) error {
	var cleared int
	var errs []error
	for _, rf := range running {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f.emu.ClearProc(cctx, rf.GetResourceId())
		cancel()
		switch {
		case err == nil:
			cleared++
		case errors.Is(err, cuebotemu.ErrNotFound):
			// It completed between the snapshot and the stop.
		default:
			errs = append(errs, fmt.Errorf("clear frame %s (proc %s): %w", rf.GetFrameName(), rf.GetResourceId(), err))
		}
	}
	f.log.Info("fake RQD stopped: frames still running cleared (proc released, frame WAITING)", "cleared", cleared, "failed", len(errs))
	return errors.Join(errs...)
}

func (f *fakeFarm) onLaunch(l fakerqd.Launch) {
	rf := l.RunFrame
	f.launches.WithLabelValues(l.Code.String()).Inc()
	if l.Started {
		f.log.Info("frame launched", "host", l.Host, "job", rf.GetJobName(), "frame", rf.GetFrameName(),
			"cores", float64(rf.GetNumCores())/100, "mem_soft_kb", rf.GetSoftMemoryLimit(), "mem_hard_kb", rf.GetHardMemoryLimit(),
			"gpus", rf.GetNumGpus(), "frame_id", rf.GetFrameId(), "proc", rf.GetResourceId())
		return
	}
	f.log.Warn("launch refused", "host", l.Host, "code", l.Code.String(), "job", rf.GetJobName(), "frame", rf.GetFrameName(),
		"frame_id", rf.GetFrameId())
}

func (f *fakeFarm) onComplete(ctx context.Context, fc fakerqd.FrameCompletion) {
	kv := []any{"host", fc.Host, "job", fc.JobName, "frame", fc.FrameName, "exit_status", fc.ExitStatus, "run_time", fc.RunTime}
	if fc.Killed {
		kv = append(kv, "killed", fc.KillMessage)
	}
	if f.emu == nil {
		f.completions.WithLabelValues("not_reported").Inc()
		f.log.Info("frame finished (not reported)", kv...)
		return
	}
	f.pending.Inc()
	defer f.pending.Dec()
	var drainEnd <-chan time.Time
	backoff := retryMin
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		outcome, err := f.emu.CompleteOutcome(cctx, cuebotemu.FromFakeRQD(fc))
		cancel()
		if err == nil {
			f.completions.WithLabelValues(outcome.String()).Inc()
			if attempt > 1 {
				kv = append(kv, "attempts", attempt)
			}
			f.log.Info("frame finished", append(kv, "reported", outcome.String())...)
			return
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(backoff*2, retryMax)
		if attempt == 1 {
			f.log.Warn("frame finished; reporting it failed, retrying until it is accepted",
				append(kv, "frame_id", fc.FrameID, "proc", fc.ResourceID, "error", err)...)
		} else {
			f.log.Debug("completion report refused again", "frame", fc.FrameName, "attempt", attempt, "retry_in", wait, "error", err)
		}
		select {
		case <-f.stopping:
			if drainEnd == nil {
				drainEnd = time.After(retryDrain)
			}
		default:
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-drainEnd:
			t.Stop()
			f.completions.WithLabelValues("error").Inc()
			f.log.Error("fake RQD stopping: dropped a completion report the database never accepted: the frame stays RUNNING until Cuebot's orphan check clears it",
				append(kv, "frame_id", fc.FrameID, "proc", fc.ResourceID, "attempts", attempt, "error", err)...)
			return
		}
		f.retries.Inc()
	}
}
