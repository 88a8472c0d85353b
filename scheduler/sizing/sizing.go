// Package sizing decides how much of a host one frame books, by Cuebot's
// rules (VirtualProc.build; rust-scheduler §4.7).
//
// Cores, in whole cores (Cuebot stores centicores; RQD refuses fractions):
//
//   - The layer minimum is a request with two sentinels: 0 means every core
//     of the host, a negative value -n means all but n.
//   - A non-threadable frame books exactly one core, whatever its minimum.
//   - A threadable frame on a host in thread mode ALL books every idle core.
//   - A threadable frame on a VARIABLE host asking for at most two cores
//     books two.
//   - Otherwise (AUTO, or VARIABLE asking for more) a frame of a selfish
//     service, or one that would leave less than the stranded-memory
//     threshold of idle memory behind, books every idle core (the cores
//     would be stranded anyway). Any other frame books cores in proportion
//     to its memory (its memory over the host's memory per core), at least
//     its request.
//   - With threadable sizing (sizing.threadable: history) a threadable
//     frame whose layer has RSS history books round(rss / the host's
//     memory per core) cores, at least its request (except on an ALL
//     host, which still gives every idle core).
//   - The layer's per-frame cap (int_cores_max) and the job's remaining
//     budget then cap the count.
//
// Memory books the layer's effective memory (Policy.MemKB: a frame's own
// size after a memory kill, clamped to the host's total memory when that
// is smaller but still holds the killed run's max RSS, else the layer's size from its RSS history,
// else the layer minimum, a negative one replaced by mem_reserved_min); GPUs and GPU memory
// book exactly the layer minimums. A frame that does not fit (no core left,
// or the cores, memory or GPUs it needs exceed what is idle) is refused.
//
// One Policy, built from the configuration by package scheduler, is shared
// by the matcher (Policy.Floor for the host cache's floors, Policy.Fitter in
// its Accept, Policy.FrameCores for the layer spread cap), the dispatcher
// (Policy.Plan) and the reservation loop (Policy.FitsIdle). It reads a
// layer as a Shape (embedded in jobs.Layer) and a host as a Host (embedded
// in hostcache.Host), the one host type of the booking path. The package
// does no I/O.
package sizing

// Thread modes (host.int_thread_mode).
const (
	Auto     = 0
	All      = 1
	Variable = 2
)

// Host is a host as a booking sees it: its identity and its capacity
// (cores in centicores, memory in KB). It is the one host type of the
// booking path: the host cache hands it out (hostcache.Host embeds it), the
// matcher's Accept and the dispatcher size frames against it, and the
// dispatcher hands it back with the idle values Postgres returned, which is
// what the cache checks in.
type Host struct {
	ID, Name string
	AllocID  string
	// OS is host_stat.str_os (a comma-separated list Cuebot reads as the
	// OSes the host serves).
	OS         string
	ThreadMode int // Auto, All or Variable
	TotalCores int64
	IdleCores  int64
	TotalMemKB int64 // host_stat.int_mem_total
	// IdleMemKB is the conservative value the host cache keeps: least of
	// host.int_mem_idle and host_stat.int_mem_free; IdleGPUMemKB likewise.
	IdleMemKB    int64
	IdleGPUs     int64
	IdleGPUMemKB int64
	// LayerCores are the centicores the layer being matched already holds
	// on the host, as the host cache counts its bookings (0 if unknown).
	LayerCores int64
	// KeepCores and KeepMemKB are held back from this reservation: idle
	// capacity that other work (an idle GPU's bundle, another layer's
	// share) must find free. They describe one booking decision, not the
	// host: the host cache ignores them.
	KeepCores, KeepMemKB int64
}

// Request is what the frame's layer asks for (centicores, KB).
type Request struct {
	CoresMin   int64 // 0 = every core, < 0 = all but |n|
	CoresMax   int64 // 0 = no cap
	MemKB      int64
	GPUs       int64
	GPUMemKB   int64
	Threadable bool
	// Selfish marks a frame of a selfish service.
	Selfish bool
	// RSSKB: a threadable frame books round(RSSKB / the host's memory per
	// core) cores, within its minimum and maximum (threadable sizing; 0:
	// Cuebot's rules).
	RSSKB int64
	// MemFloorKB > 0 marks a retry after a memory kill: on a host whose
	// total memory is below MemKB it books the host's total memory
	// instead, if that is at least MemFloorKB (else the host cannot run
	// it). 0: MemKB is exact.
	MemFloorKB int64
}

