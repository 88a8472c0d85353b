// Package cuebotdb gives tests a fresh Cuebot-compatible database.
//
// Database(t) returns the URL of a new database that has the baseline
// schema (tables, triggers, views and seed rows of a stock Cuebot after
// V47) with every rollout step applied on top (b_scheduler_managed,
// publications, REPLICA IDENTITY FULL on proc, scheduler indexes). The
// schema is built once per test binary into a template database and each
// call clones it, which takes a few tens of milliseconds.
//
// Use it from packages whose TestMain calls testenv.Main:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		url := cuebotdb.Database(t)
//		...
//	}
//
// Replication slots are cluster-wide and are not part of the clone: tests
// that create slots must name them uniquely and drop them.
package cuebotdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TemplateName is the testenv template key of the baseline+rollout schema.
// It changes when the meaning of the template changes.
const TemplateName = "cuebot-v1"

// Database returns the URL of a fresh database with the baseline schema,
// seed rows and all rollout steps applied. It is dropped at test cleanup.
func Database(t testing.TB) string {
	t.Helper()
	return testenv.NewDatabase(t, testenv.WithTemplate(TemplateName, Setup))
}

// Setup applies the baseline and the rollout to the (empty) database at
// url. It is the template setup of Database, exported for the demo and for
// benchmarks that manage their own databases.
func Setup(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("cuebotdb: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := migrations.ApplyBaseline(ctx, conn); err != nil {
		return err
	}
	if _, err := migrations.Up(ctx, conn); err != nil {
		return err
	}
	return nil
}

// RealCuebotDirEnv names an OpenCue checkout's
// cuebot/src/main/resources/conf/ddl/postgres directory (migrations/V*.sql
// and seed_data.sql). OpenCue's SQL is not in this repository.
const RealCuebotDirEnv = "CUESCHED_CUEBOT_MIGRATIONS_DIR"

// RealDatabase returns the URL of a fresh database built by Cuebot's own
// migrations (RealCuebotDirEnv) with cuesched's rollout on top, or skips
// the test when the variable is not set.
func RealDatabase(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(RealCuebotDirEnv)
	if dir == "" {
		t.Skipf("set %s to an OpenCue cuebot/src/main/resources/conf/ddl/postgres directory to run against Cuebot's real schema", RealCuebotDirEnv)
	}
	return testenv.NewDatabase(t, testenv.WithTemplate("cuebot-real-rollout", func(ctx context.Context, url string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if err := ApplyRealCuebot(ctx, conn, dir); err != nil {
			return err
		}
		_, err = migrations.Up(ctx, conn)
		return err
	}))
}

// ApplyRealCuebot runs Cuebot's V*.sql under dir/migrations in numeric
// order, each in one transaction (as Flyway does), then dir/seed_data.sql
// statement by statement, skipping the duplicate-key failures the seed is
// known to produce.
func ApplyRealCuebot(ctx context.Context, conn *pgx.Conn, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "migrations", "V*__*.sql"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no V*__*.sql under %s/migrations (%v)", dir, err)
	}
	num := regexp.MustCompile(`V(\d+)__`)
	sort.Slice(files, func(i, j int) bool {
		a, _ := strconv.Atoi(num.FindStringSubmatch(filepath.Base(files[i]))[1])
		b, _ := strconv.Atoi(num.FindStringSubmatch(filepath.Base(files[j]))[1])
		return a < b
	})
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, string(b), pgx.QueryExecModeSimpleProtocol)
			return err
		}); err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(f), err)
		}
	}
	seed, err := os.ReadFile(filepath.Join(dir, "seed_data.sql"))
	if err != nil {
		return err
	}
	for _, stmt := range migrations.SplitStatements(string(seed)) {
		if _, err := conn.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "23505" {
				continue // task_lock rows also inserted by V35/V38/V46
			}
			first, _, _ := strings.Cut(strings.TrimSpace(stmt), "\n")
			return fmt.Errorf("seed: %s: %w", first, err)
		}
	}
	return nil
}
