package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cuesched/cuesched/rollout"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// Round 1's behaviour, for the comparison variants.
var (
	strictOrder = Variant{Name: "strict order", Config: func(c *config.Config) { c.Queue.JobOrder = config.JobOrderStrict }}
	noTiers     = Variant{Name: "no show tiers", Config: func(c *config.Config) { c.Queue.ShowTiers = false }}
	noJobBudget = Variant{Name: "no job budget", Config: func(c *config.Config) { c.Queue.DispatchFramesPerJobLimit = 0 }}
)

// Scenarios is the battery, in run order.
func Scenarios() []Scenario {
	return []Scenario{
		{Name: "PRIORITY", Description: "10 equal streams at priorities 10..100 on a farm they oversubscribe many times: completions follow priority (Spearman rho >= 0.9).",
			Variants: []Variant{strictOrder}, Run: runPriority},
		{Name: "PRIORITY_STARVING", Description: "a farm saturated by priority-300 jobs, then a priority-100 job: its share of completions >= 3%.",
			Variants: []Variant{strictOrder}, Run: runStarving},
		{Name: "SHOWTIER", Description: "two shows subscribed 1/4 and 3/4 of an allocation at equal priority: cores / size within 0.15; an idle show's share is lent and returned.",
			Variants: []Variant{noTiers}, Run: runShowTier},
		{Name: "SOLOFILL", Description: "a one-layer job and a 50-layer job of equal size and priority: the one-layer job holds >= 50% of the other's running frames.",
			Variants: []Variant{noJobBudget}, Run: runSoloFill},
		{Name: "JOBCAP", Description: "a job capped at 10 cores in a busy farm: its use reaches the cap and never books past it.", Fast: true, Run: runJobCap},
		{Name: "CAPREFILL", Description: "a job capped at 8 cores of one-core frames running 4-8 s, on a farm with room for many more, under the product's pacing (cluster_saturated_sleep 5 s, layer backoffs 1-30 s): once at its cap, its mean use >= 0.8x the cap over 40 s (a cap's headroom comes back when one of its frames ends; the sidecar's release notice wakes the capped cluster); beside the same run without release wake-ups (queue.cluster_release_wake_min 0).",
			Run: runCapRefill, Variants: []Variant{{Name: "no release wake-ups", Config: func(c *config.Config) { c.Queue.ClusterReleaseWakeMin = 0 }}}},
		{Name: "FOLDER", Description: "a folder capped at 12 cores holding two jobs: their sum reaches the cap and never books past it.", Run: runFolderCap},
		{Name: "LIMIT", Description: "a limit_record of 6 shared by two jobs' layers: running frames reach 6 and never book past it.", Fast: true, Run: runLimit},
		{Name: "LICENSE_DENIED", Description: "a limit whose licence server denies half the launches (exit 42), on a job of int_max_retries 1: with 42 named as the limit's denial status, denied frames run again without spending a retry and none ends DEAD; beside the same run without it.",
			Fast: true, Variants: []Variant{noDenials}, Run: runLicenseDenied},
		{Name: "LICENSE", Description: "a node-locked limit of 3 seats on a layer of one-core frames (8 fit a host) beside lower-priority filler on 10 hosts: hosts holding a seat never exceed 3 (render nodes and the booking script), and the licensed frames hold >= 0.8x the slots of 3 hosts (mean over 40 s); beside the same run without seat packing.",
			Fast: true, Variants: []Variant{noSeatPacking}, Run: runLicense},
		{Name: "LICENSE_NO_HOSTS", Description: "licensed layers that cannot run (a node-locked limit of 0 seats; a layer no host can take) arrive at a higher priority beside healthy work: nothing of them starts, the healthy work keeps >= 0.9x the cores it held before them, explain names the limit and the missing host.",
			Fast: true, Run: runLicenseNoHosts},
		{Name: "LIMIT_MIXED", Description: "one limit of 8 shared by a managed show's layer and one Cuebot still dispatches (Cuebot's own limit check: an unlocked read): the managed side never runs past the limit; the combined peak stays within the limit plus Cuebot's largest batch from one stale read (the documented worst case; Cuebot's side cannot be locked without changing Cuebot).",
			Fast: true, Run: runLimitMixed},
		{Name: "POISON", Description: "one job of 5,000 frames that exit 1 within a second arrives beside healthy jobs on a saturated farm: the fail-fast backoff holds it back, so healthy completions stay >= 0.8x their rate before it came, and >= 200 of its frames still start (it keeps being tried), judged over a window of events, not wall time: until the backoff has held it 11 times (its first hold and ten retry windows, each a probe of fail_fast_probe failed runs); beside the same run without the backoff (a minute).",
			Variants: []Variant{noFailFast}, Run: runPoison},
		{Name: "CAPDROP", Description: "a job cap and a subscription burst lowered below live use mid-run, then restored: no wedge, no negative counter, no drift.", Run: runCapDrop},
		{Name: "DEPENDS", Description: "three jobs of three layers chained layer-on-layer: no frame starts before its dependency is satisfied; every gated frame runs once it is.", Fast: true, Run: runDepends},
		{Name: "RETRIES", Description: "frames that fail (retried until int_max_retries, then DEAD) and frames killed for memory (retried on more memory: cuesched's retry size, and Cuebot raises the layer) beside healthy work: every OOM frame succeeds on more memory, every failing frame ends DEAD after its retries, the rest runs.", Fast: true, Run: runRetries},
		{Name: "TAGS_GPU", Description: "general, GPU-tagged CPU and GPU layers on a farm of tagged CPU and GPU hosts: zero tag or GPU violations.", Fast: true, Run: runTagsGPU},
		{Name: "GPUSTRAND", Description: "a GPU job arriving behind a CPU flood on GPU hosts: no idle GPU stays stranded behind CPU work for more than 5 s.", Run: runGPUStrand,
			Variants: []Variant{{Name: "no GPU protection", Config: func(c *config.Config) { c.Queue.GPUProtection = false }}}},
		{Name: "COLDFILL", Description: "1,553 idle hosts (~57k cores, mixed sizes, some GPU) and a deep backlog: seconds to 95% of cores booked.", Run: runColdFill},
		{Name: "COMPLETIONSTORM", Description: ">= 150 completions/s for a minute: zero lost releases, Redis = SUM(proc) at the end.", Run: runStorm},
		{Name: "FAILOVER", Description: "two schedulers; the loop leader is killed mid-run: the survivor books >= 100 frames within 10 s, nothing launched twice.", Run: runFailover},
		{Name: "SPLIT", Description: "three allocations shared by six shows, cold-filled by three schedulers splitting the clusters by allocation (scheduler.work_split): races lost (planned bookings refused because another instance took the capacity) <= 10% of planned; statements per frame and fill time beside 1 and 2 instances and 3 that do not split.",
			Variants: splitVariants(), Run: runSplit},
		{Name: "RESERVATIONS", Description: "64/128-core frames among a flood of 1-core frames on 64/128-core hosts: every wide frame runs within a bounded wait, utilization >= 85%, no non-owner booking on a reserved host but EASY backfills; beside the same run without reservations, and a failover while a reservation is held.",
			Variants: []Variant{noReservations, resvFailover}, Run: runReservations},
		{Name: "LOCALITY", Description: "sustained feed of several multi-frame layers on a busy farm: share of frames placed on a host that last ran the same layer >= 25%.",
			Variants: []Variant{noLocality}, Run: runLocality},
		{Name: "SCALE", Description: "issue #28's farm (--hosts, default 10,000 hosts, ~400k cores, some GPUs; 3 allocations, 60 shows, 600 jobs; --frames, default 1,000,000 waiting), seeded in bulk: cold fill to 95% <= 60 s, process RSS <= 1 GiB, per-frame DB cost within 1.2x of a 1/10 farm's; lifecycles/s, statements/rows/buffer hits per frame, job/layer query time, WAL lag p99, races lost, CPU of product and simulator; beside the 1/10 farm and 2 and 3 schedulers. Run by name only (make scale).",
			Explicit: true, Variants: []Variant{scaleBaseline, scaleTwo, scaleThree}, Run: runScale, Summarize: compareScale},
		{Name: "OOM", Description: "six layers asking 4 GB whose frames need 2.5-5x (lognormal, 2% spikes of 1.5x) and a well-sized layer with one 9x frame, on a busy farm whose hosts kill the frame furthest over its booking when RSS exceeds memory: every killed frame succeeds, no layer is raised on a single kill (cuesched's ledger), kills after each layer's first kill per 1,000 frames <= half the sizing-off run's (the first wave's kills, launched before any signal, reported beside).",
			Variants: []Variant{sizingOff}, Compare: compareOOM, Run: runOOM},
		{Name: "MEMSTRAND", Description: "layers asking 3-5x the memory their frames use, on hosts of 2 GB per core: frames running at once >= 1.5x the sizing-off run, with no more memory kills.",
			Variants: []Variant{sizingOff}, Compare: compareMemStrand, Run: runMemStrand},
		{Name: "STRANDGROW", Description: "a threadable layer (1 core, 4 GB asked) whose frames use ~24 GB, with no history, on 32-core hosts of 4 GB per core: a few probes at the request, then every first run within ±1 core of round(rss / memory per core).",
			Variants: []Variant{sizingOff}, Run: runStrandGrow},
		{Name: "MIGRATE", Description: "legacy-dispatched and managed shows on one farm, flipped each way mid-run: no host over-booked, nothing launched twice, no orphan proc older than 30 s.",
			Run: runMigrate},
	}
}

