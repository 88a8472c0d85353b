package gpuguard_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/gpuguard"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestKeepFollowsWaitingGPUWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &farmseed.Seeder{DB: pool}
	fac, err := s.Facility(ctx, "f1")
	if err != nil {
		t.Fatal(err)
	}
	show, err := s.Show(ctx, "alpha", true)
	if err != nil {
		t.Fatal(err)
	}
	legacy, err := s.Show(ctx, "legacy", false)
	if err != nil {
		t.Fatal(err)
	}
	g := gpuguard.New(pool, gpuguard.Options{Registerer: prometheus.NewRegistry()})
	refresh := func() {
		t.Helper()
		if err := g.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	keep := func(tags []string, idle int64) [2]int64 {
		c, m := g.Keep(tags, idle)
		return [2]int64{c, m}
	}

	// Nothing waits: nothing held back.
	refresh()
	if k := keep([]string{"gpu"}, 2); k != [2]int64{} {
		t.Fatalf("no GPU work: keep %v, want nothing", k)
	}
	// GPU work of an unmanaged show and of a paused job does not count.
	n := 0
	gl := func(cores, gpus int, mem int64) farmseed.LayerSpec {
		n++
		return farmseed.LayerSpec{Name: fmt.Sprintf("g%d", n), Tags: []string{"gpu"}, Frames: 2, Cores: cores, GPUs: gpus, MemKB: mem, GPUMemKB: farmseed.GB}
	}
	if _, err := s.Job(ctx, farmseed.JobSpec{Name: "legacy-gpu", Show: legacy, Facility: fac, Layers: []farmseed.LayerSpec{gl(2, 1, 4*farmseed.GB)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Job(ctx, farmseed.JobSpec{Name: "paused-gpu", Show: show, Facility: fac, Paused: true, Layers: []farmseed.LayerSpec{gl(2, 1, 4*farmseed.GB)}}); err != nil {
		t.Fatal(err)
	}
	refresh()
	if k := keep([]string{"gpu"}, 2); k != [2]int64{} {
		t.Fatalf("only unmanaged or paused GPU work: keep %v, want nothing", k)
	}
	// Two waiting GPU layers: the smallest per-GPU share, per idle GPU.
	if _, err := s.Job(ctx, farmseed.JobSpec{Name: "gpu", Show: show, Facility: fac,
		Layers: []farmseed.LayerSpec{gl(8, 2, 16*farmseed.GB), gl(6, 1, 8*farmseed.GB)}}); err != nil {
		t.Fatal(err)
	}
	refresh()
	if k := keep([]string{"general", "gpu"}, 2); k != [2]int64{800, 16 * farmseed.GB} {
		t.Fatalf("keep on a host with 2 idle GPUs = %v, want 2 × (4 cores, 8 GB)", k)
	}
	if k := keep([]string{"general"}, 2); k != [2]int64{} {
		t.Fatalf("a host whose tags no waiting GPU layer asks for: keep %v, want nothing", k)
	}
	if k := keep([]string{"gpu"}, 0); k != [2]int64{} {
		t.Fatalf("no idle GPU: keep %v, want nothing", k)
	}
}
