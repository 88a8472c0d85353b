package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/redact"
)

// migrateGroup is "cuesched migrate": flags may come before or after the
// subcommand ("migrate --database-url URL up" and "migrate up --database-url
// URL").
func migrateGroup() cli.Group {
	return cli.Group{
		Name: "cuesched migrate",
		Intro: "Plans, applies or checks the rollout migrations of a Cuebot database.\n" +
			"Flags may come before or after the subcommand.\n",
		Lead: func(fs *flag.FlagSet) { migrateFlags(cli.FlagSetOn(fs), true) },
		Subs: []cli.Subcommand{
			{Name: "plan", Run: migrateAction("plan"), Summary: `print the SQL "up" would run (nothing is changed)`},
			{Name: "up", Run: migrateAction("up"), Summary: "check the server (preflight) and apply the pending rollout steps"},
			{Name: "status", Run: migrateAction("status"), Summary: "report applied/pending steps and replication readiness; " +
				"exits 1 when the database is not ready"},
		},
	}
}

// runMigrate is "cuesched migrate <subcommand>".
func runMigrate(ctx context.Context, c *cli.Env, args []string) int {
	return migrateGroup().Run(ctx, c, args)
}

const baselineHelp = "first create the Cuebot-compatible baseline schema and seed rows; refused unless the database is empty (for demos and tests, never for a real Cuebot database)"

// migrateUsage is the usage text of a migrate action.
func migrateUsage(action string) string {
	switch action {
	case "plan":
		return `usage: cuesched migrate plan [--baseline] [--config FILE] [--database-url URL]

Prints the SQL "cuesched migrate up" would run, one block per pending step
with its transaction mode. Nothing is changed. When up would stop at the
preflight, the plan starts with a WARNING saying why.

exit status: 0 printed; 1 error; 2 bad usage.
`
	case "up":
		return `usage: cuesched migrate up [--baseline] [--config FILE] [--database-url URL]

Checks the server first (preflight: wal_level, replication slots and
senders, the role's REPLICATION, the Cuebot tables) and, when it passes,
applies the pending rollout steps, each in its own transaction unless
marked, recording each in its own version table. Running it again applies
nothing.

exit status: 0 applied or nothing to apply; 1 the preflight failed (nothing
was changed) or a step failed; 2 bad usage.
`
	default:
		return `usage: cuesched migrate status [--config FILE] [--database-url URL]

Reports the applied and pending rollout steps and whether the server is
ready for cuesched (wal_level, slots, role, Cuebot tables, replica identity),
saying what to change.

exit status: 0 ready; 1 not ready or error; 2 bad usage.
`
	}
}

// migrateFlags adds the flags of a migrate action.
func migrateFlags(fs *cli.FlagSet, withBaseline bool) (*cli.ConnFlags, *bool) {
	cf := cli.AddConnFlags(fs, false)
	baseline := new(bool)
	if withBaseline {
		fs.BoolVar(baseline, "baseline", false, baselineHelp)
	}
	return cf, baseline
}

// migrateAction is "cuesched migrate plan|up|status".
func migrateAction(action string) func(ctx context.Context, c *cli.Env, args []string) int {
	return func(ctx context.Context, c *cli.Env, args []string) int {
		fs := cli.NewFlagSet(c, "cuesched migrate "+action, migrateUsage(action))
		name := fs.Name()
		cf, baseline := migrateFlags(fs, action != "status")
		if code, done := fs.ParseArgs(args); done {
			return code
		}
		if fs.NArg() > 0 {
			return fs.Fail("unexpected argument %q", fs.Arg(0))
		}
		v, code := cf.Resolve(c, name, false)
		if code != 0 {
			return code
		}
		conn, err := pgx.Connect(ctx, v.DBURL)
		if err != nil {
			fmt.Fprintf(c.Stderr, "%s: connect to the database (%s): %v\n", name, v.Source[cli.KeyDatabaseURL], redact.Error(err, v.DBURL))
			return 1
		}
		defer conn.Close(context.WithoutCancel(ctx))
		log := c.Logger.Named("migrate")
		log.Debug("connected", "database", conn.Config().Database, "action", action)

		switch action {
		case "plan":
			err = migratePlan(ctx, c.Stdout, conn, *baseline)
		case "up":
			err = migrateUp(ctx, c.Stdout, conn, *baseline)
		case "status":
			err = migrateStatus(ctx, c.Stdout, conn)
		}
		if err != nil {
			var pf *migrations.PreflightError
			if errors.As(err, &pf) {
				fmt.Fprintf(c.Stderr, "%s: %v\nnothing was changed.\n", name, err)
			} else {
				fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
			}
			return 1
		}
		return 0
	}
}

