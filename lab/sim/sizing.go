package sim

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// sizingOff is the comparison run of the sizing scenarios: memory and
// threadable cores booked as the layer requests, Cuebot's behaviour.
var sizingOff = Variant{Name: "sizing off", Config: func(c *config.Config) {
	c.Sizing.Memory, c.Sizing.Threadable = config.SizingRequest, config.SizingRequest
}}

// Metric names the Compare functions read.
const (
	mKillsPer1000 = "memory kills per 1,000 frames"
	// mLateKillsPer1000 counts the kills of runs launched after their
	// layer's first kill (OOM's judged figure).
	mLateKillsPer1000 = "memory kills per 1,000 frames after the layer's first"
	mConcurrent       = "frames running at once (mean)"
	mKills            = "memory kills"
)

// memHosts adds n hosts of cores cores and memKB memory to alloc.
func (w *World) memHosts(ctx context.Context, prefix, alloc string, n, cores int, memKB int64) error {
	for i := 0; i < n; i++ {
		if _, err := w.Seed.Host(ctx, farmseed.HostSpec{Name: fmt.Sprintf("%s%04d", prefix, i), Alloc: alloc,
			AllocTag: "general", Cores: cores, MemKB: memKB}); err != nil {
			return err
		}
	}
	return nil
}

// memFarm seeds n hosts of the given shape and one managed show.
func (w *World) memFarm(ctx context.Context, n, cores int, memKB int64) (simFarm, error) {
	var f simFarm
	var err error
	if f.alloc, err = w.Seed.Alloc(ctx, w.Facility, "sim.general", "general"); err != nil {
		return f, err
	}
	if err = w.memHosts(ctx, "m", f.alloc, n, cores, memKB); err != nil {
		return f, err
	}
	f.cores = n * cores
	if f.show, err = w.Seed.Show(ctx, "main", true); err != nil {
		return f, err
	}
	_, err = w.Seed.Subscribe(ctx, f.show, f.alloc, f.cores, f.cores)
	return f, err
}

// memLayer is a job of one layer whose frames use profile, seeded and
// registered with the memory world.
func (w *World) memLayer(ctx context.Context, show farmseed.Show, job string, priority int, l farmseed.LayerSpec, p MemProfile) (farmseed.Layer, error) {
	j, err := w.job(ctx, show, job, priority, l)
	if err != nil {
		return farmseed.Layer{}, err
	}
	w.LayerMemory(j.Layers[0].ID, p)
	return j.Layers[0], nil
}

// frameStates counts the frames of the layers by state.
func (w *World) frameStates(ctx context.Context, layers []string) map[string]int64 {
	out, _ := queryMap[int64](ctx, w, `SELECT str_state, count(*) FROM frame WHERE pk_layer = ANY($1) GROUP BY 1`, layers)
	return out
}

// bookedKB is the memory a launch booked (CUE_MEMORY).
func bookedKB(l fakerqd.Launch) int64 {
	n, _ := strconv.ParseInt(l.RunFrame.GetEnvironment()["CUE_MEMORY"], 10, 64)
	return n
}

// runningOf counts the frames of the layers running on the fake RQD now.
func (w *World) runningOf(layers map[string]bool) int {
	n := 0
	for _, rf := range w.Fake.Running("") {
		if layers[rf.GetLayerId()] {
			n++
		}
	}
	return n
}

// concurrency samples how many frames of the layers run at once, from
// `from` seconds after Start on.
type concurrency struct {
	mu   sync.Mutex
	sum  float64
	n    int
	peak int
	from float64
}

// startAt moves the start of the sampling to from seconds after Start.
func (c *concurrency) startAt(from float64) {
	c.mu.Lock()
	c.from = from
	c.mu.Unlock()
}

func (c *concurrency) mean() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return 0
	}
	return c.sum / float64(c.n)
}

