package hostcache

import (
	"math"
	"slices"

	"github.com/cuesched/cuesched/shared/cuebot"
)

// Placement makes Checkout score a bounded candidate set instead of taking
// the first fitting host of the walk: the E-PVM opportunity cost (Amir et
// al.), the marginal rise of Σ_r w_r·e^(used_r/total_r) over cores, memory,
// GPUs and GPU memory that one frame of the request causes. The cheapest
// candidate wins; with Locality, a host running (live) or recently running
// (warm) the request's layer wins instead when its cost is within
// Tolerance of the cheapest (live before warm, then the host where the
// layer booked most recently).
//
// The candidates are the first Candidates hosts that fit (Fits: gates and
// floors) in the strategy's walk order, a quarter as many (at least one)
// from the other end of the walk (the reverse order), and, with Locality,
// the hosts the layer is live or warm on (at most maxLayerHosts). A walk
// also ends once it has visited eight times its quota with at least one
// fit. The request's Accept is asked in order of preference until it takes
// one, so it usually runs once; if it refuses them all, the walk goes on as
// a first fit. The cost of a checkout is O(log n + K).
type Placement struct {
	Weights    Weights
	Candidates int
	Locality   bool
	// Tolerance is the near-tie band of Locality, a fraction of the
	// cheapest candidate's cost (0.1).
	Tolerance float64
}

// Weights weigh each resource in the E-PVM cost.
type Weights struct {
	Cores, Memory, GPUs, GPUMemory float64
}

// DefaultPlacement is E-PVM with weights cores 1, memory 1, GPUs 4, GPU
// memory 1, 24 candidates, locality on within 10%.
func DefaultPlacement() Placement {
	return Placement{Weights: Weights{Cores: 1, Memory: 1, GPUs: 4, GPUMemory: 1}, Candidates: 24, Locality: true, Tolerance: 0.1}
}

// Usage is what E-PVM reads of a host: totals and idle values (centicores,
// KB, devices, KB).
type Usage struct {
	TotalCores, IdleCores       int64
	TotalMemKB, IdleMemKB       int64
	TotalGPUs, IdleGPUs         int64
	TotalGPUMemKB, IdleGPUMemKB int64
}

// UsageOf reads a host view.
func UsageOf(h Host) Usage {
	return Usage{TotalCores: h.TotalCores, IdleCores: h.IdleCores, TotalMemKB: h.TotalMemKB, IdleMemKB: h.IdleMemKB,
		TotalGPUs: h.TotalGPUs, IdleGPUs: h.IdleGPUs, TotalGPUMemKB: h.TotalGPUMemKB, IdleGPUMemKB: h.IdleGPUMemKB}
}

// Demand is one frame's need (centicores, KB, devices, KB).
type Demand struct {
	Cores, MemKB, GPUs, GPUMemKB int64
}

// share is used/total after adding d, clamped to [0, 2] (a host whose
// idle values exceed its totals reads as empty; a demand above the idle
// values cannot fit anyway).
func share(total, idle, d int64) float64 {
	used := min(max(total-idle, 0), total) + max(d, 0)
	return min(float64(used)/float64(total), 2)
}

// EPVMCost is the marginal E-PVM cost of placing d on a host: the rise of
// Σ_r w_r·e^(used_r/total_r) over cores, memory, GPUs and GPU memory. A
// resource the host has none of (total 0) is skipped. A GPU host's GPUs
// count as used at least in the share its cores are used: a GPU whose cores
// are taken cannot run a GPU frame, so CPU work on a GPU host pays for the
// GPUs it strands (without this a CPU frame would cost a GPU host nothing
// for its GPUs, and E-PVM could not tell a GPU host from a CPU host).
func EPVMCost(u Usage, d Demand, w Weights) float64 {
	var cost float64
	term := func(weight, before, after float64) {
		if weight != 0 {
			cost += weight * (math.Exp(after) - math.Exp(before))
		}
	}
	var cb, ca float64
	if u.TotalCores > 0 {
		cb, ca = share(u.TotalCores, u.IdleCores, 0), share(u.TotalCores, u.IdleCores, d.Cores)
		term(w.Cores, cb, ca)
	}
	if u.TotalMemKB > 0 {
		term(w.Memory, share(u.TotalMemKB, u.IdleMemKB, 0), share(u.TotalMemKB, u.IdleMemKB, d.MemKB))
	}
	if u.TotalGPUs > 0 {
		term(w.GPUs, max(share(u.TotalGPUs, u.IdleGPUs, 0), cb), max(share(u.TotalGPUs, u.IdleGPUs, d.GPUs), ca))
	}
	if u.TotalGPUMemKB > 0 {
		term(w.GPUMemory, share(u.TotalGPUMemKB, u.IdleGPUMemKB, 0), share(u.TotalGPUMemKB, u.IdleGPUMemKB, d.GPUMemKB))
	}
	return cost
}

// candidate is one scored host of a checkout.
type candidate struct {
	h    *hostRec
	v    idle
	cost float64
}

