package explain

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// Gauge keeps scheduler_waiting_frames{show,reason} current: every Interval
// it counts the waiting frames of the managed shows by reason (one query,
// off the dispatch path). With Leader set, only the instance it reports as
// leader exports counts (the others export none), so summing the gauge over
// scheduler instances does not count a frame twice.
type Gauge struct {
	DB       DB
	Interval time.Duration
	Leader   func() bool
	Logger   hclog.Logger
	// GPUProtection mirrors queue.gpu_protection (the strand reason).
	GPUProtection bool

	vec    *prometheus.GaugeVec
	silent *prometheus.GaugeVec
}

// NewGauge registers the gauge.
func NewGauge(db DB, interval time.Duration, leader func() bool, logger hclog.Logger, reg prometheus.Registerer) (*Gauge, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	g := &Gauge{DB: db, Interval: interval, Leader: leader, Logger: logger.Named("explain"),
		vec: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scheduler_waiting_frames",
			Help: "Waiting frames of scheduler-managed shows by the one reason each waits (see `cuesched explain`).",
		}, []string{"show", "reason"}),
		silent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scheduler_procs_on_silent_hosts",
			Help: "Procs of managed shows older than their layer's longest successful frame on hosts whose RQD has not reported (host_stat.ts_ping) for 3 minutes: frames probably dead with their RQD, RUNNING and booked until Cuebot clears the procs.",
		}, []string{"show"})}
	if reg != nil {
		for _, c := range []prometheus.Collector{g.vec, g.silent} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return g, nil
}

// Run updates the gauge until ctx ends.
func (g *Gauge) Run(ctx context.Context) error {
	t := time.NewTicker(g.Interval)
	defer t.Stop()
	for {
		g.Update(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Update counts once and replaces the gauge's series. A count gets at most
// one interval: one that has not answered by the next tick is abandoned,
// and the gauge keeps its last values.
func (g *Gauge) Update(ctx context.Context) {
	if g.Leader != nil && !g.Leader() {
		g.vec.Reset()
		g.silent.Reset()
		return
	}
	if g.Interval > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.Interval)
		defer cancel()
	}
	g.updateSilent(ctx)
	counts, err := Waiting(ctx, g.DB, g.GPUProtection)
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) { // shutting down: nothing to say
			g.Logger.Warn("waiting-frame count failed", "error", err)
		}
		return
	}
	g.vec.Reset()
	shows := map[string]bool{}
	for _, c := range counts {
		shows[c.Show] = true
	}
	// Every reason of every show with waiting frames, zeros included, so
	// a reason that empties drops to 0 instead of vanishing.
	for s := range shows {
		for _, r := range Reasons() {
			g.vec.WithLabelValues(s, r.Label()).Set(0)
		}
	}
	for _, c := range counts {
		g.vec.WithLabelValues(c.Show, c.Reason.Label()).Set(float64(c.Frames))
	}
}

// updateSilent replaces scheduler_procs_on_silent_hosts{show}.
func (g *Gauge) updateSilent(ctx context.Context) {
	ps, err := SilentProcs(ctx, g.DB, SilentAfter)
	if err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) {
			g.Logger.Warn("count of procs on silent hosts failed", "error", err)
		}
		return
	}
	g.silent.Reset()
	for _, p := range ps {
		g.silent.WithLabelValues(p.Show).Inc()
	}
	if len(ps) > 0 {
		p := ps[0]
		g.Logger.Warn("procs run past their layer's longest frame on hosts whose RQD stopped reporting; they stay RUNNING and booked until Cuebot clears them",
			"procs", len(ps), "example_host", p.Host, "example_frame", p.Job+"/"+p.Frame, "age", p.Age, "host_silent_for", p.Silent)
	}
}
