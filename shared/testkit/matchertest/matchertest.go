// Package matchertest holds what the tests of the matcher and of the loop
// that drives it share: a pool that counts the matcher's layer reads, a
// host cache with no host, and a one-allocation farm to seed jobs into.
package matchertest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// LayerQueries is a pool that counts the layer queries reaching the
// database (the matcher's per-job and per-pass layer reads).
type LayerQueries struct {
	*pgxpool.Pool
	N atomic.Int32
}

// Query counts a layer query and runs it.
func (d *LayerQueries) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "lay AS") {
		d.N.Add(1)
	}
	return d.Pool.Query(ctx, sql, args...)
}

// NoHosts is a host cache with no host for anyone; it counts the checkouts
// (one per layer worked).
type NoHosts struct{ Checkouts atomic.Int32 }

// Checkout finds no candidate.
func (h *NoHosts) Checkout(context.Context, matcher.HostRequest) (sizing.Host, error) {
	h.Checkouts.Add(1)
	return sizing.Host{}, matcher.ErrNoCandidate
}

// Checkin does nothing.
func (h *NoHosts) Checkin(sizing.Host) {}

// Farm is a fresh Cuebot database with facility f1, a managed show "show"
// and one allocation f1.general (tag general) it subscribes to (100/100).
type Farm struct {
	Pool     *pgxpool.Pool
	Seed     *farmseed.Seeder
	Facility string
	Show     farmseed.Show
	Alloc    string
}

// OneAlloc seeds a Farm; the pool closes with the test.
func OneAlloc(ctx context.Context, t *testing.T) Farm {
	t.Helper()
	pool, err := pgxpool.New(ctx, cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	f := Farm{Pool: pool, Seed: &farmseed.Seeder{DB: pool}}
	if f.Facility, err = f.Seed.Facility(ctx, "f1"); err != nil {
		t.Fatal(err)
	}
	if f.Show, err = f.Seed.Show(ctx, "show", true); err != nil {
		t.Fatal(err)
	}
	if f.Alloc, err = f.Seed.Alloc(ctx, f.Facility, "f1.general", "general"); err != nil {
		t.Fatal(err)
	}
	if _, err = f.Seed.Subscribe(ctx, f.Show, f.Alloc, 100, 100); err != nil {
		t.Fatal(err)
	}
	return f
}
