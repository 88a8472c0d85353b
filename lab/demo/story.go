package demo

import (
	"context"
	"fmt"
	"image/color"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cuesched/cuesched/lab/chart"
	"github.com/cuesched/cuesched/scheduler/explain"
)

// hold is one reason frames wait for; a limit keeps its name.
type hold struct {
	Reason explain.Reason
	Limit  string
}

// Waiting is one sample of why the managed shows' frames wait: the same
// classification as `cuesched explain` and the scheduler_waiting_frames
// gauge (package scheduler/explain), with the limits' names and use.
type Waiting struct {
	Total  int
	ByHold map[hold]int
	ByShow map[string]map[hold]int
	// Limits: name -> running frames under it, its max.
	Limits map[string][2]int
}

// SampleWaiting classifies every waiting frame of the managed shows (one
// explain query) and reads the limits' use.
func SampleWaiting(ctx context.Context, db explain.DB, gpuProtection bool) (Waiting, error) {
	w := Waiting{ByHold: map[hold]int{}, ByShow: map[string]map[hold]int{}, Limits: map[string][2]int{}}
	layers, err := explain.Layers(ctx, db, "", "", gpuProtection)
	if err != nil {
		return w, err
	}
	add := func(show string, h hold, n int) {
		if n <= 0 {
			return
		}
		w.Total += n
		w.ByHold[h] += n
		if w.ByShow[show] == nil {
			w.ByShow[show] = map[hold]int{}
		}
		w.ByShow[show][h] += n
	}
	for _, l := range layers {
		h := hold{Reason: l.Reason}
		if l.Reason == explain.Limit {
			h.Limit = l.LimitFull
		}
		add(l.Show, h, l.Waiting)
		add(l.Show, hold{Reason: explain.Depend}, l.Depend)
	}
	rows, err := db.Query(ctx, `
		SELECT lr.str_name, lr.int_max_value,
		       (SELECT count(*) FROM proc p JOIN layer_limit ll ON ll.pk_layer = p.pk_layer
		         WHERE ll.pk_limit_record = lr.pk_limit_record)
		  FROM limit_record lr`)
	if err != nil {
		return w, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var maxV, used int
		if err := rows.Scan(&name, &maxV, &used); err != nil {
			return w, err
		}
		w.Limits[name] = [2]int{used, maxV}
	}
	return w, rows.Err()
}

// label names a hold as the live view shows it.
func (w Waiting) label(h hold, withUse bool) string {
	if h.Reason != explain.Limit || h.Limit == "" {
		return string(h.Reason)
	}
	if u, ok := w.Limits[h.Limit]; ok && withUse {
		return fmt.Sprintf("limit %s (%d/%d)", h.Limit, u[0], u[1])
	}
	return "limit " + h.Limit
}

// sorted lists the holds of m, most frames first.
func sorted(m map[hold]int) []hold {
	hs := make([]hold, 0, len(m))
	for h := range m {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool {
		if m[hs[i]] != m[hs[j]] {
			return m[hs[i]] > m[hs[j]]
		}
		return hs[i].Reason+explain.Reason(hs[i].Limit) < hs[j].Reason+explain.Reason(hs[j].Limit)
	})
	return hs
}

// Line is e.g. "limit spi-nuke-license (12/12) 465 · depend 300".
func (w Waiting) Line(m map[hold]int, withUse bool) string {
	if len(m) == 0 {
		return "nothing"
	}
	var parts []string
	for _, h := range sorted(m) {
		parts = append(parts, fmt.Sprintf("%s %d", w.label(h, withUse), m[h]))
	}
	return strings.Join(parts, " · ")
}

// Top is the hold of the most waiting frames, as "limit X (12/12) 465".
func (w Waiting) Top() string {
	hs := sorted(w.ByHold)
	if len(hs) == 0 {
		return "nothing waits"
	}
	return fmt.Sprintf("%s %d", w.label(hs[0], true), w.ByHold[hs[0]])
}

// binding is the hold that bounds throughput: the one of the most waiting
// frames, dependencies aside.
func (w Waiting) binding() (hold, int) {
	for _, h := range sorted(w.ByHold) {
		if h.Reason != explain.Depend {
			return h, w.ByHold[h]
		}
	}
	return hold{}, 0
}

