package loop

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	jobsQueried   prometheus.Counter
	jobsProcessed prometheus.Counter
	jobQuery      prometheus.Histogram
	passes        *prometheus.CounterVec
	perPass       *prometheus.HistogramVec
	errors        *prometheus.CounterVec
	planned       prometheus.Counter
	delivered     prometheus.Counter
	delivery      prometheus.Histogram
	inFlight      prometheus.Gauge
	jobsInFlight  prometheus.Gauge
	errorBackoff  prometheus.Histogram
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
			Help: "Cluster passes by how they ended (booked, saturated, no_jobs, capped, query_error, failed, alloc_full, not_seeded, cancelled, timeout, busy: every pending job was being worked by another pass of the same cluster).",
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
		planned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_pass_planned_frames_total",
			Help: "Frames the cluster passes planned to book: those of every layer a pass's jobs offered to hosts (trimmed to the job's budget).",
		}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_pass_delivered_frames_total",
			Help: "Frames the cluster passes booked and launched, out of scheduler_pass_planned_frames_total.",
		}),
		delivery: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_pass_delivery_ratio",
			Help:    "Delivered frames over planned frames of one cluster pass that planned any.",
			Buckets: []float64{0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1},
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_passes_in_flight",
			Help: "Cluster passes running now (at most queue.stream.cluster_buffer_size).",
		}),
		jobsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_pass_jobs_in_flight",
			Help: "Jobs of running passes being worked by the matcher now (at most cluster_buffer_size x job_buffer_size).",
		}),
		errorBackoff: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_pass_error_backoff_seconds",
			Help:    "Sleep given to a cluster after a failed pass (query_error, failed) before its retry: at most queue.cluster_error_backoff_max.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60},
		}),
	}
	for _, s := range []string{"job_query", "booking"} {
		m.errors.WithLabelValues(s)
	}
	for _, r := range []Reason{Booked, Saturated, NoJobs, Capped, QueryError, Failed, AllocFull, NotSeeded, Cancelled, TimedOut, Busy} {
		m.passes.WithLabelValues(string(r))
	}
	if reg != nil {
		reg.MustRegister(m.jobsQueried, m.jobsProcessed, m.jobQuery, m.passes, m.perPass, m.errors,
			m.planned, m.delivered, m.delivery, m.inFlight, m.jobsInFlight, m.errorBackoff)
	}
	return m
}
