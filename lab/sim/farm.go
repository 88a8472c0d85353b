package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/jackc/pgx/v5"
)

// simFarm is the common shape: one allocation (tag "general") and one
// managed show subscribed with its size and burst at the farm's size.
type simFarm struct {
	show  farmseed.Show
	alloc string
	cores int
}

const gb = farmseed.GB

// hosts adds n hosts of the given cores (4 GiB per core) to alloc.
func (w *World) hosts(ctx context.Context, prefix, alloc, tag string, n, cores, gpus int) error {
	for i := 0; i < n; i++ {
		h := farmseed.HostSpec{Name: fmt.Sprintf("%s%04d", prefix, i), Alloc: alloc, AllocTag: tag, Cores: cores,
			MemKB: int64(cores) * 4 * gb}
		if gpus > 0 {
			h.GPUs, h.GPUMemKB = gpus, int64(gpus)*16*gb
		}
		if _, err := w.Seed.Host(ctx, h); err != nil {
			return err
		}
	}
	return nil
}

// basicFarm seeds n hosts of cores cores and one managed show "main".
func (w *World) basicFarm(ctx context.Context, n, cores int) (simFarm, error) {
	var f simFarm
	var err error
	if f.alloc, err = w.Seed.Alloc(ctx, w.Facility, "sim.general", "general"); err != nil {
		return f, err
	}
	if err = w.hosts(ctx, "h", f.alloc, "general", n, cores, 0); err != nil {
		return f, err
	}
	f.cores = n * cores
	if f.show, err = w.Seed.Show(ctx, "main", true); err != nil {
		return f, err
	}
	_, err = w.Seed.Subscribe(ctx, f.show, f.alloc, f.cores, f.cores)
	return f, err
}

// oneCore is a layer of n one-core frames on the general tag.
func oneCore(name string, n int) farmseed.LayerSpec {
	return farmseed.LayerSpec{Name: name, Tags: []string{"general"}, Frames: n, NotThreadable: true, MemKB: gb}
}

// job seeds one job of one-core layers.
func (w *World) job(ctx context.Context, show farmseed.Show, name string, priority int, layers ...farmseed.LayerSpec) (farmseed.Job, error) {
	return w.Seed.Job(ctx, farmseed.JobSpec{Name: name, Show: show, Facility: w.Facility, Priority: priority,
		MaxCores: farmseed.Uncapped, Layers: layers})
}

// fill is booked cores ÷ host cores now.
func (w *World) fillNow(ctx context.Context) float64 {
	var f float64
	_ = w.Pool.QueryRow(ctx, `SELECT COALESCE((SELECT sum(int_cores_reserved) FROM proc),0)::float8 / GREATEST(sum(int_cores),1)
		FROM host`).Scan(&f)
	return f
}

// succeededBy counts SUCCEEDED frames per job name.
func (w *World) succeededBy(ctx context.Context) (map[string]int, error) {
	return queryMap[int](ctx, w, `SELECT j.str_name, count(f.pk_frame) FILTER (WHERE f.str_state = 'SUCCEEDED')
		FROM job j LEFT JOIN frame f ON f.pk_job = j.pk_job GROUP BY j.str_name`)
}

// queryMap runs a query of (name, value) rows into a map (empty on error).
func queryMap[V any](ctx context.Context, w *World, sql string, args ...any) (map[string]V, error) {
	out := map[string]V{}
	rows, err := w.Pool.Query(ctx, sql, args...)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var v V
		if err := rows.Scan(&k, &v); err != nil {
			return out, err
		}
		out[k] = v
	}
	return out, rows.Err()
}

// window counts completions per job over d.
func (w *World) window(ctx context.Context, d time.Duration) (map[string]int, error) {
	before, err := w.succeededBy(ctx)
	if err != nil {
		return nil, err
	}
	if err := Sleep(ctx, d); err != nil {
		return nil, err
	}
	after, err := w.succeededBy(ctx)
	if err != nil {
		return nil, err
	}
	for k, v := range after {
		after[k] = v - before[k]
	}
	return after, nil
}

// queryList runs a query of one column into a slice.
func queryList[V any](ctx context.Context, w *World, sql string, args ...any) ([]V, error) {
	rows, err := w.Pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[V])
}
