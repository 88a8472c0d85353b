package hostcache

import (
	"context"
	"fmt"

	"github.com/cuesched/cuesched/shared/replication"
)

// Snapshot loads a new mirror from the slot's snapshot and swaps it in.
// Groups keep their keys and are rebuilt from the new mirror; checked-out
// hosts stay checked out.
func (c *Cache) Snapshot(ctx context.Context, q replication.SnapshotQuerier) error {
	st := newState()
	// The schema of each mirrored table on this connection's search_path:
	// the tables the SELECTs below read, and the only ones whose streamed
	// changes are applied (a same-named table in another schema that the
	// publication also carries is not Cuebot's).
	tables, err := replication.ResolveTables(ctx, replication.SnapshotText(q), cachedTables()...)
	if err != nil {
		return fmt.Errorf("hostcache: %w", err)
	}
	st.tables = tables
	e := newEffects()
	for _, sq := range snapshotQueries {
		rel := replication.NewRelation(0, "", sq.table, nil)
		err := q.Query(ctx, sq.sql, func(r replication.Row) error {
			ch := replication.Change{Op: replication.Insert, Relation: rel, New: r}
			return st.apply(&ch, e)
		})
		if err != nil {
			return fmt.Errorf("hostcache: snapshot of %s: %w", sq.table, err)
		}
	}
	for _, h := range st.hosts {
		h.lsn = q.ConsistentPoint()
		h.version = 1
	}
	if c.tap != nil {
		if err := c.tap.TapSnapshot(ctx, q); err != nil {
			return fmt.Errorf("hostcache: tap snapshot: %w", err)
		}
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.st
	c.st = st
	for _, h := range old.hosts {
		h.groups = nil
	}
	for _, g := range c.groups {
		g.tree.Clear(false)
		g.size = 0
		// A new mirror may hold anything: every waiter retries.
		c.bumpGroupLocked(g)
	}
	c.assumedList = nil
	for id, l := range c.leases {
		if h := st.hosts[id]; h != nil {
			h.out = l
		}
	}
	for id, o := range old.hosts {
		if h := st.hosts[id]; h != nil {
			c.adoptRecentLocked(o, h)
		} else {
			c.forgetRecentLocked(o)
		}
	}
	for _, h := range st.hosts {
		c.reindexLocked(h)
	}
	c.lastLSN.Store(uint64(q.ConsistentPoint()))
	c.freshAsOf.Store(now.UnixNano())
	c.hostCount.Store(int64(len(st.hosts)))
	c.m.snapshots.Inc()
	c.bumpLocked()
	c.readyOnce.Do(func() { close(c.ready) })
	c.log.Info("host cache loaded", "hosts", len(st.hosts), "consistent_point", q.ConsistentPoint())
	return nil
}

// Apply applies one committed transaction in place. A TRUNCATE of any cached
// table asks the stream for a new snapshot instead. Changes of other
// relations (tables the cache does not mirror, or same-named tables in
// another schema) are ignored.
func (c *Cache) Apply(ctx context.Context, txn *replication.Transaction) (err error) {
	if c.tap != nil {
		defer func() { // after the unlock below
			if err == nil {
				c.tap.TapApply(txn)
			}
		}()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range txn.Changes {
		if ch := &txn.Changes[i]; ch.Op == replication.Truncate && c.mirroredLocked(ch) {
			return fmt.Errorf("hostcache: TRUNCATE %s: %w", ch.Relation.QualifiedName(), replication.ErrResync)
		}
	}
	e := newEffects()
	for i := range txn.Changes {
		ch := &txn.Changes[i]
		if !c.mirroredLocked(ch) {
			continue
		}
		if err := c.st.apply(ch, e); err != nil {
			return fmt.Errorf("hostcache: transaction %d at %s: %w", txn.XID, txn.CommitLSN, err)
		}
	}
	for a := range e.allocs {
		for h := range c.st.hostsByAlloc[a] {
			e.hosts[h] = struct{}{}
		}
	}
	for _, h := range e.gone {
		c.dropLocked(h)
	}
	for h := range e.hosts {
		if h.out == nil {
			h.out = c.leases[h.id] // re-created while checked out: still out
		}
	}
	for h := range e.rowChanged {
		c.observeRowLocked(h)
	}
	for h := range e.hosts {
		h.lsn = txn.CommitLSN
		h.version++
		c.reindexLocked(h)
	}
	c.lastLSN.Store(uint64(txn.EndLSN))
	if t := txn.CommitTime.UnixNano(); t > c.freshAsOf.Load() {
		c.freshAsOf.Store(t)
	}
	c.hostCount.Store(int64(len(c.st.hosts)))
	c.bumpLocked()
	return nil
}

// Heartbeat records that the cache is current as of the server's time.
func (c *Cache) Heartbeat(ctx context.Context, hb replication.Heartbeat) error {
	if t := hb.ServerTime.UnixNano(); t > c.freshAsOf.Load() {
		c.freshAsOf.Store(t)
	}
	return nil
}

// mirroredLocked reports whether a streamed change is of a mirrored table
// (its name and the schema the snapshot resolved it to); other relations
// are logged once each (replication.Tables.Admit).
func (c *Cache) mirroredLocked(ch *replication.Change) bool {
	return c.st.tables.Admit(ch, &c.ignored, c.log)
}

// observeRowLocked applies the assume/confirm rule to a WAL change of a
// host row: a checked-out host remembers the values (so a later check-in
// can tell the WAL already has them), and an assumed host whose row now
// shows exactly the assumed values is confirmed.
func (c *Cache) observeRowLocked(h *hostRec) {
	if l := h.out; l != nil {
		if len(l.seen) < maxSeen {
			l.seen = append(l.seen, h.row)
		} else {
			l.many = true
		}
	}
	if a := h.assumed; a != nil && confirms(h.row, a.v) {
		c.clearAssumptionLocked(h)
		c.m.assumptions.WithLabelValues("confirmed").Inc()
	}
}

// confirms reports whether a host row the WAL delivered is (or may be) the
// commit whose values a check-in reported: equal cores, GPUs and GPU memory,
// and at least the reported memory. Memory cannot be compared exactly: the
// dispatcher reports it as min(the row it committed, the checked-out view
// minus what it took), and the view is lowered by host_stat's free memory
// and by a pending assumption, so the report is often below the row. With
// exact equality such a check-in was never confirmed, and the host looked
// busier than it was (freed resources hidden) until AssumeTTL, after every
// booking. The price: values are all that identifies the commit, and an
// older row that happens to show the same cores, GPUs and GPU memory (a
// release and a booking in between cancelling out) now also matches when
// only its memory is higher. It confirms early; the index then follows the
// WAL, which may show more idle than Postgres has until the booking's row
// arrives (one WAL lag), and a checkout in that window gets a host the
// dispatcher's guarded UPDATE refuses (HostStale, rolled back, retried).
// Exact equality had the same hazard whenever memory matched too; the
// end-to-end benchmark sees it in about 1% of batches. The exact fix is on
// the dispatcher's side: report the host row's memory as RETURNING gave it
// (as Checkin documents) and let the cache apply the host_stat cap.
func confirms(row, v idle) bool {
	return row.cores == v.cores && row.gpus == v.gpus && row.gpuMemKB == v.gpuMemKB && row.memKB >= v.memKB
}

// dropLocked removes a deleted host from every index.
func (c *Cache) dropLocked(h *hostRec) {
	for _, g := range h.groups {
		g.remove(h)
	}
	h.groups = nil
	if h.assumed != nil {
		c.clearAssumptionLocked(h)
	}
	c.forgetRecentLocked(h)
}
