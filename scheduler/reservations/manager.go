package reservations

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/scheduler/hostcache"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
)

// DB is what the loop queries (a pgxpool.Pool).
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Hosts walks the hosts that could serve a layer (hostcache.Cache.EachServing).
type Hosts interface {
	EachServing(facilityID, showID string, tags []string, os string, threadable bool, fn func(hostcache.Host))
}

// Config holds the knobs (queue.reservations).
type Config struct {
	// Enabled: this instance grants reservations. Disabled, it still
	// honours and sweeps the ones others hold.
	Enabled bool
	// BlockedFor is the net blocked time a layer needs before it may
	// reserve (the bucket's threshold; 300 s).
	BlockedFor time.Duration
	// MaxGrants caps the reservations held at once, by every instance (8).
	MaxGrants int
	// MaxFraction caps the share of the hosts of an allocation that fit a
	// layer's frame (when idle) that may be reserved at once (0.5; at
	// least one host).
	MaxFraction float64
	// Timeout ends a reservation held this long (30 m).
	Timeout time.Duration
	// Interval is the loop's period: refresh from Redis, sweep, grant (1 s).
	Interval time.Duration
	// Horizon bounds how long a layer's last outcome holds without a new
	// observation (1 m; see buckets).
	Horizon time.Duration
	// Policy sizes frames (the matcher's and dispatcher's).
	Policy sizing.Policy
	// Seed seeds the grant lottery (0: random).
	Seed int64
}

// MinWidth is the width gate: a layer may reserve only if one frame needs
// at least this share of the cores of the largest host that serves it.
const MinWidth = 0.5

// Options are the dependencies of a Manager.
type Options struct {
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// Instance names this scheduler in the reservations it grants.
	Instance string
}

// Manager runs one instance's side of the reservations: it feeds the
// blocked-time buckets from the matcher (Observe), answers the matcher's
// Admit from the board's snapshot, ends a reservation when its owner runs
// on the host (OwnerBooked, from the dispatcher), and loops: refresh the
// snapshot from Redis, end reservations whose demand is gone or that timed
// out, and grant new ones to the candidates that win the lottery.
type Manager struct {
	db     DB
	hosts  Hosts
	board  *Board
	cfg    Config
	bucket *buckets
	log    hclog.Logger
	m      *metrics

	rngMu sync.Mutex
	rng   *rand.Rand
}

var (
	_ matcher.Reservations = (*Manager)(nil)
	_ dispatch.OwnerBooked = (*Manager)(nil)
)

