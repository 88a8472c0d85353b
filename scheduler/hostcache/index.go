package hostcache

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/btree"
)

// HostBookingStrategy picks Best-Fit (saturation true: the smallest
// sufficient bucket first, filling hosts up) or Worst-Fit (false: the
// largest first, spreading load) independently for cores and memory.
type HostBookingStrategy struct {
	CoreSaturation   bool
	MemorySaturation bool
}

// DefaultStrategy is Best-Fit on cores, Worst-Fit on memory (the reference
// scheduler's default).
func DefaultStrategy() HostBookingStrategy { return HostBookingStrategy{CoreSaturation: true} }

func (s HostBookingStrategy) String() string {
	fit := func(b bool) string {
		if b {
			return "best-fit"
		}
		return "worst-fit"
	}
	return fit(s.CoreSaturation) + " cores, " + fit(s.MemorySaturation) + " memory"
}

// ClusterKey names a group: the hosts of one facility, usable by one show
// (through a subscription to the host's allocation) and carrying one tag.
type ClusterKey struct {
	FacilityID, ShowID, Tag string
}

func (k ClusterKey) String() string { return fmt.Sprintf("%s/%s/%s", k.FacilityID, k.ShowID, k.Tag) }

// group is one ClusterKey's index: idle cores (whole cores) → idle-memory
// buckets (idle bytes / memory_key_divisor) → hosts, as a B-tree of core
// buckets each holding a B-tree of (memory bucket, host) entries. Every
// bucket is a B-tree node range, so removal and insertion are O(log n) and
// empty core buckets are pruned.
type group struct {
	key         ClusterKey
	tree        *btree.BTreeG[*coreBucket]
	size        int
	lastQueried time.Time
	freeList    *btree.FreeListG[memItem]
	// gen is the capacity generation (see capacity.go); wants are the
	// floors of checkouts that missed here since its last bump (c.mu).
	gen   atomic.Uint64
	wants []want
	probe coreBucket // lookup key, reused under the cache's mutex
}

type coreBucket struct {
	core uint32
	mem  *btree.BTreeG[memItem]
}

// memItem orders by memory bucket, then by the host's creation sequence (a
// stable, deterministic order inside a bucket).
type memItem struct {
	mem uint32
	seq uint64
	h   *hostRec
}

func lessCore(a, b *coreBucket) bool { return a.core < b.core }

func lessMem(a, b memItem) bool {
	if a.mem != b.mem {
		return a.mem < b.mem
	}
	return a.seq < b.seq
}

const (
	coreDegree = 8
	memDegree  = 16
)

func newGroup(key ClusterKey, fl *btree.FreeListG[memItem], now time.Time) *group {
	return &group{key: key, tree: btree.NewG(coreDegree, lessCore), lastQueried: now, freeList: fl}
}

func (g *group) insert(h *hostRec) {
	g.probe.core = h.coreKey
	cb, ok := g.tree.Get(&g.probe)
	if !ok {
		cb = &coreBucket{core: h.coreKey, mem: btree.NewWithFreeListG(memDegree, lessMem, g.freeList)}
		g.tree.ReplaceOrInsert(cb)
	}
	if _, replaced := cb.mem.ReplaceOrInsert(memItem{mem: h.memKey, seq: h.seq, h: h}); !replaced {
		g.size++
	}
}

func (g *group) remove(h *hostRec) {
	g.probe.core = h.coreKey
	cb, ok := g.tree.Get(&g.probe)
	if !ok {
		return
	}
	if _, found := cb.mem.Delete(memItem{mem: h.memKey, seq: h.seq}); found {
		g.size--
	}
	if cb.mem.Len() == 0 {
		g.tree.Delete(cb)
	}
}

// find walks the buckets with core key ≥ coreHint and memory key ≥ memHint
// in the strategy's order and returns the first host ok accepts. Best-Fit
// walks a dimension upward from the hint, Worst-Fit downward from the
// largest bucket.
func (g *group) find(coreHint, memHint uint32, s HostBookingStrategy, ok func(*hostRec) bool) *hostRec {
	var found *hostRec
	visitMem := func(it memItem) bool {
		if ok(it.h) {
			found = it.h
			return false
		}
		return true
	}
	visitCore := func(cb *coreBucket) bool {
		if s.MemorySaturation {
			cb.mem.AscendGreaterOrEqual(memItem{mem: memHint}, visitMem)
		} else if memHint == 0 {
			cb.mem.Descend(visitMem)
		} else {
			// seq starts at 1, so (memHint-1, max) < every item of bucket memHint.
			cb.mem.DescendGreaterThan(memItem{mem: memHint - 1, seq: ^uint64(0)}, visitMem)
		}
		return found == nil
	}
	switch {
	case s.CoreSaturation:
		g.probe.core = coreHint
		g.tree.AscendGreaterOrEqual(&g.probe, visitCore)
	case coreHint == 0:
		g.tree.Descend(visitCore)
	default:
		g.probe.core = coreHint - 1
		g.tree.DescendGreaterThan(&g.probe, visitCore)
	}
	return found
}

// each visits every entry (for invariant checks and eviction).
func (g *group) each(fn func(core uint32, it memItem) bool) {
	g.tree.Ascend(func(cb *coreBucket) bool {
		cont := true
		cb.mem.Ascend(func(it memItem) bool {
			cont = fn(cb.core, it)
			return cont
		})
		return cont
	})
}
