package clusters

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// FeedOptions configures a Feed.
type FeedOptions struct {
	Load LoadOptions
	// ReloadInterval rebuilds the cluster set (reference: 120 s); zero
	// disables reloading.
	ReloadInterval time.Duration
	// ScanInterval runs the awake scan (reference: 2 s); zero disables the
	// gate, so every cluster is always awake.
	ScanInterval time.Duration
	Logger       hclog.Logger
	Registerer   prometheus.Registerer
	// Rank, if set, orders the clusters ready to be handed out: the lowest
	// rank goes first, ties round-robin (the show tiers, package tiers).
	// It is called under the feed's mutex and must be cheap and lock-free.
	Rank func(*Cluster) float64
	// OnePerAlloc keeps at most one allocation cluster of each allocation
	// in flight, so the passes of the shows sharing an allocation take
	// turns in Rank order: the lowest-ranked show gets first pick of the
	// capacity that appeared, and only what it leaves goes to the next.
	OnePerAlloc bool
}

// Feed hands clusters to pipeline workers round-robin; see the package doc.
// It is safe for concurrent use.
type Feed struct {
	db   DB
	opts FeedOptions
	log  hclog.Logger
	m    *feedMetrics

	mu       sync.Mutex
	universe []*Cluster
	active   []*Cluster
	lastScan map[activeKey]struct{} // nil: gate off or never scanned
	next     int
	sleeping map[string]nap
	inflight map[string]struct{}
	allocs   map[string]struct{} // allocations with a cluster in flight (OnePerAlloc)
	changed  chan struct{}       // closed and replaced on every state change
}

// nap is a sleeping cluster: until when, and what may end it early.
type nap struct {
	until time.Time
	wake  Watch // nil: only the time
}

// Watch ends a cluster's sleep early once Moved reports true (the host
// cache's capacity watch of the cluster's groups). Moved must be cheap and
// lock-free: the feed calls it under its mutex, for every sleeping cluster,
// whenever it is poked.
type Watch interface {
	Moved() bool
}

type feedMetrics struct {
	total    *prometheus.GaugeVec
	active   prometheus.Gauge
	sleeping prometheus.Gauge
	woken    prometheus.Counter
	scans    *prometheus.CounterVec
	scanDur  prometheus.Histogram
	reloads  *prometheus.CounterVec
}

func newFeedMetrics(reg prometheus.Registerer) *feedMetrics {
	m := &feedMetrics{
		total: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scheduler_clusters_total",
			Help: "Clusters in the loaded cluster set, by type.",
		}, []string{"cluster_type"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_clusters_active",
			Help: "Clusters the awake scan found waiting work for.",
		}),
		sleeping: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scheduler_clusters_sleeping",
			Help: "Clusters currently sleeping after an empty or saturated pass.",
		}),
		woken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_clusters_woken_total",
			Help: "Sleeping clusters handed out before their sleep ended because hosts of theirs gained capacity.",
		}),
		scans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_active_scans_total",
			Help: "Awake scans run, by result (ok or error).",
		}, []string{"result"}),
		scanDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scheduler_active_scan_duration_seconds",
			Help:    "Latency of the awake scan query.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_cluster_reloads_total",
			Help: "Cluster-set reloads, by result (unchanged, swapped or error).",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.total, m.active, m.sleeping, m.woken, m.scans, m.scanDur, m.reloads)
	}
	return m
}

// NewFeed loads the cluster set and runs the first awake scan. If that scan
// fails the feed starts fully awake (it can only cost queries, never hide
// work). Call Run to keep the set and the gate fresh.
func NewFeed(ctx context.Context, db DB, o FeedOptions) (*Feed, error) {
	f := newFeed(db, o)
	cs, err := Load(ctx, db, o.Load)
	if err != nil {
		return nil, err
	}
	f.universe = cs
	f.active = cs
	if o.ScanInterval > 0 {
		if err := f.Scan(ctx); err != nil {
			f.log.Warn("initial awake scan failed; starting with every cluster awake", "error", err)
		}
	}
	f.publish()
	f.log.Info("cluster set loaded", "clusters", len(cs), "awake", len(f.active))
	return f, nil
}

