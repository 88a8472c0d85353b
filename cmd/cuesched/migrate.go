package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/cuesched/cuesched/migrations"
	"github.com/jackc/pgx/v5"
)

const migrateUsage = `usage: cuesched migrate plan|up|status [--database-url URL] [--baseline]

  plan     print the SQL "up" would run (nothing is changed)
  up       check the server (preflight) and apply the pending rollout steps
  status   report applied/pending steps and replication readiness;
           exits 1 when the database is not ready

flags:
  --database-url URL  PostgreSQL URL of the Cuebot database
                      (default: $CUESCHED_DATABASE_URL)
  --baseline          plan/up only: first create the Cuebot-compatible baseline
                      schema and seed rows; refused unless the database is empty
                      (for demos and tests, never for a real Cuebot database)
`

// runMigrate implements "cuesched migrate".
func runMigrate(ctx context.Context, c *cli, args []string) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() { fmt.Fprint(c.stderr, migrateUsage) }
	dbURL := fs.String("database-url", "", "PostgreSQL URL of the Cuebot database")
	baseline := fs.Bool("baseline", false, "create the baseline schema first (empty database only)")

	// Accept flags before and after the action: "migrate --database-url X up"
	// and "migrate up --database-url X".
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(c.stderr, "migrate: missing action (plan, up or status)")
		fs.Usage()
		return 2
	}
	action := fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(c.stderr, "migrate: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	switch action {
	case "plan", "up", "status":
	default:
		fmt.Fprintf(c.stderr, "migrate: unknown action %q (want plan, up or status)\n", action)
		fs.Usage()
		return 2
	}
	if *baseline && action == "status" {
		fmt.Fprintln(c.stderr, "migrate: --baseline applies to plan and up, not status")
		return 2
	}
	url := *dbURL
	if url == "" {
		url = c.getenv("CUESCHED_DATABASE_URL")
	}
	if url == "" {
		fmt.Fprintln(c.stderr, "migrate: no database given: pass --database-url URL or set CUESCHED_DATABASE_URL")
		return 2
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		fmt.Fprintf(c.stderr, "migrate: connect to the database: %v\n", err)
		return 1
	}
	defer conn.Close(context.WithoutCancel(ctx))
	log := c.logger.Named("migrate")
	log.Debug("connected", "database", conn.Config().Database, "action", action)

	switch action {
	case "plan":
		err = migratePlan(ctx, c.stdout, conn, *baseline)
	case "up":
		err = migrateUp(ctx, c.stdout, conn, *baseline)
	case "status":
		err = migrateStatus(ctx, c.stdout, conn)
	}
	if err != nil {
		var pf *migrations.PreflightError
		if errors.As(err, &pf) {
			fmt.Fprintf(c.stderr, "migrate %s: %v\nnothing was changed.\n", action, err)
		} else {
			fmt.Fprintf(c.stderr, "migrate %s: %v\n", action, err)
		}
		return 1
	}
	return 0
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
			fmt.Fprintf(w, "\n-- ==== %s ====\n%s", f.Name, ensureNewline(f.SQL))
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
		fmt.Fprintf(w, "\n-- ==== step %s (%s; %s) ====\n%s", s, s.File, mode, ensureNewline(s.SQL))
	}
	return nil
}

func migrateUp(ctx context.Context, w io.Writer, conn *pgx.Conn, baseline bool) error {
	if baseline {
		if err := migrations.ApplyBaseline(ctx, conn); err != nil {
			return err
		}
		fmt.Fprintf(w, "created the baseline Cuebot schema in database %q\n", conn.Config().Database)
	}
	if err := migrations.Preflight(ctx, conn); err != nil {
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

func ensureNewline(s string) string {
	if strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}
