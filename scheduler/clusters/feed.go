package clusters

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/shared/replication"
)

// FeedOptions configures a Feed.
type FeedOptions struct {
	Load LoadOptions
	// ReloadInterval is the safety reload: it rebuilds the cluster set
	// whatever the WAL said (reference: 120 s) and counts what it finds
	// that the WAL path missed as drift; zero disables it.
	ReloadInterval time.Duration
	// ChangeDebounce gathers the changes reported by Notify (the WAL) for
	// this long before acting on them: a burst of changes costs one reload
	// (default 150ms).
	ChangeDebounce time.Duration
	// CapsChanged, if set, runs before the clusters of shows whose caps
	// changed (per Notify) are woken, with those shows, so the woken passes
	// book against the new caps (the scheduler copies them to the
	// accounting store there). An error is logged; the clusters are woken
	// anyway.
	CapsChanged func(ctx context.Context, shows []string) error
	// VisibleWait bounds how long a flush waits for PostgreSQL to show
	// the transactions of the changes it acts on (Change.XIDs; default
	// 2 s). Past it the flush goes on without CapsChanged: a cap read
	// before its change is visible would be stamped newer than the
	// change and kept (the sidecar copies it once it is visible).
	VisibleWait time.Duration
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
	// Owns, if set, filters the clusters handed out: only those it accepts
	// (the shares this instance holds under scheduler.work_split, package
	// shard). It is called under the feed's mutex and must be cheap and
	// lock-free; call Poke when its answer changes.
	Owns func(*Cluster) bool
	// PassesPerCluster is how many passes of one cluster may be in flight
	// at once (queue.stream.passes_per_cluster; 0 or 1: one). A second
	// pass is handed out only while the cluster has more work than its
	// passes in flight hold (More), only to a worker no other cluster
	// needs, and, with OnePerAlloc, only while no other cluster of its
	// allocation waits for its turn. Its passes work disjoint jobs
	// (package loop).
	PassesPerCluster int
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
	inflight map[string]int // passes in flight per cluster
	allocs   map[string]int // passes in flight per allocation (OnePerAlloc)
	// more are in-flight clusters whose passes said there is work beyond
	// theirs (More): candidates for another pass.
	more    map[string]struct{}
	changed chan struct{} // closed and replaced on every state change
	// rewoken are clusters in flight when a WAL change woke their show:
	// the sleep their pass ends with is dropped.
	rewoken map[string]struct{}
	// pending gathers Notify's changes until the Run loop flushes them;
	// flushing is set while it does.
	pending  pendingChange
	flushing bool
	notify   chan struct{} // signalled (buffer 1) by Notify
	// vis tells when the transactions of a flushed change are visible
	// (nil without a database).
	vis *replication.Visibility
}

// pendingChange is the union of the Changes not flushed yet.
type pendingChange struct {
	reload                         bool
	shows, capShows, folders, jobs map[string]struct{}
	xids                           map[uint32]struct{}
}

func (p *pendingChange) addXIDs(xids ...uint32) {
	for _, x := range xids {
		if p.xids == nil {
			p.xids = map[uint32]struct{}{}
		}
		p.xids[x] = struct{}{}
	}
}

func (p *pendingChange) xidList() []uint32 {
	out := make([]uint32, 0, len(p.xids))
	for x := range p.xids {
		out = append(out, x)
	}
	return out
}

func (p *pendingChange) empty() bool {
	return !p.reload && len(p.shows)+len(p.capShows)+len(p.folders)+len(p.jobs) == 0
}

func addAll(m *map[string]struct{}, ids ...string) {
	for _, id := range ids {
		if id == "" {
			continue
		}
		if *m == nil {
			*m = map[string]struct{}{}
		}
		(*m)[id] = struct{}{}
	}
}

func (p *pendingChange) add(c Change) {
	p.reload = p.reload || c.Reload
	addAll(&p.shows, c.Shows...)
	addAll(&p.capShows, c.CapShows...)
	addAll(&p.folders, c.Folders...)
	addAll(&p.jobs, c.Jobs...)
	p.addXIDs(c.XIDs...)
}

func (p *pendingChange) merge(o pendingChange) {
	p.reload = p.reload || o.reload
	for _, pair := range []struct{ dst, src *map[string]struct{} }{
		{&p.shows, &o.shows}, {&p.capShows, &o.capShows}, {&p.folders, &o.folders}, {&p.jobs, &o.jobs}} {
		for id := range *pair.src {
			addAll(pair.dst, id)
		}
	}
	for x := range o.xids {
		p.addXIDs(x)
	}
}

