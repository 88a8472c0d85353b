package accounting

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
)

type metrics struct {
	recomputeCycles   *prometheus.CounterVec
	recomputeRetries  prometheus.Counter
	recomputeDuration prometheus.Histogram
	reseedCycles      *prometheus.CounterVec
	reseedDuration    *prometheus.HistogramVec
	drift             *prometheus.CounterVec
	records           *prometheus.CounterVec
	pgRows            *prometheus.CounterVec
	leader            prometheus.Gauge
	unseeded          prometheus.Gauge
	unattended        prometheus.Gauge
	paused            prometheus.Gauge
	bootstraps        prometheus.Counter
	rollbacks         *prometheus.CounterVec
	recycles          prometheus.Counter
	visWaits          prometheus.Counter
	foreign           prometheus.Gauge
}

var loopBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		recomputeCycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_accounting_recompute_cycles_total",
			Help: "Booked-counter recompute cycles by result: ok, error, skipped (no managed shows, or Redis not bootstrapped).",
		}, []string{"result"}),
		recomputeRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_accounting_recompute_retries_total",
			Help: "Recompute cycles restarted because a batch ran later than the tombstone TTL allows (there is no compare-and-swap to retry on).",
		}),
		recomputeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_accounting_recompute_duration_seconds",
			Help:    "Duration of one recompute cycle (snapshot, reconcile, repair, Postgres dual write).",
			Buckets: loopBuckets,
		}),
		reseedCycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_accounting_reseed_cycles_total",
			Help: "Reseed cycles by kind (limit, show_limit: the caps of shows the WAL says changed, seed, bootstrap) and result (ok, error, skipped).",
		}, []string{"kind", "result"}),
		reseedDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "scheduler_accounting_reseed_duration_seconds",
			Help:    "Duration of one reseed by kind: limit, show_limit, seed (one managed flip), bootstrap.",
			Buckets: loopBuckets,
		}, []string{"kind"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_accounting_drift_corrected_total",
			Help: "Cores corrected in Redis booked counters by recompute, seed and bootstrap, per table.",
		}, []string{"table"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_accounting_records_reconciled_total",
			Help: "Per-proc records changed by reconciliation: adopted, retargeted, dropped (past the in-flight grace), dropped_orphaned (within it: the booking's database connection is gone); and left alone: skipped_released, kept_inflight.",
		}, []string{"action"}),
		pgRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_accounting_pg_rows_written_total",
			Help: "Accounting-table rows whose booked totals the recompute changed in Postgres, per table.",
		}, []string{"table"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_accounting_leader",
			Help: "1 while this instance holds the loop lock and runs recompute and limit reseed.",
		}),
		unseeded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_accounting_unseeded_shows",
			Help: "Managed shows whose caps and counters are not seeded in Redis yet (not bookable; seen by the leader).",
		}),
		unattended: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_accounting_sidecar_unattended",
			Help: "1 when scheduler-managed shows exist but no sidecar streams the release slot (seen by the leader): releases are not reaching Redis.",
		}),
		paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_accounting_booking_paused",
			Help: "1 while booking is paused because Redis is not bootstrapped (empty after a restart, or unreachable).",
		}),
		rollbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_accounting_rollbacks_detected_total",
			Help: "Times this instance found the Redis accounting state rolled back and closed it for booking until the re-bootstrap: kind seq (acct:seq below what it saw acknowledged under the same epoch) or epoch (an epoch older than the one it knew).",
		}, []string{"kind"}),
		recycles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_accounting_connections_recycled_total",
			Help: "Times this instance closed its database connections because the epoch it booked under was lost (Redis rolled back or emptied), so booking records naming their backends are dropped once those are gone, not after the in-flight grace.",
		}),
		visWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_accounting_visibility_waits_total",
			Help: "Snapshots (bootstrap, seed, recompute, limit reseed, audit) that waited, before being taken, for transactions committed before them that were waiting for a synchronous standby and not visible yet.",
		}),
		foreign: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_accounting_identity_mismatch",
			Help: "1 while the accounting Redis is bound to another database (acct:identity): booking and every accounting loop refuse it.",
		}),
		bootstraps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_accounting_bootstraps_total",
			Help: "Full bootstraps run by this instance (startup on an empty Redis, or Redis restarted).",
		}),
	}
	for _, r := range []string{"ok", "error", "skipped"} {
		m.recomputeCycles.WithLabelValues(r)
		for _, k := range []string{"limit", "seed", "bootstrap"} {
			m.reseedCycles.WithLabelValues(k, r)
		}
	}
	for _, t := range []string{"subscription", "folder", "job", "layer", "point"} {
		m.drift.WithLabelValues(t)
		m.pgRows.WithLabelValues(t)
	}
	for _, a := range []string{"adopted", "retargeted", "dropped", "dropped_orphaned", "skipped_released", "kept_inflight"} {
		m.records.WithLabelValues(a)
	}
	m.rollbacks.WithLabelValues("seq")
	m.rollbacks.WithLabelValues("epoch")
	m.paused.Set(1)
	if reg != nil {
		for _, c := range []prometheus.Collector{m.recomputeCycles, m.recomputeRetries, m.recomputeDuration, m.reseedCycles,
			m.reseedDuration, m.drift, m.records, m.pgRows, m.leader, m.unseeded, m.unattended, m.paused, m.bootstraps, m.rollbacks, m.recycles, m.visWaits, m.foreign} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) observeReconcile(s publisher.ReconcileStats) {
	m.records.WithLabelValues("adopted").Add(float64(s.Adopted))
	m.records.WithLabelValues("retargeted").Add(float64(s.Retargeted))
	m.records.WithLabelValues("dropped").Add(float64(s.Dropped - s.DroppedOrphaned))
	m.records.WithLabelValues("dropped_orphaned").Add(float64(s.DroppedOrphaned))
	m.records.WithLabelValues("skipped_released").Add(float64(s.SkippedReleased))
	m.records.WithLabelValues("kept_inflight").Add(float64(s.KeptInFlight))
	m.observeDrift(s.Drift)
}

func (m *metrics) observeDrift(d publisher.TableCores) {
	m.drift.WithLabelValues("subscription").Add(float64(d.Sub))
	m.drift.WithLabelValues("folder").Add(float64(d.Folder))
	m.drift.WithLabelValues("job").Add(float64(d.Job))
	m.drift.WithLabelValues("layer").Add(float64(d.Layer))
	m.drift.WithLabelValues("point").Add(float64(d.Point))
}

func (m *metrics) observePG(n pgWriteCounts) {
	m.pgRows.WithLabelValues("subscription").Add(float64(n.Subs))
	m.pgRows.WithLabelValues("folder").Add(float64(n.Folders))
	m.pgRows.WithLabelValues("job").Add(float64(n.Jobs))
	m.pgRows.WithLabelValues("layer").Add(float64(n.Layers))
	m.pgRows.WithLabelValues("point").Add(float64(n.Points))
}
