package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/replication"
)

// LSN is a WAL position.
type LSN = replication.LSN

// consumer is the replication.Consumer of the sidecar. The replication
// package never calls its methods concurrently; every field without an
// atomic type is owned by that one goroutine.
type consumer struct {
	log        hclog.Logger
	m          *sidecarMetrics
	pub        *publisher.Publisher
	rdb        redis.UniversalClient
	pool       *pgxpool.Pool
	ack        func(LSN)
	flushEvery time.Duration
	now        func() time.Time

	// tables are Cuebot's tables the sidecar reads, each with the schema
	// its name resolves to on the search_path (resolved at the start of
	// every session); ignored logs the other relations once each.
	tables  replication.Tables
	ignored replication.Ignored

	state        managedState // managed shows as of state.lsn (stream position)
	c            *caches      // resolution caches and the cap mirror (resolve.go, caps.go)
	cachesLoaded bool
	positions                            // the checkpoint and applied positions (checkpoint.go)
	vis          *replication.Visibility // when a streamed transaction is visible

	// For Status and health (read from other goroutines).
	redisFail    atomic.Pointer[redisFailure]
	managedCount atomic.Int64
}

// cuebotTables are the tables whose rows the sidecar applies.
func cuebotTables() []string {
	return []string{"show", "host", "job", "proc", "subscription", "folder_resource", "job_resource"}
}

// resolveTables finds the schema of Cuebot's tables on the search_path of
// the connection q runs on (the schema the sidecar's own queries read).
func (c *consumer) resolveTables(ctx context.Context, q textQuery) error {
	t, err := replication.ResolveTables(ctx, q, cuebotTables()...)
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	c.tables = t
	return nil
}

// table names a change's relation when it is one of Cuebot's tables, and
// returns "" for any other relation, including a table of the same name in
// another schema that a publication also carries (its rows are not
// Cuebot's: applying them would release running procs, flip shows or
// write caps). Ignored relations are logged once each; their transactions
// are acknowledged like any other.
func (c *consumer) table(ch *replication.Change) string {
	if c.tables.Admit(ch, &c.ignored, c.log) {
		return ch.Relation.Table
	}
	return ""
}

// Snapshot seeds the state from the new slot's exported snapshot (the slot
// was just created): exact at the consistent point.
func (c *consumer) Snapshot(ctx context.Context, q replication.SnapshotQuerier) error {
	cp := q.ConsistentPoint()
	tq := replication.SnapshotText(q)
	if err := c.resolveTables(ctx, tq); err != nil {
		return err
	}
	if err := c.bindIdentity(ctx); err != nil {
		return err
	}
	shows, err := seedManaged(ctx, tq)
	if err != nil {
		return err
	}
	cs, err := seedCaches(ctx, tq)
	if err != nil {
		return err
	}
	var stored uint64
	var ok bool
	if err := c.redisCall(ctx, "read checkpoint", func(ctx context.Context) error {
		var err error
		stored, ok, err = c.pub.Checkpoint(ctx)
		return err
	}); err != nil {
		return err
	}
	reason := "new replication slot: WAL before its consistent point was never streamed to Redis"
	if !ok {
		reason = "new replication slot and no checkpoint in Redis"
	}
	if ok && LSN(stored) > cp {
		// A checkpoint from another slot or timeline would refuse every
		// release of this one.
		reason = "new replication slot behind the Redis checkpoint (another slot or database timeline)"
		if err := c.redisCall(ctx, "reset checkpoint", func(ctx context.Context) error {
			return c.rdb.Set(ctx, publisher.LSNKey, publisher.FormatLSN(uint64(cp)), 0).Err()
		}); err != nil {
			return err
		}
	}
	if err := c.requestRebootstrap(ctx, reason); err != nil {
		return err
	}
	if err := c.redisCall(ctx, "checkpoint at consistent point", func(ctx context.Context) error {
		_, err := c.pub.ReleaseBatch(ctx, uint64(cp), nil)
		return err
	}); err != nil {
		return err
	}
	c.state = managedState{lsn: cp, shows: shows}
	if err := c.persistState(ctx, true); err != nil {
		return err
	}
	c.c, c.cachesLoaded = cs, true
	c.setCheckpoint(cp)
	c.applied, c.pending = cp, 0
	c.appliedA.Store(uint64(cp))
	c.managedCount.Store(int64(len(shows)))
	c.m.managedShows.Set(float64(len(shows)))
	c.log.Info("replication slot created; state seeded from its snapshot", "consistent_point", cp, "managed_shows", len(shows))
	c.ack(cp)
	return nil
}

// bindIdentity binds the accounting keyspace to this database, or refuses
// for good (replication.ErrRefused) when it accounts for another one:
// releases of this database's procs applied there would corrupt it.
func (c *consumer) bindIdentity(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	id, err := publisher.DatabaseIdentity(qctx, c.pool)
	cancel()
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	err = c.redisCall(ctx, "bind identity", func(ctx context.Context) error { return c.pub.BindIdentity(ctx, id) })
	if errors.Is(err, publisher.ErrIdentityMismatch) {
		return fmt.Errorf("%w: %w", replication.ErrRefused, err)
	}
	return err
}

