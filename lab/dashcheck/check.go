package dashcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/cuesched/cuesched/lab/demo"
)

// Options configures Run.
type Options struct {
	// DocsDir holds grafana/*.json and prometheus/*.yml ("docs").
	DocsDir string
	// Duration is how long the simulated farm runs at least while
	// Prometheus scrapes it; then it runs on, up to MaxDuration, until
	// every expression has data (some only after an event: a reservation
	// ending, say), checked every 5 s.
	Duration, MaxDuration time.Duration
	// Hosts and Frames size the farm (lab/demo); Seed its generator;
	// RunTimeMin/Max bound the fake frames' run times. Frames of seconds
	// keep hosts partly busy, so the demo's wide frames (submitted 20 s
	// in) find no empty host and get a reservation (the reservation
	// panels then have data).
	Hosts, Frames          int
	Seed                   int64
	RunTimeMin, RunTimeMax time.Duration
	// Prometheus and Promtool are the binaries ("" = from PATH).
	Prometheus, Promtool string
	// Out receives the report.
	Out    io.Writer
	Logger hclog.Logger
}

// Step is the range queries' step and ScrapeInterval Prometheus's scrape
// and rule evaluation interval.
const (
	Step           = 2 * time.Second
	ScrapeInterval = time.Second
)

// Report is the outcome of Run.
type Report struct {
	// Panels evaluated, and those whose every target returned data (a
	// panel with an allowed-empty target is not counted as with data).
	Panels, PanelsWithData int
	// Targets (panel expressions) evaluated, and those with data.
	Targets, TargetsWithData int
	// Alerts evaluated, and those whose expression ran and whose every
	// selector returned data.
	Alerts, AlertsOK int
	// AllowedEmpty counts the targets without a number that the
	// allowlist (allowances, each with its reason) let pass.
	AllowedEmpty int
	// Failures lists every problem found (empty: the check passed).
	Failures []string
}

