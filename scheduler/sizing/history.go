package sizing

import (
	"math"
	"slices"
	"time"
)

// Sizing modes (sizing.memory, sizing.threadable).
const (
	ModeHistory = "history"
	ModeRequest = "request"
)

// History is memory sizing from measured RSS (section sizing of the
// configuration). The zero History books requests, as Cuebot does.
type History struct {
	// Memory and Threadable are ModeHistory or ModeRequest.
	Memory, Threadable string
	// Quantile of the samples booked (nearest rank), plus Headroom (a
	// fraction), clamped to MinKB..MaxKB (MaxKB 0: no upper clamp).
	Quantile float64
	Headroom float64
	MinKB    int64
	MaxKB    int64
	// WindowFrames, MinSamples, MaxAge select the samples.
	WindowFrames int
	MinSamples   int
	MaxAge       time.Duration
	// OOMRetryFactor, OOMBumpKills, OOMBumpWindow: the OOM policy.
	OOMRetryFactor float64
	OOMBumpKills   int
	OOMBumpWindow  time.Duration
	// ProbeFrames a threadable layer without history runs at its request
	// before its cores are derived.
	ProbeFrames int
}

// MemoryOn reports whether memory is sized from history.
func (h History) MemoryOn() bool { return h.Memory == ModeHistory }

// ThreadableOn reports whether threadable cores are sized from history.
func (h History) ThreadableOn() bool { return h.Threadable == ModeHistory }

// Enabled reports whether anything is sized from history (the pass then
// reads history and kills).
func (h History) Enabled() bool { return h.MemoryOn() || h.ThreadableOn() }

// Sources of a decision.
const (
	SourceRequest = "request" // no (or too little) history: the request
	SourceHistory = "history" // quantile of the samples + headroom
	SourceBump    = "bump"    // the layer's OOM bump is above the history size
	SourceRetry   = "retry"   // a frame's own size after a memory kill
)

// Input is what a layer's decision reads.
type Input struct {
	// RequestKB is the request booked without history (see Decide).
	RequestKB int64
	// SamplesKB are the RSS peaks (frame.int_mem_max_used) of the layer's
	// recent succeeded frames, any order.
	SamplesKB []int64
	// BumpKB is the layer's OOM bump (0: none).
	BumpKB int64
}

// Decision is a layer's memory and why (cuesched explain prints it).
type Decision struct {
	MemKB      int64  // what a frame books
	Source     string // SourceRequest, SourceHistory or SourceBump
	RequestKB  int64
	Samples    int
	QuantileKB int64 // the quantile of the samples (0 without history)
	HeadroomKB int64 // added on top of it
	Clamp      string
	BumpKB     int64
	// RSSKB is what a frame is expected to use (the quantile; 0 without
	// history): the memory threadable cores are derived from.
	RSSKB int64
}

// Quantile returns the q-quantile of samples by nearest rank (the
// smallest sample with at least q of the samples at or below it); 0 for
// no samples. samples is not changed.
func Quantile(samples []int64, q float64) int64 {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

// Decide sizes a layer. With memory sizing off, or fewer than MinSamples
// samples, it books the request (raised to the bump, if any); otherwise the
// Quantile of the samples plus Headroom, within the clamps, raised to the
// bump.
func (h History) Decide(in Input) Decision {
	d := Decision{RequestKB: in.RequestKB, Samples: len(in.SamplesKB), BumpKB: max(in.BumpKB, 0), Source: SourceRequest, MemKB: in.RequestKB}
	if len(in.SamplesKB) >= max(h.MinSamples, 1) {
		d.QuantileKB = Quantile(in.SamplesKB, h.Quantile)
		d.RSSKB = d.QuantileKB
	}
	if !h.MemoryOn() {
		return d
	}
	if d.QuantileKB > 0 {
		d.HeadroomKB = int64(math.Ceil(float64(d.QuantileKB) * h.Headroom))
		kb := d.QuantileKB + d.HeadroomKB
		switch {
		case kb < h.MinKB:
			kb, d.Clamp = h.MinKB, "min_memory"
		case h.MaxKB > 0 && kb > h.MaxKB:
			kb, d.Clamp = h.MaxKB, "max_memory"
		}
		d.MemKB, d.Source = kb, SourceHistory
	}
	if d.BumpKB > d.MemKB {
		d.MemKB, d.Source = d.BumpKB, SourceBump
	}
	return d
}

// RetryKB is the size a frame killed for memory books next: its max RSS,
// at least what it had booked, times OOMRetryFactor, within MaxKB.
func (h History) RetryKB(maxRSSKB, reservedKB int64) int64 {
	f := h.OOMRetryFactor
	if f < 1 {
		f = 1
	}
	kb := int64(math.Ceil(float64(max(maxRSSKB, reservedKB)) * f))
	if h.MaxKB > 0 {
		kb = min(kb, max(h.MaxKB, reservedKB))
	}
	return kb
}

// NeedSamples is how many samples a threadable layer needs before its
// cores are derived: MinSamples, and at least ProbeFrames probes.
func (h History) NeedSamples() int { return max(h.MinSamples, h.ProbeFrames, 1) }

// Memory-kill exit statuses (frame.int_exit_status): Cuebot's
// EXIT_STATUS_MEMORY_FAILURE, which it also stores on the frame before its
// own memory-guard kill, and its Docker equivalent (128 + SIGKILL).
const (
	ExitMemoryFailure       = 33
	ExitMemoryFailureDocker = 137
)

// MemoryKill reports whether a run that ended with exitStatus, having used
// maxRSSKB of a reservedKB booking, was killed for memory: Cuebot's memory
// statuses, or any failure that used more than it booked (a kill by the
// kernel's OOM killer reports only SIGKILL).
func MemoryKill(exitStatus, maxRSSKB, reservedKB int64) bool {
	switch {
	case exitStatus == ExitMemoryFailure || exitStatus == ExitMemoryFailureDocker:
		return true
	case exitStatus == 0 || exitStatus < 0:
		return false
	case exitStatus == 256 || exitStatus == 286 || exitStatus == 299 || exitStatus == 301 || exitStatus == 302 || exitStatus == 399:
		return false // launch failures, clears, orphans, down hosts: not the frame's memory
	}
	return reservedKB > 0 && maxRSSKB > reservedKB
}
