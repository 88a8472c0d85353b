package farmseed

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
)

// OneHostFarm seeds a database with one managed show subscribed (10 cores)
// to one allocation of facility fac, one 4-core host and one job of frames
// one-core frames; it returns the database URL and a pool on it.
func OneHostFarm(t *testing.T, fac, show, host, job string, frames int) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	db := cuebotdb.Database(t)
	pool, err := pgxpool.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &Seeder{DB: pool}
	facID, err := s.Facility(ctx, fac)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := s.Show(ctx, show, true)
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := s.Alloc(ctx, facID, fac+".general", "general")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Subscribe(ctx, sh, alloc, 10, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Host(ctx, HostSpec{Name: host, Alloc: alloc, AllocTag: "general", Cores: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Job(ctx, JobSpec{Name: job, Show: sh, Facility: facID,
		Layers: []LayerSpec{{Tags: []string{"general"}, Frames: frames, NotThreadable: true}}}); err != nil {
		t.Fatal(err)
	}
	return db, pool
}
