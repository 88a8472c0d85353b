// Package demo runs an embedded render farm: a throwaway PostgreSQL (with
// logical replication) and Redis started by shared/testkit/testenv, the Cuebot
// baseline schema plus the rollout migrations, a seeded farm, and the real
// scheduler and sidecar against a fake RQD and a Cuebot completion emulator
// (both test doubles). It shows live progress until the queue drains, the
// duration ends or the context is cancelled, then prints a summary.
package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/testkit/farm"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// Options configures a demo run.
type Options struct {
	Hosts, Frames int
	// UntilDrained stops when every frame of the managed shows is done.
	UntilDrained bool
	// Duration stops after this long (0 = no limit).
	Duration time.Duration
	// RunTimeMin/Max bound the fake frames' run times.
	RunTimeMin, RunTimeMax time.Duration
	// Out receives progress and the summary; Interactive redraws in place.
	Out         io.Writer
	Interactive bool
	// Logger receives the components' logs (keep it quiet for a readable demo).
	Logger hclog.Logger
	Seed   int64
	// Keep leaves the farm up after the run ends on its own, until ctx
	// ends (Ctrl-C), to explore it with the real tools.
	Keep bool
	// ChartPath is where the run's chart (PNG) goes; "" = a file in the
	// temp dir.
	ChartPath string
	// SchedulerMetricsAddr and SidecarMetricsAddr are where the
	// scheduler's and the sidecar's /metrics listen, each on its own
	// endpoint as in production ("" = 127.0.0.1 on a free port).
	SchedulerMetricsAddr, SidecarMetricsAddr string
	// PrometheusConfig, when set, is where the demo writes a
	// prometheus.yml that scrapes both endpoints (with the shipped alert
	// rules when RulesDir names docs/prometheus).
	PrometheusConfig string
	RulesDir         string
	// WideAfter is when the wide job is submitted (0 = 4 s into the run).
	WideAfter time.Duration
	// Stop, when closed, ends the run as Duration does.
	Stop <-chan struct{}
	// MetricsReady, when set, is called once both /metrics endpoints
	// listen, before the fake RQD, sidecar and scheduler start (so a
	// scraper sees every series from zero); an error ends the run.
	MetricsReady func(MetricsEndpoints) error
}

// Env is the running embedded environment.
type Env struct {
	env      *testenv.Env
	PG       *testenv.Postgres
	Redis    *testenv.Redis
	DBURL    string
	RedisURL string
	Pool     *pgxpool.Pool
	Farm     *farm.Farm
}

// Close stops everything the environment started.
func (e *Env) Close() {
	if e.Pool != nil {
		e.Pool.Close()
	}
	if e.env != nil {
		e.env.Close()
	}
}

// Start brings up Postgres and Redis, applies the baseline schema and the
// rollout migrations, and seeds the farm.
func Start(ctx context.Context, o Options) (*Env, error) {
	e := &Env{env: testenv.NewEnv()}
	ok := false
	defer func() {
		if !ok {
			e.Close()
		}
	}()
	var err error
	step := func(msg string) { fmt.Fprintf(o.Out, "  %s\n", msg) }
	t0 := time.Now()
	if e.PG, err = e.env.Postgres(ctx); err != nil {
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	step(fmt.Sprintf("PostgreSQL (wal_level=logical) on 127.0.0.1:%d, in %s", e.PG.Port(), e.PG.Dir()))
	if e.Redis, err = e.env.Redis(ctx); err != nil {
		return nil, fmt.Errorf("start Redis: %w", err)
	}
	e.RedisURL = e.Redis.URL(0)
	step(fmt.Sprintf("Redis on %s", e.Redis.Addr()))
	if err := e.PG.CreateDatabase(ctx, "cuebot", ""); err != nil {
		return nil, err
	}
	e.DBURL = e.PG.URL("cuebot")
	step(fmt.Sprintf("Cuebot database %q: %s", "cuebot", e.DBURL))
	conn, err := pgx.Connect(ctx, e.DBURL)
	if err != nil {
		return nil, err
	}
	if err := migrations.ApplyBaseline(ctx, conn); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	applied, err := migrations.Up(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		return nil, err
	}
	step(fmt.Sprintf("Cuebot baseline schema + %d rollout migrations applied", len(applied)))
	if e.Pool, err = pgxpool.New(ctx, e.DBURL); err != nil {
		return nil, err
	}
	spec := farm.Default()
	spec.Seed = o.Seed
	// Show the placement features rather than hide them: a few wide
	// frames (reservations, EASY backfill) and GPU hosts that CPU work
	// may spill onto (GPU protection).
	spec.WideFrames = wideFrames
	spec.GPUHostsServeCPU = true
	if o.Hosts > 0 {
		spec.Hosts = o.Hosts
	}
	if o.Frames > 0 {
		spec.Frames = o.Frames
	}
	if o.RunTimeMin > 0 {
		spec.RunTimeMin = o.RunTimeMin
	}
	if o.RunTimeMax > 0 {
		spec.RunTimeMax = o.RunTimeMax
	}
	if e.Farm, err = farm.Seed(ctx, e.Pool, spec); err != nil {
		return nil, err
	}
	step(fmt.Sprintf("farm seeded: %s (%s)", e.Farm, time.Since(t0).Round(time.Millisecond)))
	ok = true
	return e, nil
}

// Counts is a progress sample.
type Counts struct {
	Waiting, Running, Succeeded, Dead int
	Procs                             int
	ManagedLeft                       int // frames of managed shows not yet done
}

// Sample reads frame and proc counts.
func Sample(ctx context.Context, pool *pgxpool.Pool) (Counts, error) {
	var c Counts
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE f.str_state = 'WAITING'),
		       count(*) FILTER (WHERE f.str_state = 'RUNNING'),
		       count(*) FILTER (WHERE f.str_state = 'SUCCEEDED'),
		       count(*) FILTER (WHERE f.str_state = 'DEAD'),
		       (SELECT count(*) FROM proc),
		       count(*) FILTER (WHERE s.b_scheduler_managed AND f.str_state NOT IN ('SUCCEEDED', 'DEAD', 'EATEN'))
		  FROM frame f JOIN job j ON j.pk_job = f.pk_job JOIN show s ON s.pk_show = j.pk_show`).
		Scan(&c.Waiting, &c.Running, &c.Succeeded, &c.Dead, &c.Procs, &c.ManagedLeft)
	return c, err
}

// IsTerminal reports whether w is a terminal (for in-place redraws).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func bar(done, total, width int) string {
	if total <= 0 {
		return strings.Repeat(" ", width)
	}
	n := done * width / total
	return strings.Repeat("#", n) + strings.Repeat(".", width-n)
}