// NewStaticFeed serves a fixed list of clusters, all awake, with no reload
// and no scan (tests and tools).
func NewStaticFeed(cs []*Cluster, o FeedOptions) *Feed {
	o.ReloadInterval, o.ScanInterval = 0, 0
	f := newFeed(nil, o)
	list := append([]*Cluster(nil), cs...)
	sortClusters(list)
	f.universe, f.active = list, list
	f.publish()
	return f
}

func newFeed(db DB, o FeedOptions) *Feed {
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Feed{
		db:       db,
		opts:     o,
		log:      log.Named("clusters"),
		m:        newFeedMetrics(o.Registerer),
		sleeping: map[string]nap{},
		inflight: map[string]struct{}{},
		allocs:   map[string]struct{}{},
		changed:  make(chan struct{}),
	}
}

// broadcast wakes every Next waiting for a state change. Call with mu held.
func (f *Feed) broadcast() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// publish updates the gauges. Call with mu held or before sharing f.
func (f *Feed) publish() {
	byType := map[TagType]int{Alloc: 0, Manual: 0, Hostname: 0, Hardware: 0}
	for _, c := range f.universe {
		byType[c.Type()]++
	}
	for t, n := range byType {
		f.m.total.WithLabelValues(t.Label()).Set(float64(n))
	}
	f.m.active.Set(float64(len(f.active)))
	f.m.sleeping.Set(float64(len(f.sleeping)))
}

// Next blocks until a cluster is awake, not sleeping and not in flight, and
// returns it marked in flight. The caller must hand it back with Done.
func (f *Feed) Next(ctx context.Context) (*Cluster, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		f.mu.Lock()
		c, earliest := f.pick(time.Now())
		if c != nil {
			f.mu.Unlock()
			return c, nil
		}
		changed := f.changed
		f.mu.Unlock()

		var timer *time.Timer
		var fire <-chan time.Time
		if !earliest.IsZero() {
			timer = time.NewTimer(time.Until(earliest))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil, ctx.Err()
		case <-changed:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// pick chooses the next cluster to hand out and marks it in flight, or
// returns nil and the earliest time a sleeping candidate wakes. Call with
// mu held.
func (f *Feed) pick(now time.Time) (*Cluster, time.Time) {
	var (
		earliest time.Time
		best     *Cluster
		bestIdx  int
		bestRank float64
	)
	n := len(f.active)
	for i := 0; i < n; i++ {
		idx := (f.next + i) % n
		c := f.active[idx]
		if _, busy := f.inflight[c.key]; busy {
			continue
		}
		if a := c.AllocID(); a != "" && f.opts.OnePerAlloc {
			if _, busy := f.allocs[a]; busy {
				continue
			}
		}
		if z, ok := f.sleeping[c.key]; ok {
			if now.Before(z.until) {
				if z.wake == nil || !z.wake.Moved() {
					if earliest.IsZero() || z.until.Before(earliest) {
						earliest = z.until
					}
					continue
				}
				f.m.woken.Inc()
			}
			delete(f.sleeping, c.key)
		}
		if f.opts.Rank == nil {
			best, bestIdx = c, idx
			break
		}
		if r := f.opts.Rank(c); best == nil || r < bestRank {
			best, bestIdx, bestRank = c, idx, r
		}
	}
	if best == nil {
		return nil, earliest
	}
	f.inflight[best.key] = struct{}{}
	if a := best.AllocID(); a != "" && f.opts.OnePerAlloc {
		f.allocs[a] = struct{}{}
	}
	f.next = bestIdx + 1
	f.m.sleeping.Set(float64(len(f.sleeping)))
	return best, time.Time{}
}

// Done returns a cluster handed out by Next. A positive sleep keeps it from
// being handed out again for that long.
func (f *Feed) Done(c *Cluster, sleep time.Duration) { f.DoneWatch(c, sleep, nil) }

// DoneWatch is Done with a watch that ends the sleep early: once wake has
// moved, the cluster is handed out again at the next Next that looks at it
// (Poke makes waiting Next calls look). wake nil is Done.
func (f *Feed) DoneWatch(c *Cluster, sleep time.Duration, wake Watch) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.inflight, c.key)
	if a := c.AllocID(); a != "" {
		delete(f.allocs, a)
	}
	if sleep > 0 {
		f.sleeping[c.key] = nap{until: time.Now().Add(sleep), wake: wake}
	}
	f.m.sleeping.Set(float64(len(f.sleeping)))
	f.broadcast()
}

