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
//   - The layer's per-frame cap (int_cores_max) and the job's remaining
//     budget then cap the count.
//
// Memory, GPUs and GPU memory book exactly the layer minimums. A frame that
// does not fit (no core left, or the cores, memory or GPUs it needs exceed
// what is idle) is refused.
package sizing

// Thread modes (host.int_thread_mode).
const (
	Auto     = 0
	All      = 1
	Variable = 2
)

// Host is the capacity a frame is reserved on. Cores in centicores, memory
// in KB. IdleMemKB should be the conservative value the host cache keeps
// (least of host idle and host_stat free).
type Host struct {
	TotalCores, IdleCores int64
	TotalMemKB, IdleMemKB int64
	IdleGPUs, IdleGPUMem  int64
	ThreadMode            int
	// KeepCores and KeepMemKB are held back from this reservation: idle
	// capacity that other work (an idle GPU's bundle) must find free. They
	// describe one booking decision, not the host.
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
}

// Reservation is what one frame books (centicores, KB).
type Reservation struct {
	Cores    int64
	MemKB    int64
	GPUs     int64
	GPUMemKB int64
}

// Policy holds the configured knobs.
type Policy struct {
	// CoreUnit is one core in centicores (100).
	CoreUnit int64
	// StrandedMemKB: a booking that leaves less idle memory than this takes
	// every idle core (queue.memory_stranded_threshold).
	StrandedMemKB int64
	// MinMemKB replaces a negative memory request (bad data: layer
	// int_mem_min has no CHECK): Cuebot's mem_reserved_min, as Cuebot
	// raises a layer's minimum to it when the job is submitted. 0 clamps
	// to 0.
	MinMemKB int64
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
	// Negative requests are bad data, never a reservation that gives the
	// host resources back.
	if r.MemKB < 0 {
		r.MemKB = max(p.MinMemKB, 0)
	}
	r.GPUs, r.GPUMemKB = max(r.GPUs, 0), max(r.GPUMemKB, 0)
	if h.KeepCores > 0 || h.KeepMemKB > 0 {
		h.IdleCores = max(h.IdleCores-max(h.KeepCores, 0), 0)
		h.IdleMemKB = max(h.IdleMemKB-max(h.KeepMemKB, 0), 0)
	}
	unit := p.CoreUnit
	if unit <= 0 {
		unit = 100
	}
	total := h.TotalCores / unit
	idle := h.IdleCores / unit
	if total <= 0 {
		return Reservation{}, BadHostCores
	}
	if h.IdleMemKB < r.MemKB {
		return Reservation{}, NoMemory
	}
	if h.IdleGPUs < r.GPUs {
		return Reservation{}, NoGPUs
	}
	if h.IdleGPUMem < r.GPUMemKB {
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
	case h.ThreadMode == Variable && want <= 2:
		cores = 2
	case r.Selfish || h.IdleMemKB-r.MemKB <= p.StrandedMemKB:
		cores = idle
	default:
		perCore := (h.TotalMemKB + total/2) / total // rounded KB per core
		balanced := want
		if perCore > 0 {
			balanced = r.MemKB / perCore
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
	return Reservation{Cores: cores * unit, MemKB: r.MemKB, GPUs: r.GPUs, GPUMemKB: r.GPUMemKB}, Fits
}

// Take subtracts a reservation from the host's idle values.
func (h *Host) Take(r Reservation) {
	h.IdleCores -= r.Cores
	h.IdleMemKB -= r.MemKB
	h.IdleGPUs -= r.GPUs
	h.IdleGPUMem -= r.GPUMemKB
}
