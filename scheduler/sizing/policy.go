package sizing

import "slices"

// Policy is the sizing decision of the booking path: the configured knobs
// and every rule that turns a layer into what one of its frames books. The
// composition root (package scheduler) builds one from the configuration
// and hands the same value to the matcher (whose host-cache Accept asks Fits)
// and to the dispatcher (which asks Plan), so a host the matcher checks out
// takes a frame by the very rules the dispatcher books with. A Policy is a
// value with no mutable state: safe for concurrent use.
type Policy struct {
	// CoreUnit is one core in centicores (100; queue.core_multiplier).
	CoreUnit int64
	// StrandedMemKB: a booking that leaves less idle memory than this takes
	// every idle core (queue.memory_stranded_threshold).
	StrandedMemKB int64
	// MinMemKB replaces a negative memory request (bad data: layer
	// int_mem_min has no CHECK): Cuebot's mem_reserved_min, as Cuebot
	// raises a layer's minimum to it when the job is submitted. 0 clamps
	// to 0. It is also what a new proc's int_mem_used starts at.
	MinMemKB int64
	// SelfishServices: a threadable frame of one of these services takes
	// every idle core (queue.selfish_services).
	SelfishServices []string
	// History is memory sizing from measured RSS (section sizing); the
	// zero value books requests. The pass (package memsize) turns it into
	// the Shape fields SizedMemKB, FrameMemKB and RSSKB; the rules below
	// only read those.
	History History
}

// Shape is what sizing reads of a layer and its job. jobs.Layer embeds it,
// so the policy reads the layer the query returned, never a copy.
type Shape struct {
	CoresMin    int64 // centicores; 0 = every core, < 0 = all but |n|
	CoresMax    int64 // centicores; 0 = no per-frame cap
	MemMinKB    int64 // layer.int_mem_min
	GPUsMin     int64
	GPUMemMinKB int64
	Threadable  bool
	Services    []string
	// JobMaxCores is the job's cap in centicores: always a cap (0 or below
	// books nothing; Cuebot has no "unlimited" value). JobCoresLive is
	// SUM(proc.int_cores_reserved) of the job.
	JobMaxCores  int64
	JobCoresLive int64
	// SizedMemKB is the layer's memory sized from its RSS history and OOM
	// bumps (History.Decide); 0: none, the layer books MemMinKB.
	SizedMemKB int64
	// FrameMemKB is one frame's own size after a memory kill
	// (History.RetryKB); 0: the frame books the layer's size.
	FrameMemKB int64
	// FrameFloorKB is the least that retry may book: the killed run's max
	// RSS, at least the layer's size (0: FrameMemKB is exact). On a host
	// with less memory than FrameMemKB the retry books the host's whole
	// memory instead, if that is at least FrameFloorKB: a retry is never
	// raised above every host that could run it.
	FrameFloorKB int64
	// RSSKB is what a frame is expected to use (the quantile of the RSS
	// peaks); with threadable sizing on, a threadable frame books
	// round(RSSKB / host memory per core) cores. 0: the request's cores.
	RSSKB int64
}

// Unit is one core in centicores (CoreUnit, 100 when unset).
func (p Policy) Unit() int64 {
	if p.CoreUnit <= 0 {
		return 100
	}
	return p.CoreUnit
}

// MemKB is the layer's effective memory: what one frame books and what a
// host must have idle. It is the one place a frame's memory is decided: a
// frame's own size after a memory kill (FrameMemKB), else the layer's size
// from its RSS history and bumps (SizedMemKB), else the layer's minimum (a
// negative one, bad data, replaced by MinMemKB).
func (p Policy) MemKB(l Shape) int64 {
	switch {
	case l.FrameMemKB > 0:
		return l.FrameMemKB
	case l.SizedMemKB > 0:
		return l.SizedMemKB
	}
	return p.clampMemKB(l.MemMinKB)
}

func (p Policy) clampMemKB(kb int64) int64 {
	if kb < 0 {
		return max(p.MinMemKB, 0)
	}
	return kb
}

// Selfish reports whether l runs one of the selfish services.
func (p Policy) Selfish(l Shape) bool {
	for _, s := range l.Services {
		if slices.Contains(p.SelfishServices, s) {
			return true
		}
	}
	return false
}

// JobBudget is what l's job may still book (centicores, never negative):
// its cap less what it runs.
func (p Policy) JobBudget(l Shape) int64 {
	return max(l.JobMaxCores-l.JobCoresLive, 0)
}

