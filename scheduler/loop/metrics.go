package loop

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	jobsQueried   prometheus.Counter
	jobsProcessed prometheus.Counter
	jobQuery      prometheus.Histogram
	passes        *prometheus.CounterVec
	perPass       *prometheus.HistogramVec
	errors        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		jobsQueried: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_jobs_queried_total",
			Help: "Jobs returned by pending-job queries.",
		}),
		jobsProcessed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_jobs_processed_total",
			Help: "Jobs handed to the matcher.",
		}),
		jobQuery: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_job_query_duration_seconds",
			Help:    "Latency of the pending-job query.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_passes_total",
			Help: "Cluster passes by how they ended (booked, saturated, no_jobs, capped, query_error, failed, alloc_full, not_seeded, cancelled, timeout).",
		}, []string{"reason"}),
		perPass: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "scheduler_frames_dispatched_per_pass",
			Help:    "Frames dispatched by one cluster pass, by cluster type.",
			Buckets: []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 500},
		}, []string{"cluster_type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_pass_errors_total",
			Help: "Cluster passes that failed on a database, Redis or host-cache error and were retried after the error backoff, by stage (job_query: the pending-job query; booking: a layer's query or booking, nothing booked).",
		}, []string{"stage"}),
	}
	for _, s := range []string{"job_query", "booking"} {
		m.errors.WithLabelValues(s)
	}
	for _, r := range []Reason{Booked, Saturated, NoJobs, Capped, QueryError, Failed, AllocFull, NotSeeded, Cancelled, TimedOut} {
		m.passes.WithLabelValues(string(r))
	}
	if reg != nil {
		reg.MustRegister(m.jobsQueried, m.jobsProcessed, m.jobQuery, m.passes, m.perPass, m.errors)
	}
	return m
}
