package hostcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cuesched/cuesched/scheduler/sizing"
)

// BenchmarkPlacement measures the placement cost per frame (one checkout
// and its release, with an Accept running the reservation policy as the
// matcher's does) for each strategy at 1k, 10k and 100k hosts, beside
// round 1's Best-Fit (best-fit cores, worst-fit memory, first fit) measured
// first in the same run on the same farm: x-vs-best-fit-ratio is the
// strategy's time per placement over Best-Fit's. epvm scores 24 candidates
// (plus 6 from the walk's other end); epvm+locality also adds the 16 hosts
// the layer is warm on. epvm+sizing is epvm with memory and threadable
// sizing on: the frame's size comes from its layer's RSS history (read
// once per pass, outside this loop), so per host tried it adds only the
// policy's arithmetic.
func BenchmarkPlacement(b *testing.B) {
	reqs := benchRequests()
	policy := sizing.Policy{CoreUnit: 100, StrandedMemKB: 2 * gib}
	fits := policy.Fitter(sizing.Shape{CoresMin: 100, MemMinKB: gib, Threadable: true, JobMaxCores: 1 << 40})
	accept := func(h Host) bool {
		return fits(&h.Host)
	}
	// Memory sizing on (sizing.memory/threadable: history): the layer
	// carries its history-derived size and RSS, which the pass read once
	// before the checkout (package memsize); per host tried only the
	// policy's arithmetic runs, with threadable cores from the RSS.
	sized := sizing.Policy{CoreUnit: 100, StrandedMemKB: 2 * gib,
		History: sizing.History{Memory: sizing.ModeHistory, Threadable: sizing.ModeHistory}}
	sizedFits := sized.Fitter(sizing.Shape{CoresMin: 100, MemMinKB: 8 * gib, Threadable: true, JobMaxCores: 1 << 40,
		SizedMemKB: gib + gib/10, RSSKB: gib})
	acceptSized := func(h Host) bool {
		return sizedFits(&h.Host)
	}
	type variant struct {
		name      string
		placement *Placement
		strategy  HostBookingStrategy
		layer     string
		accept    func(Host) bool
	}
	variants := []variant{
		{"best_fit", nil, DefaultStrategy(), "", accept},
		{"worst_fit", nil, HostBookingStrategy{}, "", accept},
		{"epvm", epvm(24), DefaultStrategy(), "", accept},
		{"epvm+locality", epvm(24), DefaultStrategy(), "layer-L", accept},
		{"epvm+sizing", epvm(24), DefaultStrategy(), "", acceptSized},
	}
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			f := benchFarm(b, n)
			f.rows = nil
			ctx := context.Background()
			// The layer is warm on 16 hosts.
			rng := rand.New(rand.NewPCG(5, 5))
			for range maxLayerHosts {
				f.c.Booked(fmt.Sprintf("host-%06d", rng.IntN(n)), "layer-L", 1, 100)
			}
			var baseNs float64
			for _, v := range variants {
				b.Run(v.name, func(b *testing.B) {
					f.c.mu.Lock()
					f.c.cfg.Placement = v.placement
					f.c.mu.Unlock()
					s := v.strategy
					r := Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}, Accept: v.accept, Strategy: &s, LayerID: v.layer}
					ns := timeCheckouts(ctx, b, f.c, r, reqs)
					if v.name == "best_fit" {
						baseNs = ns
					}
					if baseNs > 0 {
						b.ReportMetric(ns/baseNs, "x-vs-best-fit-ratio")
					}
				})
			}
		})
	}
}
