// Package gpuguard keeps CPU work from stranding idle GPUs. While GPU frames
// of scheduler-managed shows wait, a CPU frame may not take the cores and
// memory that an idle GPU of its host needs: the guard holds back, on every
// host with idle GPUs, one bundle per idle GPU, the bundle being the
// smallest per-GPU cores and the smallest per-GPU memory (cores ÷ GPUs,
// memory ÷ GPUs, each a minimum on its own) of the waiting GPU layers whose
// tags the host's cluster serves. `cuesched explain` reads the same rule
// in SQL for its strand reason. With no GPU work waiting the
// guard holds nothing back, so GPU hosts are ordinary CPU capacity when
// nobody needs their GPUs.
//
// The guard reads the waiting GPU layers with one query per refresh (not on
// the dispatch path) and answers Keep lock-free from that snapshot.
package gpuguard

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
)

// DB is what the guard queries (a pgxpool.Pool).
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Bundle is what one GPU frame needs per GPU (centicores, KB).
type Bundle struct {
	Cores, MemKB int64
}

// demand is one snapshot: the smallest bundle per tag of the waiting GPU
// layers.
type demand struct {
	byTag map[string]Bundle
	at    time.Time
}

// Options configure a Guard.
type Options struct {
	// Interval between refreshes (default 1s).
	Interval   time.Duration
	Logger     hclog.Logger
	Registerer prometheus.Registerer
}

// Guard holds the snapshot.
type Guard struct {
	db   DB
	opts Options
	log  hclog.Logger
	cur  atomic.Pointer[demand]

	waiting prometheus.Gauge
	held    prometheus.Counter
}

// New returns a guard with an empty snapshot (nothing held back until the
// first refresh).
func New(db DB, o Options) *Guard {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	g := &Guard{db: db, opts: o, log: o.Logger.Named("gpuguard"),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "scheduler_gpu_layers_waiting",
			Help: "Waiting GPU layers of managed shows the GPU guard protects idle GPUs for (last refresh)."}),
		held: prometheus.NewCounter(prometheus.CounterOpts{Name: "scheduler_gpu_guard_holds_total",
			Help: "Host checkouts for CPU work that had cores or memory held back for idle GPUs."}),
	}
	g.cur.Store(&demand{})
	if o.Registerer != nil {
		o.Registerer.MustRegister(g.waiting, g.held)
	}
	return g
}

// waitingGPUSQL: per waiting GPU layer of an active managed show's pending
// job, its tags and its per-GPU share.
const waitingGPUSQL = `
SELECT l.str_tags,
       GREATEST(l.int_cores_min, 0)::float8 / l.int_gpus_min,
       GREATEST(l.int_mem_min, 0)::float8 / l.int_gpus_min
  FROM layer l
  JOIN layer_stat ls ON ls.pk_layer = l.pk_layer
  JOIN job j ON j.pk_job = l.pk_job
  JOIN show s ON s.pk_show = j.pk_show
 WHERE l.int_gpus_min > 0 AND ls.int_waiting_count > 0
   AND j.str_state = 'PENDING' AND NOT j.b_paused
   AND s.b_active AND s.b_scheduler_managed`

// Refresh re-reads the waiting GPU layers.
func (g *Guard) Refresh(ctx context.Context) error {
	rows, err := g.db.Query(ctx, waitingGPUSQL)
	if err != nil {
		return fmt.Errorf("waiting GPU layers: %w", err)
	}
	defer rows.Close()
	d := &demand{byTag: map[string]Bundle{}, at: time.Now()}
	n := 0
	for rows.Next() {
		var tags string
		var cores, mem float64
		if err := rows.Scan(&tags, &cores, &mem); err != nil {
			return fmt.Errorf("waiting GPU layers: %w", err)
		}
		n++
		b := Bundle{Cores: int64(cores), MemKB: int64(mem)}
		for _, t := range strings.Split(tags, "|") {
			if t = strings.TrimSpace(t); t == "" {
				continue
			}
			nb := b
			if cur, ok := d.byTag[t]; ok {
				nb = Bundle{Cores: min(b.Cores, cur.Cores), MemKB: min(b.MemKB, cur.MemKB)}
			}
			d.byTag[t] = nb
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("waiting GPU layers: %w", err)
	}
	g.cur.Store(d)
	g.waiting.Set(float64(n))
	return nil
}

// Run refreshes until ctx ends.
func (g *Guard) Run(ctx context.Context) error {
	t := time.NewTicker(g.opts.Interval)
	defer t.Stop()
	for {
		if err := g.Refresh(ctx); err != nil && ctx.Err() == nil {
			g.log.Warn("refresh failed; keeping the last snapshot", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Keep is what CPU work must leave free on a host with idleGPUs idle GPUs
// serving tags: one bundle per idle GPU (the smallest of the waiting GPU
// layers that these tags serve), or zero when no GPU work waits there.
func (g *Guard) Keep(tags []string, idleGPUs int64) (cores, memKB int64) {
	if idleGPUs <= 0 {
		return 0, 0
	}
	d := g.cur.Load()
	if len(d.byTag) == 0 {
		return 0, 0
	}
	var best Bundle
	found := false
	for _, t := range tags {
		b, ok := d.byTag[t]
		switch {
		case !ok:
		case !found:
			best, found = b, true
		default:
			best = Bundle{Cores: min(b.Cores, best.Cores), MemKB: min(b.MemKB, best.MemKB)}
		}
	}
	if !found {
		return 0, 0
	}
	return best.Cores * idleGPUs, best.MemKB * idleGPUs
}

// Held counts a checkout that had something held back.
func (g *Guard) Held() { g.held.Inc() }