// noFailFast is POISON without the fail-fast backoff.
var noFailFast = Variant{Name: "no fail-fast backoff", Config: func(c *config.Config) { c.Queue.FailFastBackoffMin = 0 }}

// poisonHolds is how many times POISON's with-phase lets the backoff hold
// the poison layer: its first hold (after fail_fast_failures failed runs)
// and ten after retry windows, each a probe of at least fail_fast_probe
// failed runs. The window is defined by those events, not by a wall time,
// so the starts it sees do not scale with the loaded machine's speed: at
// least fail_fast_failures + 10 × fail_fast_probe (5 + 10 × 20 = 205)
// frames start in it. On the sim's time scale (holds of 1 s doubling to
// 4 s) the holds span about 40 s; a slow machine stretches the probes, not
// their size.
const poisonHolds = 11

// poisonWindowCap bounds POISON's with-phase when the holds never come
// (the backoff is broken, or the machine cannot run the probes): the
// verdict is then judged at the cap, and fails on its holds.
const poisonWindowCap = 6 * time.Minute

func runPoison(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(10), 8)
	if err != nil {
		return err
	}
	// Healthy frames run 1-2 s, a draw from the seed per frame and launch
	// (runTimeOf); enough of them that the healthy jobs never run dry
	// within the window's cap, on a fast machine too.
	w.RunTimes(time.Second, 2*time.Second)
	var healthy []string
	for i := 0; i < 2; i++ {
		j, err := w.job(ctx, f.show, fmt.Sprintf("healthy%d", i), 50, oneCore("render", w.Opts.scale(8000)))
		if err != nil {
			return err
		}
		healthy = append(healthy, j.ID)
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	done := func() int64 {
		return w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_job = ANY($1) AND str_state = 'SUCCEEDED'`, healthy)
	}
	if err := w.settle(ctx, 0.9); err != nil {
		return err
	}
	// What the scheduler saw while it booked: its host cache's staleness
	// (WAL lag), before the poison and with it.
	var mu sync.Mutex
	var stale [2]float64
	phase := 0
	w.Sample(func(ctx context.Context, _ float64) {
		v := w.cacheStaleness()
		mu.Lock()
		stale[phase] = max(stale[phase], v)
		mu.Unlock()
	})
	// Before: the healthy jobs' completion rate on the full farm.
	const before = 15 * time.Second
	d0, t0 := done(), time.Now()
	if err := Sleep(ctx, before); err != nil {
		return err
	}
	d1, t1 := done(), time.Now()
	rate0 := float64(d1-d0) / t1.Sub(t0).Seconds()
	// The poison: 5,000 frames that exit 1 after a second, at the healthy
	// jobs' priority.
	mu.Lock()
	phase = 1
	mu.Unlock()
	p, err := w.job(ctx, f.show, "poison", 50, oneCore("poison", w.Opts.scale(5000)))
	if err != nil {
		return err
	}
	w.LayerRunTime(p.Layers[0].ID, time.Second)
	w.LayerOutcome(p.Layers[0].ID, func(int64) (int32, int64) { return 1, gb / 4 })
	// The window with the poison: until the backoff has held the poison
	// layer poisonHolds times (events), or, without the backoff, a minute
	// (the comparison has no holds to wait for).
	cfg := w.config()
	level := func() int64 {
		return w.Int(ctx, `SELECT COALESCE(max(int_level), 0)::bigint FROM cuesched_layer_backoff WHERE pk_layer = $1`, p.Layers[0].ID)
	}
	holds := int64(0)
	if cfg.Queue.FailFastBackoffMin > 0 {
		deadline := time.Now().Add(poisonWindowCap)
		for holds < poisonHolds && time.Now().Before(deadline) {
			if err := Sleep(ctx, 250*time.Millisecond); err != nil {
				return err
			}
			holds = max(holds, level())
		}
	} else if err := Sleep(ctx, time.Minute); err != nil {
		return err
	}
	d2, t2 := done(), time.Now()
	rate1 := float64(d2-d1) / t2.Sub(t1).Seconds()
	starts := 0
	for _, l := range w.Fake.Launches() {
		if l.Started && l.RunFrame.GetJobId() == p.ID {
			starts++
		}
	}
	frames := w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_job = $1 AND ts_started IS NOT NULL`, p.ID)
	healthyLeft := w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_job = ANY($1) AND str_state = 'WAITING'`, healthy)
	ratio := 0.0
	if rate0 > 0 {
		ratio = rate1 / rate0
	}
	w.Metric("healthy completions with the poison ÷ before it", ratio, AtLeast, 0.8, "x")
	w.Metric("poison frame starts (launches; it keeps being tried)", float64(starts), AtLeast, 200, "")
	if cfg.Queue.FailFastBackoffMin > 0 {
		// The window is the backoff's own schedule: the holds came, and
		// each retry window was a probe large enough for the starts floor.
		w.Metric("fail-fast holds of the poison layer in the window", float64(holds), AtLeast, poisonHolds, "")
		w.Metric("starts the backoff's schedule guarantees (failures + probe per retry window)",
			float64(cfg.Queue.FailFastFailures+(poisonHolds-1)*max(cfg.Queue.FailFastProbe, cfg.Queue.FailFastFailures)), AtLeast, 200, "")
	}
	w.Metric("healthy frames still waiting at the window's end", float64(healthyLeft), AtLeast, 1, "")
	w.Metric("window with the poison", t2.Sub(t1).Seconds(), Info, 0, "s")
	w.Metric("healthy completions/s before the poison", rate0, AtLeast, 0, "/s")
	w.Metric("healthy completions/s with the poison", rate1, AtLeast, 0, "/s")
	mu.Lock()
	w.Metric("host-cache staleness max before the poison (WAL lag)", stale[0], Info, 0, "s")
	w.Metric("host-cache staleness max with the poison (WAL lag)", stale[1], Info, 0, "s")
	mu.Unlock()
	for _, o := range []string{"assumed", "confirmed", "superseded", "expired"} {
		w.Metric("host-cache check-ins "+o, w.Counter("scheduler_host_cache_assumptions_total", "outcome", o), Info, 0, "")
	}
	w.Note("distinct poison frames started %d (a failed frame is retried first, until DEAD); its backoff level at the window's end %d", frames, holds)
	return nil
}

// noDenials is LICENSE_DENIED without the limit's denial exit status.
var noDenials = Variant{Name: "no denial statuses"}

// licenceDenied is the exit status LICENSE_DENIED's licence server gives.
const licenceDenied = 42

func runLicenseDenied(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(4), 8)
	if err != nil {
		return err
	}
	w.RunTimes(200*time.Millisecond, 600*time.Millisecond)
	lim, err := w.Seed.Limit(ctx, "nuke", 6)
	if err != nil {
		return err
	}
	if w.Variant.Name != noDenials.Name {
		if err := w.Seed.LimitDenials(ctx, lim, licenceDenied); err != nil {
			return err
		}
	}
	const frames = 40
	l := oneCore("comp", frames)
	l.Limits = []string{lim}
	j, err := w.Seed.Job(ctx, farmseed.JobSpec{Name: "licensed", Show: f.show, Facility: w.Facility, Priority: 50,
		MaxCores: farmseed.Uncapped, MaxRetries: 1, Layers: []farmseed.LayerSpec{l}})
	if err != nil {
		return err
	}
	var denied atomic.Int64
	w.LayerOutcome(j.Layers[0].ID, func(int64) (int32, int64) {
		if w.Rand(func(r *rand.Rand) int { return r.Intn(2) }) == 0 {
			denied.Add(1)
			return licenceDenied, gb / 2
		}
		return 0, gb / 2
	})
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	states := func() map[string]int64 {
		out, _ := queryMap[int64](ctx, w, `SELECT str_state, count(*) FROM frame WHERE pk_job = $1 GROUP BY 1`, j.ID)
		return out
	}
	settled := w.WaitFor(ctx, 90*time.Second, func() bool {
		st := states()
		return st["SUCCEEDED"]+st["DEAD"] == frames
	})
	st := states()
	if !settled {
		w.Note("not settled in 90 s: %v", st)
	}
	var maxRetries int64
	_ = w.Pool.QueryRow(ctx, `SELECT COALESCE(max(int_retries), -1) FROM frame WHERE pk_job = $1`, j.ID).Scan(&maxRetries)
	w.Metric("frames DEAD (int_max_retries 1)", float64(st["DEAD"]), Equal, 0, "")
	w.Metric("frames succeeded", float64(st["SUCCEEDED"]), Equal, frames, "")
	w.Metric("launches denied a seat", float64(denied.Load()), AtLeast, 10, "")
	w.Note("largest int_retries of a frame: %d", maxRetries)
	return nil
}

// settle waits for the farm to fill to at least frac (or 60 s).
func (w *World) settle(ctx context.Context, frac float64) error {
	if !w.WaitFor(ctx, 60*time.Second, func() bool { return w.fillNow(ctx) >= frac }) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("the farm did not fill to %.0f%% within 60 s (%.0f%%)", frac*100, w.fillNow(ctx)*100)
	}
	return nil
}

func runPriority(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(10), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	frames := w.Opts.scale(400)
	prio := map[string]float64{}
	for i := 1; i <= 10; i++ {
		name := fmt.Sprintf("p%03d", i*10)
		prio[name] = float64(i * 10)
		if _, err := w.job(ctx, f.show, name, i*10, oneCore("render", frames)); err != nil {
			return err
		}
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.9); err != nil {
		return err
	}
	waiting := w.Int(ctx, `SELECT count(*) FROM frame WHERE str_state = 'WAITING'`)
	got, err := w.window(ctx, 30*time.Second)
	if err != nil {
		return err
	}
	var xs, ys []float64
	total := 0
	names := make([]string, 0, len(prio))
	for n := range prio {
		names = append(names, n)
	}
	sort.Strings(names)
	line := ""
	for _, n := range names {
		xs, ys = append(xs, prio[n]), append(ys, float64(got[n]))
		total += got[n]
		line += fmt.Sprintf(" %s:%d", n, got[n])
	}
	w.Note("completions in the 30 s window:%s", line)
	w.Metric("Spearman rho(priority, completions)", Spearman(xs, ys), AtLeast, 0.9, "")
	w.Metric("oversubscription (waiting ÷ cores)", float64(waiting)/float64(f.cores), AtLeast, 9, "x")
	w.Metric("completions in window", float64(total), Info, 0, "")
	return nil
}

func runStarving(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(10), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	for i := 0; i < 5; i++ {
		if _, err := w.job(ctx, f.show, fmt.Sprintf("high%d", i), 300, oneCore("render", w.Opts.scale(500))); err != nil {
			return err
		}
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.95); err != nil {
		return err
	}
	if _, err := w.job(ctx, f.show, "low", 100, oneCore("render", w.Opts.scale(500))); err != nil {
		return err
	}
	got, err := w.window(ctx, 25*time.Second)
	if err != nil {
		return err
	}
	total := 0
	for _, n := range got {
		total += n
	}
	share := 0.0
	if total > 0 {
		share = float64(got["low"]) / float64(total)
	}
	w.Metric("priority-100 share of completions", share*100, AtLeast, 3, "%")
	w.Metric("completions in window", float64(total), Info, 0, "")
	return nil
}

// showCores samples the cores each show uses.
func (w *World) showCores(ctx context.Context) map[string]float64 {
	out, _ := queryMap[float64](ctx, w, `SELECT s.str_name, COALESCE(sum(p.int_cores_reserved),0)::float8 / 100
		FROM show s LEFT JOIN proc p ON p.pk_show = s.pk_show GROUP BY s.str_name`)
	return out
}

// averageCores samples showCores every 250 ms over d and averages.
func (w *World) averageCores(ctx context.Context, d time.Duration) (map[string]float64, error) {
	sum := map[string]float64{}
	n := 0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		for k, v := range w.showCores(ctx) {
			sum[k] += v
		}
		n++
		if err := Sleep(ctx, 250*time.Millisecond); err != nil {
			return nil, err
		}
	}
	for k := range sum {
		sum[k] /= float64(max(n, 1))
	}
	return sum, nil
}

func runShowTier(ctx context.Context, w *World) error {
	alloc, err := w.Seed.Alloc(ctx, w.Facility, "sim.general", "general")
	if err != nil {
		return err
	}
	n := w.Opts.scale(16)
	if err := w.hosts(ctx, "h", alloc, "general", n, 8, 0); err != nil {
		return err
	}
	total := n * 8
	small, err := w.Seed.Show(ctx, "small", true)
	if err != nil {
		return err
	}
	big, err := w.Seed.Show(ctx, "big", true)
	if err != nil {
		return err
	}
	sizeS, sizeB := total/4, total*3/4
	if _, err := w.Seed.Subscribe(ctx, small, alloc, sizeS, total); err != nil {
		return err
	}
	if _, err := w.Seed.Subscribe(ctx, big, alloc, sizeB, total); err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	if _, err := w.job(ctx, small, "small-job", 50, oneCore("render", w.Opts.scale(3000))); err != nil {
		return err
	}
	bj, err := w.job(ctx, big, "big-job", 50, oneCore("render", w.Opts.scale(3000)))
	if err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.9); err != nil {
		return err
	}
	if err := Sleep(ctx, 5*time.Second); err != nil {
		return err
	}
	avg, err := w.averageCores(ctx, 15*time.Second)
	if err != nil {
		return err
	}
	ts, tb := avg["small"]/float64(sizeS), avg["big"]/float64(sizeB)
	w.Note("both busy: small %.1f cores (size %d, tier %.2f), big %.1f cores (size %d, tier %.2f)", avg["small"], sizeS, ts, avg["big"], sizeB, tb)
	diff := ts - tb
	if diff < 0 {
		diff = -diff
	}
	w.Metric("|cores÷size small − big|", diff, AtMost, 0.15, "")

	// The big show goes idle: its share is lent to the small one...
	if _, err := w.Pool.Exec(ctx, `UPDATE job SET b_paused = true WHERE pk_job = $1`, bj.ID); err != nil {
		return err
	}
	if err := Sleep(ctx, 4*time.Second); err != nil {
		return err
	}
	if avg, err = w.averageCores(ctx, 8*time.Second); err != nil {
		return err
	}
	w.Metric("lent: small cores÷size while big idles", avg["small"]/float64(sizeS), AtLeast, 2, "")
	// ...and returned when it has work again.
	if _, err := w.Pool.Exec(ctx, `UPDATE job SET b_paused = false WHERE pk_job = $1`, bj.ID); err != nil {
		return err
	}
	if err := Sleep(ctx, 5*time.Second); err != nil {
		return err
	}
	if avg, err = w.averageCores(ctx, 8*time.Second); err != nil {
		return err
	}
	w.Metric("returned: big cores÷size after it resumes", avg["big"]/float64(sizeB), AtLeast, 0.8, "")
	return nil
}

// runningBy samples running frames per job name.
func (w *World) runningBy(ctx context.Context) map[string]float64 {
	out, _ := queryMap[float64](ctx, w, `SELECT j.str_name, count(p.pk_proc)::float8 FROM job j LEFT JOIN proc p ON p.pk_job = j.pk_job GROUP BY j.str_name`)
	return out
}

func runSoloFill(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(8), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	per := w.Opts.scale(24)
	if _, err := w.job(ctx, f.show, "solo", 50, oneCore("render", 50*per)); err != nil {
		return err
	}
	var layers []farmseed.LayerSpec
	for i := 0; i < 50; i++ {
		layers = append(layers, oneCore(fmt.Sprintf("l%02d", i), per))
	}
	if _, err := w.job(ctx, f.show, "fifty", 50, layers...); err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.9); err != nil {
		return err
	}
	var solo, fifty float64
	n := 0
	end := time.Now().Add(15 * time.Second)
	for time.Now().Before(end) {
		r := w.runningBy(ctx)
		solo, fifty = solo+r["solo"], fifty+r["fifty"]
		n++
		if err := Sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	w.Note("average running frames: solo %.1f, fifty-layer %.1f", solo/float64(n), fifty/float64(n))
	ratio := 0.0
	if fifty > 0 {
		ratio = solo / fifty
	}
	w.Metric("one-layer ÷ fifty-layer running frames", ratio*100, AtLeast, 50, "%")
	return nil
}

// capScenario: a busy farm plus the capped work; use() is the capped use;
// it must reach cap (waited for) and never pass it (the monitor and the
// peak over an observation window after).
func (w *World) capScenario(ctx context.Context, what string, limit float64, use func() float64) error {
	peak := 0.0
	w.Sample(func(ctx context.Context, _ float64) {
		if u := use(); u > peak {
			peak = u
		}
	})
	reached := w.WaitFor(ctx, w.Patient(60*time.Second), func() bool { return use() >= limit })
	if err := Sleep(ctx, 8*time.Second); err != nil {
		return err
	}
	r := 0.0
	if reached {
		r = 1
	}
	w.StopSampling()
	w.Metric(what+" reached its cap", r, Equal, 1, "")
	w.Metric(what+" peak use", peak, AtMost, limit, "")
	return nil
}

func runJobCap(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(6), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	capped, err := w.Seed.Job(ctx, farmseed.JobSpec{Name: "capped", Show: f.show, Facility: w.Facility, Priority: 90, MaxCores: 10,
		Layers: []farmseed.LayerSpec{oneCore("render", 300)}})
	if err != nil {
		return err
	}
	if _, err := w.job(ctx, f.show, "filler", 10, oneCore("render", 600)); err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	return w.capScenario(ctx, "job", 10, func() float64 {
		return float64(w.Int(ctx, `SELECT COALESCE(sum(int_cores_reserved),0)::bigint / 100 FROM proc WHERE pk_job = $1`, capped.ID))
	})
}

// runCapRefill: the capped job's use, sampled once it first reaches its
// cap, over a window of 40 s of frames of 4-8 s. Only the cap binds (the
// farm has six times its cores and no other work), so every idle slot of
// the cap is pacing: before release wake-ups, the capped cluster slept
// cluster_saturated_sleep (5 s) after each pass that found its job at the
// cap.
func runCapRefill(ctx context.Context, w *World) error {
	w.Configure(func(c *config.Config) {
		d := config.Default().Queue
		c.Queue.ClusterEmptySleep, c.Queue.ClusterSaturatedSleep = d.ClusterEmptySleep, d.ClusterSaturatedSleep
		c.Queue.ActiveScanInterval = d.ActiveScanInterval
		c.Queue.LayerBackoffMin, c.Queue.LayerBackoffMax = d.LayerBackoffMin, d.LayerBackoffMax
	})
	const limit = 8
	f, err := w.basicFarm(ctx, w.Opts.scale(6), 8)
	if err != nil {
		return err
	}
	w.RunTimes(4*time.Second, 8*time.Second)
	capped, err := w.Seed.Job(ctx, farmseed.JobSpec{Name: "capped", Show: f.show, Facility: w.Facility, Priority: 90, MaxCores: limit,
		Layers: []farmseed.LayerSpec{oneCore("render", 400)}})
	if err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	use := func(ctx context.Context) float64 {
		return float64(w.Int(ctx, `SELECT COALESCE(sum(int_cores_reserved),0)::bigint / 100 FROM proc WHERE pk_job = $1`, capped.ID))
	}
	if !w.WaitFor(ctx, w.Patient(60*time.Second), func() bool { return use(ctx) >= limit }) {
		w.Metric("job reached its cap", 0, Equal, 1, "")
		return nil
	}
	var sum, peak float64
	var n int
	w.Sample(func(ctx context.Context, _ float64) {
		u := use(ctx)
		sum += u
		n++
		peak = max(peak, u)
	})
	if err := Sleep(ctx, 40*time.Second); err != nil {
		return err
	}
	w.StopSampling()
	w.Metric("job reached its cap", 1, Equal, 1, "")
	mean := 0.0
	if n > 0 {
		mean = sum / float64(n) / limit
	}
	w.Metric("mean use at the cap / cap", mean, AtLeast, 0.8, "")
	w.Metric("peak use", peak, AtMost, limit, "cores")
	w.Note("%d samples over 40 s", n)
	return nil
}

func runFolderCap(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(6), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	folder, err := w.Seed.Folder(ctx, f.show, "capped", 12, -1)
	if err != nil {
		return err
	}
	for i := 0; i < 2; i++ {
		if _, err := w.Seed.Job(ctx, farmseed.JobSpec{Name: fmt.Sprintf("in-folder%d", i), Show: f.show, Facility: w.Facility, Folder: folder,
			Priority: 90, MaxCores: farmseed.Uncapped, Layers: []farmseed.LayerSpec{oneCore("render", 300)}}); err != nil {
			return err
		}
	}
	if _, err := w.job(ctx, f.show, "filler", 10, oneCore("render", 600)); err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	return w.capScenario(ctx, "folder", 12, func() float64 {
		return float64(w.Int(ctx, `SELECT COALESCE(sum(p.int_cores_reserved),0)::bigint / 100 FROM proc p JOIN job j ON j.pk_job = p.pk_job
			WHERE j.pk_folder = $1`, folder))
	})
}

func runLimit(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(6), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	lim, err := w.Seed.Limit(ctx, "nuke", 6)
	if err != nil {
		return err
	}
	for i := 0; i < 2; i++ {
		l := oneCore("comp", 300)
		l.Limits = []string{lim}
		if _, err := w.job(ctx, f.show, fmt.Sprintf("limited%d", i), 90, l); err != nil {
			return err
		}
	}
	if _, err := w.job(ctx, f.show, "filler", 10, oneCore("render", 600)); err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	// The limit's use is its layers' RUNNING frames (what Cuebot and the
	// booking statement count; a proc outlives its frame for a moment
	// after the completion, its seat already free), and the seats held on
	// the render nodes (the fake RQD's running frames of those layers).
	seats := 0.0
	w.Sample(func(ctx context.Context, _ float64) {
		if n := w.seatsHeld(ctx); n > seats {
			seats = n
		}
	})
	if err := w.capScenario(ctx, "limit", 6, func() float64 {
		return float64(w.Int(ctx, `SELECT count(*) FROM frame f JOIN layer_limit ll ON ll.pk_layer = f.pk_layer WHERE f.str_state = 'RUNNING'`))
	}); err != nil {
		return err
	}
	w.Metric("limit peak seats held on render nodes", seats, AtMost, 6, "")
	return nil
}

// seatsHeld is the number of frames of layers under a limit that run on the
// fake RQD now.
func (w *World) seatsHeld(ctx context.Context) float64 {
	limited := map[string]bool{}
	rows, err := w.Pool.Query(ctx, `SELECT DISTINCT pk_layer FROM layer_limit`)
	if err != nil {
		return 0
	}
	for rows.Next() {
		var id string
		if rows.Scan(&id) == nil {
			limited[id] = true
		}
	}
	rows.Close()
	n := 0.0
	for _, rf := range w.Fake.Running("") {
		if limited[rf.GetLayerId()] {
			n++
		}
	}
	return n
}

func runCapDrop(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(8), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	j, err := w.Seed.Job(ctx, farmseed.JobSpec{Name: "dropped", Show: f.show, Facility: w.Facility, Priority: 50, MaxCores: 40,
		Layers: []farmseed.LayerSpec{oneCore("render", 2000)}})
	if err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	use := func() int64 {
		return w.Int(ctx, `SELECT COALESCE(sum(int_cores_reserved),0)::bigint / 100 FROM proc WHERE pk_job = $1`, j.ID)
	}
	if !w.WaitFor(ctx, 60*time.Second, func() bool { return use() >= 36 }) {
		return errors.New("the job did not reach 36 cores within 60 s")
	}
	// Below live use: the job to 8 cores, the subscription's burst to 20.
	if err := w.Seed.SetJobCaps(ctx, j.ID, 8, 100); err != nil {
		return err
	}
	if _, err := w.Pool.Exec(ctx, `UPDATE subscription SET int_burst = 2000 WHERE pk_show = $1`, f.show.ID); err != nil {
		return err
	}
	done0 := w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_job = $1 AND str_state = 'SUCCEEDED'`, j.ID)
	settled := w.WaitFor(ctx, 60*time.Second, func() bool { return use() <= 8 })
	r := 0.0
	if settled {
		r = 1
	}
	w.Metric("use fell under the lowered cap", r, Equal, 1, "")
	if err := Sleep(ctx, 4*time.Second); err != nil {
		return err
	}
	w.Metric("completions after the drop (no wedge)", float64(w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_job = $1 AND str_state = 'SUCCEEDED'`, j.ID)-done0), AtLeast, 1, "")
	// Restored: the job books again.
	if err := w.Seed.SetJobCaps(ctx, j.ID, 40, 100); err != nil {
		return err
	}
	if _, err := w.Pool.Exec(ctx, `UPDATE subscription SET int_burst = $2 WHERE pk_show = $1`, f.show.ID, f.cores*100); err != nil {
		return err
	}
	back := w.WaitFor(ctx, 60*time.Second, func() bool { return use() >= 30 })
	r = 0
	if back {
		r = 1
	}
	w.Metric("rebooked after the caps were restored", r, Equal, 1, "")
	return nil
}

func runDepends(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(4), 8)
	if err != nil {
		return err
	}
	w.RunTimes(300*time.Millisecond, 800*time.Millisecond)
	type edge struct{ child, parent string }
	var edges []edge
	total := 0
	for i := 0; i < 3; i++ {
		j, err := w.job(ctx, f.show, fmt.Sprintf("chain%d", i), 50, oneCore("a", 20), oneCore("b", 20), oneCore("c", 20))
		if err != nil {
			return err
		}
		total += 60
		edges = append(edges, edge{j.Layers[1].ID, j.Layers[0].ID}, edge{j.Layers[2].ID, j.Layers[1].ID})
		for _, l := range j.Layers[1:] {
			if _, err := w.Pool.Exec(ctx, `UPDATE frame SET str_state = 'DEPEND', int_depend_count = 1 WHERE pk_layer = $1`, l.ID); err != nil {
				return err
			}
		}
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	// Cuebot's side of a layer-on-layer depend: once every frame of the
	// parent has succeeded, the child's frames become WAITING.
	satisfied := map[string]time.Time{}
	allDone := w.WaitFor(ctx, w.Patient(120*time.Second), func() bool {
		for _, e := range edges {
			if _, ok := satisfied[e.child]; ok {
				continue
			}
			if w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state <> 'SUCCEEDED'`, e.parent) == 0 {
				satisfied[e.child] = time.Now()
				if _, err := w.Pool.Exec(ctx, `UPDATE frame SET str_state = 'WAITING', int_depend_count = 0
					WHERE pk_layer = $1 AND str_state = 'DEPEND'`, e.child); err != nil {
					w.Note("satisfy: %v", err)
				}
			}
		}
		return w.Int(ctx, `SELECT count(*) FROM frame WHERE str_state = 'SUCCEEDED'`) == int64(total)
	})
	early := 0
	for _, l := range w.Fake.Launches() {
		if l.RunFrame == nil || !l.Started {
			continue
		}
		for _, e := range edges {
			if l.RunFrame.GetLayerId() == e.child {
				if at, ok := satisfied[e.child]; !ok || l.At.Before(at) {
					early++
				}
			}
		}
	}
	w.Metric("frames started before their depend was satisfied", float64(early), Equal, 0, "")
	done := w.Int(ctx, `SELECT count(*) FROM frame WHERE str_state = 'SUCCEEDED'`)
	w.Metric("frames done (every gated frame ran)", float64(done), AtLeast, float64(total), "")
	if !allDone {
		w.Note("not every frame succeeded within %v", w.Patient(120*time.Second))
	}
	return nil
}

