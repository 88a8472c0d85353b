// Package releases wakes the clusters that wait for a show's procs to end.
//
// A cluster pass that finds its show's waiting work held back by a cap (a
// job or folder maximum, the subscription's burst) books nothing and
// sleeps queue.cluster_saturated_sleep: its headroom comes back when one
// of the show's frames ends, and no host-cache event says so (the host
// that freed up may be full of other shows' wants, or fit nobody's miss).
// The sidecar's release script publishes each show it released a proc of
// (publisher.WatchReleases); the Board keeps a generation per show, and
// the pass hands the feed a Watch of its show, taken before its queries,
// so a release during the pass is not missed. The watch moves at the
// first release of the show after it was taken, but not before
// queue.cluster_release_wake_min has passed since: a show whose frames end
// many times a second gets at most one capped pass per that interval per
// cluster, not one per release. A lost notice (Redis unreachable, a slow
// reader) leaves the cluster to its timed sleep: notices are hints only.
package releases

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
)

// Board holds a release generation per show.
type Board struct {
	// Log gets Run's warnings (New sets a null logger).
	Log hclog.Logger

	min time.Duration
	now func() time.Time

	mu      sync.Mutex
	gens    map[string]*atomic.Uint64
	changed chan struct{}
	// timer re-signals Changed min after the last notice, when watches
	// taken less than min before it may have moved by then.
	timer    *time.Timer
	timerAt  time.Time
	lastSeen time.Time

	notices prometheus.Counter
}

// New returns a Board whose watches move no sooner than min after they
// were taken (min > 0).
func New(min time.Duration, reg prometheus.Registerer) *Board {
	b := &Board{Log: hclog.NewNullLogger(), min: min, now: time.Now, gens: map[string]*atomic.Uint64{}, changed: make(chan struct{}),
		notices: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_release_notices_total",
			Help: "Release notices received from the accounting store (a show had procs released); each may wake that show's clusters held back by a cap or burst.",
		})}
	if reg != nil {
		reg.MustRegister(b.notices)
	}
	return b
}

// Run feeds the Board from watch (publisher.WatchReleases) until ctx ends,
// subscribing again after an error (1 s, doubling up to a minute; each
// failure is a warning: clusters then wait out their sleeps).
func (b *Board) Run(ctx context.Context, watch func(ctx context.Context, fn func(show string)) error) error {
	backoff := time.Second
	for ctx.Err() == nil {
		err := watch(ctx, b.Bump)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			b.Log.Warn("no release notices: a cluster held back by a cap or burst waits out queue.cluster_saturated_sleep; retrying",
				"error", err, "retry_in", backoff)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Minute)
	}
	b.mu.Lock()
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	return nil
}

// Bump records a release of show's procs.
func (b *Board) Bump(show string) {
	b.notices.Inc()
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.gens[show]; g != nil {
		g.Add(1)
	} else {
		// Nobody watches it yet: a watch taken later starts from here.
		b.gens[show] = new(atomic.Uint64)
	}
	now := b.now()
	b.lastSeen = now
	b.signalLocked()
	// A watch taken at t moves from t+min on; one taken before this
	// notice has t+min <= now+min, so a signal at now+min finds it moved.
	if b.timer == nil {
		b.timerAt = now.Add(b.min)
		b.timer = time.AfterFunc(b.min, b.fire)
	}
}

func (b *Board) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.signalLocked()
	if next := b.lastSeen.Add(b.min); next.After(b.timerAt) {
		b.timerAt = next
		b.timer.Reset(next.Sub(b.now()))
		return
	}
	b.timer = nil
}

func (b *Board) signalLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Changed returns a channel closed at the next notice, and again min after
// the last one; take a new one after every wake-up.
func (b *Board) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changed
}

// Watch returns a watch of show's releases, taken now.
func (b *Board) Watch(show string) clusters.Watch {
	b.mu.Lock()
	g := b.gens[show]
	if g == nil {
		g = new(atomic.Uint64)
		b.gens[show] = g
	}
	b.mu.Unlock()
	return &watch{gen: g, at: g.Load(), from: b.now().Add(b.min), now: b.now}
}

type watch struct {
	gen  *atomic.Uint64
	at   uint64
	from time.Time
	now  func() time.Time
}

// Moved reports a release of the show since the watch was taken, once min
// has passed since.
func (w *watch) Moved() bool {
	return w.gen.Load() != w.at && !w.now().Before(w.from)
}
