package memsize

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	historyReads prometheus.Counter
	kills        prometheus.Counter
	bumps        prometheus.Counter
	retries      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		historyReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_sizing_history_reads_total",
			Help: "Layers whose RSS history was read from Postgres (cache misses; at most one per layer per sizing.history_ttl).",
		}),
		kills: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_sizing_oom_kills_total",
			Help: "Memory kills of frames recorded in cuesched_frame_oom by this instance (each kill once across instances).",
		}),
		bumps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_sizing_layer_bumps_total",
			Help: "Layers raised by this instance after sizing.oom_bump_kills memory kills within sizing.oom_bump_window.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_sizing_oom_retries_total",
			Help: "Frames handed to the matcher at their own raised size after a memory kill (once per pass that considers them).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.historyReads, m.kills, m.bumps, m.retries)
	}
	return m
}
