package reservations

import (
	"sync"
	"time"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
)

// buckets are the leaky buckets of net blocked time, one per layer: the
// level grows while the layer's last outcome was "blocked" (no host fitted
// a frame) and drains while it was "placed", at one second per second,
// between 0 and the threshold. A layer whose level reaches the threshold
// and that is blocked now is a candidate for a reservation.
//
// Observations come from the matcher's passes; between them the last
// outcome holds (a layer waiting out its backoff after a miss is still
// blocked), for at most horizon: a layer nobody has worked for longer (its
// job paused, or no pass drew it) stops filling, and is forgotten after
// ten horizons. Buckets are in memory, per instance: a restart or a
// failover starts them empty (held reservations are in Redis and stay).
type buckets struct {
	threshold time.Duration
	horizon   time.Duration

	mu sync.Mutex
	m  map[string]*bucket
}

type bucket struct {
	level time.Duration
	state matcher.LayerOutcome
	at    time.Time // last observation
	// Of the last blocked observation: where it was blocked, and the
	// layer as read then.
	cluster *clusters.Cluster
	layer   jobs.Layer
}

func newBuckets(threshold, horizon time.Duration) *buckets {
	return &buckets{threshold: threshold, horizon: horizon, m: map[string]*bucket{}}
}

// advance brings b's level from its last observation up to now.
func (bs *buckets) advance(b *bucket, now time.Time) time.Duration {
	dt := now.Sub(b.at)
	if dt <= 0 {
		return b.level
	}
	if dt > bs.horizon {
		dt = bs.horizon
	}
	lv := b.level
	switch b.state {
	case matcher.OutcomeBlocked:
		lv += dt
	case matcher.OutcomePlaced:
		lv -= dt
	}
	return min(max(lv, 0), bs.threshold)
}

// observe records one outcome of layer l in a pass of cluster c.
func (bs *buckets) observe(c *clusters.Cluster, l *jobs.Layer, o matcher.LayerOutcome, now time.Time) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.m[l.ID]
	if b == nil {
		if o != matcher.OutcomeBlocked {
			return // nothing to remember until it is blocked
		}
		b = &bucket{at: now, state: o}
		bs.m[l.ID] = b
	}
	b.level = bs.advance(b, now)
	b.at, b.state = now, o
	if o == matcher.OutcomeBlocked {
		b.cluster = c
		cp := *l
		cp.Frames, cp.Env = nil, nil // not needed; do not pin them
		b.layer = cp
	}
}

// candidate is a layer whose bucket is full and that is blocked now.
type candidate struct {
	cluster *clusters.Cluster
	layer   jobs.Layer
	level   time.Duration
}

// full returns the candidates at now and forgets buckets nobody observed
// for ten horizons or that drained empty since their last placement.
func (bs *buckets) full(now time.Time) []candidate {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var out []candidate
	for id, b := range bs.m {
		lv := bs.advance(b, now)
		if now.Sub(b.at) > 10*bs.horizon || (lv == 0 && b.state != matcher.OutcomeBlocked) {
			delete(bs.m, id)
			continue
		}
		if b.state == matcher.OutcomeBlocked && lv >= bs.threshold && now.Sub(b.at) <= bs.horizon {
			out = append(out, candidate{cluster: b.cluster, layer: b.layer, level: lv})
		}
	}
	return out
}

// level returns a layer's current level (tests and status).
func (bs *buckets) level(layer string, now time.Time) (time.Duration, bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.m[layer]
	if b == nil {
		return 0, false
	}
	return bs.advance(b, now), true
}

// size is the number of tracked layers.
func (bs *buckets) size() int {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return len(bs.m)
}
