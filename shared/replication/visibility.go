package replication

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/shared/pause"
)

// A delivered Transaction may not be visible yet. The walsender ships a
// transaction once its commit record is flushed, which can be before the
// committing backend has left the in-progress list that snapshots are
// built from: microseconds as a rule, longer on a loaded machine, and as
// long as a synchronous standby takes to confirm. A consumer that acts on
// a transaction and then reads Postgres (or lets others read it, as the
// sidecar's releases do) must first wait until a snapshot shows it:
// Visibility.Await. One snapshot (txid_current_snapshot) answers for every
// transaction that ended before it, and the last one read is kept, so a
// backlog costs one read.

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
		return snapshotView{}, fmt.Errorf("replication: snapshot %q is not xmin:xmax:xip", s)
	}
	xmin, err1 := strconv.ParseUint(parts[0], 10, 64)
	xmax, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || xmin > xmax {
		return snapshotView{}, fmt.Errorf("replication: snapshot %q has no valid xmin and xmax", s)
	}
	v := snapshotView{xmin: xmin, xmax: xmax, ok: true}
	if parts[2] != "" {
		ids := strings.Split(parts[2], ",")
		v.xip = make(map[uint64]struct{}, len(ids))
		for _, x := range ids {
			id, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return snapshotView{}, fmt.Errorf("replication: snapshot %q: in-progress id %q: %w", s, x, err)
			}
			v.xip[id] = struct{}{}
		}
	}
	return v, nil
}

// RowQuerier runs a one-row query (a *pgxpool.Pool or *pgx.Conn).
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// VisibilityOptions configures a Visibility.
type VisibilityOptions struct {
	Logger hclog.Logger
	// Waits counts the Await calls that had to wait (a transaction the
	// last snapshot did not show yet was not shown by the next one
	// either); Reads counts snapshot reads. Either may be nil.
	Waits, Reads prometheus.Counter
	// Patience is how long a wait lasts before it is logged, once per
	// Await (default 5 s). Await itself waits until its context ends.
	Patience time.Duration
	// What names what waits, for that log line.
	What string
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Visibility tells when PostgreSQL shows streamed transactions to new
// snapshots. It is safe for concurrent use.
type Visibility struct {
	db RowQuerier
	o  VisibilityOptions

	mu   sync.Mutex
	last snapshotView // the last snapshot read
}

// NewVisibility returns a Visibility that reads snapshots on db.
func NewVisibility(db RowQuerier, o VisibilityOptions) *Visibility {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Patience <= 0 {
		o.Patience = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Visibility{db: db, o: o}
}

// Await returns once PostgreSQL shows every committed transaction of xids
// to new snapshots (at once when the last snapshot read already does; an
// xid of 0 is ignored). It waits with backoff, 1 ms doubling to 50 ms,
// until ctx ends, and then returns ctx's error.
func (v *Visibility) Await(ctx context.Context, xids ...uint32) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.showsAll(xids) {
		return nil
	}
	start := v.o.Now()
	backoff := time.Millisecond
	for waited, warned := false, false; ; {
		s, err := v.read(ctx)
		if err != nil {
			return err
		}
		v.last = s
		if v.showsAll(xids) {
			return nil
		}
		if !waited {
			waited = true
			if v.o.Waits != nil {
				v.o.Waits.Inc()
			}
		}
		if d := v.o.Now().Sub(start); !warned && d >= v.o.Patience {
			warned = true
			v.o.Logger.Warn("a streamed transaction is still not visible in PostgreSQL; "+v.o.What+" wait for it (a synchronous standby that does not confirm?)",
				"xids", xids, "waited", d.Round(time.Millisecond))
		}
		if err := pause.For(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

func (v *Visibility) showsAll(xids []uint32) bool {
	for _, x := range xids {
		if x != 0 && !v.last.shows(x) {
			return false
		}
	}
	return true
}

// snapshotTimeout bounds one snapshot read.
const snapshotTimeout = 10 * time.Second

func (v *Visibility) read(ctx context.Context) (snapshotView, error) {
	qctx, cancel := context.WithTimeout(ctx, snapshotTimeout)
	defer cancel()
	var s string
	if err := v.db.QueryRow(qctx, `SELECT txid_current_snapshot()::text`).Scan(&s); err != nil {
		return snapshotView{}, fmt.Errorf("replication: read a snapshot to tell whether a streamed transaction is visible: %w", err)
	}
	if v.o.Reads != nil {
		v.o.Reads.Inc()
	}
	return parseSnapshot(s)
}
