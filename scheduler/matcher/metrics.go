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
	// holds: layer passes stopped by a limit (frames or seats), and layers
	// newly held by the fail-fast backoff (HoldReason).
	holds     *prometheus.CounterVec
	seatWaits prometheus.Counter
}

// HoldReason labels scheduler_layer_holds_total.
type HoldReason string

// The reasons of scheduler_layer_holds_total.
const (
	// HoldLimit: a layer's pass stopped because a limit counting frames
	// (Cuebot's meaning) had no room.
	HoldLimit HoldReason = "limit"
	// HoldSeat: a layer's pass stopped because every seat of a node-locked
	// limit was held by hosts with no room for it.
	HoldSeat HoldReason = "seat"
	// HoldFailFast: the loop leader held a layer whose frames keep failing
	// fast (scheduler/failfast).
	HoldFailFast HoldReason = "fail_fast"
)

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
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_layer_holds_total",
			Help: "Layers held back: passes stopped by a limit with no room (reason limit: frames; seat: every seat of a node-locked limit held) and layers newly held by the fail-fast backoff (fail_fast).",
		}, []string{"reason"}),
		seatWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_seat_packing_waits_total",
			Help: "Layer passes of a node-locked limit that found every seat held and no seat host with room, so tried no other host.",
		}),
	}
	for _, r := range []HoldReason{HoldLimit, HoldSeat, HoldFailFast} {
		m.holds.WithLabelValues(string(r))
	}
	if reg != nil {
		reg.MustRegister(m.noCandidate, m.candidates, m.permitDenied, m.quarantined, m.jobBudgetSpent, m.spreadCapped,
			m.holds, m.seatWaits)
	}
	return m
}
