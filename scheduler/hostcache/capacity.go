package hostcache

import (
	"slices"
	"sync/atomic"

	"github.com/cuesched/cuesched/shared/cuebot"
)

// Capacity generations: how waiters learn that hosts they could not get
// have gained idle resources. See "Capacity wake-ups" in the package doc.

// maxWants bounds the floors a group remembers between two bumps; past it
// they collapse into their per-dimension minimum (still a necessary
// condition for any of them to fit).
const maxWants = 8

// Watch is the capacity generations of some groups at one moment. Moved
// reports whether one of them has been bumped since: a host of those groups
// gained idle resources that may fit a request that missed there, the
// groups were rebuilt (re-snapshot) or evicted, or, for a watch taken by
// Cache.Watch, a group was built. It is lock-free (atomic loads) and safe
// for concurrent use; the zero Watch never moves.
type Watch struct {
	gens []*atomic.Uint64
	at   uint64
}

// Moved reports whether the watched capacity changed since the watch was
// taken.
func (w Watch) Moved() bool {
	if len(w.gens) == 0 {
		return false
	}
	return w.sum() != w.at
}

func (w Watch) sum() uint64 {
	var s uint64
	for _, g := range w.gens {
		s += g.Load()
	}
	return s
}

// NoCandidateError is what Checkout returns when no host fits. It matches
// ErrNoCandidate (errors.Is) and carries a Watch of the probed groups taken
// atomically with the miss, so a caller that backs off can be released as
// soon as one of those groups gains capacity that may fit the request.
type NoCandidateError struct {
	Watch Watch
}

func (e *NoCandidateError) Error() string { return ErrNoCandidate.Error() }

// Is makes errors.Is(err, ErrNoCandidate) true.
func (e *NoCandidateError) Is(target error) bool { return target == ErrNoCandidate }

// Watch returns a watch of the groups (facilityID, showID, tag) for tags,
// for a caller about to sleep on them (a cluster pass that booked nothing).
// It registers no request floors: those come from the misses of the
// checkouts the caller made. Groups that do not exist yet are not built;
// instead the watch also moves when any group is built, so a group created
// by a checkout after the watch was taken cannot be missed. Take it before
// the checkouts it should cover.
func (c *Cache) Watch(facilityID, showID string, tags []string) Watch {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := Watch{gens: make([]*atomic.Uint64, 0, len(tags)+1)}
	w.gens = append(w.gens, &c.buildGen)
	for _, tag := range tags {
		if g := c.groups[ClusterKey{FacilityID: facilityID, ShowID: showID, Tag: tag}]; g != nil {
			w.gens = append(w.gens, &g.gen)
		}
	}
	w.at = w.sum()
	return w
}

// CapacityChanged returns a channel closed at the next capacity bump of any
// group (see Watch). Take a new one after every wake-up; then ask the
// watches you hold whether they moved.
func (c *Cache) CapacityChanged() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capWatched = true
	return c.capChanged
}

// missLocked records that a request needing need found no host in gs
// and returns the watch of gs at this moment.
func (c *Cache) missLocked(gs []*group, need want) Watch {
	w := Watch{gens: make([]*atomic.Uint64, len(gs))}
	for i, g := range gs {
		g.addWant(need)
		w.gens[i] = &g.gen
	}
	w.at = w.sum()
	return w
}

// bumpGroupLocked moves g's generation: every watch of g moves, and the
// floors it was waiting for are forgotten (their waiters retry, and
// register again if they miss again).
func (c *Cache) bumpGroupLocked(g *group) {
	g.gen.Add(1)
	g.wants = g.wants[:0]
	c.m.capacityBumps.Inc()
	c.signalCapacityLocked()
}

func (c *Cache) signalCapacityLocked() {
	if c.capWatched {
		close(c.capChanged)
		c.capChanged = make(chan struct{})
		c.capWatched = false
	}
}

// want is what a checkout that missed in a group needed: its floors and
// its gates (Fits' OS and thread-mode gates; Accept is not known).
type want struct {
	floor      idle
	os         string // "" = any
	threadable bool
}

// implies reports whether every host that passes a also passes b.
func (a want) implies(b want) bool {
	return covers(a.floor, b.floor) && (b.os == "" || b.os == a.os) && (b.threadable || !a.threadable)
}

// admits reports whether a host with effective values v, serving the OS
// values oses, in thread mode ALL (threadAll) or not, passes w.
func (w want) admits(v idle, oses []string, threadAll bool) bool {
	return covers(v, w.floor) && cuebot.ServesOS(oses, w.os) && (w.threadable || !threadAll)
}

// addWant remembers what a request that missed in g needed, dropping
// entries another one implies.
func (g *group) addWant(w want) {
	for i, x := range g.wants {
		if w.implies(x) {
			return // any host passing w passes x: x already wakes for it
		}
		if x.implies(w) {
			g.wants[i] = w
			g.wants = slices.DeleteFunc(g.wants, func(y want) bool { return y != w && y.implies(w) })
			return
		}
	}
	if len(g.wants) >= maxWants {
		m := w
		for _, x := range g.wants {
			m.floor = idle{min(m.floor.cores, x.floor.cores), min(m.floor.memKB, x.floor.memKB),
				min(m.floor.gpus, x.floor.gpus), min(m.floor.gpuMemKB, x.floor.gpuMemKB)}
			if m.os != x.os {
				m.os = ""
			}
			m.threadable = m.threadable || x.threadable
		}
		g.wants = append(g.wants[:0], m)
		return
	}
	g.wants = append(g.wants, w)
}

// covers reports whether a >= b in every dimension.
func covers(a, b idle) bool {
	return a.cores >= b.cores && a.memKB >= b.memKB && a.gpus >= b.gpus && a.gpuMemKB >= b.gpuMemKB
}

// gained reports whether a host indexed in g with effective values v
// (serving oses, thread mode ALL or not), that had prev before, or was not in g at
// all (joined), now passes what g is waiting for and did not fit it
// before. A host that already fitted the floors when the waiter missed was
// refused for another reason (Accept) that more memory or cores does not
// cure, so it does not wake anyone: host_stat pings that move free memory
// up and down stay silent.
func (g *group) gained(v, prev idle, oses []string, threadAll, joined bool) bool {
	for _, w := range g.wants {
		if w.admits(v, oses, threadAll) && (joined || !covers(prev, w.floor)) {
			return true
		}
	}
	return false
}
