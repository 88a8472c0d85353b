package cuebot

import "fmt"

// FrameState is frame.str_state (also frame_history.str_state).
type FrameState string

// Frame states. Cuebot inserts frames as SETUP and activates them to
// WAITING; the frame triggers may rewrite WAITING into DEPEND or
// CHECKPOINT. A transition into SETUP fails in the database (there is no
// int_setup_count column for the status-count trigger).
const (
	FrameWaiting    FrameState = "WAITING"
	FrameSetup      FrameState = "SETUP"
	FrameRunning    FrameState = "RUNNING"
	FrameSucceeded  FrameState = "SUCCEEDED"
	FrameDepend     FrameState = "DEPEND"
	FrameDead       FrameState = "DEAD"
	FrameEaten      FrameState = "EATEN"
	FrameCheckpoint FrameState = "CHECKPOINT"
)

func frameStates() []FrameState {
	return []FrameState{FrameWaiting, FrameSetup, FrameRunning, FrameSucceeded, FrameDepend, FrameDead, FrameEaten, FrameCheckpoint}
}

// CountColumn is the layer_stat/job_stat column counting frames in this
// state (int_waiting_count, ...), or "" for SETUP, which is not counted.
func (s FrameState) CountColumn() string {
	if s == FrameSetup || !s.Valid() {
		return ""
	}
	return "int_" + lower(string(s)) + "_count"
}

// JobState is job.str_state.
type JobState string

// Job states. Jobs are inserted as STARTUP and activated to PENDING (POSTED
// for post-jobs); FINISHED clears str_visible_name.
const (
	JobPending  JobState = "PENDING"
	JobFinished JobState = "FINISHED"
	JobStartup  JobState = "STARTUP"
	JobShutdown JobState = "SHUTDOWN"
	JobPosted   JobState = "POSTED"
)

func jobStates() []JobState {
	return []JobState{JobPending, JobFinished, JobStartup, JobShutdown, JobPosted}
}

// LockState is host.str_lock_state. Only OPEN hosts are bookable. The
// column has no default: inserts must supply it.
type LockState string

// Host lock states.
const (
	LockOpen        LockState = "OPEN"
	LockLocked      LockState = "LOCKED"
	LockNimbyLocked LockState = "NIMBY_LOCKED"
)

func lockStates() []LockState {
	return []LockState{LockOpen, LockLocked, LockNimbyLocked}
}

// HardwareState is host_stat.str_state. Only UP hosts are bookable.
type HardwareState string

// Host hardware states.
const (
	HardwareUp             HardwareState = "UP"
	HardwareDown           HardwareState = "DOWN"
	HardwareRebooting      HardwareState = "REBOOTING"
	HardwareRebootWhenIdle HardwareState = "REBOOT_WHEN_IDLE"
	HardwareRepair         HardwareState = "REPAIR"
)

func hardwareStates() []HardwareState {
	return []HardwareState{HardwareUp, HardwareDown, HardwareRebooting, HardwareRebootWhenIdle, HardwareRepair}
}

// HostTagType is host_tag.str_tag_type. (The column default 'Hardware' is
// mixed-case and never written by Cuebot; always write one of these.)
type HostTagType string

// Host tag types. ALLOC tags carry the allocation's str_tag and are written
// with b_constant = true.
const (
	TagManual   HostTagType = "MANUAL"
	TagHardware HostTagType = "HARDWARE"
	TagAlloc    HostTagType = "ALLOC"
	TagHostname HostTagType = "HOSTNAME"
)

func hostTagTypes() []HostTagType {
	return []HostTagType{TagManual, TagHardware, TagAlloc, TagHostname}
}

// CheckpointState is frame.str_checkpoint_state.
type CheckpointState string

// Checkpoint states.
const (
	CheckpointDisabled CheckpointState = "DISABLED"
	CheckpointEnabled  CheckpointState = "ENABLED"
	CheckpointCopying  CheckpointState = "COPYING"
	CheckpointComplete CheckpointState = "COMPLETE"
)

func checkpointStates() []CheckpointState {
	return []CheckpointState{CheckpointDisabled, CheckpointEnabled, CheckpointCopying, CheckpointComplete}
}

// LayerType is layer.str_type.
type LayerType string

// Layer types.
const (
	LayerPre    LayerType = "PRE"
	LayerPost   LayerType = "POST"
	LayerRender LayerType = "RENDER"
	LayerUtil   LayerType = "UTIL"
)

func layerTypes() []LayerType {
	return []LayerType{LayerPre, LayerPost, LayerRender, LayerUtil}
}

// DependType is depend.str_type.
type DependType string

// Dependency types.
const (
	DependJobOnJob        DependType = "JOB_ON_JOB"
	DependJobOnLayer      DependType = "JOB_ON_LAYER"
	DependJobOnFrame      DependType = "JOB_ON_FRAME"
	DependLayerOnJob      DependType = "LAYER_ON_JOB"
	DependLayerOnLayer    DependType = "LAYER_ON_LAYER"
	DependLayerOnFrame    DependType = "LAYER_ON_FRAME"
	DependFrameOnJob      DependType = "FRAME_ON_JOB"
	DependFrameOnLayer    DependType = "FRAME_ON_LAYER"
	DependFrameOnFrame    DependType = "FRAME_ON_FRAME"
	DependFrameByFrame    DependType = "FRAME_BY_FRAME"
	DependPreviousFrame   DependType = "PREVIOUS_FRAME"
	DependLayerOnSimFrame DependType = "LAYER_ON_SIM_FRAME"
)

