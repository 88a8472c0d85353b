// Package sim is the verify battery: farm-scale scenarios that drive the
// real scheduler(s) and sidecar in-process against a real PostgreSQL
// (wal_level=logical) and Redis, with the fake RQD and the Cuebot emulator
// standing in for the render nodes and Cuebot's own completion path, and
// judge how well cuesched schedules: each scenario measures values and
// compares each with a threshold (PASS/FAIL), and every scenario also
// checks the global invariants (no frame launched twice, no host over its
// cores, memory or GPUs, no cap exceeded, no accounting drift at the end).
//
// A scenario may run in variants: the same farm and load under another
// configuration (round 1's job order, no show tiers, ...), so the gain of a
// placement feature is measured side by side in one report. Thresholds are
// the verdict of the default variant; the other variants are reported for
// comparison.
//
// Runs are reproducible from a seed: farm shapes, frame run times and the
// scheduler's lottery draws all come from it. Timing on a shared machine is
// not reproducible, so thresholds keep a margin and the report shows the
// measured value beside each.
package sim

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/cuesched/cuesched/shared/config"
)

// Options configure a battery run.
type Options struct {
	// Seed drives every random choice (default 1).
	Seed int64
	// Scale multiplies farm sizes and load (default 1).
	Scale float64
	// Hosts overrides the host count of the scenarios that take one
	// (COLDFILL); 0 keeps the scenario's.
	Hosts int
	// Frames overrides SCALE's waiting frames (0: 1,000,000 × Scale).
	Frames int
	// Schedulers is how many scheduler instances share the farm (default
	// 1; FAILOVER always runs at least two).
	Schedulers int
	// WorkSplit sets scheduler.work_split (none, allocation, cluster) for
	// every scenario; "" keeps the default (none) or the scenario's.
	WorkSplit string
	// Variants runs the comparison variants too (default true via New).
	NoVariants bool
	// Progress receives one line per scenario start and end (nil: none).
	Progress func(string)
	// Verbose keeps the components' logs (at INFO) on Progress.
	Verbose bool
	// Patience stretches the deadlines a scenario gives an event that must
	// happen (the cap reached, every frame run) by this factor, so a loaded
	// machine makes a run wait longer, not fail; never a threshold nor an
	// observation window. 0 or 1: as written (the CLI); the tests pass
	// testenv's factor.
	Patience float64
	// SchedulerBin is the deployed cuesched binary. When set, SCALE runs
	// its schedulers as child processes of it ("cuesched scheduler"), so
	// their RSS and CPU are measured apart from the fakes'; otherwise
	// every scheduler runs in this process.
	SchedulerBin string
}

func (o Options) scale(n int) int {
	s := o.Scale
	if s <= 0 {
		s = 1
	}
	return max(int(math.Round(float64(n)*s)), 1)
}

// Op compares a value with its threshold.
type Op string

// Comparisons.
const (
	AtLeast Op = ">="
	AtMost  Op = "<="
	Equal   Op = "=="
	Info    Op = "info" // reported, not judged
)

// Metric is one measured value and its threshold.
type Metric struct {
	Name      string  `json:"name"`
	Value     float64 `json:"value"`
	Op        Op      `json:"op"`
	Threshold float64 `json:"threshold"`
	Unit      string  `json:"unit,omitempty"`
	Pass      bool    `json:"pass"`
}

func (m *Metric) judge() {
	switch m.Op {
	case AtLeast:
		m.Pass = m.Value >= m.Threshold
	case AtMost:
		m.Pass = m.Value <= m.Threshold
	case Equal:
		m.Pass = m.Value == m.Threshold
	default:
		m.Pass = true
	}
}

// String renders "name value op threshold".
func (m Metric) String() string {
	if m.Op == Info {
		return fmt.Sprintf("%s %s%s", m.Name, num(m.Value), m.Unit)
	}
	return fmt.Sprintf("%s %s%s (%s %s)", m.Name, num(m.Value), m.Unit, m.Op, num(m.Threshold))
}

