package sim

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cuesched/cuesched/scheduler/explain"
	"github.com/cuesched/cuesched/shared/config"
)

// noSeatPacking is LICENSE without seat packing: hosts in the cache's
// order, the booking script refusing hosts without a seat.
var noSeatPacking = Variant{Name: "no seat packing", Config: func(c *config.Config) { c.Queue.SeatPacking = false }}

// licenseSeats is LICENSE's K; licenseHostCores the cores of each host.
const (
	licenseSeats     = 3
	licenseHostCores = 8
)

// runLicense: a node-locked limit of K seats on a layer of one-core frames
// (8 fit a host), beside lower-priority filler that keeps every host busy.
// Seats in use (hosts running a licensed frame, on the render nodes and in
// Redis) never exceed K, and the licensed frames run at >= 0.8x what K
// hosts' slots allow.
func runLicense(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(10), licenseHostCores)
	if err != nil {
		return err
	}
	// Long frames: what is judged is where the licensed frames run and how
	// many, not how fast a loaded machine refills a slot.
	w.RunTimes(25*time.Second, 35*time.Second)
	lim, err := w.Seed.Limit(ctx, "houdini", licenseSeats)
	if err != nil {
		return err
	}
	if err := w.Seed.LimitPerHost(ctx, lim, true); err != nil {
		return err
	}
	l := oneCore("sim", w.Opts.scale(3000))
	l.Limits = []string{lim}
	lic, err := w.job(ctx, f.show, "licensed", 90, l)
	if err != nil {
		return err
	}
	if _, err := w.job(ctx, f.show, "filler", 10, oneCore("render", w.Opts.scale(6000))); err != nil {
		return err
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	// Ground truth: hosts running a licensed frame on the fake RQD, and
	// the seats the booking script holds.
	var mw meanWindow
	w.Sample(func(ctx context.Context, _ float64) {
		hosts, frames := w.licensedOnNodes(ctx, lic.Layers[0].ID)
		mw.peak("hosts", float64(hosts))
		if hs, err := w.Pub.SeatHosts(ctx, lim); err == nil {
			mw.peak("seats", float64(len(hs)))
		}
		mw.add(float64(frames))
	})
	slots := float64(licenseSeats * licenseHostCores)
	// Until the licensed layer first holds 0.8 of K hosts' slots (or the
	// patience runs out: then the window measures what it got).
	if !w.WaitFor(ctx, w.Patient(60*time.Second), func() bool {
		_, frames := w.licensedOnNodes(ctx, lic.Layers[0].ID)
		return float64(frames) >= 0.8*slots
	}) {
		w.Note("the licensed layer did not reach 0.8 of %v slots within the patience", slots)
	}
	mw.start()
	d0 := w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_job = $1 AND str_state = 'SUCCEEDED'`, lic.ID)
	if err := Sleep(ctx, 40*time.Second); err != nil {
		return err
	}
	mean := mw.stop()
	d1 := w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_job = $1 AND str_state = 'SUCCEEDED'`, lic.ID)
	peakHosts, peakSeats := mw.peakOf("hosts"), mw.peakOf("seats")
	w.Metric("peak hosts running a licensed frame (render nodes)", peakHosts, AtMost, licenseSeats, "")
	w.Metric("peak seats held (booking script)", peakSeats, AtMost, licenseSeats, "")
	w.Metric("licensed frames running ÷ K hosts' slots (mean over 40 s)", mean/slots, AtLeast, 0.8, "x")
	w.Note("K = %d seats x %d slots; licensed completions in the window %d; mean running %.1f", licenseSeats, licenseHostCores, d1-d0, mean)
	return nil
}

// licensedOnNodes counts the hosts running a frame of layer on the fake RQD
// and the frames.
func (w *World) licensedOnNodes(ctx context.Context, layer string) (hosts, frames int) {
	names, err := queryList[string](ctx, w, `SELECT str_name FROM host`)
	if err != nil {
		return 0, 0
	}
	for _, h := range names {
		k := 0
		for _, rf := range w.Fake.Running(h) {
			if rf.GetLayerId() == layer {
				k++
			}
		}
		if k > 0 {
			hosts++
			frames += k
		}
	}
	return hosts, frames
}

