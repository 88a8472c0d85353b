package sim

import (
	"context"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
)

// MemProfile is what the frames of a layer really use: a lognormal peak
// RSS around MedianKB (shape Sigma, the standard deviation of its log),
// and with probability SpikeProb a spike of SpikeFactor times that, never
// above CapKB (0: no cap). A frame's peak is a function of the seed, its
// job and its name, so a retry of it needs what its first run needed, and
// a seed gives every frame the same peak however the runs interleave.
type MemProfile struct {
	MedianKB    int64
	Sigma       float64
	SpikeProb   float64
	SpikeFactor float64
	CapKB       int64
	// FrameKB pins the peak of named frames ("0030-render").
	FrameKB map[string]int64
}

// memWorld is the realistic memory world of a scenario: the layers' true
// RSS, the render hosts' physical memory enforced by the fake RQD's memory
// guard, and what the guard killed.
type memWorld struct {
	on       bool
	peakAt   float64
	profiles sync.Map // layer id -> MemProfile
	requests sync.Map // layer id -> memory asked at its first launch (KB)
	kills    atomic.Int64
	killedMu sync.Mutex
	killed   map[string]int       // frame id -> memory kills
	byLayer  map[string]int       // layer id -> memory kills
	first    map[string]time.Time // layer id -> its first memory kill
}

// MemoryWorld makes host memory real for the scenario: every frame uses
// its max RSS from peakAt of its run time on (its layer's MemProfile, or
// its layer's request), and a host whose frames' RSS exceeds its physical
// memory (host.int_mem) kills the frame furthest over its booking, which
// Cuebot's completion path then retries as a memory failure (exit status
// 33 marked before the kill, the layer's memory raised by Cuebot's rule).
// Call it before Start.
func (w *World) MemoryWorld(peakAt float64) {
	w.mem.on, w.mem.peakAt = true, peakAt
}

// LayerMemory sets the true RSS of one layer's frames.
func (w *World) LayerMemory(layerID string, p MemProfile) { w.mem.profiles.Store(layerID, p) }

// MemoryKills is how many frames the hosts' memory guard killed.
func (w *World) MemoryKills() int64 { return w.mem.kills.Load() }

// KilledFrames returns the frames killed for memory and how often.
func (w *World) KilledFrames() map[string]int {
	w.mem.killedMu.Lock()
	defer w.mem.killedMu.Unlock()
	out := make(map[string]int, len(w.mem.killed))
	for k, v := range w.mem.killed {
		out[k] = v
	}
	return out
}

// LayerKills returns the memory kills per layer id.
func (w *World) LayerKills() map[string]int {
	w.mem.killedMu.Lock()
	defer w.mem.killedMu.Unlock()
	out := make(map[string]int, len(w.mem.byLayer))
	for k, v := range w.mem.byLayer {
		out[k] = v
	}
	return out
}

func (w *World) recordKill(fc fakerqd.FrameCompletion) {
	w.mem.kills.Add(1)
	w.mem.killedMu.Lock()
	defer w.mem.killedMu.Unlock()
	if w.mem.killed == nil {
		w.mem.killed, w.mem.byLayer, w.mem.first = map[string]int{}, map[string]int{}, map[string]time.Time{}
	}
	w.mem.killed[fc.FrameID]++
	w.mem.byLayer[fc.LayerID]++
	if _, ok := w.mem.first[fc.LayerID]; !ok {
		w.mem.first[fc.LayerID] = time.Now()
	}
}

// FirstKills returns when each layer's first memory kill happened.
func (w *World) FirstKills() map[string]time.Time {
	w.mem.killedMu.Lock()
	defer w.mem.killedMu.Unlock()
	return maps.Clone(w.mem.first)
}

// rssOf is the peak RSS of a launched frame (KB): its layer's profile
// drawn for this frame, or its layer's request (requestedRSS).
func (w *World) rssOf(rf *rqdpb.RunFrame) int64 {
	v, ok := w.mem.profiles.Load(rf.GetLayerId())
	if !ok {
		return w.requestedRSS(rf)
	}
	return drawRSS(v.(MemProfile), w.Opts.Seed, rf.GetJobName(), rf.GetFrameName())
}

// requestedRSS is the peak of a frame whose layer has no MemProfile: the
// memory the layer asked for when its first frame launched
// (layer.int_mem_min then; Cuebot's raise after a memory failure does not
// move it). Never what the frame booked: with memory sizing on, a booking
// follows the layer's past peaks plus headroom, so a peak that followed the
// booking grew by the headroom (1.1x) with every window of samples until
// one frame filled a host's memory and the farm ran a frame or two per
// host (POISON's healthy jobs fell to half their rate over a minute). On
// an unreadable layer it falls back to the fake RQD's default, half the
// hard limit (the booking), without remembering it.
func (w *World) requestedRSS(rf *rqdpb.RunFrame) int64 {
	id := rf.GetLayerId()
	if v, ok := w.mem.requests.Load(id); ok {
		return v.(int64)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var kb int64
	if err := w.Pool.QueryRow(ctx, `SELECT int_mem_min FROM layer WHERE pk_layer = $1`, id).Scan(&kb); err != nil || kb <= 0 {
		return rf.GetHardMemoryLimit() / 2
	}
	v, _ := w.mem.requests.LoadOrStore(id, kb)
	return v.(int64)
}

// drawRSS draws a frame's peak from p: attempt numbers below zero keep the
// draws apart from the run-time draw's.
func drawRSS(p MemProfile, seed int64, job, frame string) int64 {
	if kb, ok := p.FrameKB[frame]; ok {
		return kb
	}
	u := func(attempt int64) float64 {
		return (float64(frameDraw(seed, job, frame, attempt)>>11) + 0.5) / (1 << 53)
	}
	z := math.Sqrt(-2*math.Log(u(-1))) * math.Cos(2*math.Pi*u(-2)) // Box-Muller
	rss := float64(p.MedianKB) * math.Exp(p.Sigma*z)
	if p.SpikeProb > 0 && u(-3) < p.SpikeProb {
		rss *= max(p.SpikeFactor, 1)
	}
	if p.CapKB > 0 {
		rss = min(rss, float64(p.CapKB))
	}
	return max(int64(rss), 1024)
}

// hostBehaviors is one guarded fake RQD behaviour per host, with its
// physical memory (host.int_mem).
func (w *World) hostBehaviors(ctx context.Context, def fakerqd.Behavior) (map[string]fakerqd.Behavior, error) {
	if !w.mem.on {
		return nil, nil
	}
	mem, err := queryMap[int64](ctx, w, `SELECT str_name, int_mem FROM host`)
	if err != nil {
		return nil, err
	}
	out := make(map[string]fakerqd.Behavior, len(mem))
	for name, kb := range mem {
		b := def
		b.MemoryKB, b.MemoryGuard, b.PeakAt = kb, true, w.mem.peakAt
		out[name] = b
	}
	return out, nil
}
