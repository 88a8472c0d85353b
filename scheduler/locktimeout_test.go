package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/scheduler/loop"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestLockHeldOnOneShowLeavesDispatchGoingElsewhere is the fault case of a
// lock held for long on a row a pass reads: an operator (or a stalled
// Cuebot transaction) holds the limit_record row of show A's layer, which
// the booking transaction reads FOR UPDATE. With one cluster worker and a
// long accounting.in_flight_grace (5 m, a valid configuration: the batch's
// only deadline was half of it), the pass of show A waited on that lock
// with the worker, and show B, on another cluster, did not book. The
// pool's lock_timeout (database.lock_timeout) ends the wait, the batch is
// rolled back, and the worker goes on to show B.
//
// The pass deadline (queue.pass_timeout) is the backstop for waits no
// server timeout ends: with the lock and statement timeouts off, it ends
// the stuck pass instead.
func TestLockHeldOnOneShowLeavesDispatchGoingElsewhere(t *testing.T) {
	t.Parallel()
	t.Run("lock_timeout", func(t *testing.T) {
		t.Parallel()
		lockedShowLeavesOthersBooking(t, func(c *config.Config) { c.Database.LockTimeout = config.Duration(2 * time.Second) })
	})
	t.Run("pass_timeout", func(t *testing.T) {
		t.Parallel()
		lockedShowLeavesOthersBooking(t, func(c *config.Config) {
			c.Database.LockTimeout, c.Database.StatementTimeout = 0, 0
			c.Queue.PassTimeout = config.Duration(2 * time.Second)
		})
	})
}

func lockedShowLeavesOthersBooking(t *testing.T, mod func(*config.Config)) {
	ctx := context.Background()
	url := cuebotdb.Database(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w := newWorldOn(t, pool, 2)
	limit, err := w.seed.Limit(ctx, "nuke", 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "a_job", Show: w.show, Facility: w.facility,
		Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2, NotThreadable: true, Limits: []string{limit}}}}); err != nil {
		t.Fatal(err)
	}
	showB, err := w.seed.Show(ctx, "showb", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Subscribe(ctx, showB, w.alloc, 100, 100); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{w.show.ID, showB.ID} {
		if err := farmseed.SeedAccounting(ctx, w.pool, w.pub, id); err != nil {
			t.Fatal(err)
		}
	}

	// The lock: held until the test ends.
	holder, err := w.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	if _, err := holder.Exec(ctx, `SELECT 1 FROM limit_record WHERE pk_limit_record = $1 FOR UPDATE`, limit); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(w)
	cfg.Database.URL = url
	cfg.Accounting.InFlightGrace = config.Duration(5 * time.Minute)
	cfg.Queue.Stream.ClusterBufferSize = 1
	cfg.Queue.ClusterEmptySleep = config.Duration(50 * time.Millisecond)
	cfg.Queue.ClusterSaturatedSleep = config.Duration(50 * time.Millisecond)
	cfg.Queue.ActiveScanInterval = config.Duration(20 * time.Millisecond)
	mod(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := productionPoolScheduler(t, cfg)
	runUntilEnd(t, s)

	// Wait until the only worker is stuck behind the lock...
	deadline := time.Now().Add(testenv.Patience(30 * time.Second))
	for {
		var waiting int
		if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query ILIKE '%limit_record%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("show A's pass never waited on the held limit lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// ...then give show B work: it books although show A's lock is still held.
	if _, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "b_job", Show: showB, Facility: w.facility,
		Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 3, NotThreadable: true}}}); err != nil {
		t.Fatal(err)
	}
	if err := farmseed.SeedAccounting(ctx, w.pool, w.pub, showB.ID); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(testenv.Patience(30 * time.Second))
	for {
		var b, a int
		if err := w.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pk_show = $1), count(*) FILTER (WHERE pk_show = $2) FROM proc`,
			showB.ID, w.show.ID).Scan(&b, &a); err != nil {
			t.Fatal(err)
		}
		if a != 0 {
			t.Fatalf("show A booked %d frames past a held limit lock", a)
		}
		if b == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("show B booked %d of 3 frames while show A's limit lock was held: the worker is stuck", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// productionPoolScheduler builds a scheduler over a pool configured as
// production's (scheduler.PoolConfig: statement and lock timeouts).
func productionPoolScheduler(t *testing.T, cfg config.Config) *scheduler.Scheduler {
	t.Helper()
	pc, err := scheduler.PoolConfig(cfg.Database)
	if err != nil {
		t.Fatal(err)
	}
	spool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(spool.Close)
	s, err := scheduler.New(context.Background(), cfg, scheduler.Deps{Pool: spool, Hosts: farmseed.NewDBHosts(spool),
		NoAccounting: true, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestPassBehindATableLockEnds: a table every pass reads (layer_env, read
// by the layer query) locked ACCESS EXCLUSIVE for long (a VACUUM FULL, an
// ALTER TABLE, an operator's LOCK TABLE) used to hang the pass, and with
// it its worker, for as long as the lock was held: three such passes and
// no worker was left. Now the pass ends (lock_timeout, or the pass
// deadline when the server timeouts are off), and once the lock is gone
// the next pass books.
func TestPassBehindATableLockEnds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mod  func(*config.Config)
	}{
		{"lock_timeout", func(c *config.Config) { c.Database.LockTimeout = config.Duration(time.Second) }},
		{"pass_timeout", func(c *config.Config) {
			c.Database.LockTimeout, c.Database.StatementTimeout = 0, 0
			c.Queue.PassTimeout = config.Duration(time.Second)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := cuebotdb.Database(t)
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			w := newWorldOn(t, pool, 1)
			w.job(t, "j1", 2)
			cfg := testConfig(w)
			cfg.Database.URL = url
			tc.mod(&cfg)
			s := productionPoolScheduler(t, cfg)

			holder, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(context.Background()) }()
			if _, err := holder.Exec(ctx, `LOCK TABLE layer_env IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			done := make(chan loop.PassResult, 1)
			go func() { done <- s.Loop.Pass(ctx, allocCluster(w)) }()
			select {
			case r := <-done:
				if r.Dispatched != 0 {
					t.Fatalf("pass behind the lock booked %d frames", r.Dispatched)
				}
			case <-time.After(testenv.Patience(30 * time.Second)):
				t.Fatal("the pass is still waiting on the table lock: its worker would be stuck until the lock goes")
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			// The passes after it book. (With a pass deadline of one
			// second, a pass on a loaded machine can end on it before it
			// books; the next one goes on from there.)
			booked, deadline := 0, time.Now().Add(testenv.Patience(30*time.Second))
			for booked < 2 {
				r := s.Loop.Pass(ctx, allocCluster(w))
				booked += r.Dispatched
				if booked < 2 && time.Now().After(deadline) {
					t.Fatalf("passes after the lock went booked %d frames, want 2 (last pass %+v)", booked, r)
				}
			}
			if booked != 2 {
				t.Fatalf("passes after the lock went booked %d frames, want 2", booked)
			}
		})
	}
}