// Choose returns the index of the winning candidate: the cheapest (the
// first of equals), or, with locality, the highest rank among those within
// tolerance of the cheapest, cheapest first among equal ranks. costs and
// rank are parallel (rank: LocalityRank); a cost of +Inf marks a candidate
// out of the running. It returns -1 for none.
func Choose(costs []float64, rank []int, locality bool, tolerance float64) int {
	best := -1
	for i, c := range costs {
		if !math.IsInf(c, 1) && (best < 0 || c < costs[best]) {
			best = i
		}
	}
	if best < 0 || !locality {
		return best
	}
	limit := costs[best] + math.Abs(costs[best])*tolerance
	pick := best
	for i, c := range costs {
		if c > limit {
			continue
		}
		if rank[i] > rank[pick] || (rank[i] == rank[pick] && c < costs[pick]) {
			pick = i
		}
	}
	return pick
}

// fitsRecLocked is Fits on the host record (no view): the OS and thread
// mode gates and the floors against the effective idle values.
func (c *Cache) fitsRecLocked(h *hostRec, p *Profile) (idle, bool) {
	if !h.servesOS(p.OS) || (h.threadMode == int(cuebot.ThreadAll) && !p.Threadable) {
		return idle{}, false
	}
	v := c.effective(h)
	return v, v.cores >= p.CoresMin && v.memKB >= p.MemMinKB && v.gpus >= p.GPUsMin && v.gpuMemKB >= p.GPUMemMinKB
}

// usageRec is what E-PVM reads of a host record with effective idle v.
func usageRec(h *hostRec, v idle) Usage {
	u := Usage{TotalCores: h.coresTotal, IdleCores: v.cores, IdleMemKB: v.memKB, TotalGPUs: h.gpusTotal, IdleGPUs: v.gpus,
		TotalGPUMemKB: h.gpuMemTotalKB, IdleGPUMemKB: v.gpuMemKB}
	if h.stat != nil {
		u.TotalMemKB = h.stat.memTotalKB
	}
	return u
}

// placeLocked chooses g's host for req (nil if none fits). It collects the
// candidates that fit by resources and gates, scores them, and asks
// req.Accept in the order Choose prefers them, so Accept usually runs once.
// If Accept refuses every candidate, the walk goes on as a first fit over
// the hosts not yet visited (accept is Fits plus Accept on the view), so a
// host round 1 would find is never missed.
func (c *Cache) placeLocked(g *group, req *Request, coreHint, memHint uint32, s HostBookingStrategy, p *Placement,
	accept func(*hostRec) (Host, bool)) (*hostRec, Host) {
	c.pickSeq++
	seq := c.pickSeq
	cands := c.cands[:0]
	defer func() {
		clear(cands) // drop the host pointers
		c.cands = cands[:0]
	}()
	collect := func(quota int) func(*hostRec) bool {
		fits, seen := 0, 0
		return func(h *hostRec) bool {
			if h.pick == seq {
				return false
			}
			h.pick = seq
			seen++
			if v, ok := c.fitsRecLocked(h, &req.Profile); ok {
				cands = append(cands, candidate{h: h, v: v})
				fits++
			}
			return fits >= quota || (fits > 0 && seen >= 8*quota)
		}
	}
	k := max(p.Candidates, 1)
	g.find(coreHint, memHint, s, collect(k))
	if len(cands) == 0 {
		return nil, Host{} // the whole walk found nothing: nor will its reverse
	}
	g.find(coreHint, memHint, HostBookingStrategy{CoreSaturation: !s.CoreSaturation, MemorySaturation: !s.MemorySaturation},
		collect(max(k/4, 1)))
	locality := p.Locality && req.LayerID != ""
	if locality {
		for _, h := range c.layerHosts[req.LayerID] {
			if h.pick == seq || !slices.Contains(h.groups, g) {
				continue
			}
			h.pick = seq
			if v, ok := c.fitsRecLocked(h, &req.Profile); ok {
				cands = append(cands, candidate{h: h, v: v})
			}
		}
	}
	d := Demand{Cores: max(req.CoresMin, 0), MemKB: max(req.MemMinKB, 0), GPUs: max(req.GPUsMin, 0), GPUMemKB: max(req.GPUMemMinKB, 0)}
	costs, locs := c.costs[:0], c.locs[:0]
	for i := range cands {
		cands[i].cost = EPVMCost(usageRec(cands[i].h, cands[i].v), d, p.Weights)
		costs = append(costs, cands[i].cost)
		locs = append(locs, cands[i].h.localityRank(req.LayerID))
	}
	defer func() { c.costs, c.locs = costs[:0], locs[:0] }()
	for {
		i := Choose(costs, locs, locality, p.Tolerance)
		if i < 0 {
			break
		}
		h := cands[i].h
		v := c.viewLocked(h, req.ShowID)
		v.Locality, v.LayerCores = h.localityOf(req.LayerID)
		if req.Accept == nil || req.Accept(v) {
			return h, v
		}
		costs[i] = math.Inf(1)
	}
	var out Host
	h := g.find(coreHint, memHint, s, func(h *hostRec) bool {
		if h.pick == seq {
			return false
		}
		var ok bool
		out, ok = accept(h)
		return ok
	})
	return h, out
}
