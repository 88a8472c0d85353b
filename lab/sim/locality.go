package sim

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

var noLocality = Variant{Name: "no locality", Config: func(c *config.Config) { c.Queue.Locality.Enabled = false }}

// runLocality: a sustained feed of several multi-frame layers on a farm
// kept busy. A frame is local when the host's previous batch (the frames
// the fake RQD started there before it, of one layer, each within 100 ms
// of the last) was of the frame's layer. The measure is taken over a
// window after the farm has filled.
func runLocality(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(16), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	layers := 0
	for i := 0; i < 4; i++ {
		ls := []farmseed.LayerSpec{oneCore("sim", w.Opts.scale(1000)), oneCore("comp", w.Opts.scale(1000)), oneCore("render", w.Opts.scale(1000))}
		if _, err := w.job(ctx, f.show, fmt.Sprintf("shot%d", i), 50, ls...); err != nil {
			return err
		}
		layers += len(ls)
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.9); err != nil {
		return err
	}
	from := time.Now()
	c0 := map[string]float64{}
	for _, l := range []string{"live", "warm", "cold"} {
		c0[l] = w.Counter("scheduler_placements_total", "locality", l)
	}
	if err := Sleep(ctx, 20*time.Second); err != nil {
		return err
	}
	to := time.Now()
	local, total := localShare(w, from, to)
	share := 0.0
	if total > 0 {
		share = float64(local) / float64(total)
	}
	w.Note("%d layers on %d cores; %d of %d frames started in the window went to a host whose previous batch was of their layer",
		layers, f.cores, local, total)
	w.Metric("frames on a host that last ran the same layer", share*100, AtLeast, 25, "%")
	var placed float64
	split := map[string]float64{}
	for _, l := range []string{"live", "warm", "cold"} {
		split[l] = w.Counter("scheduler_placements_total", "locality", l) - c0[l]
		placed += split[l]
	}
	for _, l := range []string{"live", "warm", "cold"} {
		v := 0.0
		if placed > 0 {
			v = split[l] / placed * 100
		}
		w.Metric("placements "+l+" (scheduler_placements_total)", v, Info, 0, "%")
	}
	return nil
}

// localShare counts, among the frames started in [from, to), those whose
// host's previous batch was of the same layer.
func localShare(w *World, from, to time.Time) (local, total int) {
	ls := w.Fake.Launches()
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].At.Before(ls[j].At) })
	type batch struct {
		layer string
		last  time.Time
		local bool
	}
	cur := map[string]*batch{}  // host -> its current batch
	prev := map[string]string{} // host -> the layer of its batch before
	for _, l := range ls {
		if !l.Started || l.RunFrame == nil || l.Host == "" {
			continue
		}
		layer := l.RunFrame.GetLayerId()
		b := cur[l.Host]
		if b == nil || b.layer != layer || l.At.Sub(b.last) > 100*time.Millisecond {
			if b != nil {
				prev[l.Host] = b.layer
			}
			b = &batch{layer: layer, local: prev[l.Host] == layer}
			cur[l.Host] = b
		}
		b.last = l.At
		if l.At.Before(from) || !l.At.Before(to) {
			continue
		}
		total++
		if b.local {
			local++
		}
	}
	return local, total
}
