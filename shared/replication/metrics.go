package replication

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a stream's Prometheus collectors. Every name starts with the
// prefix given to NewMetrics (e.g. "scheduler_replication_" or
// "sidecar_replication_").
type Metrics struct {
	lagBytes        prometheus.Gauge
	applyLagSeconds prometheus.Gauge
	messages        *prometheus.CounterVec
	transactions    prometheus.Counter
	reconnects      prometheus.Counter
	slotBusy        prometheus.Counter
	snapshots       prometheus.Counter
	snapshotSeconds prometheus.Histogram
	lastAppliedLSN  prometheus.Gauge
	durableLSN      prometheus.Gauge
	serverWALEnd    prometheus.Gauge
	queued          prometheus.Gauge
}

// NewMetrics creates the collectors and registers them with reg (nil: not
// registered). Registering twice with the same prefix reuses the collectors
// already registered, so two streams sharing a prefix share the series.
func NewMetrics(reg prometheus.Registerer, prefix string) *Metrics {
	m := &Metrics{
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "lag_bytes",
			Help: "Server WAL end minus the last position applied by the consumer (bytes).",
		}),
		applyLagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "apply_lag_seconds",
			Help: "Now minus the commit time of the last applied transaction, at the time it was applied; 0 after a keepalive shows the consumer caught up.",
		}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "messages_total",
			Help: "Replication messages received, by type (begin, commit, insert, update, delete, truncate, relation, type, origin, message, keepalive).",
		}, []string{"type"}),
		transactions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "transactions_applied_total",
			Help: "Transactions applied by the consumer.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "reconnects_total",
			Help: "Replication sessions that ended with an error and were retried.",
		}),
		slotBusy: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "slot_busy_total",
			Help: "Attempts that found the replication slot held by another consumer (SQLSTATE 55006).",
		}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prefix + "snapshots_total",
			Help: "Initial snapshots taken (once per temporary-slot session, once per permanent slot creation).",
		}),
		snapshotSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    prefix + "snapshot_duration_seconds",
			Help:    "Time the consumer spent loading an initial snapshot.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		lastAppliedLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "last_applied_lsn",
			Help: "End LSN of the last applied transaction (or keepalive position when idle), as a number.",
		}),
		durableLSN: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "durable_lsn",
			Help: "Position acknowledged to the server as flushed, as a number.",
		}),
		serverWALEnd: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "server_wal_end_lsn",
			Help: "Server WAL end reported in the last message, as a number.",
		}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prefix + "queue_transactions",
			Help: "Transactions and keepalives received from the server and waiting for the consumer to apply them (at most the stream's queue size, 64): the completions not yet seen.",
		}),
	}
	if reg == nil {
		return m
	}
	m.lagBytes = register(reg, m.lagBytes)
	m.applyLagSeconds = register(reg, m.applyLagSeconds)
	m.messages = register(reg, m.messages)
	m.transactions = register(reg, m.transactions)
	m.reconnects = register(reg, m.reconnects)
	m.slotBusy = register(reg, m.slotBusy)
	m.snapshots = register(reg, m.snapshots)
	m.snapshotSeconds = register(reg, m.snapshotSeconds)
	m.lastAppliedLSN = register(reg, m.lastAppliedLSN)
	m.durableLSN = register(reg, m.durableLSN)
	m.serverWALEnd = register(reg, m.serverWALEnd)
	m.queued = register(reg, m.queued)
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		// A conflicting descriptor is a programming error (two different
		// metrics with one name); keep the unregistered collector working.
	}
	return c
}

func messageTypeLabel(b byte) string {
	switch b {
	case 'B':
		return "begin"
	case 'C':
		return "commit"
	case 'I':
		return "insert"
	case 'U':
		return "update"
	case 'D':
		return "delete"
	case 'T':
		return "truncate"
	case 'R':
		return "relation"
	case 'Y':
		return "type"
	case 'O':
		return "origin"
	case 'M':
		return "message"
	}
	return "other"
}