func num(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e12 {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.3g", v)
}

// Point is one farm-fill sample.
type Point struct {
	T    float64 `json:"t"`    // seconds since the scenario's load started
	Fill float64 `json:"fill"` // booked cores ÷ total cores
}

// Result is one scenario (or variant) run.
type Result struct {
	Scenario string   `json:"scenario"`
	Variant  string   `json:"variant,omitempty"` // "" = the default configuration
	Judged   bool     `json:"judged"`            // false for comparison variants
	Pass     bool     `json:"pass"`
	Metrics  []Metric `json:"metrics"`
	Notes    []string `json:"notes,omitempty"`
	Error    string   `json:"error,omitempty"`
	Seed     int64    `json:"seed"`
	Seconds  float64  `json:"seconds"`
	Fill     []Point  `json:"-"`
	// Variants are the scenario's comparison runs (JSON output only).
	Variants []Result `json:"variants,omitempty"`
}

// Name is SCENARIO or SCENARIO[variant].
func (r Result) Name() string {
	if r.Variant == "" {
		return r.Scenario
	}
	return r.Scenario + "[" + r.Variant + "]"
}

// Variant is a comparison run of a scenario under another configuration
// (the scenario's Run may also read World.Variant.Name).
type Variant struct {
	Name   string
	Config func(*config.Config)
	// Judged: the variant's thresholds are a verdict like the default
	// run's (e.g. the same scenario under a failover), not a comparison.
	Judged bool
}

// Scenario is one entry of the battery.
type Scenario struct {
	Name        string
	Description string
	// Fast scenarios take seconds and run inside `make test`.
	Fast bool
	// Explicit scenarios run only when named (not in "all"): SCALE.
	Explicit bool
	// Summarize, when set, adds to the default run's result what the runs
	// say together (SCALE: per-frame cost against the 1/10 farm).
	Summarize func([]Result)
	// NotBuilt names the open issue whose capability the scenario needs;
	// the scenario is then reported as FAIL with that note, never skipped.
	NotBuilt string
	Variants []Variant
	// Run seeds the farm in w, starts it (w.Start) and drives the load,
	// recording metrics with w.Metric.
	Run func(ctx context.Context, w *World) error
	// Compare, when set, judges the default run against its comparison
	// runs (a threshold relative to the run without a feature): it returns
	// metrics added to the default run's verdict. It is not called when
	// the variants do not run (NoVariants), and the default run then
	// notes that its relative thresholds were not judged.
	Compare func(def Result, variants []Result) []Metric
}

// Value returns the value of the metric named name, and whether r has it.
func (r Result) Value(name string) (float64, bool) {
	for _, m := range r.Metrics {
		if m.Name == name {
			return m.Value, true
		}
	}
	return 0, false
}

// Names lists the scenarios in battery order.
func Names() []string {
	var out []string
	for _, s := range Scenarios() {
		out = append(out, s.Name)
	}
	return out
}

// Battery lists the scenarios "all" runs (every one but the explicit).
func BatteryScenarios() []Scenario {
	var out []Scenario
	for _, s := range Scenarios() {
		if !s.Explicit {
			out = append(out, s)
		}
	}
	return out
}

// Lookup finds a scenario by name (case-insensitive).
func Lookup(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if strings.EqualFold(s.Name, name) {
			return s, true
		}
	}
	return Scenario{}, false
}

// Battery runs scenarios against one embedded Postgres and Redis.
type Battery struct {
	opts Options
	env  *Env
}

// NewBattery starts the embedded Postgres and Redis.
func NewBattery(ctx context.Context, o Options) (*Battery, error) {
	if o.Seed == 0 {
		o.Seed = 1
	}
	env, err := StartEnv(ctx)
	if err != nil {
		return nil, err
	}
	return &Battery{opts: o, env: env}, nil
}

// WithSeed returns a battery over the same Postgres and Redis whose runs
// use seed (the sweep over seeds of the fast scenarios in the tests).
func (b *Battery) WithSeed(seed int64) *Battery {
	c := *b
	c.opts.Seed = seed
	return &c
}

// Close stops Postgres and Redis.
func (b *Battery) Close() { b.env.Close() }