// Request is what one frame of l asks for.
func (p Policy) Request(l Shape) Request {
	return Request{CoresMin: l.CoresMin, CoresMax: l.CoresMax, MemKB: p.MemKB(l),
		GPUs: max(l.GPUsMin, 0), GPUMemKB: max(l.GPUMemMinKB, 0), Threadable: l.Threadable, Selfish: p.Selfish(l), RSSKB: p.rssKB(l),
		MemFloorKB: p.memFloorKB(l)}
}

// memFloorKB is the least a retried frame books on a host smaller than its
// retry size (0: none; see Shape.FrameFloorKB).
func (p Policy) memFloorKB(l Shape) int64 {
	if l.FrameMemKB <= 0 || l.FrameFloorKB <= 0 {
		return 0
	}
	return min(l.FrameFloorKB, l.FrameMemKB)
}

// rssKB is the memory a threadable frame's cores are derived from (0: its
// request's cores).
func (p Policy) rssKB(l Shape) int64 {
	if !l.Threadable || !p.History.ThreadableOn() || l.RSSKB <= 0 {
		return 0
	}
	// A frame retried after a memory kill uses at least its raised size.
	return max(l.RSSKB, l.FrameMemKB)
}

// Fits reports whether one frame of l fits on h now, within its job's
// budget (the matcher's host-cache Accept).
func (p Policy) Fits(h Host, l Shape) bool {
	return p.Fitter(l)(&h)
}

// Fitter is Fits for many hosts: it resolves l's request and budget once
// and returns what reports whether one frame fits on a host (the host
// cache runs it for every candidate). Take a new one when l's job changes
// (its live cores after a booking).
func (p Policy) Fitter(l Shape) func(h *Host) bool {
	r, budget := p.Request(l), p.JobBudget(l)
	return func(h *Host) bool {
		_, why := p.reserve(h, &r, budget)
		return why == Fits
	}
}

// FitsIdle reports whether one frame of l would fit on h with every core
// and all the memory of h idle, leaving GPUs and the job's budget aside
// (the reservation loop's "could this host ever take it").
func (p Policy) FitsIdle(h Host, l Shape) bool {
	h.IdleCores, h.IdleMemKB, h.IdleGPUs, h.IdleGPUMemKB = h.TotalCores, h.TotalMemKB, 0, 0
	h.KeepCores, h.KeepMemKB = 0, 0
	r := p.Request(l)
	r.GPUs, r.GPUMemKB = 0, 0
	_, why := p.reserve(&h, &r, -1)
	return why == Fits
}

// Plan sizes up to n frames of l on h, one after another, each on what the
// ones before left idle and within what they left of the job's budget. why
// is why the next frame did not fit (Fits when all n did).
func (p Policy) Plan(h Host, l Shape, n int) (rs []Reservation, why Reason) {
	req, budget := p.Request(l), p.JobBudget(l)
	for range n {
		r, why := p.reserve(&h, &req, budget)
		if why != Fits {
			return rs, why
		}
		h.Take(r)
		budget = max(budget-r.Cores, 0)
		rs = append(rs, r)
	}
	return rs, Fits
}

// Floor is what a host must have idle for a frame of l to be worth trying
// (the host cache's floors, as Cuebot's host query filters): the layer's
// cores (one core for the "whole host" sentinels, which Fits resolves
// against the host), its effective memory, GPUs and GPU memory.
type Floor struct {
	Cores, MemKB, GPUs, GPUMemKB int64
}

// Floor returns l's floors (a retried frame's memory floor is the least
// it may book, Shape.FrameFloorKB: Fits decides per host).
func (p Policy) Floor(l Shape) Floor {
	cores := l.CoresMin
	if cores <= 0 {
		cores = p.Unit()
	}
	mem := p.MemKB(l)
	if f := p.memFloorKB(l); f > 0 {
		mem = f // a retry clamps to hosts smaller than its size
	}
	return Floor{Cores: cores, MemKB: mem, GPUs: max(l.GPUsMin, 0), GPUMemKB: max(l.GPUMemMinKB, 0)}
}

// FrameCores is the fewest centicores one frame of l books on any host: one
// core for a non-threadable frame, its minimum in whole cores for a
// threadable one, 0 for a threadable frame whose minimum is a "whole host"
// sentinel (its size depends on the host).
func (p Policy) FrameCores(l Shape) int64 {
	unit := p.Unit()
	switch {
	case !l.Threadable:
		return unit
	case l.CoresMin <= 0:
		return 0
	}
	return (l.CoresMin + unit - 1) / unit * unit
}