// Resume checks Redis against the slot before streaming resumes and loads
// the persisted managed set.
func (c *consumer) Resume(ctx context.Context, slot replication.SlotInfo) error {
	f := slot.ConfirmedFlushLSN
	if err := c.resolveTables(ctx, replication.QueryText(c.pool)); err != nil {
		return err
	}
	if err := c.bindIdentity(ctx); err != nil {
		return err
	}
	var walText string
	if err := c.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&walText); err != nil {
		return fmt.Errorf("sidecar: read current WAL position: %w", err)
	}
	walNow, err := pglogrepl.ParseLSN(walText)
	if err != nil {
		return fmt.Errorf("sidecar: current WAL position %q: %w", walText, err)
	}
	var stored uint64
	var ok bool
	if err := c.redisCall(ctx, "read checkpoint", func(ctx context.Context) error {
		var err error
		stored, ok, err = c.pub.Checkpoint(ctx)
		return err
	}); err != nil {
		return err
	}
	reset := false
	switch {
	case ok && LSN(stored) > walNow:
		reset = true
		if err := c.redisCall(ctx, "reset checkpoint", func(ctx context.Context) error {
			return c.rdb.Set(ctx, publisher.LSNKey, publisher.FormatLSN(uint64(f)), 0).Err()
		}); err != nil {
			return err
		}
		c.setCheckpoint(f)
		if err := c.requestRebootstrap(ctx, fmt.Sprintf("Redis checkpoint %s is ahead of the database's WAL %s (another database, or a restored one)", LSN(stored), walNow)); err != nil {
			return err
		}
	case !ok:
		c.setCheckpoint(0)
		if err := c.requestRebootstrap(ctx, "no checkpoint in Redis (new or emptied Redis)"); err != nil {
			return err
		}
	case LSN(stored) < f:
		c.setCheckpoint(LSN(stored))
		if err := c.requestRebootstrap(ctx, fmt.Sprintf("Redis checkpoint %s is behind the slot's confirmed_flush_lsn %s: Redis lost acknowledged releases", LSN(stored), f)); err != nil {
			return err
		}
	default:
		c.setCheckpoint(LSN(stored))
	}

	var st managedState
	var found bool
	if err := c.redisCall(ctx, "read managed shows", func(ctx context.Context) error {
		var err error
		st, found, err = loadState(ctx, c.rdb)
		return err
	}); err != nil {
		return err
	}
	force := reset || (found && st.lsn > walNow)
	if !found || force {
		shows, err := seedManaged(ctx, replication.QueryText(c.pool))
		if err != nil {
			return err
		}
		st = managedState{lsn: f, shows: shows}
		c.state = st
		if err := c.persistState(ctx, force); err != nil {
			return err
		}
		c.log.Warn("no persisted managed-show set matches this slot; seeded it by a query (flips committed since the slot's confirmed position are re-applied from the stream)",
			"confirmed_flush_lsn", f, "managed_shows", len(shows))
	} else {
		c.state = st
	}
	if !c.cachesLoaded || f > c.applied {
		cs, err := seedCaches(ctx, replication.QueryText(c.pool))
		if err != nil {
			return err
		}
		c.c, c.cachesLoaded = cs, true
	}
	c.applied, c.pending = f, 0
	c.appliedA.Store(uint64(f))
	c.managedCount.Store(int64(len(c.state.shows)))
	c.m.managedShows.Set(float64(len(c.state.shows)))
	c.log.Info("resuming the replication slot", "confirmed_flush_lsn", f, "redis_checkpoint", c.checkpoint,
		"managed_shows", len(c.state.shows), "managed_set_lsn", c.state.lsn)
	return nil
}

// Apply handles one committed source transaction.
func (c *consumer) Apply(ctx context.Context, txn *replication.Transaction) error {
	p, err := c.plan(ctx, txn)
	if err != nil {
		return err
	}
	if err := c.execute(ctx, txn, p); err != nil {
		return err
	}
	// Commit the transaction's effect on the in-memory state only now: a
	// retried transaction starts again from the same state.
	if p.managed != nil {
		c.state.shows = p.managed
		c.managedCount.Store(int64(len(p.managed)))
		c.m.managedShows.Set(float64(len(p.managed)))
	}
	if txn.EndLSN > c.state.lsn {
		c.state.lsn = txn.EndLSN
	}
	c.applied = txn.EndLSN
	c.appliedA.Store(uint64(txn.EndLSN))
	if c.checkpoint >= txn.EndLSN {
		c.pending = 0
		c.ack(txn.EndLSN)
		return nil
	}
	if c.pending == 0 {
		c.pendingSince = c.now()
	}
	c.pending = txn.EndLSN
	if c.now().Sub(c.pendingSince) >= c.flushEvery {
		return c.flush(ctx, c.pending)
	}
	return nil
}

// Heartbeat makes an idle (or unmanaged-only) stream durable up to the
// server's position.
func (c *consumer) Heartbeat(ctx context.Context, hb replication.Heartbeat) error {
	target := max(hb.WALEnd, c.pending)
	if target == 0 {
		return nil
	}
	return c.flush(ctx, target)
}
