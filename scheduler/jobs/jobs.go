// Package jobs reads the work a cluster pass dispatches: pending jobs in
// priority order (with age relief), their dispatchable layers and the first
// WAITING frames of each layer; and it keeps the per-layer schedule-after
// backoff of layers that found no host.
//
// Queries. Both are equivalent to the reference scheduler's (rust-scheduler
// §4.2, §4.3) with three deliberate differences:
//
//   - Headroom is computed from live proc sums everywhere. The reference
//     still reads vs_waiting and job_resource.int_cores for the job cap,
//     columns that for a scheduler-managed show are only refreshed by the
//     recompute loop, so a job could stay hidden for minutes after its
//     frames finished. Redis remains the authority for caps; these filters
//     only avoid wasted booking attempts. The scheduler gives the query
//     those live sums from the Redis counters the booking script charges
//     (PendingQuery.Live): one read of the show's pending jobs and a
//     pipeline of counter reads, so a pass costs O(pending jobs), not
//     O(running frames of the show). Without a source, for a show whose
//     accounting is not seeded, or while Redis cannot be read, the query
//     sums the show's procs in one scan.
//   - Frames are fetched per layer through a LATERAL ... LIMIT that walks
//     the (pk_job, pk_layer, dispatch order) index of WAITING frames, so the
//     cost is O(frames per layer limit), not O(waiting frames of the job).
//     Layers that end up with no frame are not returned (the reference
//     returns them and spends a host checkout on them).
//   - Priority has age relief: the order is job_resource.int_priority plus
//     one point per queue.priority_age_relief of the job's age
//     (now - job.ts_started), ties broken by age. A low-priority job
//     therefore climbs past newer high-priority work after
//     (difference x relief), the "occasional starvation relief" of the
//     assigners design, instead of waiting for the farm to drain as under
//     strict priority. Relief 0 gives the reference's strict order.
//
// Minimum cores first. A job running fewer cores than its minimum
// (job_resource.int_min_cores, centicores; 0 or less: no minimum) comes
// before every job at or above its minimum, whatever the priorities: the
// leading sort key, in strict order and lottery alike (the lottery then
// draws among the jobs below their minimum first, then among the rest).
// Cuebot gives such a job a 100-point priority boost, which puts it first
// on any farm whose priorities span less than 100 points; the sort key
// states the intent without depending on that span. Running cores are the
// job's live proc sum, like every other headroom in these queries, not
// job_resource.int_cores (stale for a managed show between recomputes).
//
// Backoff. A layer that found no host in a cluster is not retried there
// until its schedule-after time: min backoff after the first miss, doubling
// on each further miss up to max, cleared by a successful dispatch. It is
// per (cluster, layer) because the same layer may fit the hosts of another
// cluster (its other tags), and per process: a backoff is an efficiency
// hint, never a correctness mechanism, so it is not shared. A miss may
// come with a Watch (the host cache's capacity generations of the groups
// the layer was probed in, taken with the miss): Held then releases the
// layer as soon as the watch moves, that is as soon as one of those hosts
// gained capacity that may fit it, instead of when its time ends. Only
// those groups count, so capacity freed elsewhere releases nothing. The
// delay keeps doubling across such releases: the timer remains the bound
// for a layer nothing relevant happens to. A layer released early that
// misses again MaxWastedWakes times in a row (capacity does not help it:
// reservation rules, caps, or losing every race for scarce hosts) has its
// watches ignored until it books, so on a busy farm it falls back to the
// plain backoff instead of retrying at every capacity change.
package jobs

import (
	"time"

	"github.com/cuesched/cuesched/scheduler/sizing"
)

// Job is a pending job returned for a cluster pass.
type Job struct {
	ID, Name   string
	ShowID     string
	ShowName   string
	FacilityID string
	FolderID   string
	DeptID     string
	// Priority is job_resource.int_priority; Effective adds the age relief.
	Priority  int
	Effective float64
	Started   time.Time
	// BelowMinCores: the job runs fewer cores than job_resource.int_min_cores
	// (it was ranked ahead of the jobs at their minimum).
	BelowMinCores bool
	// Live is the job's live use (centicores, GPUs) as the pending query
	// weighed it: the accounting store's counters, or the sums of its procs
	// (nil when the job did not come from Pending).
	Live *Use
}

// Frame is a WAITING frame fetched for dispatch.
type Frame struct {
	ID     string
	Name   string // "0001-layer"
	Number int64
	// Version is the int_version read with the frame; the dispatch UPDATE
	// is guarded by it (optimistic lock).
	Version int32
	// Eligible is when the frame became WAITING (ts_eligible, else
	// ts_updated): the start of its time to book.
	Eligible time.Time
	// The frame's last run as Cuebot recorded it at completion
	// (int_exit_status, int_mem_max_used and int_mem_reserved in KB,
	// ts_stopped; zero when it never ran): memory sizing reads a memory
	// kill from them.
	ExitStatus int64
	MaxRSSKB   int64
	ReservedKB int64
	Stopped    time.Time
}

// Layer is a dispatchable layer with the frames a pass may book. Resource
// fields use the schema's units: centicores, KB, GPU devices.
type Layer struct {
	ID, Name string

	JobID, JobName     string
	ShowID, ShowName   string
	FacilityID         string
	FolderID, DeptID   string
	Shot, User, LogDir string
	LokiURL            string
	UID                *int32 // job.int_uid; nil when unset
	OS                 string // job.str_os; "" = any OS
	Priority           int
	Command, Range     string
	ChunkSize          int
	DispatchOrder      int64
	// Shape is what sizing reads (cores, memory, GPUs, threadable,
	// services, the job's core cap and live cores): the matcher and the
	// dispatcher hand it to the one sizing.Policy.
	sizing.Shape
	Tags           []string
	JobMaxGPUs     int64 // always a cap, for layers that need GPUs
	JobGPUsLive    int64
	FolderMaxCores int64 // folder_resource caps (exactly -1 unlimited; any other value is a cap)
	FolderMaxGPUs  int64
	LimitIDs       []string
	// SeatLimits are the node-locked ones among LimitIDs
	// (cuesched_limit.b_per_host): they count hosts holding a seat, checked
	// by the booking script, not frames.
	SeatLimits []SeatLimit
	// RuntimeHigh is the layer's longest successful frame so far
	// (layer_usage.int_clock_time_high, whole seconds; 0 = no history):
	// the worst-case runtime an EASY backfill is judged by.
	RuntimeHigh time.Duration
	// Running and Succeeded are layer_stat.int_running_count and
	// int_succeeded_count when the query ran (the probes of a threadable
	// layer without history).
	Running, Succeeded int64
	Env                map[string]string // job env overlaid by layer env
	Frames             []Frame
}

// SeatLimit is a node-locked limit of a layer and its max seats (hosts).
type SeatLimit struct {
	ID  string
	Max int64
}

// WorstCase is how long a frame of the layer may run, for an EASY backfill:
// RuntimeHigh plus one second (the clock times are whole seconds, rounded
// down), or 0 when the layer has no runtime history (it never backfills).
func (l *Layer) WorstCase() time.Duration {
	if l.RuntimeHigh <= 0 {
		return 0
	}
	return l.RuntimeHigh + time.Second
}