// Run runs one scenario and, unless NoVariants, its variants; it returns
// the default run first.
func (b *Battery) Run(ctx context.Context, s Scenario) []Result {
	out := []Result{b.runOne(ctx, s, Variant{})}
	if !b.opts.NoVariants {
		for _, v := range s.Variants {
			out = append(out, b.runOne(ctx, s, v))
		}
	}
	if s.Summarize != nil {
		s.Summarize(out)
		out[0].Pass = out[0].Error == "" && len(out[0].Metrics) > 0
		for i := range out[0].Metrics {
			out[0].Metrics[i].judge()
			out[0].Pass = out[0].Pass && out[0].Metrics[i].Pass
		}
	}
	if s.Compare != nil {
		if b.opts.NoVariants || len(out) == 1 {
			out[0].Notes = append(out[0].Notes, "the thresholds relative to the comparison runs were not judged (variants not run)")
		} else if out[0].Error == "" {
			ms := s.Compare(out[0], out[1:])
			var line []string
			for i := range ms {
				ms[i].judge()
				if !ms[i].Pass {
					out[0].Pass = false
				}
				line = append(line, ms[i].String())
			}
			out[0].Metrics = append(out[0].Metrics, ms...)
			b.progress("%s: against %s: %s (verdict %s)", s.Name, out[1].Name(), strings.Join(line, "; "), verdict(out[0].Pass))
		}
	}
	return out
}

func verdict(pass bool) string {
	if pass {
		return "PASS"
	}
	return "FAIL"
}

func (b *Battery) progress(format string, args ...any) {
	if b.opts.Progress != nil {
		b.opts.Progress(fmt.Sprintf(format, args...))
	}
}

func (b *Battery) runOne(ctx context.Context, s Scenario, v Variant) Result {
	r := Result{Scenario: s.Name, Variant: v.Name, Judged: v.Name == "" || v.Judged, Seed: b.opts.Seed}
	b.progress("%s: running", r.Name())
	start := time.Now()
	if s.NotBuilt != "" {
		r.Notes = append(r.Notes, "not built yet: "+s.NotBuilt)
		r.Metrics = append(r.Metrics, Metric{Name: "capability built", Value: 0, Op: Equal, Threshold: 1})
		r.Metrics[0].judge()
		r.Pass = false
		b.progress("%s: FAIL (not built: %s)", r.Name(), s.NotBuilt)
		return r
	}
	w, err := newWorld(ctx, b.env, b.opts, s.Name, v)
	if err == nil {
		err = s.Run(ctx, w)
		w.stop()
		if err == nil {
			w.checkInvariants(ctx)
		}
		r.Metrics, r.Notes, r.Fill = w.metrics, w.notes, w.fill
		w.close()
	}
	if err != nil {
		r.Error = err.Error()
	}
	r.Seconds = time.Since(start).Seconds()
	r.Pass = err == nil && len(r.Metrics) > 0
	for i := range r.Metrics {
		r.Metrics[i].judge()
		if !r.Metrics[i].Pass {
			r.Pass = false
		}
	}
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	if !r.Judged {
		verdict = "(comparison) " + verdict
	}
	var ms []string
	for _, m := range r.Metrics {
		ms = append(ms, m.String())
	}
	b.progress("%s: %s in %.0fs: %s%s", r.Name(), verdict, r.Seconds, strings.Join(ms, "; "), errSuffix(r.Error))
	return r
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return "; error: " + e
}

// Spearman is the rank correlation of xs and ys (average ranks for ties).
func Spearman(xs, ys []float64) float64 {
	rx, ry := ranks(xs), ranks(ys)
	return pearson(rx, ry)
}

func ranks(v []float64) []float64 {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return v[idx[a]] < v[idx[b]] })
	r := make([]float64, len(v))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && v[idx[j+1]] == v[idx[i]] {
			j++
		}
		avg := float64(i+j)/2 + 1
		for k := i; k <= j; k++ {
			r[idx[k]] = avg
		}
		i = j + 1
	}
	return r
}

func pearson(a, b []float64) float64 {
	n := float64(len(a))
	if n < 2 {
		return 0
	}
	var ma, mb float64
	for i := range a {
		ma += a[i]
		mb += b[i]
	}
	ma, mb = ma/n, mb/n
	var cov, va, vb float64
	for i := range a {
		cov += (a[i] - ma) * (b[i] - mb)
		va += (a[i] - ma) * (a[i] - ma)
		vb += (b[i] - mb) * (b[i] - mb)
	}
	if va == 0 || vb == 0 {
		return 0
	}
	return cov / math.Sqrt(va*vb)
}
