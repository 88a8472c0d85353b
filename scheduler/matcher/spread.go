package matcher

import "github.com/cuesched/cuesched/scheduler/sizing"

// Spread caps one layer's share of a host (queue.layer_spread): a layer may
// hold at most Fraction of a host's cores, but always at least MinFrames of
// its frames. The layer's cores on a host come from the host cache
// (sizing.Host.LayerCores). The cap is lifted when the layer is the only
// work of its cluster pass (the pass found one job, and the job one
// dispatchable layer): nobody else wants the hosts then. The zero Spread
// (Fraction 0) caps nothing.
type Spread struct {
	Fraction  float64
	MinFrames int
}

// Room returns the centicores a layer whose frames take frameCores each may
// still book on h under the cap, and whether one more frame fits. A
// frameCores of 0 or less (frames that take the whole host) is not capped.
func (s Spread) Room(h sizing.Host, frameCores int64) (int64, bool) {
	if s.Fraction <= 0 || frameCores <= 0 {
		return h.IdleCores, true
	}
	limit := max(int64(s.Fraction*float64(h.TotalCores)), int64(max(s.MinFrames, 1))*frameCores)
	room := limit - max(h.LayerCores, 0)
	return max(room, 0), room >= frameCores
}

// spreadLimit returns what applies the cap to a host for a layer whose
// frames book at least frameCores each (sizing.Policy.FrameCores): it
// raises h.KeepCores so the layer books at most its room and reports
// whether one frame still fits; nil when the cap does not apply (the cap is
// off, the layer is alone, or its frames take the whole host).
func (m *Matcher) spreadLimit(frameCores int64, solo bool) func(h *sizing.Host) bool {
	if m.cfg.Spread.Fraction <= 0 || solo || frameCores <= 0 {
		return nil
	}
	return func(h *sizing.Host) bool {
		room, ok := m.cfg.Spread.Room(*h, frameCores)
		h.KeepCores = max(h.KeepCores, h.IdleCores-room)
		return ok
	}
}