const tagViolationSQL = `
SELECT count(*) FROM proc p JOIN layer l ON l.pk_layer = p.pk_layer
 WHERE NOT EXISTS (SELECT 1 FROM host_tag ht WHERE ht.pk_host = p.pk_host
                     AND ht.str_tag = ANY (string_to_array(replace(l.str_tags, ' ', ''), '|')))
    OR p.int_gpus_reserved < l.int_gpus_min`

func runTagsGPU(ctx context.Context, w *World) error {
	general, err := w.Seed.Alloc(ctx, w.Facility, "sim.general", "general")
	if err != nil {
		return err
	}
	gpu, err := w.Seed.Alloc(ctx, w.Facility, "sim.gpu", "gpu")
	if err != nil {
		return err
	}
	if err := w.hosts(ctx, "cpu", general, "general", w.Opts.scale(4), 8, 0); err != nil {
		return err
	}
	if err := w.hosts(ctx, "gpu", gpu, "gpu", w.Opts.scale(2), 8, 2); err != nil {
		return err
	}
	show, err := w.Seed.Show(ctx, "main", true)
	if err != nil {
		return err
	}
	for _, a := range []string{general, gpu} {
		if _, err := w.Seed.Subscribe(ctx, show, a, 1000, 1000); err != nil {
			return err
		}
	}
	w.RunTimes(300*time.Millisecond, 800*time.Millisecond)
	gpuLayer := farmseed.LayerSpec{Name: "gpu", Tags: []string{"gpu"}, Frames: 40, Cores: 2, GPUs: 1, GPUMemKB: 4 * gb, MemKB: 4 * gb}
	cpuOnGPU := oneCore("cpu-on-gpu-tag", 40)
	cpuOnGPU.Tags = []string{"gpu"}
	if _, err := w.job(ctx, show, "mixed", 50, oneCore("general", 120), cpuOnGPU, gpuLayer); err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	violations := int64(0)
	w.Sample(func(ctx context.Context, _ float64) { violations += w.Int(ctx, tagViolationSQL) })
	done := w.WaitFor(ctx, w.Patient(90*time.Second), func() bool {
		return w.Int(ctx, `SELECT count(*) FROM frame WHERE str_state <> 'SUCCEEDED'`) == 0
	})
	w.StopSampling()
	w.Metric("tag or GPU violations (samples)", float64(violations), Equal, 0, "")
	d := 0.0
	if done {
		d = 1
	}
	w.Metric("every frame ran", d, Equal, 1, "")
	return nil
}