// Run is `make dashboard-check`: it parses every dashboard and alert
// expression, runs promtool check/test rules, starts a real Prometheus
// (temp dir, free port, 1 s scrape), runs a short embedded farm (real
// scheduler and sidecar, fake RQD, Cuebot emulator: lab/demo) that it
// scrapes, runs `promtool check metrics` on both daemons' /metrics
// mid-run, and evaluates every panel target and alert expression over the
// run through the HTTP API. Any expression that errors, returns no series,
// or (a panel) only NaN, and any selector that matches no series, is a
// failure; all are listed.
func Run(ctx context.Context, o Options) (Report, error) {
	var rep Report
	if o.DocsDir == "" {
		o.DocsDir = "docs"
	}
	if o.Duration <= 0 {
		o.Duration = 60 * time.Second
	}
	if o.MaxDuration < o.Duration {
		o.MaxDuration = max(o.Duration, 4*time.Minute)
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	var err error
	if o.Prometheus == "" {
		if o.Prometheus, err = exec.LookPath("prometheus"); err != nil {
			return rep, errors.New("prometheus not found: install Debian's prometheus package (make deps / scripts/ensure-deps.sh)")
		}
	}
	if o.Promtool == "" {
		if o.Promtool, err = exec.LookPath("promtool"); err != nil {
			return rep, errors.New("promtool not found: install Debian's prometheus package (make deps / scripts/ensure-deps.sh)")
		}
	}
	fail := func(format string, args ...any) { rep.Failures = append(rep.Failures, fmt.Sprintf(format, args...)) }

	vars := Vars{Interval: Step, ScrapeInterval: ScrapeInterval, Range: o.Duration}
	qs, err := LoadAll(o.DocsDir, vars)
	if err != nil {
		return rep, err
	}
	for _, q := range qs {
		if _, err := Parse(q.Expr); err != nil {
			fail("%s: does not parse: %v\n      %s", q.Name(), err, q.Expr)
		}
	}
	ruleFiles, err := AlertFiles(o.DocsDir)
	if err != nil {
		return rep, err
	}
	rulesDir, _ := filepath.Abs(filepath.Join(o.DocsDir, "prometheus"))
	fmt.Fprintf(o.Out, "dashboard-check: %d expressions (%d dashboard targets, %d alert rules) from %s\n",
		len(qs), countKind(qs, false), countKind(qs, true), o.DocsDir)

	// The alert rules: promtool's own checks and unit tests.
	if out, err := exec.CommandContext(ctx, o.Promtool, append([]string{"check", "rules"}, ruleFiles...)...).CombinedOutput(); err != nil {
		fail("promtool check rules: %v\n%s", err, indent(out))
	}
	tests, _ := filepath.Glob(filepath.Join(rulesDir, "*_test.yml"))
	for _, t := range tests {
		cmd := exec.CommandContext(ctx, o.Promtool, "test", "rules", filepath.Base(t))
		cmd.Dir = rulesDir
		if out, err := cmd.CombinedOutput(); err != nil {
			fail("promtool test rules %s: %v\n%s", filepath.Base(t), err, indent(out))
		} else {
			fmt.Fprintf(o.Out, "  promtool test rules %s: ok\n", filepath.Base(t))
		}
	}

	base, err := demo.PrometheusConfig(demo.MetricsEndpoints{}, rulesDir, ScrapeInterval.String())
	if err != nil {
		return rep, err
	}
	// No scrape target until the demo's endpoints listen.
	base = base[:strings.Index(base, "scrape_configs:")]
	prom, err := startPrometheus(ctx, o.Prometheus, base)
	if err != nil {
		return rep, err
	}
	defer prom.stop()
	fmt.Fprintf(o.Out, "  prometheus %s (scrape every %s, data in %s)\n", prom.url, ScrapeInterval, prom.dir)

	var (
		start      time.Time
		midDone    = make(chan struct{})
		midMu      sync.Mutex
		midFailure []string
		firing     []string
	)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var demoOut bytes.Buffer
	stop := make(chan struct{})
	var (
		stopMu    sync.Mutex
		stoppedAt time.Time
	)
	ready := func(m demo.MetricsEndpoints) error {
		cfg, err := demo.PrometheusConfig(m, rulesDir, ScrapeInterval.String())
		if err != nil {
			return err
		}
		if err := prom.reload(runCtx, cfg); err != nil {
			return err
		}
		if err := prom.waitTargetsUp(runCtx, 2, 60*time.Second); err != nil {
			return err
		}
		start = time.Now()
		fmt.Fprintf(o.Out, "  scraping scheduler %s and sidecar %s; the farm runs %s, then until every expression has data (at most %s)\n",
			m.Scheduler, m.Sidecar, o.Duration, o.MaxDuration)
		go func() {
			defer func() {
				stopMu.Lock()
				stoppedAt = time.Now()
				stopMu.Unlock()
				close(stop)
			}()
			select {
			case <-time.After(o.Duration):
			case <-runCtx.Done():
				return
			}
			for {
				missing := prom.missing(runCtx, qs, time.Now())
				if len(missing) == 0 || time.Since(start) >= o.MaxDuration || runCtx.Err() != nil {
					return
				}
				fmt.Fprintf(o.Out, "  %s: %d expression(s) without data yet, e.g. %s\n",
					time.Since(start).Round(time.Second), len(missing), missing[0])
				select {
				case <-time.After(5 * time.Second):
				case <-runCtx.Done():
					return
				}
			}
		}()
		// Mid-run, on a busy farm: promtool check metrics on both
		// daemons' output, and the rules' state.
		go func() {
			defer close(midDone)
			select {
			case <-time.After(o.Duration * 3 / 4):
			case <-runCtx.Done():
				return
			}
			var f []string
			for _, e := range []struct{ name, addr string }{{"scheduler", m.Scheduler}, {"sidecar", m.Sidecar}} {
				if msg := promtoolCheckMetrics(runCtx, o.Promtool, "http://"+e.addr+"/metrics"); msg != "" {
					f = append(f, fmt.Sprintf("promtool check metrics on the %s's /metrics: %s", e.name, msg))
				} else {
					fmt.Fprintf(o.Out, "  promtool check metrics on the %s's /metrics (%s into the run): clean\n", e.name, time.Since(start).Round(time.Second))
				}
			}
			rules, err := prom.rules(runCtx)
			if err != nil {
				f = append(f, fmt.Sprintf("prometheus rules: %v", err))
			}
			var fire []string
			for _, r := range rules {
				if r.Health != "ok" {
					f = append(f, fmt.Sprintf("rule %s: health %q: %s", r.Name, r.Health, r.LastError))
				}
				if r.State == "firing" || r.State == "pending" {
					fire = append(fire, r.Name+" ("+r.State+")")
				}
			}
			midMu.Lock()
			midFailure, firing = f, fire
			midMu.Unlock()
		}()
		return nil
	}
	hosts, frames, rtMin, rtMax := o.Hosts, o.Frames, o.RunTimeMin, o.RunTimeMax
	if hosts <= 0 {
		hosts = 80
	}
	if frames <= 0 {
		frames = 4000
	}
	if rtMin <= 0 {
		rtMin = 4 * time.Second
	}
	if rtMax < rtMin {
		rtMax = max(rtMin, 20*time.Second)
	}
	runErr := demo.Run(runCtx, demo.Options{
		Hosts: hosts, Frames: frames, Duration: o.MaxDuration + time.Minute, UntilDrained: false,
		RunTimeMin: rtMin, RunTimeMax: rtMax, Stop: stop,
		// The wide frames come once every host is busy with frames of
		// seconds: no host is free for them, so they get a reservation,
		// and it ends when the reserved host has drained (the
		// reservation panels need both).
		WideAfter: 20 * time.Second,
		Out:       &demoOut, Logger: o.Logger, Seed: o.Seed,
		ChartPath:    filepath.Join(prom.dir, "demo.png"),
		MetricsReady: ready,
	})
	end := time.Now()
	cancel()
	stopMu.Lock()
	if !stoppedAt.IsZero() && stoppedAt.Before(end) {
		// The farm stopped booking then; the rest was its shutdown.
		end = stoppedAt
	}
	stopMu.Unlock()
	if start.IsZero() {
		return rep, fmt.Errorf("the farm did not start: %v\n%s", runErr, tail(demoOut.String(), 3000))
	}
	<-midDone
	switch {
	case errors.Is(runErr, demo.ErrGuarantees):
		// The farm is stopped mid-flight (frames running, releases in
		// the stream): the demo's end-of-run audit can catch a release
		// the sidecar had not applied yet. The check judges the
		// dashboard, not that audit (make demo and make verify do).
		fmt.Fprintf(o.Out, "  note: the demo's end-of-run guarantees check did not pass on the farm stopped mid-flight (not this check's verdict):\n%s\n",
			indent([]byte(summaryOf(demoOut.String()))))
	case runErr != nil:
		fail("the simulated farm failed: %v (its output below)\n%s", runErr, indent([]byte(tail(demoOut.String(), 3000))))
	}
	midMu.Lock()
	rep.Failures = append(rep.Failures, midFailure...)
	if len(firing) > 0 {
		fmt.Fprintf(o.Out, "  alerts pending or firing mid-run (a healthy farm; firing is a failure): %s\n", strings.Join(firing, ", "))
	}
	midMu.Unlock()
	fmt.Fprintf(o.Out, "  the farm ran %s; evaluating over [%s, %s] at a %s step\n",
		end.Sub(start).Round(time.Second), start.UTC().Format("15:04:05"), end.UTC().Format("15:04:05"), Step)

	qctx, qcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer qcancel()
	// Firing alerts on a healthy farm are a failure.
	if r, err := prom.queryRange(qctx, `ALERTS{alertstate="firing"}`, start, end, Step); err != nil {
		fail("ALERTS: %v", err)
	} else if r.Series > 0 {
		fail("%d alert(s) fired on a healthy farm (query ALERTS{alertstate=\"firing\"})", r.Series)
	}

	type panelKey struct {
		src string
		id  int
	}
	panelOK := map[panelKey]bool{}
	var lines, allowed []string
	for _, q := range qs {
		e, err := Parse(q.Expr)
		if err != nil {
			continue // reported above
		}
		var problems []string
		allowedHere := false
		r, err := prom.queryRange(qctx, q.Expr, start, end, Step)
		switch {
		case err != nil:
			problems = append(problems, "error: "+err.Error())
		case q.Alert:
			// Empty is the healthy answer of an alert expression; its
			// inputs must exist (below).
		case r.Series == 0:
			problems = append(problems, "no series")
		case r.WithNumbers == 0:
			problems = append(problems, fmt.Sprintf("%d series, only NaN", r.Series))
			if a, ok := allowanceFor(e); ok {
				cond := fmt.Sprintf("max_over_time((%s)[%ds:%ds])", a.none, int(end.Sub(start).Seconds())+1, int(Step.Seconds()))
				if c, err := prom.queryInstant(qctx, cond, end); err == nil && c.Max <= 0 {
					problems = problems[:len(problems)-1]
					allowedHere = true
					allowed = append(allowed, fmt.Sprintf("%s: allowed empty: %s (%s stayed 0)", q.Name(), a.reason, a.none))
				}
			}
		}
		for _, sel := range Selectors(e) {
			sr, err := prom.queryRange(qctx, sel, start, end, Step)
			if err != nil {
				problems = append(problems, fmt.Sprintf("selector %s: %v", sel, err))
			} else if sr.Series == 0 {
				problems = append(problems, fmt.Sprintf("selector %s matches no series", sel))
			}
		}
		status := "ok"
		if len(problems) > 0 {
			status = "FAIL"
			fail("%s: %s\n      %s", q.Name(), strings.Join(problems, "; "), q.Expr)
		}
		if q.Alert {
			rep.Alerts++
			if len(problems) == 0 {
				rep.AlertsOK++
			}
			lines = append(lines, fmt.Sprintf("  %-4s %s", status, q.Name()))
			continue
		}
		rep.Targets++
		hasData := len(problems) == 0 && !allowedHere
		if hasData {
			rep.TargetsWithData++
		}
		k := panelKey{q.Source, q.PanelID}
		if prev, seen := panelOK[k]; !seen || prev {
			panelOK[k] = hasData
		}
		if allowedHere {
			status = "allowed"
		}
		lines = append(lines, fmt.Sprintf("  %-4s %s: %d series", status, q.Name(), r.Series))
	}
	rep.Panels = len(panelOK)
	for _, ok := range panelOK {
		if ok {
			rep.PanelsWithData++
		}
	}
	for _, l := range lines {
		fmt.Fprintln(o.Out, l)
	}
	for _, l := range allowed {
		fmt.Fprintln(o.Out, "  note: "+l)
	}
	rep.AllowedEmpty = len(allowed)
	fmt.Fprintf(o.Out, "dashboard-check: panels %d evaluated, %d with data; targets %d, %d with data (%d more allowed empty); alert rules %d, %d evaluated with every input present\n",
		rep.Panels, rep.PanelsWithData, rep.Targets, rep.TargetsWithData, rep.AllowedEmpty, rep.Alerts, rep.AlertsOK)
	sort.Strings(rep.Failures)
	return rep, nil
}

// missing names the expressions that have no data at t: a panel target
// without a number, an alert rule with a selector matching nothing (or
// any that errors). For the wait before the verdict.
func (p *prometheus) missing(ctx context.Context, qs []Query, t time.Time) []string {
	var out []string
	for _, q := range qs {
		e, err := Parse(q.Expr)
		if err != nil {
			continue
		}
		exprs := Selectors(e)
		if !q.Alert {
			if a, ok := allowanceFor(e); ok {
				if r, err := p.queryInstant(ctx, a.waitWhile, t); err == nil && r.Max <= 0 {
					// Nothing on its way: the verdict applies the allowance.
					continue
				}
			}
			exprs = append([]string{q.Expr}, exprs...)
		}
		for _, x := range exprs {
			r, err := p.queryInstant(ctx, x, t)
			if err != nil || r.WithNumbers == 0 {
				out = append(out, q.Name())
				break
			}
		}
	}
	return out
}

// allowance lets a panel target come back without a number on a healthy
// farm, for a stated reason, and only while a condition shows that the
// event it needs has not happened.
type allowance struct {
	// metric is the one metric the target reads.
	metric string
	reason string
	// none must be 0 (or empty) over the whole run for the allowance to
	// apply: the event the target needs did not happen.
	none string
	// waitWhile: while it is above 0 the event is on its way (the check
	// keeps the farm running for it, up to MaxDuration).
	waitWhile string
}

// allowances is the whole allowlist (keep it tiny: fix the metric or the
// expression instead where possible; every labelled series is at zero
// from start-up, so counters and gauges never need one).
func allowances() []allowance {
	return []allowance{{
		metric:    "scheduler_reservation_hold_duration_seconds_bucket",
		reason:    "a quantile of reservation hold times has no value until a reservation ends, and this farm ended none",
		none:      "sum(scheduler_reservations_ended_total)",
		waitWhile: "max(scheduler_reservations_held)",
	}}
}

// allowanceFor is the allowance covering e (every metric it reads), if any.
func allowanceFor(e parser.Expr) (allowance, bool) {
	names := MetricNames(e)
	for _, a := range allowances() {
		if len(names) == 1 && names[0] == a.metric {
			return a, true
		}
	}
	return allowance{}, false
}

func countKind(qs []Query, alert bool) int {
	n := 0
	for _, q := range qs {
		if q.Alert == alert {
			n++
		}
	}
	return n
}

// promtoolCheckMetrics fetches url and runs `promtool check metrics` on
// it; "" when clean.
func promtoolCheckMetrics(ctx context.Context, promtool, url string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return err.Error()
	}
	if resp.StatusCode != http.StatusOK {
		return resp.Status
	}
	if body.Len() == 0 {
		return "empty exposition"
	}
	cmd := exec.CommandContext(ctx, promtool, "check", "metrics")
	cmd.Stdin = &body
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		return fmt.Sprintf("%v\n%s", err, indent(out))
	}
	return ""
}

func indent(b []byte) string {
	s := strings.TrimRight(string(b), "\n")
	return "      " + strings.ReplaceAll(s, "\n", "\n      ")
}

// summaryOf is the demo output's audit differences and summary block.
func summaryOf(out string) string {
	if i := strings.Index(out, "\naudited "); i >= 0 {
		out = out[i+1:]
	} else if i := strings.Index(out, "\nsummary\n"); i >= 0 {
		out = out[i+1:]
	}
	if i := strings.Index(out, "\nthe story of the run"); i >= 0 {
		out = out[:i]
	}
	return tail(out, 3000)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
