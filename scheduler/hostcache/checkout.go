package hostcache

import (
	"context"
	"slices"
	"time"

	"github.com/cuesched/cuesched/scheduler/sizing"
)

type lease struct {
	at     time.Time
	handed idle   // the values Checkout returned
	seen   []idle // host-row idle values the WAL applied while out
	many   bool   // seen overflowed: the WAL moved on a lot
}

const maxSeen = 16

type assumption struct {
	v     idle
	until time.Time
}

func (c *Cache) viewLocked(h *hostRec, showID string) Host {
	v := c.effective(h)
	out := Host{
		Host: sizing.Host{ID: h.id, Name: h.name, AllocID: h.allocID, ThreadMode: h.threadMode, TotalCores: h.coresTotal,
			IdleCores: v.cores, IdleMemKB: v.memKB, IdleGPUs: v.gpus, IdleGPUMemKB: v.gpuMemKB},
		TotalGPUs: h.gpusTotal, TotalGPUMemKB: h.gpuMemTotalKB, LSN: h.lsn, Version: h.version,
	}
	if a := c.st.allocs[h.allocID]; a != nil {
		out.AllocName, out.FacilityID = a.name, a.facilityID
	}
	if s := c.st.subsByAlloc[h.allocID][showID]; s != nil {
		out.AllocAvailableCores = s.burst - s.cores
	}
	if s := h.stat; s != nil {
		out.OS, out.TotalMemKB, out.LastPing = s.os, s.memTotalKB, s.ping
	}
	return out
}

// Checkout finds a host for req and removes it from every group, so no
// other caller can get it until it is checked in. Groups are probed in the
// order of req.Tags; inside a group the strategy orders the walk and, with
// no Placement, the first host that passes Fits and req.Accept wins; with
// one, the candidates that pass are scored (see Placement).
func (c *Cache) Checkout(ctx context.Context, req Request) (Host, error) {
	if !c.Ready() {
		return Host{}, ErrNotReady
	}
	if err := ctx.Err(); err != nil {
		return Host{}, err
	}
	strategy := *c.cfg.Strategy
	if req.Strategy != nil {
		strategy = *req.Strategy
	}
	place := c.cfg.Placement
	coreHint, memHint := c.coreKey(req.CoresMin), c.memKey(req.MemMinKB)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var buf [4]*group
	probed := buf[:0]
	for _, tag := range req.Tags {
		g := c.groupLocked(ClusterKey{FacilityID: req.FacilityID, ShowID: req.ShowID, Tag: tag}, now)
		probed = append(probed, g)
		g.lastQueried = now
		fits := func(h *hostRec) (Host, bool) {
			if !h.servesOS(req.OS) {
				return Host{}, false
			}
			v := c.viewLocked(h, req.ShowID)
			v.Locality, v.LayerCores = h.localityOf(req.LayerID)
			return v, fitsResources(v, req.Profile) && (req.Accept == nil || req.Accept(v))
		}
		var h *hostRec
		var out Host
		if place != nil {
			h, out = c.placeLocked(g, &req, coreHint, memHint, strategy, place, fits)
		} else {
			h = g.find(coreHint, memHint, strategy, func(h *hostRec) bool {
				var ok bool
				out, ok = fits(h)
				return ok
			})
		}
		if h == nil {
			continue
		}
		for _, g := range h.groups {
			g.remove(h)
		}
		h.groups = h.groups[:0]
		l := &lease{at: now, handed: idle{out.IdleCores, out.IdleMemKB, out.IdleGPUs, out.IdleGPUMemKB}}
		h.out = l
		c.leases[h.id] = l
		c.m.hits.Inc()
		return out, nil
	}
	c.m.misses.Inc()
	w := c.missLocked(probed, want{floor: idle{max(req.CoresMin, 0), max(req.MemMinKB, 0), max(req.GPUsMin, 0), max(req.GPUMemMinKB, 0)},
		os: req.OS, threadable: req.Threadable})
	return Host{}, &NoCandidateError{Watch: w}
}

// Checkin returns a checked-out host (v.ID) to the index. v's idle values
// are the host row's after the caller's bookings, as Postgres returned
// them; pass the host Checkout returned (or call Release) if nothing was
// booked. Only v.ID and the four idle values are read.
//
// Ordering with the WAL (newest committed state wins, no stale
// resurrection): if the WAL already delivered a host-row change with exactly
// these values since the checkout (the caller's own booking, possibly
// followed by newer changes), v is already in, or older than, the mirror and
// is ignored. Otherwise v is assumed — the index uses min(v, WAL row) per
// dimension — until the WAL delivers a row equal to v (confirmed) or
// AssumeTTL passes (forgotten). Eligibility (lock, state, tags, allocation,
// deletion) always comes from the WAL, so a host locked, downed, re-tagged
// or deleted while checked out does not come back.
func (c *Cache) Checkin(v sizing.Host) {
	hostID := v.ID
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.leases[hostID]
	if l == nil {
		c.log.Debug("check-in of a host that is not checked out", "host", hostID)
		return
	}
	delete(c.leases, hostID)
	h := c.st.hosts[hostID]
	if h == nil || h.out != l {
		c.bumpLocked()
		return // deleted while out
	}
	h.out = nil
	got := idle{v.IdleCores, v.IdleMemKB, v.IdleGPUs, v.IdleGPUMemKB}
	switch {
	case got == l.handed:
		// Nothing booked: the WAL state stands.
	case l.many || slices.ContainsFunc(l.seen, func(row idle) bool { return confirms(row, got) }):
		c.m.assumptions.WithLabelValues("superseded").Inc()
	default:
		if h.assumed == nil {
			h.assumedListIndex = len(c.assumedList)
			c.assumedList = append(c.assumedList, h)
		}
		h.assumed = &assumption{v: got, until: c.now().Add(c.cfg.AssumeTTL)}
		c.m.assumptions.WithLabelValues("assumed").Inc()
	}
	h.version++
	c.reindexLocked(h)
	c.bumpLocked()
}

// Release checks a host in unchanged (nothing was booked on it).
func (c *Cache) Release(hostID string) {
	c.mu.Lock()
	l := c.leases[hostID]
	c.mu.Unlock()
	if l == nil {
		return
	}
	c.Checkin(sizing.Host{ID: hostID, IdleCores: l.handed.cores, IdleMemKB: l.handed.memKB, IdleGPUs: l.handed.gpus,
		IdleGPUMemKB: l.handed.gpuMemKB})
}

func (c *Cache) clearAssumptionLocked(h *hostRec) {
	h.assumed = nil
	i := h.assumedListIndex
	if i < 0 || i >= len(c.assumedList) || c.assumedList[i] != h {
		return
	}
	last := len(c.assumedList) - 1
	c.assumedList[i] = c.assumedList[last]
	c.assumedList[i].assumedListIndex = i
	c.assumedList = c.assumedList[:last]
	h.assumedListIndex = -1
}

// Lookup returns a cached host as a request of showID would see it, and
// whether it is currently indexed (available to Checkout).
func (c *Cache) Lookup(hostID, showID string) (h Host, indexed, found bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.st.hosts[hostID]
	if r == nil {
		return Host{}, false, false
	}
	return c.viewLocked(r, showID), len(r.groups) > 0, true
}
