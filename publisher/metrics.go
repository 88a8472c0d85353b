package publisher

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	bookings        *prometheus.CounterVec
	bookingLatency  prometheus.Histogram
	limitExceeded   *prometheus.CounterVec
	rollbacks       *prometheus.CounterVec
	rollbackLatency prometheus.Histogram
	releases        *prometheus.CounterVec
	releaseLatency  prometheus.Histogram
}

// scriptBuckets span a local Redis round trip (~50µs) to a congested one.
var scriptBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}

func newMetrics(prefix string, reg prometheus.Registerer, releasesOnly bool) (*metrics, error) {
	m := &metrics{
		bookings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_bookings_total",
			Help: "Booking script calls by result: booked, duplicate, limit_exceeded, reserved (a host reservation of another layer refused it), unseeded, released, error.",
		}, []string{"result"}),
		bookingLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    prefix + "_booking_duration_seconds",
			Help:    "Latency of one booking script call, including the Redis round trip.",
			Buckets: scriptBuckets,
		}),
		limitExceeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_limit_exceeded_total",
			Help: "Bookings refused by a cap, by table: subscription, folder, job, folder_gpus, job_gpus.",
		}, []string{"table"}),
		rollbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_rollbacks_total",
			Help: "Rollbacks by result: rolled_back, not_found, error.",
		}, []string{"result"}),
		rollbackLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    prefix + "_rollback_duration_seconds",
			Help:    "Latency of one rollback script call.",
			Buckets: scriptBuckets,
		}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_releases_total",
			Help: "Released procs by result: released, already_released, never_booked (counted no-op), stale_batch, error.",
		}, []string{"result"}),
		releaseLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    prefix + "_release_duration_seconds",
			Help:    "Latency of one release script call (one proc or one batch chunk).",
			Buckets: scriptBuckets,
		}),
	}
	for _, r := range []string{"booked", "duplicate", "limit_exceeded", "reserved", "seat", "unseeded", "released", "error"} {
		m.bookings.WithLabelValues(r)
	}
	for _, t := range []string{TableSubscription, TableFolder, TableJob, TableFolderGPUs, TableJobGPUs} {
		m.limitExceeded.WithLabelValues(t)
	}
	for _, r := range []string{"rolled_back", "not_found", "error"} {
		m.rollbacks.WithLabelValues(r)
	}
	for _, r := range []string{"released", "already_released", "never_booked", "stale_batch", "error"} {
		m.releases.WithLabelValues(r)
	}
	if reg != nil {
		cs := []prometheus.Collector{m.releases, m.releaseLatency}
		if !releasesOnly {
			cs = append(cs, m.bookings, m.bookingLatency, m.limitExceeded, m.rollbacks, m.rollbackLatency)
		}
		for _, c := range cs {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