func runGPUStrand(ctx context.Context, w *World) error {
	gpu, err := w.Seed.Alloc(ctx, w.Facility, "sim.gpu", "gpu")
	if err != nil {
		return err
	}
	hosts := w.Opts.scale(4)
	if err := w.hosts(ctx, "gpu", gpu, "gpu", hosts, 8, 1); err != nil {
		return err
	}
	show, err := w.Seed.Show(ctx, "main", true)
	if err != nil {
		return err
	}
	if _, err := w.Seed.Subscribe(ctx, show, gpu, 1000, 1000); err != nil {
		return err
	}
	w.RunTimes(2*time.Second, 4*time.Second)
	flood := oneCore("cpu", 3000)
	flood.Tags = []string{"gpu"}
	if _, err := w.job(ctx, show, "cpu-flood", 50, flood); err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.95); err != nil {
		return err
	}
	gl := farmseed.LayerSpec{Name: "gpu", Tags: []string{"gpu"}, Frames: 4 * hosts, Cores: 4, GPUs: 1, GPUMemKB: 4 * gb, MemKB: 4 * gb}
	if _, err := w.job(ctx, show, "gpu-job", 50, gl); err != nil {
		return err
	}
	arrived := w.Elapsed().Seconds()
	// A GPU is stranded when it is idle while GPU frames wait and its host
	// has no room for one (4 cores): the longest such stretch per host.
	since := map[string]float64{}
	longest := 0.0
	w.Sample(func(ctx context.Context, t float64) {
		if t < arrived+0.5 {
			return
		}
		rows, err := w.Pool.Query(ctx, `SELECT h.str_name FROM host h
			WHERE h.int_gpus_idle > 0 AND h.int_cores_idle < 400
			  AND EXISTS (SELECT 1 FROM frame f JOIN layer l ON l.pk_layer = f.pk_layer WHERE l.int_gpus_min > 0 AND f.str_state = 'WAITING')`)
		if err != nil {
			return
		}
		now := map[string]bool{}
		for rows.Next() {
			var h string
			if rows.Scan(&h) == nil {
				now[h] = true
			}
		}
		rows.Close()
		for h := range now {
			if _, ok := since[h]; !ok {
				since[h] = t
			}
			if d := t - since[h]; d > longest {
				longest = d
			}
		}
		for h := range since {
			if !now[h] {
				delete(since, h)
			}
		}
	})
	ok := w.WaitFor(ctx, 30*time.Second, func() bool {
		return w.Int(ctx, `SELECT count(*) FROM frame f JOIN layer l ON l.pk_layer = f.pk_layer WHERE l.int_gpus_min > 0 AND f.str_state = 'WAITING'`) == 0
	})
	if !ok {
		w.Note("GPU frames still waiting 30 s after the GPU job arrived")
		longest = max(longest, 30)
	}
	w.StopSampling()
	w.Metric("longest stretch an idle GPU stayed stranded", longest, AtMost, 5, "s")
	return nil
}

