package hostcache

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/btree"

	"github.com/cuesched/cuesched/shared/cuebot"
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

// effective returns the idle values the index uses: the row's, lowered by a
// pending assumption, with memory capped by host_stat's free memory.
func (c *Cache) effective(h *hostRec) idle {
	v := h.row
	if a := h.assumed; a != nil {
		v.cores, v.memKB = min(v.cores, a.v.cores), min(v.memKB, a.v.memKB)
		v.gpus, v.gpuMemKB = min(v.gpus, a.v.gpus), min(v.gpuMemKB, a.v.gpuMemKB)
	}
	if s := h.stat; s != nil {
		v.memKB = min(v.memKB, s.memFreeKB)
		v.gpuMemKB = min(v.gpuMemKB, s.gpuMemFreeKB)
	} else {
		v.memKB, v.gpuMemKB = 0, 0
	}
	return v
}

func (c *Cache) coreKey(centicores int64) uint32 {
	return clampU32(max(centicores, 0) / cuebot.CenticoresPerCore)
}

func (c *Cache) memKey(kb int64) uint32 {
	b := max(kb, 0)
	if b > (1<<62)/cuebot.BytesPerKB {
		return ^uint32(0)
	}
	return clampU32(b * cuebot.BytesPerKB / c.cfg.MemoryKeyDivisor)
}

func clampU32(v int64) uint32 {
	if v > int64(^uint32(0)) {
		return ^uint32(0)
	}
	return uint32(v)
}

// eligibleLocked is the reference host query's WHERE clause minus the tag
// and the show: lock state OPEN, host_stat UP, allocation known. It returns
// the allocation's facility.
func (c *Cache) eligibleLocked(h *hostRec) (facilityID string, ok bool) {
	if h.out != nil || h.lockState != string(cuebot.LockOpen) || h.stat == nil || h.stat.state != string(cuebot.HardwareUp) {
		return "", false
	}
	a := c.st.allocs[h.allocID]
	if a == nil {
		return "", false
	}
	return a.facilityID, true
}

// reindexLocked puts h into exactly the existing groups it belongs to, under
// its current keys.
//
// It is also where capacity gains are noticed: a group waiting for floors
// (a checkout missed there) is bumped when h now fits them and did not
// before, or just joined the group (checked in, unlocked, up, re-tagged,
// newly subscribed).
func (c *Cache) reindexLocked(h *hostRec) {
	if h.out == nil && len(h.recent) > 0 {
		c.trimRecentLocked(h, c.effective(h))
	}
	var buf [8]*group
	was := append(buf[:0], h.groups...)
	prev := h.idx
	for _, g := range h.groups {
		g.remove(h)
	}
	h.groups = h.groups[:0]
	fac, ok := c.eligibleLocked(h)
	if !ok || len(c.groups) == 0 {
		return
	}
	v := c.effective(h)
	h.idx = v
	h.coreKey, h.memKey = c.coreKey(v.cores), c.memKey(v.memKB)
	for _, tag := range h.tags {
		for show := range c.st.subsByAlloc[h.allocID] {
			if g := c.groups[ClusterKey{FacilityID: fac, ShowID: show, Tag: tag}]; g != nil {
				g.insert(h)
				h.groups = append(h.groups, g)
				if len(g.wants) > 0 && g.gained(v, prev, h.stat.oses, h.threadMode == int(cuebot.ThreadAll), !slices.Contains(was, g)) {
					c.bumpGroupLocked(g)
				}
			}
		}
	}
}

// groupLocked returns the key's group, building it from the mirror (no
// query) if it does not exist.
func (c *Cache) groupLocked(key ClusterKey, now time.Time) *group {
	if g := c.groups[key]; g != nil {
		return g
	}
	g := newGroup(key, c.freeList, now)
	c.groups[key] = g
	for allocID := range c.st.allocsByShow[key.ShowID] {
		a := c.st.allocs[allocID]
		if a == nil || a.facilityID != key.FacilityID {
			continue
		}
		for h := range c.st.hostsByAlloc[allocID] {
			if _, ok := c.eligibleLocked(h); !ok || !slices.Contains(h.tags, key.Tag) {
				continue
			}
			if len(h.groups) == 0 {
				v := c.effective(h)
				h.idx = v
				h.coreKey, h.memKey = c.coreKey(v.cores), c.memKey(v.memKB)
			}
			g.insert(h)
			h.groups = append(h.groups, g)
		}
	}
	c.m.groupLoads.Inc()
	c.buildGen.Add(1)
	return g
}