func keys(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
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
	drift    *prometheus.CounterVec
	walWoken prometheus.Counter
	// extraPasses counts passes handed out while another pass of the
	// same cluster was in flight (PassesPerCluster).
	extraPasses prometheus.Counter
	// visWaits, visReads: flushes that waited for their changes to be
	// visible, and the snapshot reads that tell.
	visWaits, visReads prometheus.Counter
}

func newFeedMetrics(reg prometheus.Registerer) *feedMetrics {
	m := &feedMetrics{
		total: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scheduler_clusters",
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
			Help: "Cluster-set reloads, by trigger (wal: changes the WAL reported; safety: queue.cluster_reload_interval) and result (unchanged, swapped or error).",
		}, []string{"trigger", "result"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_cluster_set_drift_total",
			Help: "Clusters a safety reload found added, removed or changed (its tags) that the WAL path had missed, by change.",
		}, []string{"change"}),
		walWoken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_clusters_wal_woken_total",
			Help: "Sleeping clusters handed out before their sleep ended because the WAL changed their show (flags, subscriptions, caps).",
		}),
		extraPasses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_cluster_extra_passes_total",
			Help: "Passes handed out while another pass of the same cluster was in flight (queue.stream.passes_per_cluster): a cluster with more work than one pass holds.",
		}),
		visWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_clusters_visibility_waits_total",
			Help: "Flushes of WAL changes that waited for PostgreSQL to show the transactions they act on (streamed once flushed, visible a moment later).",
		}),
		visReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scheduler_clusters_visibility_snapshot_reads_total",
			Help: "Snapshot reads (txid_current_snapshot) that tell whether the transactions of WAL changes are visible yet.",
		}),
	}
	// Every labelled series exists from start-up at zero (issue #26).
	for _, r := range []string{"ok", "error"} {
		m.scans.WithLabelValues(r)
	}
	for _, t := range []string{triggerWAL, triggerSafety} {
		for _, r := range []string{"unchanged", "swapped", "error"} {
			m.reloads.WithLabelValues(t, r)
		}
	}
	for _, c := range []string{"added", "removed", "changed"} {
		m.drift.WithLabelValues(c)
	}
	if reg != nil {
		reg.MustRegister(m.total, m.active, m.sleeping, m.woken, m.scans, m.scanDur, m.reloads, m.drift, m.walWoken, m.extraPasses, m.visWaits, m.visReads)
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
	if o.ChangeDebounce <= 0 {
		o.ChangeDebounce = 150 * time.Millisecond
	}
	if o.VisibleWait <= 0 {
		o.VisibleWait = 2 * time.Second
	}
	f := &Feed{
		db:       db,
		opts:     o,
		log:      log.Named("clusters"),
		m:        newFeedMetrics(o.Registerer),
		sleeping: map[string]nap{},
		inflight: map[string]int{},
		allocs:   map[string]int{},
		more:     map[string]struct{}{},
		changed:  make(chan struct{}),
		rewoken:  map[string]struct{}{},
		notify:   make(chan struct{}, 1),
	}
	if db != nil {
		f.vis = replication.NewVisibility(db, replication.VisibilityOptions{Logger: f.log,
			Waits: f.m.visWaits, Reads: f.m.visReads, What: "the cluster feed's reads"})
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "scheduler_clusters_ready",
				Help: "The wake-up queue: awake clusters whose sleep is over (or whose watch moved) waiting for a free worker, counted at scrape time.",
			}, func() float64 { return float64(f.ready(time.Now())) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "scheduler_clusters_in_flight",
				Help: "Clusters handed to a worker whose pass has not ended.",
			}, func() float64 {
				f.mu.Lock()
				defer f.mu.Unlock()
				return float64(len(f.inflight))
			}))
	}
	return f
}

