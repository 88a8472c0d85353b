package sim

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// SPLIT's runs: how many schedulers, and their scheduler.work_split. The
// default run is three instances splitting by allocation; the variants put
// one and two instances, and three that do not split (or split by
// cluster), beside it in the same report (issue #28).
type splitRun struct {
	instances int
	split     string
}

var splitRuns = map[string]splitRun{
	"":                              {3, config.WorkSplitAllocation},
	"1 instance":                    {1, config.WorkSplitAllocation},
	"2 instances":                   {2, config.WorkSplitAllocation},
	"3 instances, no split":         {3, config.WorkSplitNone},
	"3 instances, split by cluster": {3, config.WorkSplitCluster},
}

func splitVariants() []Variant {
	var out []Variant
	for _, name := range []string{"1 instance", "2 instances", "3 instances, no split", "3 instances, split by cluster"} {
		run := splitRuns[name]
		out = append(out, Variant{Name: name, Config: func(c *config.Config) { c.Scheduler.WorkSplit = run.split }})
	}
	return out
}

// runSplit: a cold fill of three allocations shared by six shows, each
// show with a deep backlog on every allocation, booked by several
// schedulers: the share of planned bookings lost to another instance
// (a booking-script refusal, a frame or a host's capacity taken first)
// is at most 10% at three instances; statements per frame, fill time and
// the clusters each instance owned are reported beside one and two
// instances and beside three that do not split.
func runSplit(ctx context.Context, w *World) error {
	run := splitRuns[w.Variant.Name]
	if w.Variant.Name == "" {
		w.Configure(func(c *config.Config) { c.Scheduler.WorkSplit = run.split })
	}
	const allocs, shows = 3, 6
	perAlloc := w.Opts.scale(250)
	if w.Opts.Hosts > 0 {
		perAlloc = max(w.Opts.Hosts/allocs, 1)
	}
	sizes := []int{8, 16, 24, 32}
	type pool struct {
		id, tag string
		cores   int
	}
	var pools []pool
	for a := 0; a < allocs; a++ {
		tag := fmt.Sprintf("pool%d", a)
		id, err := w.Seed.Alloc(ctx, w.Facility, "sim."+tag, tag)
		if err != nil {
			return err
		}
		p := pool{id: id, tag: tag}
		for i := 0; i < perAlloc; i++ {
			c := sizes[(i+a)%len(sizes)]
			if _, err := w.Seed.Host(ctx, farmseed.HostSpec{Name: fmt.Sprintf("%s-%04d", tag, i), Alloc: id, AllocTag: tag,
				Cores: c, MemKB: int64(c) * 4 * gb}); err != nil {
				return err
			}
			p.cores += c
		}
		pools = append(pools, p)
	}
	total := 0
	var specs []farmseed.JobSpec
	for s := 0; s < shows; s++ {
		show, err := w.Seed.Show(ctx, fmt.Sprintf("split%d", s), true)
		if err != nil {
			return err
		}
		for _, p := range pools {
			if _, err := w.Seed.Subscribe(ctx, show, p.id, p.cores/shows, p.cores); err != nil {
				return err
			}
			// Each show asks for 30% more than its part of the pool, in
			// 2-core frames, so the pool fills whoever books first.
			frames := p.cores * 13 / 10 / shows / 2
			for j := 0; frames > 0; j++ {
				k := min(frames, 150)
				frames -= k
				specs = append(specs, farmseed.JobSpec{Name: fmt.Sprintf("split%d-%s-%d", s, p.tag, j), Show: show, Facility: w.Facility,
					Priority: 50 + (s+j)%10, MaxCores: farmseed.Uncapped,
					Layers: []farmseed.LayerSpec{{Name: "render", Tags: []string{p.tag}, Frames: k, Cores: 2, MemKB: 4 * gb}}})
			}
		}
	}
	for _, p := range pools {
		total += p.cores
	}
	if _, err := w.Seed.Jobs(ctx, specs...); err != nil {
		return err
	}
	w.RunTimes(time.Hour, time.Hour)
	if err := w.SchedulerRole(ctx); err != nil {
		return err
	}
	w.Note("instances %d, work_split %s; %d hosts in %d allocations, %d cores, %d shows, %d jobs",
		run.instances, run.split, perAlloc*allocs, allocs, total, shows, len(specs))
	if err := w.Start(ctx, run.instances); err != nil {
		return err
	}
	start := time.Now()
	// The owned clusters per instance, sampled while the farm fills (a
	// share moves once, when the instances first see each other).
	var owned [][]float64
	ok := w.WaitFor(ctx, w.Patient(5*time.Minute), func() bool {
		if run.split != config.WorkSplitNone {
			owned = append(owned, w.Gauges("scheduler_work_split_owned_clusters"))
		}
		return w.fillNow(ctx) >= 0.95
	})
	secs := time.Since(start).Seconds()
	if !ok {
		w.Note("95%% not reached (%.0f%%)", w.fillNow(ctx)*100)
	}
	planned := w.Counter("scheduler_bookings_planned_total", "", "")
	lost := w.Counter("scheduler_bookings_lost_total", "", "")
	frames := w.Counter("scheduler_frames_dispatched_total", "", "")
	stmts := w.SchedulerStatements(ctx)
	share := 0.0
	if planned > 0 {
		share = 100 * lost / planned
	}
	w.Note("planned %.0f bookings, lost %.0f (gate %.0f, frame claimed %.0f, host stale %.0f); %d statements for %.0f frames",
		planned, lost, w.Counter("scheduler_bookings_lost_total", "reason", "gate_refused"),
		w.Counter("scheduler_bookings_lost_total", "reason", "frame_claimed"),
		w.Counter("scheduler_bookings_lost_total", "reason", "host_stale"), stmts, frames)
	if len(owned) > 0 {
		last := owned[len(owned)-1]
		w.Note("clusters owned per instance at the end: %v", last)
		if len(last) > 0 {
			w.Metric("fewest clusters owned by an instance", slices.Min(last), Info, 0, "")
			w.Metric("most clusters owned by an instance", slices.Max(last), Info, 0, "")
		}
	}
	w.Metric("races lost, share of planned bookings", share, AtMost, 10, "%")
	w.Metric("statements per frame", float64(stmts)/max(frames, 1), Info, 0, "")
	w.Metric("seconds to 95% of cores booked", secs, Info, 0, "s")
	w.Metric("frames started per second", frames/secs, Info, 0, "")
	w.Metric("instances", float64(run.instances), Info, 0, "")
	if !ok {
		return fmt.Errorf("the farm did not reach 95%% of its cores in %s", w.Patient(5*time.Minute))
	}
	return nil
}
