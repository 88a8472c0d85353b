package memsize

import (
	"fmt"
	"strings"

	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/config"
)

// FromConfig is the sizing section as the policy reads it.
func FromConfig(c config.Sizing) sizing.History {
	return sizing.History{
		Memory: c.Memory, Threadable: c.Threadable,
		Quantile: c.Quantile, Headroom: c.Headroom, MinKB: c.MinMemory.KB(), MaxKB: c.MaxMemory.KB(),
		WindowFrames: c.WindowFrames, MinSamples: c.MinSamples, MaxAge: c.MaxAge.D(),
		OOMRetryFactor: c.OOMRetryFactor, OOMBumpKills: c.OOMBumpKills, OOMBumpWindow: c.OOMBumpWindow.D(),
		ProbeFrames: c.ProbeFrames,
	}
}

// Explanation is a layer's memory decision for `cuesched explain`.
type Explanation struct {
	BookedKB   int64   `json:"booked_kb"`
	Source     string  `json:"source"` // request, history, bump
	RequestKB  int64   `json:"request_kb"`
	MemMinKB   int64   `json:"int_mem_min_kb"`
	Samples    int     `json:"samples"`
	Quantile   float64 `json:"quantile"`
	QuantileKB int64   `json:"quantile_kb"`
	HeadroomKB int64   `json:"headroom_kb"`
	Clamp      string  `json:"clamp,omitempty"`
	BumpKB     int64   `json:"bump_kb"`
	Bumps      int     `json:"bumps"`
	Kills      int     `json:"kills"`
	Text       string  `json:"text"`
}

// Explain says what a layer books and why, from its history.
func Explain(p sizing.History, h History) Explanation {
	d := p.Decide(sizing.Input{RequestKB: h.RequestKB(), SamplesKB: h.SamplesKB, BumpKB: h.BumpKB})
	e := Explanation{BookedKB: d.MemKB, Source: d.Source, RequestKB: d.RequestKB, MemMinKB: h.MemMinKB, Samples: d.Samples,
		Quantile: p.Quantile, QuantileKB: d.QuantileKB, HeadroomKB: d.HeadroomKB, Clamp: d.Clamp, BumpKB: h.BumpKB, Bumps: h.Bumps, Kills: h.Kills}
	var b strings.Builder
	if !p.MemoryOn() {
		// Cuebot's behaviour: layer.int_mem_min, ratchet included.
		e.BookedKB, e.RequestKB, e.Source = h.MemMinKB, h.MemMinKB, sizing.SourceRequest
		fmt.Fprintf(&b, "books layer.int_mem_min %s (sizing.memory: request)", gib(h.MemMinKB))
		if d.QuantileKB > 0 {
			fmt.Fprintf(&b, "; its frames peak at %s (p%g of %d samples)", gib(d.QuantileKB), p.Quantile*100, d.Samples)
		}
		e.Text = b.String()
		return e
	}
	fmt.Fprintf(&b, "books %s: ", gib(d.MemKB))
	switch d.Source {
	case sizing.SourceHistory:
		fmt.Fprintf(&b, "p%g of %d RSS samples (last %d succeeded frames within %s) = %s + %g%% headroom %s",
			p.Quantile*100, d.Samples, p.WindowFrames, p.MaxAge, gib(d.QuantileKB), p.Headroom*100, gib(d.HeadroomKB))
		if d.Clamp != "" {
			fmt.Fprintf(&b, ", clamped to sizing.%s", d.Clamp)
		}
	case sizing.SourceBump:
		fmt.Fprintf(&b, "raised after %d memory kills within %s (%d bump(s))", p.OOMBumpKills, p.OOMBumpWindow, h.Bumps)
		if d.QuantileKB > 0 {
			fmt.Fprintf(&b, ", above p%g of %d samples + headroom", p.Quantile*100, d.Samples)
		}
	default:
		fmt.Fprintf(&b, "its request (%d of %d samples needed)", d.Samples, p.MinSamples)
	}
	fmt.Fprintf(&b, "; request %s", gib(d.RequestKB))
	if h.RequestKB() != h.MemMinKB {
		fmt.Fprintf(&b, " (layer.int_mem_min %s is Cuebot's ratchet after a kill)", gib(h.MemMinKB))
	}
	if h.BumpKB > 0 && d.Source != sizing.SourceBump {
		fmt.Fprintf(&b, "; bump %s (%d)", gib(h.BumpKB), h.Bumps)
	}
	fmt.Fprintf(&b, "; %d memory kill(s) recorded", h.Kills)
	e.Text = b.String()
	return e
}

func gib(kb int64) string { return fmt.Sprintf("%.1fGiB", float64(kb)/(1<<20)) }
