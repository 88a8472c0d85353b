package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/hashicorp/go-hclog"

	"github.com/cuesched/cuesched/lab/demo"
)

const demoUsage = `usage: cuesched-lab demo [--hosts N] [--frames N] [--until-drained] [--duration DURATION]
                     [--run-time-min DURATION] [--run-time-max DURATION]
                     [--log-level LEVEL] [--seed N] [--keep] [--chart FILE]

Runs an embedded farm: PostgreSQL and Redis started in a temp dir, the
baseline schema and rollout migrations, a generated farm of render nodes
behind a fake RQD, a sidecar and a scheduler, and shows frames flowing:
per show its booked cores against its burst and why its frames wait (the
reasons of cuesched explain). It prints the environment lines that point
cuesched status, explain, show list and accounting audit at the farm from
another terminal, and the URL of the scheduler's and sidecar's metrics.
It ends with a summary (the guarantees, what bound throughput and when,
the placement features that acted) and a chart (PNG) of cores in use per
show and waiting frames by reason. Without a terminal it prints a plain
progress line every 5 s. Needs no configuration and connects to nothing
outside. Ctrl-C stops it.

exit status: 0 finished; 1 error; 2 bad usage.
`

// runDemo is "cuesched-lab demo".
func runDemo(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched-lab demo", demoUsage)
	hosts := fs.Int("hosts", 300, "render nodes in the farm")
	frames := fs.Int("frames", 3000, "frames to render")
	untilDrained := fs.Bool("until-drained", true, "stop when every frame of the managed shows is done")
	duration := fs.Duration("duration", 0, "stop after this long (0 = no limit)")
	rtMin := fs.Duration("run-time-min", 200*time.Millisecond, "shortest fake frame run time")
	rtMax := fs.Duration("run-time-max", 2*time.Second, "longest fake frame run time")
	logLevel := fs.String("log-level", "warn", "component log level (logs go to stderr)")
	seed := fs.Int64("seed", 1, "farm generator seed")
	keep := fs.Bool("keep", false, "keep the farm up after the run ends, until Ctrl-C, to explore it with the real tools")
	chartPath := fs.String("chart", "", "write the run's chart (PNG) to `FILE` (default: cuesched-demo-<time>.png in the temp dir)")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	if *hosts < 1 || *frames < 1 {
		return fs.Fail("--hosts and --frames must be at least 1")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := hclog.New(&hclog.LoggerOptions{Name: "demo", Level: hclog.LevelFromString(*logLevel), Output: c.Stderr})
	err := demo.Run(ctx, demo.Options{
		Hosts: *hosts, Frames: *frames, UntilDrained: *untilDrained, Duration: *duration,
		RunTimeMin: *rtMin, RunTimeMax: *rtMax, Out: c.Stdout, Interactive: demo.IsTerminal(c.Stdout),
		Logger: logger, Seed: *seed, Keep: *keep, ChartPath: *chartPath,
	})
	if err != nil {
		fmt.Fprintln(c.Stderr, "cuesched-lab demo:", err)
		return 1
	}
	return 0
}