func (w *World) sampleConcurrency(layers map[string]bool, from float64) *concurrency {
	c := &concurrency{from: from}
	w.Sample(func(_ context.Context, t float64) {
		c.mu.Lock()
		from := c.from
		c.mu.Unlock()
		if t < from {
			return
		}
		n := w.runningOf(layers)
		c.mu.Lock()
		c.sum += float64(n)
		c.n++
		c.peak = max(c.peak, n)
		c.mu.Unlock()
	})
	return c
}

// memoryReport records what the memory world saw: kills, and how often
// the frames' actual RSS took a host past its physical memory (the
// host-memory invariant is judged on booked memory; this is reported).
func (w *World) memoryReport(frames int) {
	kills, over := w.Fake.MemoryStats()
	w.Metric(mKills, float64(kills), Info, 0, "")
	w.Metric("launches that took a host's actual RSS past its memory", float64(over), Info, 0, "")
	if frames > 0 {
		w.Note("%d memory kills over %d frames of the sized layers", kills, frames)
	}
}

// sizingState reads cuesched's own OOM state: per layer, the bump
// (cuesched_layer_oom) and the kills cuesched recorded (cuesched_frame_oom).
// ok is false when the tables are not there (sizing not built).
func (w *World) sizingState(ctx context.Context) (bumps map[string]int64, kills map[string]int64, ok bool) {
	var exists bool
	if err := w.Pool.QueryRow(ctx, `SELECT to_regclass('cuesched_layer_oom') IS NOT NULL AND to_regclass('cuesched_frame_oom') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return nil, nil, false
	}
	bumps, err1 := queryMap[int64](ctx, w, `SELECT pk_layer, int_bump_kb FROM cuesched_layer_oom`)
	kills, err2 := queryMap[int64](ctx, w, `SELECT pk_layer, count(*) FROM cuesched_frame_oom GROUP BY 1`)
	return bumps, kills, err1 == nil && err2 == nil
}

// runOOM: layers whose frames need 2.5–5x the 4 GB they ask for arrive on
// a farm busy with honest work; hosts kill the frame furthest over its
// booking when their frames' RSS exceeds physical memory. Sizing retries a
// killed frame at its own raised size and raises a layer only after
// repeated kills; Cuebot raises the whole layer by 2 GB at every kill.
func runOOM(ctx context.Context, w *World) error {
	const hostMem = 64 * gb
	f, err := w.memFarm(ctx, w.Opts.scale(8), 16, hostMem)
	if err != nil {
		return err
	}
	w.MemoryWorld(0.5)
	w.RunTimes(600*time.Millisecond, 1400*time.Millisecond)
	// Honest work keeps the farm busy for the first half minute or so:
	// asks 4 GB, uses ~3 GB.
	filler := oneCore("comp", w.Opts.scale(1000))
	filler.MemKB = 4 * gb
	honest, err := w.memLayer(ctx, f.show, "honest", 40, filler, MemProfile{MedianKB: 3 * gb, Sigma: 0.2, CapKB: 4 * gb})
	if err != nil {
		return err
	}
	// Long enough that a loaded machine keeps the farm full of it, and
	// spread, so that its frames do not end together.
	w.LayerRunTimes(honest.ID, 2*time.Second, 6*time.Second)
	sized := map[string]bool{}
	var ids []string
	var jobs []farmseed.JobSpec
	frames := 0
	needs := []int64{10 * gb, 12 * gb, 14 * gb, 16 * gb, 18 * gb, 20 * gb}
	for i := range needs {
		l := oneCore("render", w.Opts.scale(60))
		l.MemKB = 4 * gb
		jobs = append(jobs, farmseed.JobSpec{Name: fmt.Sprintf("under%d", i+1), Show: f.show, Facility: w.Facility, Priority: 60,
			MaxCores: farmseed.Uncapped, Paused: true, Layers: []farmseed.LayerSpec{l}})
		frames += l.Frames
	}
	// A well-sized layer with one frame that needs 9x (36 GB of a 64 GB
	// host): killed once when it lands beside ten or more other frames, it
	// must not raise the layer; its retry (1.5x its RSS) fits a host once
	// the honest work has drained.
	ol := oneCore("lookdev", w.Opts.scale(60))
	ol.MemKB = 4 * gb
	spike := fmt.Sprintf("%04d-lookdev", max(ol.Frames/2, 1))
	jobs = append(jobs, farmseed.JobSpec{Name: "outlier", Show: f.show, Facility: w.Facility, Priority: 60,
		MaxCores: farmseed.Uncapped, Paused: true, Layers: []farmseed.LayerSpec{ol}})
	frames += ol.Frames
	var outlier farmseed.Layer
	var jobIDs []string
	for i, spec := range jobs {
		j, err := w.Seed.Job(ctx, spec)
		if err != nil {
			return err
		}
		ly := j.Layers[0]
		if spec.Name == "outlier" {
			outlier = ly
			w.LayerMemory(ly.ID, MemProfile{MedianKB: 3 * gb, Sigma: 0.1, CapKB: 4 * gb, FrameKB: map[string]int64{spike: 36 * gb}})
		} else {
			w.LayerMemory(ly.ID, MemProfile{MedianKB: needs[i], Sigma: 0.15, SpikeProb: 0.02, SpikeFactor: 1.5, CapKB: hostMem / 2})
		}
		sized[ly.ID], ids, jobIDs = true, append(ids, ly.ID), append(jobIDs, j.ID)
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	// The honest work fills the farm (sized from its history it books
	// ~4.4 GB, 14 frames a host) and turns over once, so its frames end
	// spread out; then one job arrives every 1.5 s. (With every honest
	// frame running 4 s, the whole first wave ended at once a few seconds
	// in, and the jobs that had arrived by then took the empty farm: the
	// first waves' size, and the kills, followed that moment.)
	cores := w.Int(ctx, `SELECT sum(int_cores) / 100 FROM host`)
	if !w.WaitFor(ctx, w.Patient(90*time.Second), func() bool {
		return w.fillNow(ctx) >= 0.75 && w.frameStates(ctx, []string{honest.ID})["SUCCEEDED"] >= cores
	}) {
		err := fmt.Errorf("the farm did not fill to 75%% and run a farm's worth of honest frames (%d) within %v (%.0f%%, %d done)",
			cores, w.Patient(90*time.Second), w.fillNow(ctx)*100, w.frameStates(ctx, []string{honest.ID})["SUCCEEDED"])
		booked := map[int64]int{}
		for _, l := range w.Fake.Launches() {
			booked[bookedKB(l)/1024]++
		}
		return fmt.Errorf("%w (launches by MB booked: %v)", err, booked)
	}
	var arrivals []string
	for _, id := range jobIDs {
		arrivals = append(arrivals, fmt.Sprintf("%.2f", w.fillNow(ctx)))
		if _, err := w.Pool.Exec(ctx, `UPDATE job SET b_paused = false WHERE pk_job = $1`, id); err != nil {
			return err
		}
		if err := Sleep(ctx, 1500*time.Millisecond); err != nil {
			return err
		}
	}
	done := w.WaitFor(ctx, w.Patient(150*time.Second), func() bool {
		return w.frameStates(ctx, ids)["SUCCEEDED"] == int64(frames)
	})
	states := w.frameStates(ctx, ids)
	if !done {
		w.Note("not all sized frames succeeded within %v: %v", w.Patient(150*time.Second), states)
	}
	// Every killed frame eventually succeeds.
	killed := w.KilledFrames()
	var killedIDs []string
	layerKills := map[string]int{}
	for id := range killed {
		killedIDs = append(killedIDs, id)
	}
	var killedOK int64
	_ = w.Pool.QueryRow(ctx, `SELECT count(*) FROM frame WHERE pk_frame = ANY($1) AND str_state = 'SUCCEEDED'`, killedIDs).Scan(&killedOK)
	var sizedKills int
	for layer, n := range w.LayerKills() {
		if sized[layer] {
			sizedKills += n
			layerKills[layer] = n
		}
	}
	names, _ := queryMap[string](ctx, w, `SELECT l.pk_layer, j.str_name FROM layer l JOIN job j ON j.pk_job = l.pk_job WHERE l.pk_layer = ANY($1)`, ids)
	var per []string
	for _, id := range ids {
		per = append(per, fmt.Sprintf("%s %d", names[id], layerKills[id]))
	}
	w.Note("memory kills per job: %s", strings.Join(per, ", "))
	w.Note("farm fill as each job arrived: %s", strings.Join(arrivals, " "))
	waves := firstWaves(w.Fake.Launches(), w.FirstKills(), killed)
	var wave []string
	late := 0
	for _, id := range ids {
		wv := waves[id]
		late += wv.lateKilled
		wave = append(wave, fmt.Sprintf("%s %d (%d)", names[id], wv.before, wv.beforeKilled))
	}
	w.Note("runs launched before their job's first kill (killed of them), the first wave: %s", strings.Join(wave, ", "))
	w.Metric("sized frames succeeded", float64(states["SUCCEEDED"]), Equal, float64(frames), "")
	w.Metric("killed frames that succeeded later", float64(killedOK), Equal, float64(len(killedIDs)), "")
	w.Metric(mKillsPer1000, float64(sizedKills)*1000/float64(frames), Info, 0, "")
	w.Metric(mLateKillsPer1000, float64(late)*1000/float64(frames), Info, 0, "")
	// A single kill never raises the whole layer: cuesched's own state.
	judgeBumps(ctx, w, layerKills)
	// What the outlier layer's frames booked on their first run before and
	// after its kill (Cuebot's ratchet raises int_mem_min; sizing should
	// not follow a single kill).
	before, after := outlierBookings(w, outlier.ID, killed)
	w.Metric("outlier layer: largest first-run booking after its kill ÷ before", ratio(after, before), Info, 0, "")
	w.Note("outlier layer %s killed %d times; first runs booked up to %d MB before its first kill, %d MB after",
		outlier.Name, layerKills[outlier.ID], before/1024, after/1024)
	var spikeRSS, spikeReserved int64
	_ = w.Pool.QueryRow(ctx, `SELECT int_mem_max_used, int_mem_reserved FROM frame WHERE pk_layer = $1 AND str_name = $2`, outlier.ID, spike).Scan(&spikeRSS, &spikeReserved)
	w.Note("outlier frame %s: max RSS %d MB, last booked %d MB", spike, spikeRSS/1024, spikeReserved/1024)
	var raised int64
	_ = w.Pool.QueryRow(ctx, `SELECT max(int_mem_min) FROM layer WHERE pk_layer = ANY($1)`, ids).Scan(&raised)
	w.Note("largest layer.int_mem_min after Cuebot's ratchet: %d MB (requests were 4096 MB)", raised/1024)
	w.memoryReport(frames)
	return nil
}

// wave is one layer's runs split at its first memory kill: the runs
// launched before it (its first wave, launched before any frame of the
// layer could have told the scheduler its request is too small) and how
// many of them were killed, and the killed runs launched after it.
type wave struct{ before, beforeKilled, lateKilled int }

// firstWaves splits each layer's runs at the layer's first memory kill. In
// this world a frame only fails by a memory kill and every frame ends
// SUCCEEDED, so a frame killed n times had its first n runs killed.
func firstWaves(ls []fakerqd.Launch, first map[string]time.Time, killed map[string]int) map[string]wave {
	ls = slices.Clone(ls)
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].At.Before(ls[j].At) })
	runs := map[string]int{}
	out := map[string]wave{}
	for _, l := range ls {
		if !l.Started {
			continue
		}
		id, layer := l.RunFrame.GetFrameId(), l.RunFrame.GetLayerId()
		run := runs[id]
		runs[id]++
		wv := out[layer]
		wasKilled := run < killed[id]
		if at, ok := first[layer]; !ok || l.At.Before(at) {
			wv.before++
			if wasKilled {
				wv.beforeKilled++
			}
		} else if wasKilled {
			wv.lateKilled++
		}
		out[layer] = wv
	}
	return out
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return math.Round(float64(a)/float64(b)*100) / 100
}

// judgeBumps: every layer cuesched raised had at least oom_bump_kills
// kills (cuesched's own ledger), so no single kill raised a layer.
func judgeBumps(ctx context.Context, w *World, worldKills map[string]int) {
	cfg := w.config()
	if cfg.Sizing.Memory != config.SizingHistory {
		return
	}
	bumps, kills, ok := w.sizingState(ctx)
	if !ok {
		w.Metric("cuesched OOM ledger present (cuesched_layer_oom)", 0, Equal, 1, "")
		return
	}
	early := 0
	for layer := range bumps {
		if kills[layer] < int64(cfg.Sizing.OOMBumpKills) {
			early++
			w.Note("layer %s raised after %d kills (oom_bump_kills %d)", layer, kills[layer], cfg.Sizing.OOMBumpKills)
		}
	}
	single := 0
	for layer, n := range worldKills {
		if _, bumped := bumps[layer]; n == 1 && bumped {
			single++
		}
	}
	w.Metric("layers raised after fewer than oom_bump_kills kills", float64(early), Equal, 0, "")
	w.Metric("layers raised after a single kill", float64(single), Equal, 0, "")
	w.Note("cuesched raised %d layers (oom_bump_kills %d)", len(bumps), cfg.Sizing.OOMBumpKills)
}

// outlierBookings: the largest memory booked by a first run of the
// layer's frames before the layer's first memory kill and after it.
func outlierBookings(w *World, layer string, killed map[string]int) (before, after int64) {
	ls := w.Fake.Launches()
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].At.Before(ls[j].At) })
	seen := map[string]bool{}
	// The layer's first killed frame: its retry marks the kill.
	var killedFrame string
	for _, l := range ls {
		if _, ok := killed[l.RunFrame.GetFrameId()]; ok && l.RunFrame.GetLayerId() == layer {
			killedFrame = l.RunFrame.GetFrameId()
			break
		}
	}
	passed := false
	for _, l := range ls {
		if !l.Started || l.RunFrame.GetLayerId() != layer {
			continue
		}
		id := l.RunFrame.GetFrameId()
		if seen[id] {
			if id == killedFrame {
				passed = true // its retry: the kill has happened
			}
			continue
		}
		seen[id] = true
		if passed {
			after = max(after, bookedKB(l))
		} else {
			before = max(before, bookedKB(l))
		}
	}
	return before, after
}

// compareOOM: the kills after each layer's first kill, per 1,000 frames, at
// most half the sizing-off run's. Those are the kills a sizing policy
// answers for: from that kill on, both runs have the same signal (sizing
// retries the killed frame at its own size and holds the layer to
// probe_frames until it is raised; Cuebot ratchets the layer 2 GB a kill).
// The first wave's kills are launched before any signal exists, at the
// same request in both runs, and their count follows how much room the
// farm has the moment each job arrives: they are reported, with all kills'
// ratio, not judged (judged, the total made the verdict bimodal on one
// seed, 43-72 or 179-217 kills per 1,000 run to run).
func compareOOM(def Result, vs []Result) []Metric {
	on, _ := def.Value(mKillsPer1000)
	off, _ := vs[0].Value(mKillsPer1000)
	lateOn, _ := def.Value(mLateKillsPer1000)
	lateOff, _ := vs[0].Value(mLateKillsPer1000)
	return []Metric{
		{Name: "kills after the layer's first per 1,000 frames ÷ sizing off", Value: ratio64(lateOn, lateOff), Op: AtMost, Threshold: 0.5},
		{Name: "all kills per 1,000 frames ÷ sizing off", Value: ratio64(on, off), Op: Info},
	}
}

func ratio64(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return math.Round(a/b*1000) / 1000
}

// runMemStrand: layers asking 3–5x the memory their frames use, on hosts
// with 2 GB per core: booked by request, memory strands most cores.
//
// The verdict is how many frames the hosts' memory lets run at once, not
// how fast the scheduler refills them: frames run 3–5 s (seeded), long
// beside a pass even on a loaded machine (at 0.6–1.4 s, a loaded machine
// halved the sized run's mean while sizing off, capped by memory, kept
// its), and the sampling starts when every layer has min_samples
// succeeded frames (sizing has its history; sizing off the same point),
// not at a fixed second.
func runMemStrand(ctx context.Context, w *World) error {
	f, err := w.memFarm(ctx, w.Opts.scale(8), 16, 32*gb)
	if err != nil {
		return err
	}
	w.MemoryWorld(0.5)
	w.RunTimes(3*time.Second, 5*time.Second)
	layers := map[string]bool{}
	var ids []string
	for i, c := range []struct{ ask, use int64 }{{12 * gb, 4 * gb}, {16 * gb, 4 * gb}, {15 * gb, 3 * gb}} {
		l := oneCore("sim", w.Opts.scale(600))
		l.MemKB = c.ask
		ly, err := w.memLayer(ctx, f.show, fmt.Sprintf("over%d", i+1), 50, l,
			MemProfile{MedianKB: c.use, Sigma: 0.15, SpikeProb: 0.01, SpikeFactor: 1.3, CapKB: 8 * gb})
		if err != nil {
			return err
		}
		layers[ly.ID], ids = true, append(ids, ly.ID)
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	c := w.sampleConcurrency(layers, math.Inf(1))
	need := int64(max(w.config().Sizing.MinSamples, 1))
	learned := w.WaitFor(ctx, w.Patient(90*time.Second), func() bool {
		n, _ := queryMap[int64](ctx, w, `SELECT pk_layer, count(*) FROM frame WHERE pk_layer = ANY($1) AND str_state = 'SUCCEEDED'
			AND int_mem_max_used > 0 GROUP BY 1`, ids)
		for _, id := range ids {
			if n[id] < need {
				return false
			}
		}
		return true
	})
	if !learned {
		return fmt.Errorf("the layers did not have %d succeeded frames each within %v", need, w.Patient(90*time.Second))
	}
	from := w.Elapsed()
	c.startAt(from.Seconds())
	if err := Sleep(ctx, 25*time.Second); err != nil {
		return err
	}
	w.StopSampling()
	states := w.frameStates(ctx, ids)
	w.Metric(mConcurrent, math.Round(c.mean()*10)/10, Info, 0, "")
	w.Metric("frames running at once (peak)", float64(c.peak), Info, 0, "")
	w.Note("mean over the 25 s after every layer had %d succeeded frames (from %.1f s); %d frames succeeded, %d waiting",
		need, from.Seconds(), states["SUCCEEDED"], states["WAITING"])
	w.memoryReport(int(states["SUCCEEDED"]))
	return nil
}

// compareMemStrand: >= 1.5x the frames running at once, no more kills.
func compareMemStrand(def Result, vs []Result) []Metric {
	on, _ := def.Value(mConcurrent)
	off, _ := vs[0].Value(mConcurrent)
	kon, _ := def.Value(mKills)
	koff, _ := vs[0].Value(mKills)
	return []Metric{
		{Name: "frames running at once ÷ sizing off", Value: ratio64(on, off), Op: AtLeast, Threshold: 1.5},
		{Name: "memory kills − sizing off's", Value: kon - koff, Op: AtMost, Threshold: 0},
	}
}

// runStrandGrow: a threadable layer (1 core, 4 GB asked) whose frames use
// ~24 GB, alone on 32-core hosts with 4 GB per core: sizing runs a few
// probes at the request, then books round(rss / memory per core) cores.
func runStrandGrow(ctx context.Context, w *World) error {
	const memPerCore = 4 * gb
	// Threadable sizing is off by default (the probes hold a new layer
	// back): this scenario measures it switched on.
	w.Configure(func(c *config.Config) { c.Sizing.Threadable = config.SizingHistory })
	f, err := w.memFarm(ctx, w.Opts.scale(4), 32, 32*memPerCore)
	if err != nil {
		return err
	}
	w.MemoryWorld(0.5)
	w.RunTimes(time.Second, 2*time.Second)
	l := farmseed.LayerSpec{Name: "sim", Tags: []string{"general"}, Frames: w.Opts.scale(60), Cores: 1, CoresMax: 16, MemKB: 4 * gb}
	ly, err := w.memLayer(ctx, f.show, "threaded", 50, l, MemProfile{MedianKB: 24 * gb, Sigma: 0.08, CapKB: 40 * gb})
	if err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	done := w.WaitFor(ctx, w.Patient(60*time.Second), func() bool {
		return w.frameStates(ctx, []string{ly.ID})["SUCCEEDED"] == int64(len(ly.Frames))
	})
	states := w.frameStates(ctx, []string{ly.ID})
	if !done {
		w.Note("not all frames succeeded within %v: %v", w.Patient(60*time.Second), states)
	}
	var rss float64
	_ = w.Pool.QueryRow(ctx, `SELECT COALESCE(percentile_cont(0.5) WITHIN GROUP (ORDER BY int_mem_max_used), 0)::float8
		FROM frame WHERE pk_layer = $1 AND str_state = 'SUCCEEDED'`, ly.ID).Scan(&rss)
	want := int64(math.Round(rss / memPerCore))
	// First runs in launch order: the probes book the request (one core),
	// every later first run books the derived size.
	ls := w.Fake.Launches()
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].At.Before(ls[j].At) })
	seen := map[string]bool{}
	var probes, derived, within int
	var cores []int64
	derivedYet := false
	for _, la := range ls {
		if !la.Started || la.RunFrame.GetLayerId() != ly.ID || seen[la.RunFrame.GetFrameId()] {
			continue
		}
		seen[la.RunFrame.GetFrameId()] = true
		n := int64(la.RunFrame.GetNumCores() / 100)
		if n <= 1 && !derivedYet {
			probes++
			continue
		}
		derivedYet = true
		derived++
		cores = append(cores, n)
		if n >= want-1 && n <= want+1 {
			within++
		}
	}
	cfg := w.config()
	w.Metric("frames succeeded", float64(states["SUCCEEDED"]), Equal, float64(len(ly.Frames)), "")
	if cfg.Sizing.Threadable == config.SizingHistory {
		// A probe starts only while fewer than need (min_samples, at
		// least probe_frames) of the layer's frames have succeeded in the
		// history read that sizes it, and fewer than probe_frames run: so
		// when one starts, at most need-1 have succeeded and at most
		// probe_frames (itself included) run, whatever the speed of the
		// passes, the completions or the history cache. Probes cannot be
		// memory-killed here (probe_frames of them fit one host's memory),
		// so no retry frees a slot either. Bound: need + probe_frames - 1.
		need := max(cfg.Sizing.ProbeFrames, cfg.Sizing.MinSamples, 1)
		w.Metric("first runs at the request before cores are derived (probes)", float64(probes), AtMost, float64(need+cfg.Sizing.ProbeFrames-1), "")
		w.Metric("first runs at the derived size", float64(derived), AtLeast, float64(len(ly.Frames)/2), "")
		w.Metric("derived first runs within ±1 core of round(rss / memory per core)", ratio(int64(within), int64(max(derived, 1))), AtLeast, 1, "")
	} else {
		w.Metric("first runs at the request (one core)", float64(probes), Info, 0, "")
		w.Metric("derived first runs within ±1 core of round(rss / memory per core)", ratio(int64(within), int64(max(derived, 1))), Info, 0, "")
	}
	sort.Slice(cores, func(i, j int) bool { return cores[i] < cores[j] })
	med := int64(0)
	if len(cores) > 0 {
		med = cores[len(cores)/2]
	}
	w.Metric("median cores of the later first runs", float64(med), Info, 0, "")
	w.Note("median max RSS %.1f GB, host memory per core 4 GB: round(rss / memory per core) = %d cores", rss/float64(gb), want)
	w.memoryReport(len(ly.Frames))
	return nil
}
