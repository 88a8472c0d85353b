package jobs

import (
	"sync"
	"time"
)

// Backoff is the schedule-after backoff of layers that found no host, per
// (cluster, layer). It is safe for concurrent use. See the package doc.
type Backoff struct {
	min, max time.Duration
	now      func() time.Time

	mu       sync.Mutex
	m        map[string]map[string]backoffEntry // cluster -> layer -> entry
	released uint64                             // early releases by a moved watch
}

type backoffEntry struct {
	until time.Time
	delay time.Duration
	watch Watch // nil: only the timer releases the layer
	// woken: released early by its watch and not missed since; wasted:
	// early releases in a row that ended in another miss.
	woken  bool
	wasted int
}

// MaxWastedWakes is how many early releases in a row may end in another
// miss before a layer's watches are ignored (only its timer releases it)
// until it books again. A layer that capacity does not help (refused by
// reservation rules or caps, or losing every race for scarce hosts) thereby
// falls back to the plain backoff instead of retrying at every capacity
// change of a busy farm.
const MaxWastedWakes = 8

// Watch tells a backed-off layer that the hosts it missed may have gained
// capacity since (hostcache.Watch): Moved must be cheap and lock-free, as
// Held calls it under the backoff's mutex.
type Watch interface {
	Moved() bool
}

// NewBackoff returns a backoff doubling from min to max. min <= 0 disables
// it (every method is then a no-op).
func NewBackoff(min, max time.Duration) *Backoff {
	if max < min {
		max = min
	}
	return &Backoff{min: min, max: max, now: time.Now, m: map[string]map[string]backoffEntry{}}
}

// SetClock replaces the clock (tests).
func (b *Backoff) SetClock(now func() time.Time) { b.now = now }

// Missed records that layer found no host in cluster and returns how long
// it is now held back. Only the timer releases it; see MissedWatch.
func (b *Backoff) Missed(cluster, layer string) time.Duration {
	return b.MissedWatch(cluster, layer, nil)
}

// MissedWatch is Missed with a watch on the capacity the layer missed: the
// layer is released early, by Held, once w has moved. The backoff keeps
// doubling across such releases (an early release does not reset it), so
// the timer stays the upper bound for a layer nothing relevant happens to;
// after MaxWastedWakes early releases in a row that each ended in another
// miss, w is ignored until the layer books.
func (b *Backoff) MissedWatch(cluster, layer string, w Watch) time.Duration {
	if b == nil || b.min <= 0 {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	layers := b.m[cluster]
	if layers == nil {
		layers = map[string]backoffEntry{}
		b.m[cluster] = layers
	}
	e, ok := layers[layer]
	switch {
	case !ok || now.Sub(e.until) > b.max:
		// First miss, or the last backoff ended long ago: start over.
		e = backoffEntry{delay: b.min}
	default:
		e.delay = min(e.delay*2, b.max)
	}
	e.until = now.Add(e.delay)
	if e.woken {
		e.woken = false
		e.wasted++
	}
	if e.wasted >= MaxWastedWakes {
		w = nil
	}
	e.watch = w
	layers[layer] = e
	return e.delay
}

// Booked clears the layer's backoff in cluster.
func (b *Backoff) Booked(cluster, layer string) {
	if b == nil || b.min <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if layers := b.m[cluster]; layers != nil {
		delete(layers, layer)
		if len(layers) == 0 {
			delete(b.m, cluster)
		}
	}
}

// Held lists the layers of cluster that are still backed off: their time
// has not come and their watch (if any) has not moved. A layer whose watch
// moved is released at once. Held also drops entries that ended long ago.
func (b *Backoff) Held(cluster string) []string {
	if b == nil || b.min <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	layers := b.m[cluster]
	var out []string
	for l, e := range layers {
		if now.Sub(e.until) > b.max {
			delete(layers, l)
			continue
		}
		if !now.Before(e.until) {
			continue
		}
		if e.watch != nil && e.watch.Moved() {
			e.until, e.watch, e.woken = now, nil, true
			layers[l] = e
			b.released++
			continue
		}
		out = append(out, l)
	}
	if layers != nil && len(layers) == 0 {
		delete(b.m, cluster)
	}
	return out
}

// Len is the number of tracked entries (tests, metrics).
func (b *Backoff) Len() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, layers := range b.m {
		n += len(layers)
	}
	return n
}

// Released counts the backoffs ended early because their watch moved
// (tests, metrics).
func (b *Backoff) Released() uint64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.released
}
