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
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

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