func runColdFill(ctx context.Context, w *World) error {
	alloc, err := w.Seed.Alloc(ctx, w.Facility, "sim.general", "general")
	if err != nil {
		return err
	}
	n := w.Opts.Hosts
	if n <= 0 {
		n = w.Opts.scale(1553)
	}
	sizes := []int{8, 16, 24, 32, 48, 64, 64}
	cores := 0
	for i := 0; i < n; i++ {
		c := sizes[i%len(sizes)]
		h := farmseed.HostSpec{Name: fmt.Sprintf("n%05d", i), Alloc: alloc, AllocTag: "general", Cores: c, MemKB: int64(c) * 4 * gb}
		if i%10 == 9 {
			h.GPUs, h.GPUMemKB = 2, 32*gb
		}
		if _, err := w.Seed.Host(ctx, h); err != nil {
			return err
		}
		cores += c
	}
	show, err := w.Seed.Show(ctx, "main", true)
	if err != nil {
		return err
	}
	if _, err := w.Seed.Subscribe(ctx, show, alloc, cores, cores); err != nil {
		return err
	}
	w.RunTimes(time.Hour, time.Hour)
	frames := cores/4 + cores/40
	var specs []farmseed.JobSpec
	for i := 0; frames > 0; i++ {
		k := min(frames, 200)
		frames -= k
		specs = append(specs, farmseed.JobSpec{Name: fmt.Sprintf("cold%04d", i), Show: show, Facility: w.Facility, Priority: 50 + i%10,
			MaxCores: farmseed.Uncapped, Layers: []farmseed.LayerSpec{{Name: "render", Tags: []string{"general"}, Frames: k, Cores: 4, MemKB: 8 * gb}}})
	}
	if _, err := w.Seed.Jobs(ctx, specs...); err != nil {
		return err
	}
	w.Note("%d hosts, %d cores, %d jobs", n, cores, len(specs))
	// A farm that has been running has planner statistics (autovacuum
	// keeps them); a database seeded in bulk a second ago has none, and
	// the planner's one-row guesses turn the pending-jobs query's joins
	// into nested loops over every pending job (over 300 ms a pass at
	// 10,000 hosts). Measured as on the farm, as SCALE does.
	if _, err := w.Pool.Exec(ctx, `ANALYZE`); err != nil {
		return err
	}
	// Measured as a farm of this size runs: the product's own intervals,
	// the fill read from the fake render nodes' counters (cores of frames
	// running there), not a scan of the proc table 20 times a second.
	w.ScaleMode()
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	cpu0 := takeCPU()
	start := time.Now()
	ok := w.WaitFor(ctx, 5*time.Minute, func() bool { return w.LaunchedFill() >= 0.95 })
	secs := time.Since(start).Seconds()
	cpu1 := takeCPU()
	if !ok {
		w.Note("95%% not reached in 5 minutes (%.0f%%)", w.LaunchedFill()*100)
		secs = 300
	}
	started := w.Fake.Totals().Launched
	// 40 s at the battery's 1,553 hosts; issue #28 asks 60 s at 10,000.
	limit := 40.0
	if n > 1553 {
		limit = 60
	}
	w.Metric("seconds to 95% of cores running", secs, AtMost, limit, "s")
	w.Metric("frames started per second", float64(started)/secs, Info, 0, "")
	w.Metric("cores", float64(cores), Info, 0, "")
	w.fillBound(ctx, cpu0, cpu1, secs, limit)
	return nil
}

