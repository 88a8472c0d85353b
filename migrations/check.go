package migrations

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier is what CheckApplied reads through (*pgx.Conn, *pgxpool.Pool).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// NotAppliedError says the rollout is missing from the database a daemon
// was pointed at. Its text tells the operator what to run.
type NotAppliedError struct {
	// Pending are the rollout steps of this binary the version table does
	// not record.
	Pending []string
	// MissingPublications are the publications the daemon streams that do
	// not exist.
	MissingPublications []string
}

func (e *NotAppliedError) Error() string {
	var what []string
	if len(e.Pending) > 0 {
		what = append(what, fmt.Sprintf("rollout steps not applied: %s", strings.Join(e.Pending, ", ")))
	}
	if len(e.MissingPublications) > 0 {
		what = append(what, fmt.Sprintf("publications missing: %s", strings.Join(e.MissingPublications, ", ")))
	}
	return "the database lacks cuesched's rollout migrations (" + strings.Join(what, "; ") +
		"): run `cuesched migrate up --database-url ...` (see `cuesched migrate status`), then start again"
}

// CheckApplied verifies, at a daemon's start-up, that every rollout step of
// this binary is recorded in the version table and that the publications
// the daemon streams exist. Without it a daemon started on an unmigrated
// database ran until its first decoded change and only then failed.
// Steps recorded that this binary does not know (a newer cuesched) are
// fine; a ledger the daemon's role may not read is not checked.
func CheckApplied(ctx context.Context, q Querier, publications ...string) error {
	steps, err := Steps()
	if err != nil {
		return err
	}
	var hasTable bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&hasTable); err != nil {
		return fmt.Errorf("migrations: look up %s: %w", VersionTable, err)
	}
	readable := hasTable
	if hasTable {
		// A daemon role without SELECT on the ledger (it belongs to the
		// role that migrated) cannot tell; the publications still can.
		if err := q.QueryRow(ctx, `SELECT has_table_privilege($1, 'SELECT')`, VersionTable).Scan(&readable); err != nil {
			return fmt.Errorf("migrations: look up %s: %w", VersionTable, err)
		}
	}
	applied := map[int]bool{}
	if readable {
		rows, err := q.Query(ctx, `SELECT version FROM `+VersionTable)
		if err != nil {
			return fmt.Errorf("migrations: read %s: %w", VersionTable, err)
		}
		for rows.Next() {
			var v int
			if err := rows.Scan(&v); err != nil {
				rows.Close()
				return fmt.Errorf("migrations: read %s: %w", VersionTable, err)
			}
			applied[v] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("migrations: read %s: %w", VersionTable, err)
		}
	}
	e := &NotAppliedError{}
	for _, s := range steps {
		if (readable || !hasTable) && !applied[s.Version] {
			e.Pending = append(e.Pending, s.String())
		}
	}
	if len(publications) > 0 {
		var missing []string
		if err := q.QueryRow(ctx, `
			SELECT coalesce(array_agg(p ORDER BY p), '{}') FROM unnest($1::text[]) AS p
			 WHERE NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = p)`, publications).Scan(&missing); err != nil {
			return fmt.Errorf("migrations: look up publications: %w", err)
		}
		e.MissingPublications = missing
	}
	if len(e.Pending) > 0 || len(e.MissingPublications) > 0 {
		return e
	}
	return nil
}
