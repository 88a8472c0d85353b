package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cuesched/cuesched/lab/dashcheck"
	"github.com/cuesched/cuesched/shared/cli"
)

const dashcheckUsage = `usage: cuesched-lab dashboard-check [--docs DIR] [--duration DURATION] [--max-duration DURATION]
                     [--hosts N] [--frames N] [--seed N] [--log-level LEVEL]
                     [--run-time-min DURATION] [--run-time-max DURATION]

Checks that the shipped Grafana dashboards (DIR/grafana/*.json) and alert
rules (DIR/prometheus/*.yml) are true on a healthy farm. It starts a real
Prometheus (Debian package prometheus; temp dir, free port, 1 s scrape) and
a short embedded farm (the demo's: real scheduler and sidecar, fake RQD,
Cuebot emulator) that it scrapes for --duration, then on until every
expression has data (some need an event, e.g. a reservation ending) or
--max-duration passes; runs promtool check rules, promtool test
rules and, mid-run, promtool check metrics on both daemons' /metrics; then
evaluates every panel target and alert expression over the run through the
HTTP API (Grafana's $__interval, $__rate_interval and $__range and the
dashboard's variables substituted). It fails on any expression that errors
or returns no data (a panel: no series or only NaN; an alert: any of its
selectors matching nothing), and on any alert firing, and lists them all.
It ends with the panel coverage (panels evaluated / with data). Run it from
the repository (make dashboard-check).

exit status: 0 every expression returns data; 1 some do not, or an error;
2 bad usage.
`

// runDashcheck is "cuesched-lab dashboard-check".
func runDashcheck(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched-lab dashboard-check", dashcheckUsage)
	docs := fs.String("docs", "docs", "the directory with grafana/ and prometheus/ (`DIR`)")
	duration := fs.Duration("duration", 60*time.Second, "how long the farm runs at least while Prometheus scrapes it")
	maxDuration := fs.Duration("max-duration", 4*time.Minute, "how long it may run on until every expression has data")
	hosts := fs.Int("hosts", 80, "render nodes in the farm")
	frames := fs.Int("frames", 4000, "frames to render")
	seed := fs.Int64("seed", 1, "farm generator seed")
	rtMin := fs.Duration("run-time-min", 4*time.Second, "shortest fake frame run time")
	rtMax := fs.Duration("run-time-max", 20*time.Second, "longest fake frame run time")
	logLevel := fs.String("log-level", "off", "component log level (logs go to stderr; off by default: stopping the farm mid-flight logs cancelled completions)")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	if *duration < 30*time.Second {
		return fs.Fail("--duration must be at least 30s (rates need samples)")
	}
	if *hosts < 1 || *frames < 1 {
		return fs.Fail("--hosts and --frames must be at least 1")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := hclog.New(&hclog.LoggerOptions{Name: "dashboard-check", Level: hclog.LevelFromString(*logLevel), Output: c.Stderr})
	rep, err := dashcheck.Run(ctx, dashcheck.Options{
		DocsDir: *docs, Duration: *duration, Hosts: *hosts, Frames: *frames, Seed: *seed,
		RunTimeMin: *rtMin, RunTimeMax: *rtMax, MaxDuration: *maxDuration,
		Out: c.Stdout, Logger: logger,
	})
	if err != nil {
		fmt.Fprintln(c.Stderr, "cuesched-lab dashboard-check:", err)
		return 1
	}
	if len(rep.Failures) > 0 {
		fmt.Fprintf(c.Stdout, "\nFAIL: %d problem(s):\n", len(rep.Failures))
		for _, f := range rep.Failures {
			fmt.Fprintf(c.Stdout, "  - %s\n", f)
		}
		return 1
	}
	fmt.Fprintln(c.Stdout, "PASS")
	return 0
}