func migratePlan(ctx context.Context, w io.Writer, conn *pgx.Conn, baseline bool) error {
	var pending []migrations.Step
	if baseline {
		files, err := migrations.Baseline()
		if err != nil {
			return err
		}
		fmt.Fprintln(w, "-- cuesched migrate plan --baseline: the baseline schema (empty database only), then every rollout step")
		for _, f := range files {
			fmt.Fprintf(w, "\n-- ==== %s ====\n%s", f.Name, cli.EnsureNewline(f.SQL))
		}
		if pending, err = migrations.Steps(); err != nil {
			return err
		}
	} else {
		if err := migrations.Preflight(ctx, conn); err != nil {
			var pf *migrations.PreflightError
			if !errors.As(err, &pf) {
				return err
			}
			fmt.Fprintf(w, "-- WARNING: up would stop at preflight:\n-- %s\n", strings.ReplaceAll(err.Error(), "\n", "\n-- "))
		}
		if err := warnSlotWAL(ctx, w, conn, "-- "); err != nil {
			return err
		}
		var err error
		if pending, err = migrations.Plan(ctx, conn); err != nil {
			return err
		}
		if len(pending) == 0 {
			fmt.Fprintln(w, "-- nothing to apply: every rollout step is already applied")
			return nil
		}
		fmt.Fprintf(w, "-- cuesched migrate plan: %d pending step(s), each in its own transaction unless marked\n", len(pending))
	}
	for _, s := range pending {
		mode := "one transaction, recorded in " + migrations.VersionTable
		if s.NoTransaction {
			mode = "no transaction (statement by statement), then recorded in " + migrations.VersionTable
		}
		fmt.Fprintf(w, "\n-- ==== step %s (%s; %s) ====\n%s", s, s.File, mode, cli.EnsureNewline(s.SQL))
	}
	return nil
}

func migrateUp(ctx context.Context, w io.Writer, conn *pgx.Conn, baseline bool) error {
	if baseline {
		// Check the server first (wal_level, slots, role): a baseline
		// created on a server that cannot take the rollout would be left
		// behind by a preflight failure that says nothing was changed.
		req := migrations.DefaultRequirements()
		req.SchemaToCome = true
		if err := migrations.PreflightWith(ctx, conn, req); err != nil {
			return err
		}
		if err := migrations.ApplyBaseline(ctx, conn); err != nil {
			return err
		}
		fmt.Fprintf(w, "created the baseline Cuebot schema in database %q\n", conn.Config().Database)
	}
	if err := migrations.Preflight(ctx, conn); err != nil {
		return err
	}
	if err := warnSlotWAL(ctx, w, conn, ""); err != nil {
		return err
	}
	applied, err := migrations.Up(ctx, conn)
	for _, s := range applied {
		fmt.Fprintf(w, "applied %s\n", s)
	}
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Fprintln(w, "nothing to apply: the database is up to date")
	} else {
		fmt.Fprintf(w, "%d step(s) applied\n", len(applied))
	}
	return nil
}

// warnSlotWAL prints the preflight's warning about an unlimited
// max_slot_wal_keep_size (it does not stop the rollout).
func warnSlotWAL(ctx context.Context, w io.Writer, conn *pgx.Conn, prefix string) error {
	st, err := migrations.Status(ctx, conn)
	if err != nil {
		return err
	}
	if m := st.SlotWALWarning(); m != "" {
		fmt.Fprintf(w, "%sWARNING: %s\n", prefix, m)
	}
	return nil
}

func migrateStatus(ctx context.Context, w io.Writer, conn *pgx.Conn) error {
	st, err := migrations.Status(ctx, conn)
	if err != nil {
		return err
	}
	if err := st.Write(w); err != nil {
		return err
	}
	if !st.Ready() {
		return errNotReady
	}
	return nil
}

// errNotReady makes "migrate status" exit 1 when the database is not ready,
// so scripts and deploy checks can rely on the exit code.
var errNotReady = errors.New("the database is not ready for cuesched (see the report above)")