// runLicenseNoHosts: a licensed layer whose node-locked limit has 0 seats
// and one no host can take (a tag no host carries), beside healthy work
// measured against the same farm without them: nothing wedges, the healthy
// work keeps its rate, and explain says why each licensed layer waits.
func runLicenseNoHosts(ctx context.Context, w *World) error {
	f, err := w.basicFarm(ctx, w.Opts.scale(6), 8)
	if err != nil {
		return err
	}
	w.RunTimes(30*time.Second, 40*time.Second)
	zero, err := w.Seed.Limit(ctx, "nuke_zero", 0)
	if err != nil {
		return err
	}
	if err := w.Seed.LimitPerHost(ctx, zero, true); err != nil {
		return err
	}
	seats, err := w.Seed.Limit(ctx, "katana", 2)
	if err != nil {
		return err
	}
	if err := w.Seed.LimitPerHost(ctx, seats, true); err != nil {
		return err
	}
	healthy, err := w.job(ctx, f.show, "healthy", 50, oneCore("render", w.Opts.scale(4000)))
	if err != nil {
		return err
	}
	// The healthy work's share of the farm's cores, averaged over a window
	// (long frames: a loaded machine refills slots late, but fills them).
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	var mw meanWindow
	w.Sample(func(ctx context.Context, _ float64) {
		mw.add(float64(w.Int(ctx, `SELECT COALESCE(sum(int_cores_reserved), 0)::bigint FROM proc WHERE pk_job = $1`, healthy.ID)) /
			float64(f.cores*100))
	})
	window := func() (float64, error) {
		mw.start()
		err := Sleep(ctx, 30*time.Second)
		return mw.stop(), err
	}
	if !w.WaitFor(ctx, w.Patient(60*time.Second), func() bool { return w.fillNow(ctx) >= 0.9 }) {
		w.Note("the farm did not fill to 90%% within the patience (%.0f%%)", w.fillNow(ctx)*100)
	}
	fill0, err := window()
	if err != nil {
		return err
	}
	// The licensed work arrives at a higher priority.
	lz := oneCore("comp", 500)
	lz.Limits = []string{zero}
	jz, err := w.job(ctx, f.show, "licence_zero", 90, lz)
	if err != nil {
		return err
	}
	lt := oneCore("comp", 500)
	lt.Limits, lt.Tags = []string{seats}, []string{"nohost"}
	jt, err := w.job(ctx, f.show, "licence_untaggable", 90, lt)
	if err != nil {
		return err
	}
	fill1, err := window()
	if err != nil {
		return err
	}
	started := w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_job = ANY($1) AND str_state <> 'WAITING'`, []string{jz.ID, jt.ID})
	ratio := 0.0
	if fill0 > 0 {
		ratio = fill1 / fill0
	}
	w.Metric("healthy cores with the licensed layers ÷ before them (mean over 30 s)", ratio, AtLeast, 0.9, "x")
	w.Metric("licensed frames started (0 seats / no host)", float64(started), Equal, 0, "")
	why := func(job string) string {
		ls, err := explain.Layers(ctx, w.Pool, job, "", true)
		if err != nil {
			return "error: " + err.Error()
		}
		var out []string
		for _, l := range ls {
			out = append(out, fmt.Sprintf("%s: %s: %s", l.Layer, l.Reason, l.Detail))
		}
		return strings.Join(out, "\n")
	}
	ez, et := why(jz.ID), why(jt.ID)
	okZ := strings.Contains(ez, string(explain.Limit)+": ") && strings.Contains(ez, "nuke_zero")
	okT := strings.Contains(et, string(explain.NoHost)+": ")
	w.Metric("explain names the limit of the 0-seat layer", b2f(okZ), Equal, 1, "")
	w.Metric("explain says no host can take the untaggable layer", b2f(okT), Equal, 1, "")
	if !okZ || !okT {
		w.Note("explain 0 seats: %s", firstLines(ez, 6))
		w.Note("explain no host: %s", firstLines(et, 6))
	}
	w.Note("healthy share of the farm's cores: %.2f before, %.2f with the licensed layers", fill0, fill1)
	return nil
}

// meanWindow averages samples taken while it is open; safe to feed from a
// sampler while the scenario opens and closes it.
type meanWindow struct {
	mu     sync.Mutex
	open   bool
	sum, n float64
	peaks  map[string]float64
}

func (m *meanWindow) add(v float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.open {
		m.sum += v
		m.n++
	}
}

// peak records the largest value seen under name (open or not).
func (m *meanWindow) peak(name string, v float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.peaks == nil {
		m.peaks = map[string]float64{}
	}
	m.peaks[name] = max(m.peaks[name], v)
}

func (m *meanWindow) peakOf(name string) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peaks[name]
}

func (m *meanWindow) start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.open, m.sum, m.n = true, 0, 0
}

// stop closes the window and returns its mean (0 without samples).
func (m *meanWindow) stop() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.open = false
	if m.n == 0 {
		return 0
	}
	return m.sum / m.n
}

func firstLines(s string, n int) string {
	ls := strings.Split(s, "\n")
	if len(ls) > n {
		ls = ls[:n]
	}
	return fmt.Sprintf("%q", strings.Join(ls, " | "))
}

// mixedLimit is LIMIT_MIXED's limit.
const mixedLimit = 8

// runLimitMixed: one limit shared by a layer of a scheduler-managed show and
// one of a show Cuebot still dispatches (the battery's stand-in for Cuebot's
// dispatcher books it with Cuebot's own limit check: an unlocked read of
// the running count, every frame of one read sharing it). The scheduler's
// side locks the limit and counts every running frame, Cuebot's included,
// so it never books past the limit; Cuebot's side can, by the frames it
// books from one stale read. Measured: the combined peak, its overshoot
// against Cuebot's largest batch from one read (the documented worst
// case), and the managed side's own peak (never past the limit).
func runLimitMixed(ctx context.Context, w *World) error {
	alloc, err := w.Seed.Alloc(ctx, w.Facility, "sim.general", "general")
	if err != nil {
		return err
	}
	n := w.Opts.scale(8)
	if err := w.hosts(ctx, "h", alloc, "general", n, 8, 0); err != nil {
		return err
	}
	w.RunTimes(time.Second, 2*time.Second)
	lim, err := w.Seed.Limit(ctx, "nuke", mixedLimit)
	if err != nil {
		return err
	}
	layers := map[string]string{}
	for _, name := range []string{"mgd", "leg"} {
		sh, err := w.Seed.Show(ctx, name, name == "mgd")
		if err != nil {
			return err
		}
		if _, err := w.Seed.Subscribe(ctx, sh, alloc, n*4, n*8); err != nil {
			return err
		}
		l := oneCore("comp", 600)
		l.Limits = []string{lim}
		j, err := w.job(ctx, sh, name+"-comp", 50, l)
		if err != nil {
			return err
		}
		layers[name] = j.Layers[0].ID
		if _, err := w.job(ctx, sh, name+"-filler", 10, oneCore("render", w.Opts.scale(3000))); err != nil {
			return err
		}
	}
	if err := w.Start(ctx, 0); err != nil {
		return err
	}
	cuebot := w.StartLegacy(ctx)
	running := func(ctx context.Context, layer string) int64 {
		return w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'RUNNING'`, layer)
	}
	var peak, peakMgd float64
	w.Sample(func(ctx context.Context, _ float64) {
		var m, g int64
		if err := w.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pk_layer = $1), count(*) FILTER (WHERE pk_layer = $2)
			FROM frame WHERE str_state = 'RUNNING' AND pk_layer IN ($1, $2)`, layers["mgd"], layers["leg"]).Scan(&m, &g); err != nil {
			return
		}
		peak = max(peak, float64(m+g))
		peakMgd = max(peakMgd, float64(m))
	})
	if err := Sleep(ctx, 25*time.Second); err != nil {
		return err
	}
	batch := float64(cuebot.MaxLimitedPerRead())
	w.StopSampling()
	w.Metric("combined peak running ÷ limit 8 (reported)", peak/mixedLimit, AtLeast, 0, "x")
	w.Metric("combined peak - (limit + Cuebot's largest batch from one read)", peak-(mixedLimit+batch), AtMost, 0, "")
	w.Metric("managed show's peak running under the limit", peakMgd, AtMost, mixedLimit, "")
	w.Metric("frames of the limit Cuebot booked", float64(cuebot.Booked("leg")), AtLeast, 1, "")
	w.Note("peak combined %v (managed alone %v), Cuebot's largest batch of limited frames from one read %v; managed running now %d, Cuebot's %d",
		peak, peakMgd, batch, running(ctx, layers["mgd"]), running(ctx, layers["leg"]))
	return nil
}
