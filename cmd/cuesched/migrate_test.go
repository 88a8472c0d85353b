package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func testCLI(env map[string]string) (*cli.Env, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	return &cli.Env{
		Stdout: &out, Stderr: &errb,
		Getenv: func(k string) string { return env[k] },
		Logger: hclog.NewNullLogger(),
	}, &out, &errb
}

func runMigrateT(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	c, out, errb := testCLI(env)
	code := runMigrate(context.Background(), c, args)
	return code, out.String(), errb.String()
}

// baselineOnly is an empty database with just the baseline (a Cuebot
// database before cuesched).
func baselineOnly(t *testing.T) string {
	t.Helper()
	return testenv.NewDatabase(t, testenv.WithTemplate("cli-baseline-only", func(ctx context.Context, url string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		return migrations.ApplyBaseline(ctx, conn)
	}))
}

func TestMigratePlanUpStatus(t *testing.T) {
	t.Parallel()
	url := baselineOnly(t)
	steps, err := migrations.Steps()
	if err != nil {
		t.Fatal(err)
	}

	// plan prints the SQL of every pending step and changes nothing.
	code, out, errs := runMigrateT(t, nil, "plan", "--database-url", url)
	if code != 0 {
		t.Fatalf("plan: exit %d: %s", code, errs)
	}
	for _, s := range steps {
		if !strings.Contains(out, "-- ==== step "+s.String()) || !strings.Contains(out, s.SQL) {
			t.Errorf("plan output lacks step %s and its SQL", s)
		}
	}
	if !strings.Contains(out, "ALTER TABLE proc REPLICA IDENTITY FULL") || !strings.Contains(out, "no transaction") {
		t.Errorf("plan output:\n%s", out)
	}
	if strings.Contains(out, "up would stop at preflight") {
		t.Errorf("plan warned on a good database:\n%s", out)
	}
	// The preflight warns about an unlimited max_slot_wal_keep_size (the
	// stock default) and gives a value; the test server bounds it.
	keep := pgSetting(t, url, "max_slot_wal_keep_size")
	slotWarned := strings.Contains(out, "-- WARNING: max_slot_wal_keep_size is -1 (unlimited)") &&
		strings.Contains(out, "ALTER SYSTEM SET max_slot_wal_keep_size = '20GB'")
	if slotWarned != (keep == "-1") {
		t.Errorf("plan with max_slot_wal_keep_size %s: slot WAL warning %v\n%s", keep, slotWarned, out)
	}

	// status before: everything pending, not ready.
	code, out, _ = runMigrateT(t, map[string]string{"CUESCHED_DATABASE_URL": url}, "status")
	if code != 1 || !strings.Contains(out, fmt.Sprintf("0 applied, %d pending", len(steps))) || !strings.Contains(out, "status: NOT ready") ||
		!strings.Contains(out, "cuesched_proc        missing") || !strings.Contains(out, "proc replica identity: default") {
		t.Fatalf("status before up: exit %d\n%s", code, out)
	}

	// up applies every step (flags after or before the action).
	code, out, errs = runMigrateT(t, nil, "--database-url", url, "up")
	if code != 0 {
		t.Fatalf("up: exit %d: %s", code, errs)
	}
	for _, s := range steps {
		if !strings.Contains(out, "applied "+s.String()+"\n") {
			t.Errorf("up output lacks %q:\n%s", "applied "+s.String(), out)
		}
	}
	if !strings.Contains(out, fmt.Sprintf("%d step(s) applied", len(steps))) {
		t.Errorf("up output:\n%s", out)
	}
	if strings.Contains(out, "WARNING: max_slot_wal_keep_size is -1") != (keep == "-1") {
		t.Errorf("up with max_slot_wal_keep_size %s: slot WAL warning?\n%s", keep, out)
	}

	// up again: nothing to do; plan says so too.
	code, out, _ = runMigrateT(t, nil, "up", "--database-url", url)
	if code != 0 || !strings.Contains(out, "nothing to apply: the database is up to date") {
		t.Fatalf("second up: exit %d\n%s", code, out)
	}
	code, out, _ = runMigrateT(t, nil, "plan", "--database-url", url)
	if code != 0 || !strings.Contains(out, "nothing to apply") || strings.Contains(out, "CREATE") {
		t.Fatalf("plan after up: exit %d\n%s", code, out)
	}

	// status after: ready, with the readiness section.
	code, out, _ = runMigrateT(t, nil, "status", "--database-url", url)
	for _, want := range []string{
		"cuebot schema:       yes", fmt.Sprintf("%d applied, 0 pending", len(steps)), "applied  0001_version_table",
		"b_scheduler_managed: yes (0 managed show(s))", "proc replica identity: full",
		"cuesched_proc        ok: proc [insert, delete, truncate]",
		"cuesched_hostcache   ok: alloc, facility, folder_resource, host, host_stat, host_tag, job_resource, show, subscription [insert, update, delete, truncate]",
		"wal_level            logical", "max_slot_wal_keep_size " + keep, "role can replicate   yes", "status: ready",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	if code != 0 || t.Failed() {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
}

func TestMigrateBaselineOnEmptyDatabase(t *testing.T) {
	t.Parallel()
	url := testenv.NewDatabase(t)

	code, out, errs := runMigrateT(t, nil, "plan", "--baseline", "--database-url", url)
	if code != 0 || !strings.Contains(out, "baseline/0002_tables.sql") || !strings.Contains(out, "CREATE TABLE proc") ||
		!strings.Contains(out, "step 0005_scheduler_indexes") {
		t.Fatalf("plan --baseline: exit %d %s\n%.500s", code, errs, out)
	}

	steps, err := migrations.Steps()
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs = runMigrateT(t, nil, "up", "--baseline", "--database-url", url)
	if code != 0 || !strings.Contains(out, "created the baseline Cuebot schema") || !strings.Contains(out, fmt.Sprintf("%d step(s) applied", len(steps))) {
		t.Fatalf("up --baseline: exit %d %s\n%s", code, errs, out)
	}
	// Again: the database is no longer empty, so --baseline is refused.
	code, out, errs = runMigrateT(t, nil, "up", "--baseline", "--database-url", url)
	if code != 1 || !strings.Contains(errs, "not empty") || !strings.Contains(errs, "--baseline is only for an empty database") || out != "" {
		t.Fatalf("second up --baseline: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestMigrateRefusesNonCuebotDatabase(t *testing.T) {
	t.Parallel()
	url := testenv.NewDatabase(t)
	code, out, errs := runMigrateT(t, nil, "up", "--database-url", url)
	if code != 1 || !strings.Contains(errs, "is not a Cuebot database") || !strings.Contains(errs, "proc") ||
		!strings.Contains(errs, "nothing was changed") {
		t.Fatalf("up on an empty database: exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused up created %d relations (%v)", n, err)
	}
	// plan warns but still shows the SQL.
	code, out, _ = runMigrateT(t, nil, "plan", "--database-url", url)
	if code != 0 || !strings.Contains(out, "-- WARNING: up would stop at preflight") || !strings.Contains(out, "not a Cuebot database") {
		t.Fatalf("plan on a non-Cuebot database: exit %d\n%s", code, out)
	}
}

func TestMigrateFailsOnReplicaWALLevel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{WALLevel: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	if err := pg.CreateDatabase(ctx, "cuebot", ""); err != nil {
		t.Fatal(err)
	}
	// up --baseline on an empty database of that server: refused by the
	// preflight before the baseline is created, so "nothing was changed"
	// is true (the baseline used to be created first and left behind).
	if err := pg.CreateDatabase(ctx, "empty", ""); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runMigrateT(t, nil, "up", "--baseline", "--database-url", pg.URL("empty"))
	if code != 1 || !strings.Contains(errs, `wal_level is "replica"`) || !strings.Contains(errs, "nothing was changed") ||
		strings.Contains(errs, "not a Cuebot database") || out != "" {
		t.Fatalf("up --baseline with wal_level=replica: exit %d\nstdout %q\nstderr %s", code, out, errs)
	}
	econn, err := pgx.Connect(ctx, pg.URL("empty"))
	if err != nil {
		t.Fatal(err)
	}
	defer econn.Close(ctx)
	var rels int
	if err := econn.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public'`).Scan(&rels); err != nil || rels != 0 {
		t.Fatalf("refused up --baseline created %d relations (%v)", rels, err)
	}

	url := pg.URL("cuebot")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := migrations.ApplyBaseline(ctx, conn); err != nil {
		t.Fatal(err)
	}

	code, out, errs = runMigrateT(t, nil, "up", "--database-url", url)
	if code != 1 || !strings.Contains(errs, `wal_level is "replica"`) || !strings.Contains(errs, "wal_level = logical in postgresql.conf") ||
		!strings.Contains(errs, "restart PostgreSQL") || out != "" {
		t.Fatalf("up with wal_level=replica: exit %d\nstdout %q\nstderr %s", code, out, errs)
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('cuesched_schema_migrations') IS NOT NULL`).Scan(&exists); err != nil || exists {
		t.Fatalf("preflight failure still applied steps (%v)", err)
	}
	code, out, _ = runMigrateT(t, nil, "status", "--database-url", url)
	if code != 1 || !strings.Contains(out, "wal_level            replica") || !strings.Contains(out, `wal_level is "replica"`) {
		t.Fatalf("status with wal_level=replica: exit %d\n%s", code, out)
	}
}

func TestMigrateUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		code int
		msg  string
	}{
		{nil, nil, 2, "missing subcommand"},
		{[]string{"sideways"}, nil, 2, `unknown subcommand "sideways"`},
		{[]string{"up"}, nil, 2, "pass --database-url URL, set CUESCHED_DATABASE_URL"},
		{[]string{"status", "--baseline", "--database-url", "postgres://x/y"}, nil, 2, "flag provided but not defined: -baseline"},
		{[]string{"up", "extra", "--database-url", "postgres://x/y"}, nil, 2, `unexpected argument "extra"`},
		{[]string{"up", "--nope"}, nil, 2, "flag provided but not defined: -nope"},
		{[]string{"status"}, map[string]string{"CUESCHED_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"}, 1, "connect to the database"},
	} {
		code, _, errs := runMigrateT(t, tc.env, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("migrate %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errs, tc.code, tc.msg)
		}
	}
}

// pgSetting reads a server setting.
func pgSetting(t *testing.T, url, name string) string {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(context.Background(), "SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
