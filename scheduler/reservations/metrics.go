package reservations

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	held       prometheus.Gauge
	candidates prometheus.Gauge
	backfills  prometheus.Gauge
	tracked    prometheus.Gauge
	granted    prometheus.Counter
	refused    *prometheus.CounterVec
	ended      *prometheus.CounterVec
	heldFor    *prometheus.HistogramVec
	errors     *prometheus.CounterVec
}

// End reasons (scheduler_reservations_ended_total{reason}).
const (
	EndBooked    = "booked"    // the owner started a frame on the host
	EndPaused    = "paused"    // the owner's job was paused
	EndJobDone   = "job_ended" // the owner's job left PENDING (killed or finished)
	EndSatisfied = "satisfied" // the owner layer has no waiting frame left
	EndGone      = "gone"      // the owner layer no longer exists
	EndTimeout   = "timeout"   // held for queue.reservations.timeout
)

// Grant refusals of this instance's own checks (beside the script's).
const (
	refusedNarrow      = "narrow"       // frame below half the largest serving host
	refusedNoFit       = "no_fit"       // no serving host fits a frame even idle
	refusedAllReserved = "all_reserved" // every fitting host is reserved
	refusedNoDemand    = "no_demand"    // job paused or ended, layer satisfied
)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_reservations_held",
			Help: "Firm host reservations live in Redis at the last refresh (all instances' grants).",
		}),
		candidates: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_reservations_candidates",
			Help: "Layers of this instance whose blocked-time bucket is full and that are blocked now (reservation candidates).",
		}),
		backfills: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_reservations_backfills",
			Help: "EASY backfills admitted by the booking script on the hosts reserved now.",
		}),
		tracked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_reservations_tracked_layers",
			Help: "Layers with a blocked-time bucket in this instance.",
		}),
		granted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_reservations_granted_total",
			Help: "Host reservations granted by this instance.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_reservations_refused_total",
			Help: "Reservation grants this instance tried and did not make, by reason: host_reserved, layer_holds, max_grants, max_fraction (the grant script), narrow, no_fit, all_reserved, no_demand.",
		}, []string{"reason"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_reservations_ended_total",
			Help: "Host reservations ended by this instance, by reason: booked (the owner runs there), paused, job_ended (killed or finished), satisfied (no waiting frame), gone (layer deleted), timeout.",
		}, []string{"reason"}),
		heldFor: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "scheduler_reservation_hold_duration_seconds",
			Help:    "How long a reservation was held, from grant to end, by end reason.",
			Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_reservations_errors_total",
			Help: "Errors of the reservation loop by step: refresh, sweep, grant, end.",
		}, []string{"step"}),
	}
	for _, r := range []string{EndBooked, EndPaused, EndJobDone, EndSatisfied, EndGone, EndTimeout} {
		m.ended.WithLabelValues(r)
		m.heldFor.WithLabelValues(r)
	}
	for _, s := range []string{"refresh", "sweep", "grant", "end"} {
		m.errors.WithLabelValues(s)
	}
	for _, r := range []string{string(HostReserved), string(LayerHolds), string(MaxGrants), string(MaxFraction),
		refusedNarrow, refusedNoFit, refusedAllReserved, refusedNoDemand} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.held, m.candidates, m.backfills, m.tracked, m.granted, m.refused, m.ended, m.heldFor, m.errors)
	}
	return m
}
