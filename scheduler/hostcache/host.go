package hostcache

import (
	"time"

	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/cuesched/cuesched/shared/replication"
)

// Host is a snapshot of one cached host as the scheduler sees it: the
// booking's host (sizing.Host: identity, thread mode, totals and idle
// values, the requesting layer's cores) plus what only the cache knows.
// Cores are centicores, memory KB, as in Cuebot's tables. KeepCores and
// KeepMemKB are always zero here.
type Host struct {
	sizing.Host
	AllocName  string
	FacilityID string
	// TotalGPUs and TotalGPUMemKB are host.int_gpus and host.int_gpu_mem.
	TotalGPUs     int64
	TotalGPUMemKB int64
	// AllocAvailableCores is the requesting show's subscription headroom on
	// the host's allocation: int_burst − int_cores (centicores).
	AllocAvailableCores int64
	LastPing            time.Time
	// LSN is the commit LSN of the last WAL change to the host's rows;
	// Version counts every change to the host (WAL or check-in).
	LSN     replication.LSN
	Version uint64
	// Locality is the host's locality for the request's layer (see
	// locality.go; Host.LayerCores is that layer's cores there, an
	// estimate); zero without a layer (Lookup).
	Locality Locality
}

// Profile is what a layer needs from a host: the floors (centicores, KB,
// devices, KB) and the compatibility gates.
type Profile struct {
	CoresMin    int64
	MemMinKB    int64
	GPUsMin     int64
	GPUMemMinKB int64
	// OS is the job's OS; "" accepts any host. Otherwise it must equal one
	// of the values of the host's OS, which Cuebot reads as a
	// comma-separated list ("rhel7,rhel9" serves both; cuebot.ServesOS).
	OS string
	// Threadable: hosts in thread mode ALL only accept threadable layers.
	Threadable bool
}

// Fits is the validation every checkout applies: the OS gate, the thread-mode
// gate, and the floors on cores, memory, GPUs and GPU memory.
func Fits(h Host, p Profile) bool {
	return cuebot.HostServesOS(h.OS, p.OS) && fitsResources(h, p)
}

// fitsResources is Fits without the OS gate (a checkout tests the OS on
// the host's pre-split list).
func fitsResources(h Host, p Profile) bool {
	if h.ThreadMode == int(cuebot.ThreadAll) && !p.Threadable {
		return false
	}
	return h.IdleCores >= p.CoresMin && h.IdleMemKB >= p.MemMinKB &&
		h.IdleGPUs >= p.GPUsMin && h.IdleGPUMemKB >= p.GPUMemMinKB
}

// Request asks for one host.
type Request struct {
	FacilityID, ShowID string
	// Tags are probed in order (the caller sorts them MANUAL, HOSTNAME,
	// HARDWARE, ALLOC); each is one group.
	Tags []string
	Profile
	// Accept, if set, must also accept the host (e.g. "a frame fits by the
	// reservation rules").
	Accept func(Host) bool
	// Strategy overrides the cache's default when set.
	Strategy *HostBookingStrategy
	// LayerID is the requesting layer: the host view carries its Locality
	// and LayerCores, and Placement's locality bonus favours its hosts.
	LayerID string
}