func runStorm(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(100), 8)
	if err != nil {
		return err
	}
	// 800 cores of 3-4 s frames: about 200 completions/s when full.
	w.RunTimes(3*time.Second, 4*time.Second)
	var specs []farmseed.JobSpec
	for i := 0; i < 60; i++ {
		specs = append(specs, farmseed.JobSpec{Name: fmt.Sprintf("storm%02d", i), Show: f.show, Facility: w.Facility, Priority: 50,
			MaxCores: farmseed.Uncapped, Layers: []farmseed.LayerSpec{oneCore("render", w.Opts.scale(250))}})
	}
	if _, err := w.Seed.Jobs(ctx, specs...); err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.9); err != nil {
		return err
	}
	// Sampled: Redis's charged cores for the show against SUM(proc); the
	// gap is bookings and releases in flight.
	gap := 0.0
	w.Sample(func(ctx context.Context, _ float64) {
		var redisCores float64
		v, err := w.RDB.HGet(ctx, "acct:sub:"+f.show.ID+":"+f.alloc, "int_cores").Float64()
		if err != nil {
			return
		}
		redisCores = v
		pg := float64(w.Int(ctx, `SELECT COALESCE(sum(int_cores_reserved),0)::bigint / 100 FROM proc`))
		if d := redisCores - pg; d > gap || -d > gap {
			gap = max(d, -d)
		}
	})
	got, err := w.window(ctx, time.Minute)
	if err != nil {
		return err
	}
	total := 0
	for _, n := range got {
		total += n
	}
	w.StopSampling()
	w.Metric("completions per second over a minute", float64(total)/60, AtLeast, 150, "/s")
	w.Metric("largest sampled Redis − SUM(proc) gap (in flight)", gap, Info, 0, " cores")
	return nil
}