// Reservation is what one frame books (centicores, KB).
type Reservation struct {
	Cores    int64
	MemKB    int64
	GPUs     int64
	GPUMemKB int64
}

// Reason says why a frame does not fit.
type Reason string

// Refusal reasons.
const (
	Fits         Reason = ""
	NoCores      Reason = "cores"
	NoMemory     Reason = "memory"
	NoGPUs       Reason = "gpus"
	NoGPUMemory  Reason = "gpu memory"
	JobAtCap     Reason = "job cap"
	BadHostCores Reason = "host has no cores"
)

// Reserve sizes one frame on h. jobBudget is what the job may still book
// (centicores); negative means unlimited.
func (p Policy) Reserve(h Host, r Request, jobBudget int64) (Reservation, Reason) {
	return p.reserve(&h, &r, jobBudget)
}

// reserve is Reserve on pointers (the host is large, and Accept runs it for
// every candidate host): it reads h and r and changes neither.
func (p Policy) reserve(h *Host, r *Request, jobBudget int64) (Reservation, Reason) {
	// Negative requests are bad data, never a reservation that gives the
	// host resources back.
	memKB := p.clampMemKB(r.MemKB)
	rssKB := r.RSSKB
	if r.MemFloorKB > 0 && memKB > h.TotalMemKB && h.TotalMemKB >= r.MemFloorKB {
		// A retry larger than this host books all of it, never more.
		memKB = h.TotalMemKB
		rssKB = min(rssKB, memKB)
	}
	gpus, gpuMemKB := max(r.GPUs, 0), max(r.GPUMemKB, 0)
	idleCores, idleMemKB := h.IdleCores, h.IdleMemKB
	if h.KeepCores > 0 || h.KeepMemKB > 0 {
		idleCores = max(idleCores-max(h.KeepCores, 0), 0)
		idleMemKB = max(idleMemKB-max(h.KeepMemKB, 0), 0)
	}
	unit := p.Unit()
	total := h.TotalCores / unit
	idle := idleCores / unit
	if total <= 0 {
		return Reservation{}, BadHostCores
	}
	if idleMemKB < memKB {
		return Reservation{}, NoMemory
	}
	if h.IdleGPUs < gpus {
		return Reservation{}, NoGPUs
	}
	if h.IdleGPUMemKB < gpuMemKB {
		return Reservation{}, NoGPUMemory
	}

	// Requested whole cores, sentinels resolved against the host.
	var want int64
	switch {
	case r.CoresMin == 0:
		want = total
	case r.CoresMin < 0:
		want = total + r.CoresMin/unit
	default:
		want = (r.CoresMin + unit - 1) / unit
	}
	if r.Threadable && want > idle {
		return Reservation{}, NoCores
	}
	capCores := r.CoresMax / unit

	var cores int64
	switch {
	case !r.Threadable:
		cores = 1
	case h.ThreadMode == All:
		cores = idle
	case rssKB > 0:
		// Sized to the memory it will use on this host.
		perCore := (h.TotalMemKB + total/2) / total
		cores = 1
		if perCore > 0 {
			cores = max((rssKB+perCore/2)/perCore, 1)
		}
		cores = max(cores, want)
	case h.ThreadMode == Variable && want <= 2:
		cores = 2
	case r.Selfish || idleMemKB-memKB <= p.StrandedMemKB:
		cores = idle
	default:
		perCore := (h.TotalMemKB + total/2) / total // rounded KB per core
		balanced := want
		if perCore > 0 {
			balanced = memKB / perCore
		}
		cores = max(balanced, want)
	}
	if capCores > 0 && r.Threadable {
		cores = min(cores, capCores)
	}
	if jobBudget >= 0 {
		budget := jobBudget / unit
		if budget <= 0 {
			return Reservation{}, JobAtCap
		}
		cores = min(cores, budget)
	}
	if cores <= 0 || cores > total || cores > idle {
		return Reservation{}, NoCores
	}
	return Reservation{Cores: cores * unit, MemKB: memKB, GPUs: gpus, GPUMemKB: gpuMemKB}, Fits
}

// Take subtracts a reservation from the host's idle values.
func (h *Host) Take(r Reservation) {
	h.IdleCores -= r.Cores
	h.IdleMemKB -= r.MemKB
	h.IdleGPUs -= r.GPUs
	h.IdleGPUMemKB -= r.GPUMemKB
}