// point is one sample of the run's timeline.
type point struct {
	T       float64            // seconds since the start
	Done    int                // frames finished
	Running int                // frames running
	Cores   map[string]float64 // per managed show, booked cores (Redis)
	Waiting *Waiting           // the last explain sample (nil before the first)
	fresh   bool               // Waiting was taken at this point
}

// timeline is the run's record, for the summary and the chart.
type timeline struct {
	points []point
	shows  []string
	// Subscriptions: peak cores ÷ size and seconds above size.
	subs map[string]*subUse
	// Peak EASY backfills on reserved hosts (a gauge, sampled).
	peakBackfills, peakReservations float64
	// wideAt: when the wide job was resumed (seconds; 0 = not yet).
	wideAt float64
}

type subUse struct {
	size, burst int64
	peak        float64 // max cores ÷ size
	above       time.Duration
	peakCores   int64
}

// bindingPhases splits the run into spans with one binding hold.
type phase struct {
	from, to   float64
	h          hold
	peak       int
	doneFrom   int
	doneTo     int
	limitSeats int
}

func (tl *timeline) phases() []phase {
	var ps []phase
	for _, p := range tl.points {
		if !p.fresh || p.Waiting == nil {
			continue
		}
		h, n := p.Waiting.binding()
		if len(ps) > 0 && ps[len(ps)-1].h == h {
			last := &ps[len(ps)-1]
			last.to, last.doneTo = p.T, p.Done
			last.peak = max(last.peak, n)
			continue
		}
		if len(ps) > 0 {
			ps[len(ps)-1].to, ps[len(ps)-1].doneTo = p.T, p.Done
		}
		ph := phase{from: p.T, to: p.T, h: h, peak: n, doneFrom: p.Done, doneTo: p.Done}
		if h.Reason == explain.Limit {
			ph.limitSeats = p.Waiting.Limits[h.Limit][1]
		}
		ps = append(ps, ph)
	}
	if n := len(tl.points); n > 0 && len(ps) > 0 {
		ps[len(ps)-1].to, ps[len(ps)-1].doneTo = tl.points[n-1].T, tl.points[n-1].Done
	}
	// Fold blips (under 6 s: a limit seat freed between two samples)
	// into the phase before them.
	var out []phase
	for _, p := range ps {
		if len(out) > 0 && (p.to-p.from < 6 || out[len(out)-1].h == p.h) {
			last := &out[len(out)-1]
			last.to, last.doneTo = p.to, p.doneTo
			if last.h == p.h {
				last.peak = max(last.peak, p.peak)
			}
			continue
		}
		out = append(out, p)
	}
	return out
}

func (p phase) rate() float64 {
	if d := p.to - p.from; d > 0 {
		return float64(p.doneTo-p.doneFrom) / d
	}
	return 0
}

// onlySeats is the start of the phase's tail in which no more frames ran
// than the limit has seats (and the frames done then).
func (tl *timeline) onlySeats(p phase) (float64, int, bool) {
	t0, d0, ok := 0.0, 0, false
	for _, pt := range tl.points {
		if pt.T < p.from || pt.T > p.to {
			continue
		}
		if pt.Running > p.limitSeats {
			ok = false
			continue
		}
		if !ok {
			t0, d0, ok = pt.T, pt.Done, true
		}
	}
	return t0, d0, ok && t0 < p.to
}

// peakIn is the most frames the phase's hold held from p.from on.
func (tl *timeline) peakIn(p phase) int {
	n := 0
	for _, pt := range tl.points {
		if pt.T >= p.from && pt.T <= p.to && pt.Waiting != nil {
			n = max(n, pt.Waiting.ByHold[p.h])
		}
	}
	return n
}