func runFailover(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(20), 8)
	if err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	var specs []farmseed.JobSpec
	for i := 0; i < 10; i++ {
		specs = append(specs, farmseed.JobSpec{Name: fmt.Sprintf("fo%02d", i), Show: f.show, Facility: w.Facility, Priority: 50,
			MaxCores: farmseed.Uncapped, Layers: []farmseed.LayerSpec{oneCore("render", w.Opts.scale(400))}})
	}
	if _, err := w.Seed.Jobs(ctx, specs...); err != nil {
		return err
	}
	if err := w.Start(ctx, max(w.Opts.Schedulers, 2)); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.9); err != nil {
		return err
	}
	leader := -1
	if !w.WaitFor(ctx, 30*time.Second, func() bool { leader = w.Leader(); return leader >= 0 }) {
		return errors.New("no loop leader within 30 s")
	}
	w.Kill(leader)
	killed := time.Now()
	if err := Sleep(ctx, 10*time.Second); err != nil {
		return err
	}
	after := 0
	for _, l := range w.Fake.Launches() {
		if l.Started && l.At.After(killed) && l.At.Before(killed.Add(10*time.Second)) {
			after++
		}
	}
	w.Note("killed scheduler %d (the loop leader); the new leader is %d", leader, w.Leader())
	w.Metric("frames booked by the survivor in the 10 s after the kill", float64(after), AtLeast, 100, "")
	return nil
}

// launchedFor counts the frames of job the fake RQD started after t.
func (w *World) launchedFor(job string, after time.Time) int {
	n := 0
	for _, l := range w.Fake.Launches() {
		if l.Started && l.At.After(after) && l.RunFrame.GetJobId() == job {
			n++
		}
	}
	return n
}