// New returns a Manager. hosts may be nil: the instance then grants
// nothing (it still honours and sweeps).
func New(db DB, rdb redis.UniversalClient, hosts Hosts, cfg Config, o Options) *Manager {
	if cfg.BlockedFor <= 0 {
		cfg.BlockedFor = 300 * time.Second
	}
	if cfg.MaxGrants <= 0 {
		cfg.MaxGrants = 8
	}
	if cfg.MaxFraction <= 0 {
		cfg.MaxFraction = 0.5
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Horizon <= 0 {
		cfg.Horizon = time.Minute
	}
	if cfg.Policy.CoreUnit <= 0 {
		cfg.Policy.CoreUnit = 100
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	return &Manager{db: db, hosts: hosts, board: NewBoard(rdb, o.Instance), cfg: cfg,
		bucket: newBuckets(cfg.BlockedFor, cfg.Horizon), log: log.Named("reservations"), m: newMetrics(o.Registerer),
		rng: rand.New(rand.NewSource(seed))}
}

// Board returns the shared store and its snapshot.
func (m *Manager) Board() *Board { return m.board }

// Admit implements matcher.Reservations: a host without a live
// reservation, or reserved for l, admits l; a host reserved for another
// layer admits only a frame that ends (now + its worst-case runtime, from
// layer_usage) by the host's ready time. A layer with no runtime history
// never backfills. Lock-free (the snapshot).
func (m *Manager) Admit(hostID string, l *jobs.Layer, now time.Time) bool {
	r, ok := m.board.Lookup(hostID)
	if !ok || !r.Live(now) || r.Layer == l.ID {
		return true
	}
	wc := l.WorstCase()
	return wc > 0 && !now.Add(wc).After(r.ReadyAt)
}

// Observe implements matcher.Reservations: it feeds the layer's bucket.
// Only layers that could ever reserve are tracked: threadable (a frame of
// a non-threadable layer books one core), without GPUs (hosts' GPU totals
// are not known here).
func (m *Manager) Observe(c *clusters.Cluster, l *jobs.Layer, o matcher.LayerOutcome, now time.Time) {
	if !m.cfg.Enabled || !l.Threadable || l.GPUsMin > 0 || (l.CoresMin > 0 && l.CoresMin < 2*m.cfg.Policy.CoreUnit) {
		return
	}
	m.bucket.observe(c, l, o, now)
}

// OwnerBooked implements dispatch.OwnerBooked: the owner runs on its
// reserved host, so the reservation ends.
func (m *Manager) OwnerBooked(ctx context.Context, hostID, layerID string) {
	r, _ := m.board.Lookup(hostID)
	ended, _, err := m.board.End(ctx, hostID, layerID)
	if err != nil {
		m.m.errors.WithLabelValues("end").Inc()
		m.log.Warn("could not end the reservation its owner booked; the sweep or the timeout will", "host", hostID, "layer", layerID, "error", err)
		return
	}
	if ended {
		m.ended(r, EndBooked, time.Now())
	}
}

func (m *Manager) ended(r Reservation, reason string, now time.Time) {
	m.m.ended.WithLabelValues(reason).Inc()
	held := 0.0
	if !r.GrantedAt.IsZero() {
		held = now.Sub(r.GrantedAt).Seconds()
		m.m.heldFor.WithLabelValues(reason).Observe(held)
	}
	m.log.Info("reservation ended", "host", orID(r.HostName, r.Host), "layer", orID(r.LayerName, r.Layer),
		"job", orID(r.JobName, r.Job), "reason", reason, "held_s", math.Round(held*10)/10, "backfills", r.Backfills)
}

func orID(name, id string) string {
	if name != "" {
		return name
	}
	return id
}

// Run loops until ctx ends. Errors are logged and counted, never fatal.
func (m *Manager) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		if err := m.Tick(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("reservation loop", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Tick is one round: refresh the snapshot from Redis, end reservations
// whose owner's demand is gone or that timed out, grant to candidates.
func (m *Manager) Tick(ctx context.Context) error {
	now := time.Now()
	all, err := List(ctx, m.board.rdb)
	if err != nil {
		m.m.errors.WithLabelValues("refresh").Inc()
		return err
	}
	m.board.set(all, now)
	if err := m.sweep(ctx, all, now); err != nil {
		m.m.errors.WithLabelValues("sweep").Inc()
		return err
	}
	snap := m.board.snap.Load()
	m.m.held.Set(float64(len(snap.byHost)))
	var bf int64
	for _, r := range snap.byHost {
		bf += r.Backfills
	}
	m.m.backfills.Set(float64(bf))
	if !m.cfg.Enabled {
		return nil
	}
	m.m.tracked.Set(float64(m.bucket.size()))
	if err := m.grantRound(ctx, now); err != nil {
		m.m.errors.WithLabelValues("grant").Inc()
		return err
	}
	return nil
}

// set replaces the snapshot with the live reservations of rs.
func (b *Board) set(rs []Reservation, now time.Time) {
	live := make([]Reservation, 0, len(rs))
	for _, r := range rs {
		if r.Live(now) {
			live = append(live, r)
		}
	}
	b.mu.Lock()
	b.snap.Store(newSnapshot(live, now))
	b.mu.Unlock()
}

// demandSQL reads what decides whether a layer still wants a host.
const demandSQL = `
SELECT l.pk_layer, j.str_state, j.b_paused, COALESCE(ls.int_waiting_count, 0), COALESCE(jr.int_priority, 1)
  FROM layer l
  JOIN job j ON j.pk_job = l.pk_job
  LEFT JOIN layer_stat ls ON ls.pk_layer = l.pk_layer
  LEFT JOIN job_resource jr ON jr.pk_job = l.pk_job
 WHERE l.pk_layer = ANY($1)`

type demandRow struct {
	state    string
	paused   bool
	waiting  int64
	priority int64
}

// why returns the end reason for a layer's demand ("" = it still wants).
func (d *demandRow) why() string {
	switch {
	case d == nil:
		return EndGone
	case d.state != "PENDING":
		return EndJobDone
	case d.paused:
		return EndPaused
	case d.waiting <= 0:
		return EndSatisfied
	}
	return ""
}

func (m *Manager) demand(ctx context.Context, layers []string) (map[string]*demandRow, error) {
	out := map[string]*demandRow{}
	if len(layers) == 0 {
		return out, nil
	}
	rows, err := m.db.Query(ctx, demandSQL, layers)
	if err != nil {
		return nil, fmt.Errorf("reservations: demand of %d layer(s): %w", len(layers), err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var d demandRow
		if err := rows.Scan(&id, &d.state, &d.paused, &d.waiting, &d.priority); err != nil {
			return nil, fmt.Errorf("reservations: demand: %w", err)
		}
		out[id] = &d
	}
	return out, rows.Err()
}

// sweep ends the reservations that timed out or whose owner no longer
// wants a host. Any instance may end any reservation: the end script
// checks the owner, and only the call that deletes it counts it.
func (m *Manager) sweep(ctx context.Context, all []Reservation, now time.Time) error {
	if len(all) == 0 {
		return nil
	}
	var layers []string
	for _, r := range all {
		if r.Live(now) {
			layers = append(layers, r.Layer)
		}
	}
	d, err := m.demand(ctx, layers)
	if err != nil {
		return err
	}
	for _, r := range all {
		reason := EndTimeout
		if r.Live(now) {
			if reason = d[r.Layer].why(); reason == "" {
				continue
			}
		}
		ended, _, err := m.board.End(ctx, r.Host, r.Layer)
		if err != nil {
			return err
		}
		if ended {
			m.ended(r, reason, now)
		}
	}
	return nil
}

// grantRound grants reservations to the candidates, in lottery order
// (weighted by job priority, floored at 1), while the caps allow.
func (m *Manager) grantRound(ctx context.Context, now time.Time) error {
	cands := m.bucket.full(now)
	snap := m.board.snap.Load()
	kept := cands[:0]
	for _, c := range cands {
		if _, holds := snap.byLayer[c.layer.ID]; !holds {
			kept = append(kept, c)
		}
	}
	cands = kept
	m.m.candidates.Set(float64(len(cands)))
	if len(cands) == 0 {
		return nil
	}
	if len(snap.byHost) >= m.cfg.MaxGrants {
		m.m.refused.WithLabelValues(string(MaxGrants)).Add(float64(len(cands)))
		return nil
	}
	ids := make([]string, len(cands))
	for i, c := range cands {
		ids[i] = c.layer.ID
	}
	d, err := m.demand(ctx, ids)
	if err != nil {
		return err
	}
	type drawn struct {
		c   candidate
		key float64
	}
	var order []drawn
	m.rngMu.Lock()
	for _, c := range cands {
		dr := d[c.layer.ID]
		if dr.why() != "" {
			m.m.refused.WithLabelValues(refusedNoDemand).Inc()
			continue
		}
		u := m.rng.Float64()
		for u == 0 {
			u = m.rng.Float64()
		}
		// Efraimidis-Spirakis: the smallest -ln(u)/w first.
		order = append(order, drawn{c, -math.Log(u) / float64(max(dr.priority, 1))})
	}
	m.rngMu.Unlock()
	sort.Slice(order, func(i, j int) bool { return order[i].key < order[j].key })
	for _, o := range order {
		done, err := m.tryGrant(ctx, o.c, now)
		if err != nil {
			return err
		}
		if done {
			return nil // the overall cap is reached
		}
	}
	return nil
}

// want is the whole cores one frame of l asks for on a host of total cores
// (the layer minimum's sentinels resolved: 0 every core, -n all but n).
func want(l *jobs.Layer, totalCores, unit int64) int64 {
	switch {
	case l.CoresMin == 0:
		return totalCores
	case l.CoresMin < 0:
		return max(totalCores+l.CoresMin, 0)
	}
	return (l.CoresMin + unit - 1) / unit * unit
}

// tryGrant picks the host for candidate c and grants it. done reports that
// the overall cap is reached (stop the round).
func (m *Manager) tryGrant(ctx context.Context, c candidate, now time.Time) (done bool, err error) {
	if m.hosts == nil {
		return false, nil
	}
	l := &c.layer
	var tags []string
	for _, t := range c.cluster.MatchingTags(l.Tags) {
		tags = append(tags, t.Name)
	}
	// Two walks of the serving hosts, no list of them: the first finds the
	// largest (a narrow layer stops there), the second keeps the ones that
	// fit. A round asks once per candidate layer, so a list of every
	// serving host each time was most of the scheduler's heap at 10,000
	// hosts (SCALE).
	walk := func(fn func(hostcache.Host)) {
		m.hosts.EachServing(c.cluster.FacilityID, c.cluster.ShowID, tags, l.OS, l.Threadable, fn)
	}
	var largest int64
	walk(func(h hostcache.Host) { largest = max(largest, h.TotalCores) })
	if l.CoresMin > 0 && float64(l.CoresMin) < MinWidth*float64(largest) {
		m.m.refused.WithLabelValues(refusedNarrow).Inc()
		return false, nil
	}
	fitByAlloc := map[string][]string{}
	var free []hostcache.Host
	snap := m.board.snap.Load()
	walk(func(h hostcache.Host) {
		if !m.cfg.Policy.FitsIdle(h.Host, l.Shape) {
			return
		}
		fitByAlloc[h.AllocID] = append(fitByAlloc[h.AllocID], h.ID)
		if r, ok := snap.byHost[h.ID]; !ok || !r.Live(now) {
			free = append(free, h)
		}
	})
	if len(fitByAlloc) == 0 {
		m.m.refused.WithLabelValues(refusedNoFit).Inc()
		return false, nil
	}
	if len(free) == 0 {
		m.m.refused.WithLabelValues(refusedAllReserved).Inc()
		return false, nil
	}
	best, err := m.pick(ctx, l, free, now)
	if err != nil {
		return false, err
	}
	fitting := fitByAlloc[best.host.AllocID]
	maxAmong := max(1, int(math.Floor(m.cfg.MaxFraction*float64(len(fitting)))))
	r, why, err := m.board.Grant(ctx, GrantRequest{
		Reservation: Reservation{Host: best.host.ID, HostName: best.host.Name, Layer: l.ID, LayerName: l.Name,
			Job: l.JobID, JobName: l.JobName, Show: l.ShowID, Alloc: best.host.AllocID,
			Cores: want(l, best.host.TotalCores, m.cfg.Policy.Unit()), MemKB: m.cfg.Policy.MemKB(l.Shape), ReadyAt: best.ready},
		Timeout: m.cfg.Timeout, MaxGrants: m.cfg.MaxGrants, MaxAmong: maxAmong, Fitting: fitting,
	})
	if err != nil {
		return false, err
	}
	if why != "" {
		m.m.refused.WithLabelValues(string(why)).Inc()
		m.log.Debug("reservation not granted", "layer", l.Name, "job", l.JobName, "host", best.host.Name, "reason", why)
		return why == MaxGrants, nil
	}
	m.m.granted.Inc()
	m.log.Info("host reserved", "host", best.host.Name, "layer", l.Name, "job", l.JobName,
		"cores", float64(r.Cores)/float64(m.cfg.Policy.CoreUnit), "running_procs", best.procs, "must_end", best.mustEnd,
		"ready_in_s", math.Round(best.ready.Sub(now).Seconds()*10)/10, "blocked_s", math.Round(c.level.Seconds()))
	return false, nil
}

// drain is a host's projected drain for one frame.
type drain struct {
	host    hostcache.Host
	procs   int       // running procs
	mustEnd int       // procs that must end before the frame fits
	ready   time.Time // when they should have ended
}

// drainSQL: the hosts' idle values and their procs with the time each has
// run and its layer's average successful runtime (-1 without history).
const drainSQL = `
SELECT h.pk_host, h.int_cores_idle, h.int_mem_idle, p.int_cores_reserved, p.int_mem_reserved,
       EXTRACT(EPOCH FROM (now() - p.ts_dispatched))::float8,
       COALESCE(lu.int_clock_time_success::float8 / NULLIF(lu.int_frame_success_count, 0), -1)
  FROM host h
  LEFT JOIN proc p ON p.pk_host = h.pk_host
  LEFT JOIN layer_usage lu ON lu.pk_layer = p.pk_layer
 WHERE h.pk_host = ANY($1)`

// pick chooses, among hosts that fit a frame of l when idle, the one that
// drains soonest: fewest running procs, then the earliest projected ready
// time (a proc is projected to end at its layer's average runtime; one
// past it, or without history, is projected to end now, which makes the
// ready time early and backfill rare, never late).
func (m *Manager) pick(ctx context.Context, l *jobs.Layer, hosts []hostcache.Host, now time.Time) (drain, error) {
	ids := make([]string, len(hosts))
	byID := make(map[string]hostcache.Host, len(hosts))
	for i, h := range hosts {
		ids[i] = h.ID
		byID[h.ID] = h
	}
	type proc struct {
		cores, mem int64
		left       time.Duration
	}
	type hostRow struct {
		idleCores, idleMem int64
		procs              []proc
	}
	rows, err := m.db.Query(ctx, drainSQL, ids)
	if err != nil {
		return drain{}, fmt.Errorf("reservations: drain of %d host(s): %w", len(ids), err)
	}
	defer rows.Close()
	hr := map[string]*hostRow{}
	for rows.Next() {
		var id string
		var ic, im int64
		var pc, pm *int64
		var ran, avg *float64
		if err := rows.Scan(&id, &ic, &im, &pc, &pm, &ran, &avg); err != nil {
			return drain{}, fmt.Errorf("reservations: drain: %w", err)
		}
		r := hr[id]
		if r == nil {
			r = &hostRow{idleCores: ic, idleMem: im}
			hr[id] = r
		}
		if pc == nil {
			continue
		}
		p := proc{cores: *pc, mem: *pm}
		if ran != nil && avg != nil && *avg >= 0 {
			p.left = max(time.Duration((*avg-*ran)*float64(time.Second)), 0)
		}
		r.procs = append(r.procs, p)
	}
	if err := rows.Err(); err != nil {
		return drain{}, fmt.Errorf("reservations: drain: %w", err)
	}
	var out []drain
	for id, r := range hr {
		h := byID[id]
		needC := want(l, h.TotalCores, m.cfg.Policy.CoreUnit) - r.idleCores
		needM := max(l.MemMinKB, 0) - r.idleMem
		sort.Slice(r.procs, func(i, j int) bool { return r.procs[i].left < r.procs[j].left })
		d := drain{host: h, procs: len(r.procs), ready: now}
		for _, p := range r.procs {
			if needC <= 0 && needM <= 0 {
				break
			}
			needC -= p.cores
			needM -= p.mem
			d.mustEnd++
			d.ready = now.Add(p.left)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return drain{}, errors.New("reservations: none of the candidate hosts is in Postgres")
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.procs != b.procs {
			return a.procs < b.procs
		}
		if !a.ready.Equal(b.ready) {
			return a.ready.Before(b.ready)
		}
		if a.host.TotalCores != b.host.TotalCores {
			return a.host.TotalCores < b.host.TotalCores
		}
		return a.host.ID < b.host.ID
	})
	return out[0], nil
}