// Poke makes every waiting Next look again at the sleeping clusters'
// watches (call it when some may have moved: the host cache's
// CapacityChanged). It changes no state.
func (f *Feed) Poke() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broadcast()
}

// WakeAll forgets every sleep (tests, and operators via a signal).
func (f *Feed) WakeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.sleeping)
	f.publish()
	f.broadcast()
}

// Clusters returns the loaded cluster set.
func (f *Feed) Clusters() []*Cluster {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Cluster(nil), f.universe...)
}

// Active returns the clusters the awake gate lets through.
func (f *Feed) Active() []*Cluster {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Cluster(nil), f.active...)
}

// Reload re-reads the cluster set and swaps it in if it changed as a set,
// keeping the sleep state of surviving clusters. It reports whether it
// swapped.
func (f *Feed) Reload(ctx context.Context) (bool, error) {
	cs, err := Load(ctx, f.db, f.opts.Load)
	if err != nil {
		f.m.reloads.WithLabelValues("error").Inc()
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sameSet(f.universe, cs) {
		f.m.reloads.WithLabelValues("unchanged").Inc()
		return false, nil
	}
	keep := make(map[string]struct{}, len(cs))
	for _, c := range cs {
		keep[c.key] = struct{}{}
	}
	for k := range f.sleeping {
		if _, ok := keep[k]; !ok {
			delete(f.sleeping, k)
		}
	}
	f.log.Info("cluster set changed", "before", len(f.universe), "after", len(cs))
	f.universe = cs
	f.active = f.gate(cs)
	f.next = 0
	f.m.reloads.WithLabelValues("swapped").Inc()
	f.publish()
	f.broadcast()
	return true, nil
}

// gate filters cs by the last awake scan. Call with mu held.
func (f *Feed) gate(cs []*Cluster) []*Cluster {
	if f.lastScan == nil {
		return cs
	}
	out := make([]*Cluster, 0, len(cs))
	for _, c := range cs {
		if isAwake(c, f.lastScan) {
			out = append(out, c)
		}
	}
	return out
}

// Scan runs the awake scan and recomputes the active list. Clusters that
// left it lose their sleep, so work arriving later is seen at the next scan.
// On error the previous active list is kept.
func (f *Feed) Scan(ctx context.Context) error {
	start := time.Now()
	scan, err := scanActive(ctx, f.db, f.opts.Load.FacilityID)
	f.m.scanDur.Observe(time.Since(start).Seconds())
	if err != nil {
		f.m.scans.WithLabelValues("error").Inc()
		return err
	}
	f.m.scans.WithLabelValues("ok").Inc()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastScan = scan
	active := f.gate(f.universe)
	awake := make(map[string]struct{}, len(active))
	for _, c := range active {
		awake[c.key] = struct{}{}
	}
	for k := range f.sleeping {
		if _, ok := awake[k]; !ok {
			delete(f.sleeping, k)
		}
	}
	grew := len(active) > 0 && len(f.active) == 0
	if !sameSet(f.active, active) {
		f.active = active
		if f.next > len(active) {
			f.next = 0
		}
	}
	if grew {
		f.log.Debug("awake set no longer empty", "awake", len(active))
	}
	f.publish()
	f.broadcast()
	return nil
}

// Run keeps the cluster set and the awake gate fresh until ctx ends.
func (f *Feed) Run(ctx context.Context) error {
	var reload, scan <-chan time.Time
	if f.db != nil && f.opts.ReloadInterval > 0 {
		t := time.NewTicker(f.opts.ReloadInterval)
		defer t.Stop()
		reload = t.C
	}
	if f.db != nil && f.opts.ScanInterval > 0 {
		t := time.NewTicker(f.opts.ScanInterval)
		defer t.Stop()
		scan = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-reload:
			if _, err := f.Reload(ctx); err != nil && ctx.Err() == nil {
				f.log.Warn("cluster reload failed; keeping the current set", "error", err)
			}
		case <-scan:
			if err := f.Scan(ctx); err != nil && ctx.Err() == nil {
				f.log.Warn("awake scan failed; keeping the current awake set", "error", err)
			}
		}
	}
}