func dependTypes() []DependType {
	return []DependType{DependJobOnJob, DependJobOnLayer, DependJobOnFrame, DependLayerOnJob, DependLayerOnLayer, DependLayerOnFrame, DependFrameOnJob, DependFrameOnLayer, DependFrameOnFrame, DependFrameByFrame, DependPreviousFrame, DependLayerOnSimFrame}
}

// ThreadMode is host.int_thread_mode (an integer column).
type ThreadMode int

// Thread modes. NIMBY hosts are inserted as ThreadAll.
const (
	ThreadAuto     ThreadMode = 0
	ThreadAll      ThreadMode = 1
	ThreadVariable ThreadMode = 2
)

// Valid reports whether m is a thread mode Cuebot knows.
func (m ThreadMode) Valid() bool { return m >= ThreadAuto && m <= ThreadVariable }

// Exit statuses Cuebot gives special meaning (frame.int_exit_status).
const (
	ExitNeverRan            = -1  // column default: the frame never ran
	ExitSuccess             = 0   //
	ExitMemoryFailure       = 33  // killed for memory (Cuebot marks it)
	ExitMemoryFailureDocker = 137 // the same under Docker
	ExitFailedLaunch        = 256 // RQD could not launch the frame
	ExitSkipRetry           = 286
	ExitFrameCleared        = 299 // cleared (e.g. failed launch); deletes the open frame_history row
	ExitFrameOrphan         = 301
	ExitFailedKill          = 302
	ExitDownHost            = 399
)

// NoRetryCount reports whether a frame restarted after a run that ended
// with this exit status keeps its int_retries (Cuebot and the reference
// scheduler do not count these as retries).
func NoRetryCount(exitStatus int64) bool {
	switch exitStatus {
	case ExitNeverRan, ExitSkipRetry, ExitFailedLaunch, ExitFrameCleared, ExitFrameOrphan, ExitFailedKill, ExitDownHost:
		return true
	}
	return false
}

// Task lock names (task_lock.str_name).
const (
	LockHistoricalTransfer        = "LOCK_HISTORICAL_TRANSFER"
	LockHardwareStateCheck        = "LOCK_HARDWARE_STATE_CHECK"
	LockOrphanedProcCheck         = "LOCK_ORPHANED_PROC_CHECK"
	LockTaskUpdate                = "LOCK_TASK_UPDATE"
	LockSubscriptionRecalculation = "LOCK_SUBSCRIPTION_RECALCULATION"
	LockStuckDependencyRecovery   = "LOCK_STUCK_DEPENDENCY_RECOVERY"
	LockOrphanedFrameCheck        = "LOCK_ORPHANED_FRAME_CHECK"
)

// ConfigDisableHistory is the config.str_key whose mere presence switches
// off the history triggers.
const ConfigDisableHistory = "DISABLE_HISTORY"

// Valid reports whether s is one of the frame states.
func (s FrameState) Valid() bool { return member(frameStates(), s) }

// Valid reports whether s is one of the job states.
func (s JobState) Valid() bool { return member(jobStates(), s) }

// Valid reports whether s is one of the lock states.
func (s LockState) Valid() bool { return member(lockStates(), s) }

// Valid reports whether s is one of the hardware states.
func (s HardwareState) Valid() bool { return member(hardwareStates(), s) }

// Valid reports whether t is one of the host tag types.
func (t HostTagType) Valid() bool { return member(hostTagTypes(), t) }

// Valid reports whether s is one of the checkpoint states.
func (s CheckpointState) Valid() bool { return member(checkpointStates(), s) }

// Valid reports whether t is one of the layer types.
func (t LayerType) Valid() bool { return member(layerTypes(), t) }

// Valid reports whether t is one of the dependency types.
func (t DependType) Valid() bool { return member(dependTypes(), t) }

// ParseFrameState returns s as a FrameState or an error naming it.
func ParseFrameState(s string) (FrameState, error) { return parse("frame state", frameStates(), s) }

// ParseJobState returns s as a JobState or an error naming it.
func ParseJobState(s string) (JobState, error) { return parse("job state", jobStates(), s) }

// ParseLockState returns s as a LockState or an error naming it.
func ParseLockState(s string) (LockState, error) { return parse("host lock state", lockStates(), s) }

// ParseHardwareState returns s as a HardwareState or an error naming it.
func ParseHardwareState(s string) (HardwareState, error) {
	return parse("host hardware state", hardwareStates(), s)
}

// ParseHostTagType returns s as a HostTagType or an error naming it.
func ParseHostTagType(s string) (HostTagType, error) {
	return parse("host tag type", hostTagTypes(), s)
}

// ParseCheckpointState returns s as a CheckpointState or an error naming it.
func ParseCheckpointState(s string) (CheckpointState, error) {
	return parse("checkpoint state", checkpointStates(), s)
}

// ParseLayerType returns s as a LayerType or an error naming it.
func ParseLayerType(s string) (LayerType, error) { return parse("layer type", layerTypes(), s) }

// ParseDependType returns s as a DependType or an error naming it.
func ParseDependType(s string) (DependType, error) { return parse("dependency type", dependTypes(), s) }

// FrameStates returns every frame state.
func FrameStates() []FrameState { return frameStates() }

// JobStates returns every job state.
func JobStates() []JobState { return jobStates() }

func member[T ~string](set []T, v T) bool {
	for _, x := range set {
		if x == v {
			return true
		}
	}
	return false
}

func parse[T ~string](kind string, set []T, s string) (T, error) {
	if member(set, T(s)) {
		return T(s), nil
	}
	return "", fmt.Errorf("cuebot: unknown %s %q (want one of %v; Cuebot stores them upper-case)", kind, s, set)
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}
