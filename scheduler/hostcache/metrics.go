package hostcache

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	hits, misses   prometheus.Counter
	snapshots      prometheus.Counter
	groupLoads     prometheus.Counter
	groupEvictions prometheus.Counter
	leaseExpired   prometheus.Counter
	capacityBumps  prometheus.Counter
	assumptions    *prometheus.CounterVec
	placementsVec  *prometheus.CounterVec
	placements     [Live + 1]prometheus.Counter // by Locality
}

func newMetrics(reg prometheus.Registerer, c *Cache) *metrics {
	m := &metrics{
		hits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_host_cache_hits_total", Help: "Checkouts that returned a host.",
		}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_host_cache_misses_total", Help: "Checkouts that found no suitable host.",
		}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_host_cache_snapshots_total", Help: "Full loads of the cache from a replication snapshot.",
		}),
		groupLoads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_host_cache_group_builds_total", Help: "Groups built (from memory, no query) on first use.",
		}),
		groupEvictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_host_cache_group_evictions_total", Help: "Groups evicted after group_idle_timeout without a checkout.",
		}),
		leaseExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_host_cache_lease_expired_total", Help: "Checked-out hosts returned to the cache because they were never checked in.",
		}),
		capacityBumps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_host_cache_capacity_wakeups_total",
			Help: "Capacity generation bumps: a host gained idle resources that fit a checkout that had missed in its group (or the group was rebuilt or evicted), waking that group's backed-off layers and sleeping clusters.",
		}),
		assumptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_host_cache_assumptions_total",
			Help: "Checked-in idle values by outcome: assumed (pending the WAL), confirmed (the WAL showed them), superseded (the WAL already had them or newer), expired (never confirmed within assume_ttl).",
		}, []string{"outcome"}),
	}
	m.placementsVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scheduler_placements_total",
		Help: "Frames booked on a host by the host's locality for their layer: live (the layer runs there), warm (it ran there recently), cold.",
	}, []string{"locality"})
	for _, o := range []string{"assumed", "confirmed", "superseded", "expired"} {
		m.assumptions.WithLabelValues(o)
	}
	defer func() {
		for l := Cold; l <= Live; l++ {
			m.placements[l] = m.placementsVec.WithLabelValues(l.String())
		}
	}()
	if reg == nil {
		return m
	}
	m.hits = register(reg, m.hits)
	m.misses = register(reg, m.misses)
	m.snapshots = register(reg, m.snapshots)
	m.groupLoads = register(reg, m.groupLoads)
	m.groupEvictions = register(reg, m.groupEvictions)
	m.leaseExpired = register(reg, m.leaseExpired)
	m.capacityBumps = register(reg, m.capacityBumps)
	m.assumptions = register(reg, m.assumptions)
	m.placementsVec = register(reg, m.placementsVec)
	for _, g := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scheduler_host_cache_size", Help: "Hosts in the cache (every host row of the publication).",
		}, func() float64 { return float64(c.hostCount.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scheduler_host_cache_staleness_seconds",
			Help: "Now minus the time the cache is known current as of: the last applied commit, or the last keepalive received with nothing in flight.",
		}, func() float64 {
			t := c.freshAsOf.Load()
			if t == 0 {
				return 0
			}
			return max(0, time.Since(time.Unix(0, t)).Seconds())
		}),
	} {
		if err := reg.Register(g); err != nil {
			c.log.Warn("metric not registered", "error", err)
		}
	}
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, col C) C {
	if err := reg.Register(col); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return col
}
