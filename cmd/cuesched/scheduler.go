package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/cuesched/cuesched/shared/appname"
	"github.com/cuesched/cuesched/shared/cli"

	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/daemon"
	"github.com/cuesched/cuesched/shared/metrics"
)

const schedulerUsage = `usage: cuesched scheduler --config FILE [--facility NAME] [--dry-run]

Runs the standalone scheduler: finds pending work of every scheduler-managed
show (show.b_scheduler_managed = true) in its facility, matches it with hosts
from the replication-fed host cache, books it in Redis and Postgres and
launches it on RQD. Run one or more per facility; the accounting loops are
leader-elected, frames are claimed with an optimistic lock.

Configuration: the file's database, accounting, queue, host_cache,
scheduler, rqd, logging and metrics sections, overridden by the environment
variables CUESCHED_<SECTION>_<KEY>, overridden by these flags (see 'cuesched
config' and README.md, Configuration).
/metrics, /healthz and /readyz are served on metrics.listen. SIGTERM drains,
SIGUSR1 toggles debug logging.
`

// runScheduler is "cuesched scheduler".
func runScheduler(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched scheduler", schedulerUsage)
	configPath := fs.String("config", "", "configuration `FILE` (YAML); required")
	facility := fs.String("facility", "", "facility name (facility.str_name) to schedule; overrides scheduler.facility")
	dryRun := fs.Bool("dry-run", false, "book in Postgres and Redis but never call RQD (overrides rqd.dry_run)")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	if strings.TrimSpace(*configPath) == "" {
		fmt.Fprintln(c.Stderr, "cuesched scheduler: --config FILE is required (print an annotated example with 'cuesched config')")
		return 2
	}
	cfg, err := config.Load(*configPath, c.Getenv)
	if err != nil {
		fmt.Fprintf(c.Stderr, "cuesched scheduler: %v\n", err)
		return 1
	}
	if *facility != "" {
		cfg.Scheduler.Facility = *facility
	}
	if *dryRun {
		cfg.RQD.DryRun = true
	}
	if cfg.Database.URL, err = cli.WithAppName(cfg.Database.URL, appname.RoleScheduler, cli.InstanceName(cfg.Scheduler.InstanceName)); err != nil {
		fmt.Fprintf(c.Stderr, "cuesched scheduler: %v\n", err)
		return 1
	}
	d, err := daemon.New("scheduler", cfg, c.Stderr, metrics.Build{Version: version, Revision: revision})
	if err != nil {
		fmt.Fprintf(c.Stderr, "cuesched scheduler: %v\n", err)
		return 1
	}
	if c.UseLogger != nil {
		c.UseLogger(d.Logger)
	}
	// Batches in flight finish their commit, launches and compensations
	// on a detached context: wait for them (config.DispatchBudget).
	d.DrainTimeout = cfg.DispatchBudget().Drain
	err = d.Run(ctx, func(ctx context.Context) error {
		s, err := scheduler.New(ctx, cfg, scheduler.Deps{Logger: d.Logger, Registerer: d.Registry, Health: d.Health})
		if err != nil {
			return err
		}
		defer s.Close()
		return s.Run(ctx)
	})
	if err != nil {
		d.Logger.Error("scheduler stopped", "error", err)
		fmt.Fprintf(c.Stderr, "cuesched scheduler: %v\n", err)
		return 1
	}
	return 0
}
