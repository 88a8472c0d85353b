package shard

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	members  prometheus.Gauge
	shares   prometheus.Gauge
	clusters prometheus.Gauge
	renewals prometheus.Counter
	losses   prometheus.Counter
	handoffs *prometheus.CounterVec
	fenced   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_work_split_members",
			Help: "Live scheduler instances this instance saw at its last work-split step (scheduler.work_split).",
		}),
		shares: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_work_split_owned_shares",
			Help: "Shares (allocations, or clusters) whose clusters this instance hands out.",
		}),
		clusters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_work_split_owned_clusters",
			Help: "Clusters of the shares this instance owns: about 1/N of scheduler_clusters with N live instances.",
		}),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_work_split_lease_renewals_total",
			Help: "Work-split steps that renewed the lease (one per work_split_renew while healthy).",
		}),
		losses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_work_split_lease_losses_total",
			Help: "Times the lock session failed or lost a lock: every share was dropped until the instance rejoined.",
		}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_work_split_handoffs_total",
			Help: "Shares this instance acquired or released (rebalancing after a join or a death), by direction.",
		}, []string{"direction"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_work_split_fenced_total",
			Help: "Booking batches refused by the fence: the share was released, or the lease was not renewed within lease - renew.",
		}),
	}
	for _, d := range []string{"acquired", "released"} {
		m.handoffs.WithLabelValues(d)
	}
	if reg != nil {
		reg.MustRegister(m.members, m.shares, m.clusters, m.renewals, m.losses, m.handoffs, m.fenced)
	}
	return m
}