// ready counts the clusters Next could hand out now: awake, not in flight,
// not sleeping (or their sleep is over or their watch moved), and, with
// OnePerAlloc, their allocation free.
func (f *Feed) ready(now time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.active {
		if f.inflight[c.key] > 0 {
			continue
		}
		if a := c.AllocID(); a != "" && f.opts.OnePerAlloc {
			if f.allocs[a] > 0 {
				continue
			}
		}
		if z, ok := f.sleeping[c.key]; ok && now.Before(z.until) && (z.wake == nil || !z.wake.Moved()) {
			continue
		}
		n++
	}
	return n
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
		extra    *Cluster // an in-flight cluster with more work (PassesPerCluster)
		extraIdx int
		blocked  map[string]bool // allocations another cluster waits for (OnePerAlloc)
	)
	n := len(f.active)
	for i := 0; i < n; i++ {
		idx := (f.next + i) % n
		c := f.active[idx]
		if f.opts.Owns != nil && !f.opts.Owns(c) {
			continue
		}
		if k := f.inflight[c.key]; k > 0 {
			if _, ok := f.more[c.key]; ok && extra == nil && k < f.opts.PassesPerCluster {
				if z, ok := f.sleeping[c.key]; !ok || !now.Before(z.until) {
					extra, extraIdx = c, idx
				}
			}
			continue
		}
		if a := c.AllocID(); a != "" && f.opts.OnePerAlloc {
			if f.allocs[a] > 0 {
				if z, ok := f.sleeping[c.key]; !ok || !now.Before(z.until) || (z.wake != nil && z.wake.Moved()) {
					if blocked == nil {
						blocked = map[string]bool{}
					}
					blocked[a] = true
				}
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
	if best == nil && extra != nil && f.opts.OnePerAlloc && blocked[extra.AllocID()] {
		// Another show's cluster waits for this allocation: let the
		// passes in flight drain so it gets its turn.
		extra = nil
	}
	if best == nil && extra == nil {
		return nil, earliest
	}
	if best == nil {
		best, bestIdx = extra, extraIdx
		f.m.extraPasses.Inc()
	}
	f.inflight[best.key]++
	if a := best.AllocID(); a != "" && f.opts.OnePerAlloc {
		f.allocs[a]++
	}
	f.next = bestIdx + 1
	f.m.sleeping.Set(float64(len(f.sleeping)))
	return best, time.Time{}
}

// More says whether the passes of c in flight leave work for another pass
// (a pass that found a full page of jobs says true; one that found fewer,
// or none beyond the other passes' jobs, says false). Only a cluster in
// flight keeps the mark; its last pass ending clears it.
func (f *Feed) More(c *Cluster, more bool) {
	if f.opts.PassesPerCluster < 2 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !more || f.inflight[c.key] == 0 {
		delete(f.more, c.key)
		return
	}
	if _, ok := f.more[c.key]; !ok {
		f.more[c.key] = struct{}{}
		f.broadcast()
	}
}

// Done returns a cluster handed out by Next. A positive sleep keeps it from
// being handed out again for that long.
func (f *Feed) Done(c *Cluster, sleep time.Duration) { f.DoneWatch(c, sleep, nil) }

// DoneWatch is Done with a watch that ends the sleep early: once wake has
// moved, the cluster is handed out again at the next Next that looks at it
// (Poke makes waiting Next calls look). wake nil is Done.
func (f *Feed) DoneWatch(c *Cluster, sleep time.Duration, wake Watch) {
	f.DonePass(c, sleep, wake, false)
}

// DonePass is DoneWatch for a pass that says whether it booked: a booking
// pass (with no sleep) also ends a sleep another pass of the same cluster
// ended with while it ran (PassesPerCluster).
func (f *Feed) DonePass(c *Cluster, sleep time.Duration, wake Watch, booked bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inflight[c.key]--; f.inflight[c.key] <= 0 {
		delete(f.inflight, c.key)
		delete(f.more, c.key)
	}
	if a := c.AllocID(); a != "" && f.allocs[a] > 0 {
		if f.allocs[a]--; f.allocs[a] == 0 {
			delete(f.allocs, a)
		}
	}
	if _, ok := f.rewoken[c.key]; ok {
		// The WAL changed the show while this pass ran (possibly after
		// its queries): look again rather than sleep on a stale answer.
		delete(f.rewoken, c.key)
		sleep = 0
	}
	switch {
	case sleep > 0:
		f.sleeping[c.key] = nap{until: time.Now().Add(sleep), wake: wake}
		delete(f.more, c.key)
	case booked:
		// A pass that booked overrides a sleep another pass of the same
		// cluster ended with meanwhile.
		delete(f.sleeping, c.key)
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

// InFlight returns the clusters handed out by Next and not yet Done.
func (f *Feed) InFlight() []*Cluster {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*Cluster, 0, len(f.inflight))
	for _, c := range f.universe {
		if _, ok := f.inflight[c.key]; ok {
			out = append(out, c)
		}
	}
	return out
}

// Active returns the clusters the awake gate lets through.
func (f *Feed) Active() []*Cluster {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Cluster(nil), f.active...)
}

// Reload triggers.
const (
	triggerWAL    = "wal"
	triggerSafety = "safety"
)

// Reload is the safety reload: it re-reads the cluster set and swaps it in
// if it changed as a set, keeping the sleep state of surviving clusters,
// and reports whether it swapped. What it finds changed while no change
// reported by Notify is waiting to be flushed is drift: the WAL path
// missed it (scheduler_cluster_set_drift_total, and a warning).
func (f *Feed) Reload(ctx context.Context) (bool, error) {
	return f.reload(ctx, triggerSafety)
}

func (f *Feed) reload(ctx context.Context, trigger string) (bool, error) {
	cs, err := Load(ctx, f.db, f.opts.Load)
	if err != nil {
		f.m.reloads.WithLabelValues(trigger, "error").Inc()
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sameSet(f.universe, cs) {
		f.m.reloads.WithLabelValues(trigger, "unchanged").Inc()
		return false, nil
	}
	added, removed := diffSets(f.universe, cs)
	if trigger == triggerSafety && f.pending.empty() && !f.flushing {
		d := classify(added, removed)
		f.m.drift.WithLabelValues("added").Add(float64(d.added))
		f.m.drift.WithLabelValues("removed").Add(float64(d.removed))
		f.m.drift.WithLabelValues("changed").Add(float64(d.changed))
		f.log.Warn("cluster set drift: the safety reload found changes the WAL did not report",
			"added", d.added, "removed", d.removed, "changed", d.changed, "examples", examples(added, removed))
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
	f.log.Info("cluster set changed", "trigger", trigger, "before", len(f.universe), "after", len(cs),
		"added", len(added), "removed", len(removed))
	f.universe = cs
	f.active = f.gate(cs)
	f.next = 0
	f.m.reloads.WithLabelValues(trigger, "swapped").Inc()
	f.publish()
	f.broadcast()
	return true, nil
}

// diffSets lists the clusters of b not in a (added) and of a not in b
// (removed); both are sorted by key.
func diffSets(a, b []*Cluster) (added, removed []*Cluster) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].key < b[j].key):
			removed = append(removed, a[i])
			i++
		case i == len(a) || b[j].key < a[i].key:
			added = append(added, b[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}

// setDiff counts a reload's differences: a cluster removed and one added
// for the same (facility, show, tag type) are one changed cluster (its
// tags changed: a host tag added to a chunk, an allocation's tag renamed).
type setDiff struct{ added, removed, changed int }

func classify(added, removed []*Cluster) setDiff {
	type group struct {
		facility, show string
		typ            TagType
	}
	n := map[group]int{}
	for _, c := range added {
		n[group{c.FacilityID, c.ShowID, c.Type()}]++
	}
	var d setDiff
	for _, c := range removed {
		g := group{c.FacilityID, c.ShowID, c.Type()}
		if n[g] > 0 {
			n[g]--
			d.changed++
		} else {
			d.removed++
		}
	}
	d.added = len(added) - d.changed
	return d
}

// examples names a few drifted clusters for the log.
func examples(added, removed []*Cluster) string {
	var out []string
	for _, c := range added {
		if len(out) == 3 {
			break
		}
		out = append(out, "+"+c.key)
	}
	for _, c := range removed {
		if len(out) == 6 {
			break
		}
		out = append(out, "-"+c.key)
	}
	return strings.Join(out, " ")
}

// Notify reports what the WAL changed (the Follower calls it). The Run
// loop acts on the changes gathered over FeedOptions.ChangeDebounce: it
// reloads the set if one asked for it, copies the changed caps
// (CapsChanged), runs the awake scan and ends the sleeps of the clusters
// of the shows concerned, including a pass in flight (it goes round again
// instead of sleeping). Notify does not block.
func (f *Feed) Notify(c Change) {
	if c.empty() {
		return
	}
	f.mu.Lock()
	f.pending.add(c)
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

// Flush acts at once on the changes Notify gathered (Run does it after
// the debounce; tests call it directly).
func (f *Feed) Flush(ctx context.Context) error {
	f.mu.Lock()
	p := f.pending
	f.pending = pendingChange{}
	f.flushing = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.flushing = false
		f.mu.Unlock()
	}()
	if p.empty() {
		return nil
	}
	requeue := func(q pendingChange) {
		f.mu.Lock()
		f.pending.merge(q)
		f.mu.Unlock()
	}
	// Everything below reads Postgres: first let it show what the WAL
	// said. A change still invisible after VisibleWait (a synchronous
	// standby that does not confirm) is acted on without copying caps.
	capsReadable := true
	if f.vis != nil && len(p.xids) > 0 {
		vctx, cancel := context.WithTimeout(ctx, f.opts.VisibleWait)
		err := f.vis.Await(vctx, p.xidList()...)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				requeue(p)
				return ctx.Err()
			}
			capsReadable = false
			f.log.Warn("changes streamed from the WAL are not visible in PostgreSQL yet; acting on them without copying their caps to the accounting store (the sidecar copies them once visible)",
				"waited", f.opts.VisibleWait, "error", err)
		}
	}
	if p.reload && f.db != nil {
		if _, err := f.reload(ctx, triggerWAL); err != nil {
			requeue(p)
			return fmt.Errorf("cluster reload: %w", err)
		}
	}
	shows, capShows := p.shows, p.capShows
	var ferr error
	if len(p.folders)+len(p.jobs) > 0 && f.db != nil {
		more, err := showsOf(ctx, f.db, keys(p.folders), keys(p.jobs))
		if err != nil {
			requeue(pendingChange{folders: p.folders, jobs: p.jobs})
			ferr = fmt.Errorf("shows of changed folder and job caps: %w", err)
		}
		addAll(&shows, more...)
		addAll(&capShows, more...)
	}
	if len(capShows) > 0 && f.opts.CapsChanged != nil && capsReadable {
		if err := f.opts.CapsChanged(ctx, keys(capShows)); err != nil && ctx.Err() == nil {
			f.log.Warn("copying changed caps to the accounting store failed; waking the clusters anyway (the sidecar and the limit reseed copy them too)",
				"shows", len(capShows), "error", err)
		}
	}
	if f.db != nil && f.opts.ScanInterval > 0 {
		// New clusters, or a burst raised from 0, must not wait for the
		// next scan to be let through.
		if err := f.Scan(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("awake scan after a WAL change failed", "error", err)
		}
	}
	f.wakeShows(shows)
	return ferr
}

// wakeShows ends the sleeps of the clusters of shows; their clusters in
// flight will not sleep after their pass either.
func (f *Feed) wakeShows(shows map[string]struct{}) {
	if len(shows) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.universe {
		if _, ok := shows[c.ShowID]; !ok {
			continue
		}
		if _, ok := f.sleeping[c.key]; ok {
			delete(f.sleeping, c.key)
			n++
		}
		if _, ok := f.inflight[c.key]; ok {
			f.rewoken[c.key] = struct{}{}
		}
	}
	f.m.walWoken.Add(float64(n))
	f.publish()
	f.broadcast()
}

// showsOfSQL maps changed folders and jobs to their shows.
const showsOfSQL = `
SELECT pk_show FROM folder WHERE pk_folder = ANY($1::text[])
UNION
SELECT pk_show FROM job WHERE pk_job = ANY($2::text[])`

func showsOf(ctx context.Context, db DB, folders, jobs []string) ([]string, error) {
	rows, err := db.Query(ctx, showsOfSQL, folders, jobs)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
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

// Run keeps the cluster set and the awake gate fresh until ctx ends: it
// acts on the changes Notify reports (after FeedOptions.ChangeDebounce;
// a failed flush is retried after a second or the debounce, whichever is
// longer), runs the safety reload every ReloadInterval and the awake scan
// every ScanInterval.
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
	var debounce *time.Timer
	var fire <-chan time.Time
	// A flush waits the debounce, and at least four times as long as the
	// last one took after its end, so a storm of changes on a big farm
	// cannot keep the database busy reloading more than a fifth of the
	// time.
	var lastEnd time.Time
	var lastDur time.Duration
	arm := func(d time.Duration) {
		if debounce != nil {
			debounce.Stop()
		}
		debounce = time.NewTimer(d)
		fire = debounce.C
	}
	defer func() {
		if debounce != nil {
			debounce.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.notify:
			if fire == nil {
				arm(max(f.opts.ChangeDebounce, time.Until(lastEnd.Add(4*lastDur))))
			}
		case <-fire:
			fire = nil
			start := time.Now()
			err := f.Flush(ctx)
			lastEnd, lastDur = time.Now(), time.Since(start)
			if err != nil && ctx.Err() == nil {
				f.log.Warn("acting on cluster changes from the WAL failed; retrying", "error", err)
				arm(max(time.Second, f.opts.ChangeDebounce))
			}
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
