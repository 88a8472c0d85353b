package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/cuesched/cuesched/lab/sim"
	"github.com/cuesched/cuesched/shared/config"
)

const simUsage = `usage: cuesched-lab sim [--scenario NAME[,NAME…]|all] [--seed N] [--scale F] [--hosts N] [--frames N]
                    [--schedulers N] [--work-split none|allocation|cluster] [--json] [--out DIR] [--no-variants] [--list]
                    [--cpuprofile FILE] [--scheduler-bin FILE]

The verify battery: farm-scale scenarios that drive the real scheduler(s)
and sidecar in-process against an embedded PostgreSQL and Redis (started in
a temp dir), with a fake RQD and a Cuebot emulator. SCALE runs its
schedulers as child processes of the cuesched binary (--scheduler-bin, by
default the one beside cuesched-lab), so their RSS and CPU are their own.
Each scenario measures values against thresholds (PASS/FAIL) and checks
the global invariants (no frame launched twice, no host over its resources,
no cap exceeded, no accounting drift). Variants re-run a scenario with
round 1's behaviour for comparison; only the default run is judged.
Connects to nothing outside.

exit status: 0 every judged scenario passed; 1 one failed or errored; 2 bad
usage.
`

// runSim is "cuesched-lab sim".
func runSim(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched-lab sim", simUsage)
	name := fs.Name()
	scenario := fs.String("scenario", "all", "scenario name, a comma-separated list, or all")
	seed := fs.Int64("seed", 1, "seed of farm shapes, run times and the scheduler's lottery")
	scale := fs.Float64("scale", 1, "multiplies farm sizes and load")
	hosts := fs.Int("hosts", 0, "host count of COLDFILL (0: 1,553 × scale) and SCALE (0: 10,000 × scale)")
	frames := fs.Int("frames", 0, "waiting frames of SCALE (0: 1,000,000 × scale)")
	schedulers := fs.Int("schedulers", 1, "scheduler instances sharing the farm (FAILOVER runs at least 2)")
	workSplit := fs.String("work-split", "", "scheduler.work_split of every scheduler (none, allocation, cluster; SPLIT sets its own per run)")
	asJSON := fs.Bool("json", false, "print one JSON object per scenario run instead of the table")
	out := fs.String("out", "", "write report.md, report.json and fill charts (PNG) to this directory")
	noVariants := fs.Bool("no-variants", false, "skip the round-1 comparison runs")
	list := fs.Bool("list", false, "list the scenarios and exit")
	verbose := fs.Bool("v", false, "print the components' logs")
	cpuProfile := fs.String("cpuprofile", "", "write a pprof CPU profile of the whole run (scheduler, sidecar and fakes share the process) to this file")
	schedBin := fs.String("scheduler-bin", besideMe("cuesched"), "the cuesched binary SCALE runs its schedulers with, as child processes (\"\": in this process, as every other scenario)")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	if *list {
		for _, s := range sim.Scenarios() {
			fmt.Fprintf(c.Stdout, "%-18s %s\n", s.Name, s.Description)
		}
		return 0
	}
	if *scale <= 0 || *schedulers < 1 || *hosts < 0 || *frames < 0 {
		return fs.Fail("--scale must be > 0, --schedulers >= 1, --hosts >= 0, --frames >= 0")
	}
	switch *workSplit {
	case "", config.WorkSplitNone, config.WorkSplitAllocation, config.WorkSplitCluster:
	default:
		return fs.Fail("--work-split must be %s, %s or %s, not %q", config.WorkSplitNone, config.WorkSplitAllocation, config.WorkSplitCluster, *workSplit)
	}
	var picked []sim.Scenario
	if strings.EqualFold(*scenario, "all") {
		picked = sim.BatteryScenarios()
	} else {
		for _, n := range strings.Split(*scenario, ",") {
			s, ok := sim.Lookup(strings.TrimSpace(n))
			if !ok {
				fmt.Fprintf(c.Stderr, "%s: --scenario: unknown scenario %q (known: %s)\n", name, n, strings.Join(sim.Names(), ", "))
				return 2
			}
			picked = append(picked, s)
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(c.Stderr, "%s: --cpuprofile: %v\n", name, err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(c.Stderr, "%s: --cpuprofile: %v\n", name, err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	progress := func(line string) { fmt.Fprintln(c.Stderr, line) }
	b, err := sim.NewBattery(ctx, sim.Options{Seed: *seed, Scale: *scale, Hosts: *hosts, Frames: *frames, Schedulers: *schedulers, WorkSplit: *workSplit,
		NoVariants: *noVariants, Progress: progress, Verbose: *verbose, SchedulerBin: *schedBin})
	if err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	defer b.Close()
	var results []sim.Result
	for _, s := range picked {
		if ctx.Err() != nil {
			break
		}
		rs := b.Run(ctx, s)
		results = append(results, rs...)
		if *asJSON {
			if err := sim.WriteJSON(c.Stdout, rs); err != nil {
				fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
				return 1
			}
		}
	}
	if !*asJSON {
		sim.WriteTable(c.Stdout, results)
	}
	if *out != "" {
		header := fmt.Sprintf("`cuesched-lab sim --scenario %s --seed %d --scale %g --schedulers %d`", *scenario, *seed, *scale, *schedulers)
		if err := sim.WriteReport(*out, results, header); err != nil {
			fmt.Fprintf(c.Stderr, "%s: --out: %v\n", name, err)
			return 1
		}
	}
	if ctx.Err() != nil {
		return 1
	}
	if sim.Failed(results) {
		return 1
	}
	return 0
}

// besideMe is the path of a file named name in this executable's directory,
// or "" if there is none (make build puts cuesched beside cuesched-lab).
func besideMe(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(exe), name)
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		return ""
	}
	return p
}
