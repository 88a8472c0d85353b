package cuebotdb_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Each call gives an independent, fully migrated database.
func TestDatabaseIsFreshAndMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := cuebotdb.Database(t), cuebotdb.Database(t)
	if a == b {
		t.Fatalf("two calls returned the same database %s", a)
	}
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)

	pending, err := migrations.Plan(ctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 0 {
		t.Fatalf("pending steps in a cuebotdb database: %v", pending)
	}
	if _, err := ca.Exec(ctx, `UPDATE show SET b_scheduler_managed = true WHERE str_name = 'testing'`); err != nil {
		t.Fatal(err)
	}
	var managed bool
	if err := cb.QueryRow(ctx, `SELECT b_scheduler_managed FROM show WHERE str_name = 'testing'`).Scan(&managed); err != nil {
		t.Fatal(err)
	}
	if managed {
		t.Fatal("a write in one test database is visible in another")
	}
}
