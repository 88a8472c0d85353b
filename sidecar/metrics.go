package sidecar

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// sidecarMetrics are the sidecar's own collectors (prefix sidecar_).
type sidecarMetrics struct {
	releases        *prometheus.CounterVec
	transactions    *prometheus.CounterVec
	commitToRedis   prometheus.Histogram
	commitQuantile  prometheus.Summary
	mismatches      *prometheus.CounterVec
	capWrites       *prometheus.CounterVec
	flips           prometheus.Counter
	rebootstraps    *prometheus.CounterVec
	slotRecreated   prometheus.Counter
	redisErrors     prometheus.Counter
	truncates       prometheus.Counter
	active          prometheus.Gauge
	standby         prometheus.Gauge
	lagBytes        prometheus.Gauge
	retainedBytes   prometheus.Gauge
	retainedOver    prometheus.Gauge
	retainedLimit   prometheus.Gauge
	checkpointLSN   prometheus.Gauge
	managedShows    prometheus.Gauge
	badRows         *prometheus.CounterVec
	slotPollErrors  prometheus.Counter
	slotExists      prometheus.Gauge
	checkpointFlush prometheus.Counter
	visWaits        prometheus.Counter
	visReads        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*sidecarMetrics, error) {
	m := &sidecarMetrics{
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_releases_total",
			Help: "proc DELETEs seen, by result: applied (charges undone in Redis), already_released (tombstone: a replayed release), unknown_proc (no record: never booked through Redis; counted no-op), skipped_replay (in a transaction at or below the Redis checkpoint), unmanaged (show not scheduler-managed at that point of the stream and no booking record: Cuebot's own proc, not sent), after_flip (show not managed at that point but the proc was booked through Redis before a flip back to Cuebot: applied), local (desktop proc: Cuebot's own accounting, not sent).",
		}, []string{"result"}),
		transactions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_transactions_total",
			Help: "Source transactions applied, by result: released (a release batch was applied), replayed (refused by the LSN check: already applied), nothing (no release for Redis).",
		}, []string{"result"}),
		commitToRedis: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sidecar_commit_to_redis_seconds",
			Help:    "Time from a source transaction's commit (server clock) to its release batch applied in Redis.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}),
		commitQuantile: prometheus.NewSummary(prometheus.SummaryOpts{
			Name:       "sidecar_commit_to_redis_quantile_seconds",
			Help:       "Commit-to-Redis latency quantiles over the last 5 minutes (exact per instance, for SLOs and benchmarks; aggregate the histogram across instances).",
			Objectives: map[float64]float64{0.5: 0.01, 0.9: 0.005, 0.99: 0.001},
			MaxAge:     5 * time.Minute,
		}),
		mismatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_release_key_mismatch_total",
			Help: "Releases whose per-proc record (authoritative) names another accounting key or amount than the sidecar resolved from the stream, by key (sub, folder, job, layer, point, cores, gpus).",
		}, []string{"key"}),
		capWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_cap_writes_total",
			Help: "Cap changes of managed shows written to Redis, by table (subscription, folder, job).",
		}, []string{"table"}),
		flips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_managed_flips_total",
			Help: "Changes of show.b_scheduler_managed applied from the stream.",
		}),
		rebootstraps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_rebootstrap_requests_total",
			Help: "Re-bootstraps of the Redis accounting requested (acct:epoch deleted), by reason.",
		}, []string{"reason"}),
		slotRecreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_slot_recreated_total",
			Help: "Times the slot was missing or invalidated while Redis held a sidecar checkpoint (it existed: a failover to a promoted standby) and the sidecar re-created it (sidecar.recreate_lost_slot); each requests a re-bootstrap.",
		}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_redis_errors_total",
			Help: "Redis calls that failed and were retried (nothing is acknowledged meanwhile).",
		}),
		truncates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_proc_truncates_total",
			Help: "TRUNCATEs of proc seen (each requests a re-bootstrap).",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_active",
			Help: "1 while this sidecar holds the slot and streams, else 0.",
		}),
		standby: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_standby",
			Help: "1 while this sidecar waits for the slot (another sidecar holds it), else 0.",
		}),
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_slot_lag_bytes",
			Help: "pg_current_wal_lsn() minus the slot's confirmed_flush_lsn (bytes not yet made durable in Redis).",
		}),
		retainedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_slot_retained_wal_bytes",
			Help: "pg_current_wal_lsn() minus the slot's restart_lsn: WAL the server keeps for the slot.",
		}),
		retainedOver: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_slot_retained_wal_exceeded",
			Help: "1 while the slot retains more WAL than sidecar.max_retained_wal.",
		}),
		retainedLimit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_slot_retained_wal_limit_bytes",
			Help: "The configured sidecar.max_retained_wal.",
		}),
		checkpointLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_checkpoint_lsn",
			Help: "Highest LSN this sidecar knows the Redis checkpoint holds, as a number.",
		}),
		managedShows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_managed_shows",
			Help: "Shows scheduler-managed at the sidecar's stream position.",
		}),
		badRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sidecar_bad_rows_total",
			Help: "Streamed rows that lacked a column the sidecar needs (skipped, logged), by table.",
		}, []string{"table"}),
		slotPollErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_slot_poll_errors_total",
			Help: "Failed polls of pg_replication_slots.",
		}),
		slotExists: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sidecar_slot_exists",
			Help: "1 if the slot exists at the last poll.",
		}),
		checkpointFlush: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_checkpoint_flushes_total",
			Help: "Empty release batches written only to advance the checkpoint (idle or unmanaged-only stream).",
		}),
		visWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_visibility_waits_total",
			Help: "Source transactions whose releases or cap changes were held back because PostgreSQL did not show the transaction to new snapshots yet (its WAL was flushed and streamed first: a commit in flight, or one waiting for a synchronous standby).",
		}),
		visReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sidecar_visibility_snapshot_reads_total",
			Help: "Snapshots read from PostgreSQL (txid_current_snapshot) to tell whether a streamed transaction is visible yet; one read answers for every transaction that ended before it.",
		}),
	}
	// Every labelled series exists from start-up at zero (issue #26), so a
	// panel or an increase()-based alert sees the first event.
	for _, r := range []string{"applied", "already_released", "unknown_proc", "skipped_replay", "unmanaged", "after_flip", "local"} {
		m.releases.WithLabelValues(r)
	}
	for _, r := range []string{"released", "nothing", "replayed"} {
		m.transactions.WithLabelValues(r)
	}
	for _, k := range []string{"sub", "folder", "job", "layer", "point", "cores", "gpus"} {
		m.mismatches.WithLabelValues(k)
	}
	for _, t := range []string{"subscription", "folder", "job"} {
		m.capWrites.WithLabelValues(t)
	}
	for _, r := range []string{"new_slot", "no_checkpoint", "checkpoint_behind", "checkpoint_ahead", "truncate", "redis_lost_data", "other"} {
		m.rebootstraps.WithLabelValues(r)
	}
	for _, t := range []string{"proc", "show", "subscription", "folder_resource", "job_resource"} {
		m.badRows.WithLabelValues(t)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{
		m.releases, m.transactions, m.commitToRedis, m.commitQuantile, m.mismatches, m.capWrites, m.flips,
		m.rebootstraps, m.redisErrors, m.truncates, m.active, m.standby, m.lagBytes,
		m.retainedBytes, m.retainedOver, m.retainedLimit, m.checkpointLSN, m.managedShows,
		m.badRows, m.slotPollErrors, m.slotExists, m.checkpointFlush, m.slotRecreated,
		m.visWaits, m.visReads,
	} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, errors.New("sidecar: metrics already registered in this registry (one sidecar per registry)")
			}
			return nil, err
		}
	}
	return m, nil
}