// runMigrate: a managed show and a Cuebot-managed show share one
// allocation; Cuebot's dispatcher (the legacy stand-in) books the second
// while the scheduler books the first. Mid-run the Cuebot show is flipped
// to the scheduler (cuesched show set-managed ... on), then the managed
// show back to Cuebot (off), both under load.
func runMigrate(ctx context.Context, w *World) error {
	var err error
	var alloc string
	if alloc, err = w.Seed.Alloc(ctx, w.Facility, "sim.general", "general"); err != nil {
		return err
	}
	hosts := w.Opts.scale(12)
	if err := w.hosts(ctx, "h", alloc, "general", hosts, 8, 0); err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	cores := hosts * 8
	shows := map[string]farmseed.Show{}
	jobIDs := map[string]string{}
	for _, name := range []string{"mgd", "leg"} {
		sh, err := w.Seed.Show(ctx, name, name == "mgd")
		if err != nil {
			return err
		}
		if _, err := w.Seed.Subscribe(ctx, sh, alloc, cores/2, cores); err != nil {
			return err
		}
		j, err := w.job(ctx, sh, name+"-job", 50, oneCore("render", w.Opts.scale(4000)))
		if err != nil {
			return err
		}
		shows[name], jobIDs[name] = sh, j.ID
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	cuebot := w.StartLegacy(ctx)
	tool, err := rollout.New(w.Pool, rollout.Options{Publisher: w.Pub})
	if err != nil {
		return err
	}
	orphans := int64(0)
	w.Sample(func(ctx context.Context, _ float64) {
		n := w.Int(ctx, `SELECT count(*) FROM proc p LEFT JOIN frame f ON f.pk_frame = p.pk_frame
			WHERE (f.pk_frame IS NULL OR f.str_state <> 'RUNNING' OR f.pk_frame IS DISTINCT FROM p.pk_frame)
			  AND p.ts_booked < now() - interval '30 seconds'`)
		orphans = max(orphans, n)
	})
	procsOf := func(show string) int64 {
		return w.Int(ctx, `SELECT count(*) FROM proc WHERE pk_show = $1`, shows[show].ID)
	}
	if !w.WaitFor(ctx, 60*time.Second, func() bool { return procsOf("mgd") > 0 && procsOf("leg") > 0 }) {
		return fmt.Errorf("both shows did not run (scheduler's %d procs, Cuebot's %d)", procsOf("mgd"), procsOf("leg"))
	}
	if err := Sleep(ctx, 5*time.Second); err != nil {
		return err
	}
	flip := func(show string, on bool) (time.Time, error) {
		resume := cuebot.Pause()
		defer resume()
		_, err := tool.Flip(ctx, rollout.FlipRequest{Show: show, On: on, Force: true}, io.Discard)
		return time.Now(), err
	}
	// Cuebot's show to the scheduler: Cuebot stops at once, the scheduler
	// starts once the leader seeds it (after the flip-settle time).
	onAt, err := flip("leg", true)
	if err != nil {
		return fmt.Errorf("flip leg on: %w", err)
	}
	legBefore := cuebot.Booked("leg")
	took := w.WaitFor(ctx, 60*time.Second, func() bool { return w.launchedFor(jobIDs["leg"], onAt) > 0 })
	w.Metric("flipped on: the scheduler books the show", b2f(took), Equal, 1, "")
	// The managed show back to Cuebot.
	offAt, err := flip("mgd", false)
	if err != nil {
		return fmt.Errorf("flip mgd off: %w", err)
	}
	mgdBefore := cuebot.Booked("mgd")
	back := w.WaitFor(ctx, 60*time.Second, func() bool { return cuebot.Booked("mgd") > mgdBefore })
	w.Metric("flipped off: Cuebot books the show", b2f(back), Equal, 1, "")
	// Long enough for a proc orphaned by either flip to age past 30 s.
	if err := Sleep(ctx, 35*time.Second); err != nil {
		return err
	}
	lateSched := w.launchedFor(jobIDs["mgd"], offAt.Add(time.Second))
	w.Metric("scheduler launches of the show 1 s after it went back to Cuebot", float64(lateSched), Equal, 0, "")
	w.Metric("Cuebot bookings of the show after it went to the scheduler", float64(cuebot.Booked("leg")-legBefore), Equal, 0, "")
	w.StopSampling()
	w.Metric("orphan procs older than 30 s (samples, max)", float64(orphans), Equal, 0, "")
	w.Note("Cuebot booked leg %d, mgd %d frames (refused by its triggers %d); the scheduler launched %d of leg after its flip",
		cuebot.Booked("leg"), cuebot.Booked("mgd"), cuebot.Refusals(), w.launchedFor(jobIDs["leg"], onAt))
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// runRetries drives Cuebot's failure paths through the scheduler: a layer
// whose frames need 5 GB but ask for 2 GB (each is killed for memory until
// it runs on enough: cuesched's own retry size with memory sizing on, or
// the layer's memory, raised by Cuebot's rule after each kill), a
// layer whose frames always exit 1 (retried until the job's
// int_max_retries, then DEAD), and a healthy layer.
func runRetries(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(4), 8)
	if err != nil {
		return err
	}
	w.RunTimes(200*time.Millisecond, 600*time.Millisecond)
	const need = 5 * gb
	oom := oneCore("oom", 24)
	oom.MemKB = 2 * gb
	broken := oneCore("broken", 8)
	healthy := oneCore("healthy", 60)
	j, err := w.Seed.Job(ctx, farmseed.JobSpec{Name: "retries", Show: f.show, Facility: w.Facility, Priority: 50,
		MaxCores: farmseed.Uncapped, MaxRetries: 2, Layers: []farmseed.LayerSpec{oom, broken, healthy}})
	if err != nil {
		return err
	}
	layer := map[string]string{}
	for _, l := range j.Layers {
		layer[l.Name] = l.ID
	}
	w.LayerOutcome(layer["oom"], func(reserved int64) (int32, int64) {
		if reserved >= need {
			return 0, need - gb
		}
		return cuebotemu.ExitMemoryFailure, need
	})
	w.LayerOutcome(layer["broken"], func(int64) (int32, int64) { return 1, gb / 2 })
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	states := func(l string) map[string]int64 {
		out, _ := queryMap[int64](ctx, w, `SELECT str_state, count(*) FROM frame WHERE pk_layer = $1 GROUP BY 1`, layer[l])
		return out
	}
	settled := w.WaitFor(ctx, w.Patient(90*time.Second), func() bool {
		return states("oom")["SUCCEEDED"] == 24 && states("broken")["DEAD"] == 8 && states("healthy")["SUCCEEDED"] == 60
	})
	if !settled {
		w.Note("not settled in %v: oom %v, broken %v, healthy %v", w.Patient(90*time.Second), states("oom"), states("broken"), states("healthy"))
	}
	var raised int64
	_ = w.Pool.QueryRow(ctx, `SELECT int_mem_min FROM layer WHERE pk_layer = $1`, layer["oom"]).Scan(&raised)
	var maxRetries, deadRetries int64
	_ = w.Pool.QueryRow(ctx, `SELECT COALESCE(min(int_retries), -1), COALESCE(max(int_retries), -1) FROM frame WHERE pk_layer = $1`,
		layer["broken"]).Scan(&deadRetries, &maxRetries)
	w.Metric("OOM frames succeeded on raised memory", float64(states("oom")["SUCCEEDED"]), Equal, 24, "")
	// Cuebot's ratchet: the killed run's reservation + 2 GB (with memory
	// sizing on, cuesched books the retries from their max RSS, so the
	// layer may stop at the first step).
	w.Metric("Cuebot raised the layer's memory (>= request + 2 GB)", b2f(raised >= oom.MemKB+minMemoryIncrease), Equal, 1, "")
	w.Metric("failing frames DEAD after their retries", float64(states("broken")["DEAD"]), Equal, 8, "")
	w.Metric("fewest tries of a DEAD frame (int_max_retries 2)", float64(deadRetries), AtLeast, 2, "")
	w.Metric("healthy frames succeeded", float64(states("healthy")["SUCCEEDED"]), Equal, 60, "")
	w.Note("layer oom asks %d MB after the kills (needs %d MB)", raised/1024, need/1024)
	return nil
}
