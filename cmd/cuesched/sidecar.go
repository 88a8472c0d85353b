package main

import (
	"context"
	"fmt"
	"time"

	"github.com/cuesched/cuesched/shared/appname"
	"github.com/cuesched/cuesched/shared/cli"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/daemon"
	"github.com/cuesched/cuesched/shared/metrics"
	"github.com/cuesched/cuesched/sidecar"
)

const sidecarUsage = `usage: cuesched sidecar [--config FILE] [--create-slot]

Runs the release publisher next to Cuebot: reads committed proc DELETEs from
the replication slot sidecar.slot_name and applies each scheduler-managed
release to Redis exactly once; forwards cap changes of managed shows. Several
sidecars may run against one database: one streams, the others stand by.

Configuration: the file's database, accounting (Redis), sidecar, logging and
metrics sections (defaults without a file), overridden by the environment
variables CUESCHED_<SECTION>_<KEY> (see 'cuesched config' and README.md,
Configuration). /metrics, /healthz and /readyz are served on metrics.listen.
`

// runSidecar is "cuesched sidecar".
func runSidecar(ctx context.Context, c *cli.Env, args []string) int {
	fs := cli.NewFlagSet(c, "cuesched sidecar", sidecarUsage)
	configPath := fs.String("config", "", "configuration `FILE` (YAML); without one, the defaults and the environment variables apply")
	createSlot := fs.Bool("create-slot", false, "create the replication slot if it is missing (same as sidecar.create_slot: true)")
	if code, done := fs.ParseArgs(args); done {
		return code
	}
	if fs.NArg() > 0 {
		return fs.Fail("unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.Load(*configPath, c.Getenv)
	if err != nil {
		fmt.Fprintf(c.Stderr, "cuesched sidecar: %v\n", err)
		return 1
	}
	if *createSlot {
		cfg.Sidecar.CreateSlot = true
	}
	d, err := daemon.New("sidecar", cfg, c.Stderr, metrics.Build{Version: version, Revision: revision})
	if err != nil {
		fmt.Fprintf(c.Stderr, "cuesched sidecar: %v\n", err)
		return 1
	}
	if c.UseLogger != nil {
		c.UseLogger(d.Logger)
	}
	cc, err := publisher.ClientConfigFrom(cfg.Accounting)
	if err != nil {
		fmt.Fprintf(c.Stderr, "cuesched sidecar: %v\n", err)
		return 1
	}
	rdb, err := publisher.NewClient(cc)
	if err != nil {
		fmt.Fprintf(c.Stderr, "cuesched sidecar: accounting: %v\n", err)
		return 1
	}
	if err := publisher.CheckAuth(ctx, rdb); err != nil {
		_ = rdb.Close()
		fmt.Fprintf(c.Stderr, "cuesched sidecar: accounting: %v\n", err)
		return 1
	}
	defer rdb.Close()
	dbURL, err := cli.WithAppName(cfg.Database.URL, appname.RoleSidecar, cli.InstanceName(cfg.Scheduler.InstanceName))
	if err != nil {
		fmt.Fprintf(c.Stderr, "cuesched sidecar: %v\n", err)
		return 1
	}
	sc, err := sidecar.New(sidecar.Config{
		DatabaseURL:      dbURL,
		SlotName:         cfg.Sidecar.SlotName,
		Publications:     cfg.Sidecar.Publications,
		CreateSlot:       cfg.Sidecar.CreateSlot,
		RecreateLostSlot: cfg.Sidecar.RecreateLostSlot,
		MaxRetainedWAL:   int64(cfg.Sidecar.MaxRetainedWAL),
		StandbyRetry:     time.Duration(cfg.Sidecar.StandbyRetry),
		Logger:           d.Logger,
		Registerer:       d.Registry,
		Health:           d.Health,
	}, rdb)
	if err != nil {
		fmt.Fprintf(c.Stderr, "cuesched sidecar: %v\n", err)
		return 1
	}
	if err := d.Run(ctx, sc.Run); err != nil {
		d.Logger.Error("sidecar stopped", "error", err)
		fmt.Fprintf(c.Stderr, "cuesched sidecar: %v\n", err)
		return 1
	}
	return 0
}
