package sidecar

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A streamed transaction's releases and cap changes reach Redis only once
// PostgreSQL shows the transaction to new snapshots: why is in the package
// doc ("A release waits until PostgreSQL shows its DELETE"). One snapshot
// (txid_current_snapshot) answers for every transaction that ended before
// it, and the last one read is kept, so a backlog costs one read.

// snapshotView is a snapshot's horizon: ids below xmin are finished, ids
// from xmax on had not started, ids in xip were in progress.
type snapshotView struct {
	xmin, xmax uint64
	xip        map[uint64]struct{}
	ok         bool
}

// widen turns the 32-bit transaction id of the stream into the 64-bit id
// (epoch and id) nearest ref: the ids in use are within 2^31 of each
// other, which PostgreSQL's wraparound protection guarantees.
func widen(xid uint32, ref uint64) uint64 {
	return uint64(int64(ref) + int64(int32(xid-uint32(ref))))
}

// shows reports whether the snapshot shows the committed transaction xid.
func (v *snapshotView) shows(xid uint32) bool {
	if !v.ok {
		return false
	}
	id := widen(xid, v.xmax)
	if id < v.xmin {
		return true
	}
	if id >= v.xmax {
		return false
	}
	_, running := v.xip[id]
	return !running
}

// parseSnapshot reads txid_current_snapshot's text form, xmin:xmax:xip,...
func parseSnapshot(s string) (snapshotView, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snapshotView{}, fmt.Errorf("sidecar: snapshot %q is not xmin:xmax:xip", s)
	}
	xmin, err1 := strconv.ParseUint(parts[0], 10, 64)
	xmax, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || xmin > xmax {
		return snapshotView{}, fmt.Errorf("sidecar: snapshot %q has no valid xmin and xmax", s)
	}
	v := snapshotView{xmin: xmin, xmax: xmax, ok: true}
	if parts[2] != "" {
		ids := strings.Split(parts[2], ",")
		v.xip = make(map[uint64]struct{}, len(ids))
		for _, x := range ids {
			id, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return snapshotView{}, fmt.Errorf("sidecar: snapshot %q: in-progress id %q: %w", s, x, err)
			}
			v.xip[id] = struct{}{}
		}
	}
	return v, nil
}

// visibilityPatience is how long a transaction may stay invisible before the
// wait is logged (once per transaction); the wait itself has no limit, as a
// release applied early is exactly the over-booking it prevents.
const visibilityPatience = 5 * time.Second

// awaitVisible returns once PostgreSQL shows transaction xid to new
// snapshots (at once when the last snapshot read already does).
func (c *consumer) awaitVisible(ctx context.Context, xid uint32) error {
	if xid == 0 || c.vis.shows(xid) {
		return nil
	}
	start := c.now()
	backoff := time.Millisecond
	for waited, warned := false, false; ; {
		v, err := c.readSnapshot(ctx)
		if err != nil {
			return err
		}
		c.vis = v
		if v.shows(xid) {
			return nil
		}
		if !waited {
			waited = true
			c.m.visWaits.Inc()
		}
		if !warned && c.now().Sub(start) >= visibilityPatience {
			warned = true
			c.log.Warn("a streamed transaction is still not visible in PostgreSQL; its releases and cap changes wait for it (a synchronous standby that does not confirm?)",
				"xid", xid, "waited", c.now().Sub(start).Round(time.Millisecond))
		}
		if err := pause(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// snapshotTimeout bounds one snapshot read.
const snapshotTimeout = 10 * time.Second

func (c *consumer) readSnapshot(ctx context.Context) (snapshotView, error) {
	qctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	var s string
	if err := c.pool.QueryRow(qctx, `SELECT txid_current_snapshot()::text`).Scan(&s); err != nil {
		return snapshotView{}, fmt.Errorf("sidecar: read a snapshot to tell whether a streamed transaction is visible: %w", err)
	}
	c.m.visReads.Inc()
	return parseSnapshot(s)
}
