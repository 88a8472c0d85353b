package dispatch

import (
	"context"
	"time"
)

// How an unresolved booking transaction was settled
// (scheduler_dispatch_unresolved_transactions_total{result}).
const (
	unresolvedPutBack      = "put_back"
	unresolvedNotCommitted = "not_committed"
	unresolvedLeft         = "left"
)

const (
	// unresolvedQueueLen bounds the transactions waiting for Run; one
	// more is left to the reconcile and Cuebot's orphaned-proc check.
	unresolvedQueueLen = 256
	// unresolvedHorizon: Run stops trying to settle a transaction this
	// long after it was sent, before Cuebot's orphaned-proc check (5
	// minutes) clears what it committed anyway.
	unresolvedHorizon = 4 * time.Minute
	// unresolvedRetryMax caps the wait between two tries.
	unresolvedRetryMax = 5 * time.Second
)

// unresolvedBatch is a booking transaction whose outcome stayed unknown at
// the end of its resolution: its booked frames, and the backend it ran on
// (0: unknown) and when it was sent, for procsFound.
type unresolvedBatch struct {
	layer  string
	booked []planned
	pid    uint32
	sent   time.Time
}

// later queues b for Run, or leaves it to the reconcile when the queue is
// full.
func (d *Dispatcher) later(b unresolvedBatch) {
	select {
	case d.unresolved <- b:
		d.m.unresolvedQueue.Inc()
	default:
		d.m.unresolved.WithLabelValues(unresolvedLeft).Inc()
		d.log.Warn("too many booking transactions of unknown outcome queued; this one is left to the accounting reconcile and Cuebot's orphaned-proc check",
			"layer", b.layer, "frames", len(b.booked))
	}
}

// Run settles, in the background, the booking transactions whose outcome
// stayed unknown at the end of their resolution (Postgres unreachable from
// this instance), trying again (500 ms doubling to 5 s) until Postgres
// answers or unresolvedHorizon after the transaction was sent. A
// transaction that committed has its frames put back to WAITING (never
// launched, so nothing to kill; exit status 299 as for a failed launch, not
// a retry), its procs deleted, their resources given back to their hosts
// and its bookings released; one that did not commit has its bookings
// rolled back. What Run does not settle (its context ended, the horizon
// passed) the accounting reconcile and Cuebot's orphaned-proc check settle
// later. It returns nil when ctx ends.
func (d *Dispatcher) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			for {
				select {
				case <-d.unresolved:
					d.m.unresolvedQueue.Dec()
					d.m.unresolved.WithLabelValues(unresolvedLeft).Inc()
				default:
					return nil
				}
			}
		case b := <-d.unresolved:
			d.m.unresolvedQueue.Dec()
			d.m.unresolved.WithLabelValues(d.settleUnresolved(ctx, b)).Inc()
		}
	}
}

// settleUnresolved tries b until it is settled, the horizon passes or ctx
// ends, and says how it ended.
func (d *Dispatcher) settleUnresolved(ctx context.Context, b unresolvedBatch) string {
	done := make(map[string]bool, len(b.booked))
	wait := 500 * time.Millisecond
	// sawProcs: a try found the procs (the transaction committed); a
	// later try no longer finds those it put back.
	sawProcs := false
	for {
		committed, err := d.settleOnce(ctx, b, done)
		sawProcs = sawProcs || committed
		if err == nil {
			if sawProcs {
				d.log.Info("booking transaction of unknown outcome had committed; its frames are back to WAITING", "layer", b.layer, "frames", len(b.booked))
				return unresolvedPutBack
			}
			d.log.Info("booking transaction of unknown outcome had not committed; its bookings are rolled back", "layer", b.layer, "frames", len(b.booked))
			return unresolvedNotCommitted
		}
		if time.Since(b.sent)+wait > unresolvedHorizon {
			d.log.Warn("booking transaction of unknown outcome not settled; left to the accounting reconcile and Cuebot's orphaned-proc check",
				"layer", b.layer, "frames", len(b.booked), "error", err)
			return unresolvedLeft
		}
		select {
		case <-ctx.Done():
			return unresolvedLeft
		case <-time.After(wait):
		}
		wait = min(2*wait, unresolvedRetryMax)
	}
}

// settleOnce looks for b's procs and settles each proc not yet done: a
// committed one put back and released, a missing one rolled back. It
// reports whether it found procs (the transaction committed).
func (d *Dispatcher) settleOnce(ctx context.Context, b unresolvedBatch, done map[string]bool) (bool, error) {
	found, err := d.procsFound(ctx, b.booked, time.Now().Add(resolveTimeout), b.pid, b.sent)
	if err != nil {
		return false, err
	}
	for _, p := range b.booked {
		switch {
		case done[p.proc]:
		case !found[p.proc]:
			d.rollback(p.proc)
			done[p.proc] = true
		default:
			// The claim moved the frame one version on.
			if _, _, err := d.putBack(ctx, p, p.frame.Version+1); err != nil {
				return len(found) > 0, err
			}
			if _, err := d.acct.Release(ctx, p.proc); err != nil {
				d.m.accountingErrors.WithLabelValues("release").Inc()
				d.log.Warn("accounting release failed; the sidecar or the recompute will heal it", "proc", p.proc, "error", err)
			}
			done[p.proc] = true
		}
	}
	return len(found) > 0, nil
}
