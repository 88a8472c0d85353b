package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
)

// TestCheckApplied: what a daemon checks at start-up. A database with the
// baseline only has every step pending and no publication; a migrated one
// passes; a step missing from the ledger or a dropped publication is named,
// and the error tells the operator to run `cuesched migrate up`.
func TestCheckApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, bare := baselineDB(t)
	err := migrations.CheckApplied(ctx, bare, migrations.PublicationHostCache)
	var na *migrations.NotAppliedError
	if !errors.As(err, &na) {
		t.Fatalf("baseline only: %v, want a NotAppliedError", err)
	}
	steps, _ := migrations.Steps()
	if len(na.Pending) != len(steps) || len(na.MissingPublications) != 1 {
		t.Errorf("baseline only: %+v", na)
	}
	if !strings.Contains(err.Error(), "cuesched migrate up") {
		t.Errorf("error does not say what to run: %v", err)
	}

	conn := connect(t, cuebotdb.Database(t))
	all := []string{migrations.PublicationHostCache, migrations.PublicationAccounting, migrations.PublicationProc}
	if err := migrations.CheckApplied(ctx, conn, all...); err != nil {
		t.Fatalf("migrated database: %v", err)
	}
	exec(t, conn, `DELETE FROM cuesched_schema_migrations WHERE version = 3`)
	exec(t, conn, `DROP PUBLICATION cuesched_proc`)
	err = migrations.CheckApplied(ctx, conn, all...)
	if !errors.As(err, &na) || len(na.Pending) != 1 || !strings.HasPrefix(na.Pending[0], "0003_") ||
		strings.Join(na.MissingPublications, ",") != "cuesched_proc" {
		t.Fatalf("one step and one publication missing: %v", err)
	}
	for _, w := range []string{"0003_", "cuesched_proc", "cuesched migrate up"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %q", err, w)
		}
	}
}
