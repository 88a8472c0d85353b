package matcher

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	noCandidate  prometheus.Counter
	candidates   prometheus.Histogram
	permitDenied prometheus.Counter
	quarantined  prometheus.Counter
	// jobBudgetSpent: jobs whose pass ended at dispatch_frames_per_job_limit.
	jobBudgetSpent prometheus.Counter
	// spreadCapped: checked-out hosts on which queue.layer_spread limited
	// the layer's batch.
	spreadCapped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		noCandidate: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_no_candidate_iterations_total",
			Help: "Host checkouts that found no fitting host.",
		}),
		candidates: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_candidates_per_layer",
			Help:    "Host checkouts made for one layer in one pass.",
			Buckets: []float64{1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 50, 100},
		}),
		permitDenied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_layer_permit_denied_total",
			Help: "Layers skipped because another pass of this process holds their permit.",
		}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_hosts_quarantined_total",
			Help: "Hosts held out of checkouts after a failed RQD launch.",
		}),
		jobBudgetSpent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_job_pass_budget_spent_total",
			Help: "Jobs whose pass stopped at dispatch_frames_per_job_limit with layers left.",
		}),
		spreadCapped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_layer_spread_capped_total",
			Help: "Host checkouts on which queue.layer_spread limited the layer's batch to its share of the host.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.noCandidate, m.candidates, m.permitDenied, m.quarantined, m.jobBudgetSpent, m.spreadCapped)
	}
	return m
}