func (p phase) describe() string {
	switch p.h.Reason {
	case "":
		return "nothing held the managed shows' frames but their dependencies"
	case explain.Flowing:
		return fmt.Sprintf("flowing: up to %d frames had a host with room now, booked as fast as the passes ran (per-job budget, layer spread)", p.peak)
	case explain.Limit:
		return fmt.Sprintf("limit %s (%d seats) held up to %d frames: at most %d frames of its layers run at once", p.h.Limit, p.limitSeats, p.peak, p.limitSeats)
	case explain.Capacity:
		return fmt.Sprintf("capacity: up to %d frames waited for room on hosts that fit them (the farm was full)", p.peak)
	case explain.Burst:
		return fmt.Sprintf("burst: up to %d frames of shows at their subscription burst", p.peak)
	case explain.Strand:
		return fmt.Sprintf("strand: up to %d CPU frames kept off the room of idle GPUs while GPU work waited", p.peak)
	}
	return fmt.Sprintf("%s held up to %d frames", p.h.Reason, p.peak)
}

// writeStory prints what bound throughput and when, and which placement
// features acted (from the scheduler's metrics registry).
func writeStory(out io.Writer, tl *timeline, reg prometheus.Gatherer, wideJob string) {
	fmt.Fprintln(out, "  what bound throughput:")
	ps := tl.phases()
	if len(ps) == 0 {
		fmt.Fprintln(out, "    (no sample)")
	}
	for _, p := range ps {
		// A limit phase often starts while other layers still keep the
		// farm busy; say from when only the limit's seats ran.
		if p.h.Reason == explain.Limit && p.limitSeats > 0 {
			if t0, d0, ok := tl.onlySeats(p); ok && t0-p.from >= 5 {
				before := p
				before.to, before.doneTo = t0, d0
				fmt.Fprintf(out, "    %4.0fs-%4.0fs  %s, while other layers kept the farm busy; %.1f frames/s finished\n",
					before.from, before.to, before.describe(), before.rate())
				p.from, p.doneFrom = t0, d0
				fmt.Fprintf(out, "    %4.0fs-%4.0fs  the last %.0f s: only the %d seats of limit %s ran (%d frames of its layers at a time) while up to %d waited; %.1f frames/s finished\n",
					p.from, p.to, p.to-p.from, p.limitSeats, p.h.Limit, p.limitSeats, tl.peakIn(p), p.rate())
				continue
			}
		}
		fmt.Fprintf(out, "    %4.0fs-%4.0fs  %s; %.1f frames/s finished\n", p.from, p.to, p.describe(), p.rate())
	}
	fams, _ := reg.Gather()
	fmt.Fprintln(out, "  placement features that acted:")
	granted := metricSum(fams, "scheduler_reservations_granted_total", nil)
	ownerRan := metricSum(fams, "scheduler_reservations_ended_total", map[string]string{"reason": "booked"})
	if wideJob != "" && tl.wideAt > 0 {
		fmt.Fprintf(out, "    wide frames: %s (%d frames of 24 cores on the general hosts) submitted at %.0fs\n", wideJob, wideFrames, tl.wideAt)
	}
	switch {
	case granted > 0:
		fmt.Fprintf(out, "    reservations: %.0f hosts reserved and drained for them, %.0f ran their owner's frame; up to %.0f EASY backfills at once on reserved hosts\n",
			granted, ownerRan, tl.peakBackfills)
	case wideJob != "":
		fmt.Fprintln(out, "    reservations: none granted (the wide frames found hosts before queue.reservations.blocked_for)")
	}
	var lent []string
	for _, k := range sortedKeys(tl.subs) {
		u := tl.subs[k]
		if u.above >= time.Second && u.size > 0 {
			s := fmt.Sprintf("%s up to %.1f× its size (%d of %d cores) for %.0fs", k, u.peak, u.peakCores, u.size, u.above.Seconds())
			lent = append(lent, s)
		}
	}
	if len(lent) > 0 {
		fmt.Fprintf(out, "    show tiers: idle share lent beyond the subscription size, the burst the ceiling: %s\n", strings.Join(lent, "; "))
	} else {
		fmt.Fprintln(out, "    show tiers: no show ran beyond its subscription size")
	}
	holds := metricSum(fams, "scheduler_gpu_guard_holds_total", nil)
	strand := 0
	for _, p := range tl.points {
		if p.fresh && p.Waiting != nil {
			strand = max(strand, p.Waiting.ByHold[hold{Reason: explain.Strand}])
		}
	}
	fmt.Fprintf(out, "    GPU protection: %.0f CPU checkouts left idle GPUs' room free; up to %d CPU frames waited as strand\n", holds, strand)
	live := metricSum(fams, "scheduler_placements_total", map[string]string{"locality": "live"})
	warm := metricSum(fams, "scheduler_placements_total", map[string]string{"locality": "warm"})
	cold := metricSum(fams, "scheduler_placements_total", map[string]string{"locality": "cold"})
	if all := live + warm + cold; all > 0 {
		fmt.Fprintf(out, "    locality: %.0f%% of %.0f placements on a host running the layer, %.0f%% on one that just ran it, %.0f%% cold\n",
			100*live/all, all, 100*warm/all, 100*cold/all)
	}
	if n := metricSum(fams, "scheduler_layer_spread_capped_total", nil); n > 0 {
		fmt.Fprintf(out, "    layer spread: %.0f times a layer was held to a quarter of a host\n", n)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// metricSum adds the values of a family's series whose labels match.
func metricSum(fams []*dto.MetricFamily, name string, labels map[string]string) float64 {
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// writeChart draws cores in use per show and waiting frames by reason
// over the run.
func writeChart(w io.Writer, tl *timeline, title string) error {
	pal := chart.Palette()
	var cores []chart.Series
	for i, s := range tl.shows {
		se := chart.Series{Name: s, Color: pal[i%len(pal)]}
		for _, p := range tl.points {
			se.T = append(se.T, p.T)
			se.V = append(se.V, p.Cores[s])
		}
		cores = append(cores, se)
	}
	// One stacked area per hold, in the explain check order (limits by
	// name), coloured by reason.
	seen := map[hold]bool{}
	var latest *Waiting
	for _, p := range tl.points {
		if p.Waiting != nil {
			latest = p.Waiting
			for h := range p.Waiting.ByHold {
				seen[h] = true
			}
		}
	}
	order := map[explain.Reason]int{}
	for i, r := range explain.Reasons() {
		order[r] = i
	}
	var holds []hold
	for h := range seen {
		holds = append(holds, h)
	}
	sort.Slice(holds, func(i, j int) bool {
		if order[holds[i].Reason] != order[holds[j].Reason] {
			return order[holds[i].Reason] < order[holds[j].Reason]
		}
		return holds[i].Limit < holds[j].Limit
	})
	var waiting []chart.Series
	for i, h := range holds {
		name := string(h.Reason)
		if latest != nil {
			name = latest.label(h, false)
		}
		se := chart.Series{Name: name, Color: reasonColor(h.Reason, i)}
		for _, p := range tl.points {
			v := 0.0
			if p.Waiting != nil {
				v = float64(p.Waiting.ByHold[h])
			}
			se.T = append(se.T, p.T)
			se.V = append(se.V, v)
		}
		waiting = append(waiting, se)
	}
	return chart.Draw(w, title, []chart.Panel{
		{Title: "cores in use per managed show (booked, Redis)", Series: cores},
		{Title: "waiting frames by reason (cuesched explain)", Stacked: true, Series: waiting},
	})
}

func reasonColor(r explain.Reason, i int) color.RGBA {
	switch r {
	case explain.Depend:
		return color.RGBA{186, 189, 182, 255} // grey: waiting on their inputs
	case explain.Limit:
		return color.RGBA{204, 0, 0, 255}
	case explain.Capacity:
		return color.RGBA{52, 101, 164, 255}
	case explain.Burst:
		return color.RGBA{245, 121, 0, 255}
	case explain.Flowing:
		return color.RGBA{78, 154, 6, 255}
	case explain.Strand:
		return color.RGBA{117, 80, 123, 255}
	case explain.JobCap:
		return color.RGBA{196, 160, 0, 255}
	case explain.FolderCap:
		return color.RGBA{143, 89, 2, 255}
	case explain.Held:
		return color.RGBA{46, 52, 54, 255}
	}
	pal := chart.Palette()
	return pal[(i+5)%len(pal)]
}
