package dispatch

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/sizing"
)

type metrics struct {
	frames           *prometheus.CounterVec
	timeToBook       prometheus.Histogram
	batches          *prometheus.CounterVec
	batchDuration    prometheus.Histogram
	txDuration       prometheus.Histogram
	launchDuration   prometheus.Histogram
	launchFailures   prometheus.Counter
	compensations    *prometheus.CounterVec
	killFailures     prometheus.Counter
	unknownLaunches  *prometheus.CounterVec
	accountingErrors *prometheus.CounterVec
	launchQueue      prometheus.Gauge
	compensateQueue  prometheus.Gauge
	memRequested     prometheus.Counter
	memBooked        *prometheus.CounterVec
	sizedFrames      *prometheus.CounterVec
	planned          prometheus.Counter
	lost             *prometheus.CounterVec
	groupsSplit      prometheus.Counter
	unresolved       *prometheus.CounterVec
	unresolvedQueue  prometheus.Gauge
}

// Sources of a frame's memory (scheduler_sizing_frames_total{source}).
var memSources = []string{"request", "history", "retry"}

// observeMemory counts one started frame's requested and booked memory.
func (m *metrics) observeMemory(l sizing.Shape, bookedKB int64) {
	src := "request"
	switch {
	case l.FrameMemKB > 0:
		src = "retry"
	case l.SizedMemKB > 0:
		src = "history"
	}
	m.memRequested.Add(float64(max(l.MemMinKB, 0)) * 1024)
	m.memBooked.WithLabelValues(src).Add(float64(bookedKB) * 1024)
	m.sizedFrames.WithLabelValues(src).Inc()
}

// Reasons a planned booking was lost to capacity someone else took
// (scheduler_bookings_lost_total{reason}).
const (
	lostGate   = "gate_refused"  // the booking script refused it (a cap or burst used up)
	lostFrame  = "frame_claimed" // the claim found the frame taken (another dispatcher, or no longer WAITING)
	lostHostPG = "host_stale"    // the claim found less idle on the host than the cache said
)

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		frames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_frames_dispatched_total",
			Help: "Frames booked and launched on RQD (booked only, in dry-run mode), by show.",
		}, []string{"show"}),
		timeToBook: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_time_to_book_seconds",
			Help:    "Time from a frame becoming WAITING (ts_eligible) to its launch.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 180, 300, 450, 600, 900, 1800, 3600},
		}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_dispatch_batches_total",
			Help: "Host batches dispatched (one per host, several may share a transaction), by how they ended (done, host_full, capped, limit_reached, host_stale, failed, job_stopped, ...).",
		}, []string{"stop"}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_dispatch_batch_duration_seconds",
			Help:    "Duration of one batch (one transaction, on one or several hosts): booking, transaction, launches.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		txDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_dispatch_transaction_duration_seconds",
			Help:    "Duration of one Postgres booking transaction (one or several hosts).",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}),
		launchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_rqd_launch_duration_seconds",
			Help:    "Latency of RQD LaunchFrame calls.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}),
		launchFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_rqd_launch_failures_total",
			Help: "LaunchFrame calls that failed (the booking was compensated).",
		}),
		compensations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_dispatch_compensations_total",
			Help: "Compensations of failed launches, by result (restored, already_released, error).",
		}, []string{"result"}),
		killFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_dispatch_kill_failures_total",
			Help: "Best-effort KillRunningFrame calls after a failed launch that failed themselves: the frame may be running untracked on its host until the host's next report.",
		}),
		unknownLaunches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_rqd_launch_unknown_outcomes_total",
			Help: "LaunchFrame calls whose outcome was unknown (the deadline passed or the call was cancelled in flight), by what RQD's status report then said: running (kept as launched), not_running (compensated), no_answer (compensated).",
		}, []string{"result"}),
		accountingErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_dispatch_accounting_errors_total",
			Help: "Redis rollbacks or releases that failed (healed by the recompute), by operation.",
		}, []string{"op"}),
		planned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_bookings_planned_total",
			Help: "Frames the dispatcher planned to book (sized on a checked-out host), the denominator of races lost.",
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_bookings_lost_total",
			Help: "Planned frames not booked because the capacity was taken since the plan: refused by the booking script (gate_refused), the frame claimed elsewhere (frame_claimed), the host's idle gone in Postgres (host_stale). With several instances, lost / planned is the share of races lost.",
		}, []string{"reason"}),
		launchQueue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_launch_queue_frames",
			Help: "Frames committed in Postgres whose RQD LaunchFrame has not returned yet.",
		}),
		compensateQueue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_compensation_queue_frames",
			Help: "Frames whose launch failed and whose compensation (frame back to WAITING, proc deleted, booking released) has not finished yet.",
		}),
	}
	m.groupsSplit = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "scheduler_dispatch_group_splits_total",
		Help: "Batches spanning several hosts rolled back because one host had less idle than the cache said, then committed host by host.",
	})
	m.unresolved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scheduler_dispatch_unresolved_transactions_total",
		Help: "Booking transactions whose outcome stayed unknown (the connection lost before their end was read, and Postgres unreachable for the resolution too; nothing of them launched, their Redis bookings kept), by how they were settled once Postgres answered: put_back (committed: frames back to WAITING, procs deleted, bookings released), not_committed (bookings rolled back), left (not settled by this instance: its drain, a full queue, or 4 minutes without an answer; the accounting reconcile and Cuebot's orphaned-proc check settle them).",
	}, []string{"result"})
	m.unresolvedQueue = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "scheduler_dispatch_unresolved_queue_transactions",
		Help: "Booking transactions of unknown outcome waiting for Postgres to answer, to be settled in the background.",
	})
	m.memRequested = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "scheduler_sizing_requested_memory_bytes_total",
		Help: "Memory the started frames' layers asked for (layer.int_mem_min), summed over frames.",
	})
	m.memBooked = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scheduler_sizing_booked_memory_bytes_total",
		Help: "Memory booked for the started frames, summed over frames, by where the size came from (request, history, retry).",
	}, []string{"source"})
	m.sizedFrames = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scheduler_sizing_frames_total",
		Help: "Frames started, by where their memory size came from (request, history, retry).",
	}, []string{"source"})
	for _, s := range memSources {
		m.memBooked.WithLabelValues(s)
		m.sizedFrames.WithLabelValues(s)
	}
	// Every labelled series exists from start-up at zero (issue #26), so
	// panels and increase()-based alerts see the first event.
	for _, s := range stopNames {
		m.batches.WithLabelValues(s)
	}
	for _, r := range []string{"restored", "already_released", "error"} {
		m.compensations.WithLabelValues(r)
	}
	for _, op := range []string{"release", "rollback"} {
		m.accountingErrors.WithLabelValues(op)
	}
	for _, r := range []string{unresolvedPutBack, unresolvedNotCommitted, unresolvedLeft} {
		m.unresolved.WithLabelValues(r)
	}
	for _, r := range []string{lostGate, lostFrame, lostHostPG} {
		m.lost.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.frames, m.timeToBook, m.batches, m.batchDuration, m.txDuration, m.launchDuration,
			m.launchFailures, m.compensations, m.killFailures, m.unknownLaunches, m.accountingErrors,
			m.memRequested, m.memBooked, m.sizedFrames, m.planned, m.lost, m.launchQueue, m.compensateQueue, m.groupsSplit, m.unresolved, m.unresolvedQueue)
	}
	return m
}
