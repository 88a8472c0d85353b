package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/hashicorp/go-hclog"

	"github.com/cuesched/cuesched/lab/demo"
)

const demoUsage = `usage: cuesched-lab demo [--hosts N] [--frames N] [--until-drained] [--duration DURATION]
                     [--run-time-min DURATION] [--run-time-max DURATION]
                     [--log-level LEVEL] [--seed N] [--keep] [--chart FILE]
                     [--metrics-addr ADDR] [--sidecar-metrics-addr ADDR]
                     [--prometheus-config FILE]

Runs an embedded farm: PostgreSQL and Redis started in a temp dir, the
baseline schema and rollout migrations, a generated farm of render nodes
behind a fake RQD, a sidecar and a scheduler, and shows frames flowing:
per show its booked cores against its burst and why its frames wait (the
reasons of cuesched explain). It prints the environment lines that point
cuesched status, explain, show list and accounting audit at the farm from
another terminal, the URLs of the scheduler's and the sidecar's /metrics
(two endpoints, as deployed; fixed with --metrics-addr and
--sidecar-metrics-addr) and how to point Prometheus and Grafana at them
(--prometheus-config writes the scrape configuration, with the alert rules
of docs/prometheus when run from the repository).
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
	metricsAddr := fs.String("metrics-addr", "", "serve the scheduler's /metrics on `ADDR` (host:port; default 127.0.0.1 on a free port)")
	sidecarMetricsAddr := fs.String("sidecar-metrics-addr", "", "serve the sidecar's /metrics on `ADDR` (default: --metrics-addr's port + 1, else a free port)")
	promConfig := fs.String("prometheus-config", "", "write a prometheus.yml that scrapes both endpoints to `FILE`")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	if *hosts < 1 || *frames < 1 {
		return fs.Fail("--hosts and --frames must be at least 1")
	}
	if *sidecarMetricsAddr == "" && *metricsAddr != "" {
		next, err := nextPort(*metricsAddr)
		if err != nil {
			return fs.Fail("--metrics-addr: %v", err)
		}
		*sidecarMetricsAddr = next
	}
	rulesDir := ""
	if *promConfig != "" {
		if _, err := os.Stat(filepath.Join("docs", "prometheus", "alerts.yml")); err == nil {
			rulesDir = filepath.Join("docs", "prometheus")
		}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := hclog.New(&hclog.LoggerOptions{Name: "demo", Level: hclog.LevelFromString(*logLevel), Output: c.Stderr})
	err := demo.Run(ctx, demo.Options{
		Hosts: *hosts, Frames: *frames, UntilDrained: *untilDrained, Duration: *duration,
		RunTimeMin: *rtMin, RunTimeMax: *rtMax, Out: c.Stdout, Interactive: demo.IsTerminal(c.Stdout),
		Logger: logger, Seed: *seed, Keep: *keep, ChartPath: *chartPath,
		SchedulerMetricsAddr: *metricsAddr, SidecarMetricsAddr: *sidecarMetricsAddr,
		PrometheusConfig: *promConfig, RulesDir: rulesDir,
	})
	if err != nil {
		fmt.Fprintln(c.Stderr, "cuesched-lab demo:", err)
		return 1
	}
	return 0
}

// nextPort is addr with its port plus one ("127.0.0.1:9464" ->
// "127.0.0.1:9465").
func nextPort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p >= 65535 {
		return "", fmt.Errorf("port %q: give a fixed port (1-65534) or --sidecar-metrics-addr too", port)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1)), nil
}
