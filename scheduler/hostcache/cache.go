package hostcache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/cuesched/cuesched/shared/replication"
)

var (
	// ErrNoCandidate means no cached host fits the request.
	ErrNoCandidate = errors.New("hostcache: no host candidate")
	// ErrNotReady means the initial snapshot has not been loaded yet.
	ErrNotReady = errors.New("hostcache: initial snapshot not loaded yet")
)

// Config configures a Cache.
type Config struct {
	// ConnString is the Cuebot database (an ordinary URL; the replication
	// connection is derived from it).
	ConnString string
	// Publication is the publication to stream (cuesched_hostcache).
	Publication string
	// SlotName is the temporary slot's name; empty picks a unique one.
	SlotName string
	// MemoryKeyDivisor is the memory bucket size in bytes (2 GiB).
	MemoryKeyDivisor int64
	// GroupIdleTimeout evicts a group nobody checked out of for this long
	// (3 h); it is rebuilt from the mirror, without a query, on next use.
	GroupIdleTimeout time.Duration
	// Strategy is the booking strategy; nil means DefaultStrategy()
	// (best-fit cores, worst-fit memory).
	Strategy *HostBookingStrategy
	// AssumeTTL bounds how long checked-in idle values are assumed before
	// the WAL confirms them (10 s, the reference's reservation expiry).
	AssumeTTL time.Duration
	// LeaseTimeout returns a host that was checked out and never checked in
	// (a leaked checkout) to the index (10 min).
	LeaseTimeout time.Duration
	// StatusInterval is the replication status/keepalive interval (5 s).
	StatusInterval time.Duration
	// Placement, when set, scores a bounded candidate set (E-PVM, see
	// Placement) instead of taking the first host of the strategy's walk;
	// nil is the first fit (round 1). DefaultConfig sets
	// DefaultPlacement().
	Placement *Placement
	// WarmFrames is how many frames of other layers a host may book before
	// it stops being warm for a layer (8; see locality.go).
	WarmFrames int
}

func ptr[T any](v T) *T { return &v }

// DefaultConfig returns the defaults for connString.
func DefaultConfig(connString string) Config {
	return Config{
		ConnString: connString, Publication: "cuesched_hostcache", MemoryKeyDivisor: 2 << 30,
		GroupIdleTimeout: 3 * time.Hour, Strategy: ptr(DefaultStrategy()), AssumeTTL: 10 * time.Second,
		LeaseTimeout: 10 * time.Minute, StatusInterval: 5 * time.Second,
		Placement: ptr(DefaultPlacement()), WarmFrames: 8,
	}
}

// Options are a Cache's dependencies.
type Options struct {
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// Now is the clock (tests); defaults to time.Now.
	Now func() time.Time
	// Tap, if set, also sees the stream the cache consumes (the cluster
	// feed follows the cluster-relevant tables through it).
	Tap Tap
}

// Tap observes the cache's replication stream. TapSnapshot runs inside
// every snapshot transaction, after the cache read its own rows (an error
// fails the snapshot, which is retried); TapApply gets every committed
// transaction the cache applied, after it applied it, outside the cache's
// mutex. Both run on the stream's goroutine: keep them quick.
type Tap interface {
	TapSnapshot(ctx context.Context, q replication.SnapshotQuerier) error
	TapApply(txn *replication.Transaction)
}

// Host is a snapshot of one cached host as the scheduler sees it: the
// booking's host (sizing.Host: identity, thread mode, totals and idle
// values, the requesting layer's cores) plus what only the cache knows.
// Cores are centicores, memory KB, as in Cuebot's tables. KeepCores and
// KeepMemKB are always zero here.
type Host struct {
	sizing.Host
	AllocName  string
	FacilityID string
	// TotalGPUs and TotalGPUMemKB are host.int_gpus and host.int_gpu_mem.
	TotalGPUs     int64
	TotalGPUMemKB int64
	// AllocAvailableCores is the requesting show's subscription headroom on
	// the host's allocation: int_burst − int_cores (centicores).
	AllocAvailableCores int64
	LastPing            time.Time
	// LSN is the commit LSN of the last WAL change to the host's rows;
	// Version counts every change to the host (WAL or check-in).
	LSN     replication.LSN
	Version uint64
	// Locality is the host's locality for the request's layer (see
	// locality.go; Host.LayerCores is that layer's cores there, an
	// estimate); zero without a layer (Lookup).
	Locality Locality
}

// Profile is what a layer needs from a host: the floors (centicores, KB,
// devices, KB) and the compatibility gates.
type Profile struct {
	CoresMin    int64
	MemMinKB    int64
	GPUsMin     int64
	GPUMemMinKB int64
	// OS is the job's OS; "" accepts any host. Otherwise it must equal one
	// of the values of the host's OS, which Cuebot reads as a
	// comma-separated list ("rhel7,rhel9" serves both; cuebot.ServesOS).
	OS string
	// Threadable: hosts in thread mode ALL only accept threadable layers.
	Threadable bool
}

// Fits is the validation every checkout applies: the OS gate, the thread-mode
// gate, and the floors on cores, memory, GPUs and GPU memory.
func Fits(h Host, p Profile) bool {
	return cuebot.HostServesOS(h.OS, p.OS) && fitsResources(h, p)
}

// fitsResources is Fits without the OS gate (a checkout tests the OS on
// the host's pre-split list).
func fitsResources(h Host, p Profile) bool {
	if h.ThreadMode == int(cuebot.ThreadAll) && !p.Threadable {
		return false
	}
	return h.IdleCores >= p.CoresMin && h.IdleMemKB >= p.MemMinKB &&
		h.IdleGPUs >= p.GPUsMin && h.IdleGPUMemKB >= p.GPUMemMinKB
}

// Request asks for one host.
type Request struct {
	FacilityID, ShowID string
	// Tags are probed in order (the caller sorts them MANUAL, HOSTNAME,
	// HARDWARE, ALLOC); each is one group.
	Tags []string
	Profile
	// Accept, if set, must also accept the host (e.g. "a frame fits by the
	// reservation rules").
	Accept func(Host) bool
	// Strategy overrides the cache's default when set.
	Strategy *HostBookingStrategy
	// LayerID is the requesting layer: the host view carries its Locality
	// and LayerCores, and Placement's locality bonus favours its hosts.
	LayerID string
}

type lease struct {
	at     time.Time
	handed idle   // the values Checkout returned
	seen   []idle // host-row idle values the WAL applied while out
	many   bool   // seen overflowed: the WAL moved on a lot
}

const maxSeen = 16

type assumption struct {
	v     idle
	until time.Time
}

// Cache is the replication-fed host cache. It is safe for concurrent use.
type Cache struct {
	cfg  Config
	log  hclog.Logger
	now  func() time.Time
	m    *metrics
	repl *replication.Metrics
	tap  Tap

	mu          sync.Mutex
	st          *state
	groups      map[ClusterKey]*group
	leases      map[string]*lease // by host id; survives re-snapshots
	assumedList []*hostRec
	freeList    *btree.FreeListG[memItem]
	changed     chan struct{}
	watched     bool // someone holds changed: close it on the next change
	capChanged  chan struct{}
	capWatched  bool // someone holds capChanged: close it on the next bump
	// ignored logs the relations whose changes were ignored (not the
	// mirrored tables) once each.
	ignored replication.Ignored
	// buildGen counts group builds; Cache.Watch includes it (see there).
	buildGen atomic.Uint64
	// layerHosts are, per layer, the hosts it is live or warm on
	// (locality.go); pickSeq numbers the placements, cands, costs and locs
	// are their reusable buffers (placement.go).
	layerHosts map[string][]*hostRec
	pickSeq    uint64
	cands      []candidate
	costs      []float64
	locs       []int

	ready     chan struct{}
	readyOnce sync.Once
	lastLSN   atomic.Uint64
	freshAsOf atomic.Int64 // unix nanos
	hostCount atomic.Int64
	running   atomic.Bool
}

// New validates cfg and returns an empty cache; Run fills it.
func New(cfg Config, opts Options) (*Cache, error) {
	d := DefaultConfig(cfg.ConnString)
	if cfg.Publication == "" {
		cfg.Publication = d.Publication
	}
	if cfg.SlotName == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		cfg.SlotName = "cuesched_hostcache_" + hex.EncodeToString(b[:])
	}
	if !replication.ValidSlotName(cfg.SlotName) {
		return nil, fmt.Errorf("hostcache: slot name %q must be lower-case letters, digits and underscores", cfg.SlotName)
	}
	if cfg.Strategy == nil {
		cfg.Strategy = d.Strategy
	}
	if cfg.MemoryKeyDivisor == 0 {
		cfg.MemoryKeyDivisor = d.MemoryKeyDivisor
	}
	if cfg.MemoryKeyDivisor < 1<<20 {
		return nil, fmt.Errorf("hostcache: memory_key_divisor %d bytes is below 1 MiB", cfg.MemoryKeyDivisor)
	}
	if cfg.GroupIdleTimeout <= 0 {
		cfg.GroupIdleTimeout = d.GroupIdleTimeout
	}
	if cfg.AssumeTTL <= 0 {
		cfg.AssumeTTL = d.AssumeTTL
	}
	if cfg.LeaseTimeout <= 0 {
		cfg.LeaseTimeout = d.LeaseTimeout
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = d.StatusInterval
	}
	if cfg.WarmFrames <= 0 {
		cfg.WarmFrames = d.WarmFrames
	}
	if p := cfg.Placement; p != nil {
		w := p.Weights
		if w.Cores < 0 || w.Memory < 0 || w.GPUs < 0 || w.GPUMemory < 0 || w.Cores+w.Memory+w.GPUs+w.GPUMemory <= 0 {
			return nil, fmt.Errorf("hostcache: placement weights %+v: none may be negative and one must be positive", w)
		}
		if p.Candidates <= 0 {
			return nil, fmt.Errorf("hostcache: placement candidates %d must be at least 1", p.Candidates)
		}
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Cache{
		cfg: cfg, log: opts.Logger.Named("hostcache"), now: opts.Now, tap: opts.Tap,
		st: newState(), groups: map[ClusterKey]*group{}, leases: map[string]*lease{},
		freeList: btree.NewFreeListG[memItem](1024), changed: make(chan struct{}), ready: make(chan struct{}),
		capChanged: make(chan struct{}), layerHosts: map[string][]*hostRec{},
		repl: replication.NewMetrics(opts.Registerer, "scheduler_replication_"),
	}
	c.m = newMetrics(opts.Registerer, c)
	return c, nil
}

// Run streams the publication into the cache until ctx is done or a
// non-retriable replication error occurs. Connection losses re-snapshot
// (the slot is temporary); the cache keeps serving meanwhile.
func (c *Cache) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("hostcache: Run called twice")
	}
	s, err := replication.New(replication.Config{
		ConnString: c.cfg.ConnString, Slot: c.cfg.SlotName, Kind: replication.TemporarySlot,
		Publications: []string{c.cfg.Publication}, StatusInterval: c.cfg.StatusInterval,
		Logger: c.log, Metrics: c.repl,
	}, c)
	if err != nil {
		return err
	}
	jctx, stop := context.WithCancel(ctx)
	defer stop()
	go c.janitor(jctx)
	return s.Run(ctx)
}

// WaitReady blocks until the initial snapshot is loaded.
func (c *Cache) WaitReady(ctx context.Context) error {
	select {
	case <-c.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ready reports whether the initial snapshot is loaded.
func (c *Cache) Ready() bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

// Changed returns a channel closed at the next change to the cache (a
// snapshot, a WAL transaction, a check-in or a sweep). Take a new one after
// every wake-up.
func (c *Cache) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watched = true
	return c.changed
}

func (c *Cache) bumpLocked() {
	if c.watched {
		close(c.changed)
		c.changed = make(chan struct{})
		c.watched = false
	}
}

// ---- replication.Consumer ----

// Snapshot loads a new mirror from the slot's snapshot and swaps it in.
// Groups keep their keys and are rebuilt from the new mirror; checked-out
// hosts stay checked out.
func (c *Cache) Snapshot(ctx context.Context, q replication.SnapshotQuerier) error {
	st := newState()
	// The schema of each mirrored table on this connection's search_path:
	// the tables the SELECTs below read, and the only ones whose streamed
	// changes are applied (a same-named table in another schema that the
	// publication also carries is not Cuebot's).
	tables, err := replication.ResolveTables(ctx, replication.SnapshotText(q), cachedTables()...)
	if err != nil {
		return fmt.Errorf("hostcache: %w", err)
	}
	st.tables = tables
	e := newEffects()
	for _, sq := range snapshotQueries {
		rel := replication.NewRelation(0, "", sq.table, nil)
		err := q.Query(ctx, sq.sql, func(r replication.Row) error {
			ch := replication.Change{Op: replication.Insert, Relation: rel, New: r}
			return st.apply(&ch, e)
		})
		if err != nil {
			return fmt.Errorf("hostcache: snapshot of %s: %w", sq.table, err)
		}
	}
	for _, h := range st.hosts {
		h.lsn = q.ConsistentPoint()
		h.version = 1
	}
	if c.tap != nil {
		if err := c.tap.TapSnapshot(ctx, q); err != nil {
			return fmt.Errorf("hostcache: tap snapshot: %w", err)
		}
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.st
	c.st = st
	for _, h := range old.hosts {
		h.groups = nil
	}
	for _, g := range c.groups {
		g.tree.Clear(false)
		g.size = 0
		// A new mirror may hold anything: every waiter retries.
		c.bumpGroupLocked(g)
	}
	c.assumedList = nil
	for id, l := range c.leases {
		if h := st.hosts[id]; h != nil {
			h.out = l
		}
	}
	for id, o := range old.hosts {
		if h := st.hosts[id]; h != nil {
			c.adoptRecentLocked(o, h)
		} else {
			c.forgetRecentLocked(o)
		}
	}
	for _, h := range st.hosts {
		c.reindexLocked(h)
	}
	c.lastLSN.Store(uint64(q.ConsistentPoint()))
	c.freshAsOf.Store(now.UnixNano())
	c.hostCount.Store(int64(len(st.hosts)))
	c.m.snapshots.Inc()
	c.bumpLocked()
	c.readyOnce.Do(func() { close(c.ready) })
	c.log.Info("host cache loaded", "hosts", len(st.hosts), "consistent_point", q.ConsistentPoint())
	return nil
}

// Apply applies one committed transaction in place. A TRUNCATE of any cached
// table asks the stream for a new snapshot instead. Changes of other
// relations (tables the cache does not mirror, or same-named tables in
// another schema) are ignored.
func (c *Cache) Apply(ctx context.Context, txn *replication.Transaction) (err error) {
	if c.tap != nil {
		defer func() { // after the unlock below
			if err == nil {
				c.tap.TapApply(txn)
			}
		}()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range txn.Changes {
		if ch := &txn.Changes[i]; ch.Op == replication.Truncate && c.mirroredLocked(ch) {
			return fmt.Errorf("hostcache: TRUNCATE %s: %w", ch.Relation.QualifiedName(), replication.ErrResync)
		}
	}
	e := newEffects()
	for i := range txn.Changes {
		ch := &txn.Changes[i]
		if !c.mirroredLocked(ch) {
			continue
		}
		if err := c.st.apply(ch, e); err != nil {
			return fmt.Errorf("hostcache: transaction %d at %s: %w", txn.XID, txn.CommitLSN, err)
		}
	}
	for a := range e.allocs {
		for h := range c.st.hostsByAlloc[a] {
			e.hosts[h] = struct{}{}
		}
	}
	for _, h := range e.gone {
		c.dropLocked(h)
	}
	for h := range e.hosts {
		if h.out == nil {
			h.out = c.leases[h.id] // re-created while checked out: still out
		}
	}
	for h := range e.rowChanged {
		c.observeRowLocked(h)
	}
	for h := range e.hosts {
		h.lsn = txn.CommitLSN
		h.version++
		c.reindexLocked(h)
	}
	c.lastLSN.Store(uint64(txn.EndLSN))
	if t := txn.CommitTime.UnixNano(); t > c.freshAsOf.Load() {
		c.freshAsOf.Store(t)
	}
	c.hostCount.Store(int64(len(c.st.hosts)))
	c.bumpLocked()
	return nil
}

// Heartbeat records that the cache is current as of the server's time.
func (c *Cache) Heartbeat(ctx context.Context, hb replication.Heartbeat) error {
	if t := hb.ServerTime.UnixNano(); t > c.freshAsOf.Load() {
		c.freshAsOf.Store(t)
	}
	return nil
}

// mirroredLocked reports whether a streamed change is of a mirrored table
// (its name and the schema the snapshot resolved it to); other relations
// are logged once each (replication.Tables.Admit).
func (c *Cache) mirroredLocked(ch *replication.Change) bool {
	return c.st.tables.Admit(ch, &c.ignored, c.log)
}

// observeRowLocked applies the assume/confirm rule to a WAL change of a
// host row: a checked-out host remembers the values (so a later check-in
// can tell the WAL already has them), and an assumed host whose row now
// shows exactly the assumed values is confirmed.
func (c *Cache) observeRowLocked(h *hostRec) {
	if l := h.out; l != nil {
		if len(l.seen) < maxSeen {
			l.seen = append(l.seen, h.row)
		} else {
			l.many = true
		}
	}
	if a := h.assumed; a != nil && confirms(h.row, a.v) {
		c.clearAssumptionLocked(h)
		c.m.assumptions.WithLabelValues("confirmed").Inc()
	}
}

// confirms reports whether a host row the WAL delivered is (or may be) the
// commit whose values a check-in reported: equal cores, GPUs and GPU memory,
// and at least the reported memory. Memory cannot be compared exactly: the
// dispatcher reports it as min(the row it committed, the checked-out view
// minus what it took), and the view is lowered by host_stat's free memory
// and by a pending assumption, so the report is often below the row. With
// exact equality such a check-in was never confirmed, and the host looked
// busier than it was (freed resources hidden) until AssumeTTL, after every
// booking. The price: values are all that identifies the commit, and an
// older row that happens to show the same cores, GPUs and GPU memory (a
// release and a booking in between cancelling out) now also matches when
// only its memory is higher. It confirms early; the index then follows the
// WAL, which may show more idle than Postgres has until the booking's row
// arrives (one WAL lag), and a checkout in that window gets a host the
// dispatcher's guarded UPDATE refuses (HostStale, rolled back, retried).
// Exact equality had the same hazard whenever memory matched too; the
// end-to-end benchmark sees it in about 1% of batches. The exact fix is on
// the dispatcher's side: report the host row's memory as RETURNING gave it
// (as Checkin documents) and let the cache apply the host_stat cap.
func confirms(row, v idle) bool {
	return row.cores == v.cores && row.gpus == v.gpus && row.gpuMemKB == v.gpuMemKB && row.memKB >= v.memKB
}

// dropLocked removes a deleted host from every index.
func (c *Cache) dropLocked(h *hostRec) {
	for _, g := range h.groups {
		g.remove(h)
	}
	h.groups = nil
	if h.assumed != nil {
		c.clearAssumptionLocked(h)
	}
	c.forgetRecentLocked(h)
}

// effective returns the idle values the index uses: the row's, lowered by a
// pending assumption, with memory capped by host_stat's free memory.
func (c *Cache) effective(h *hostRec) idle {
	v := h.row
	if a := h.assumed; a != nil {
		v.cores, v.memKB = min(v.cores, a.v.cores), min(v.memKB, a.v.memKB)
		v.gpus, v.gpuMemKB = min(v.gpus, a.v.gpus), min(v.gpuMemKB, a.v.gpuMemKB)
	}
	if s := h.stat; s != nil {
		v.memKB = min(v.memKB, s.memFreeKB)
		v.gpuMemKB = min(v.gpuMemKB, s.gpuMemFreeKB)
	} else {
		v.memKB, v.gpuMemKB = 0, 0
	}
	return v
}

func (c *Cache) coreKey(centicores int64) uint32 {
	return clampU32(max(centicores, 0) / cuebot.CenticoresPerCore)
}

func (c *Cache) memKey(kb int64) uint32 {
	b := max(kb, 0)
	if b > (1<<62)/cuebot.BytesPerKB {
		return ^uint32(0)
	}
	return clampU32(b * cuebot.BytesPerKB / c.cfg.MemoryKeyDivisor)
}

func clampU32(v int64) uint32 {
	if v > int64(^uint32(0)) {
		return ^uint32(0)
	}
	return uint32(v)
}

// eligibleLocked is the reference host query's WHERE clause minus the tag
// and the show: lock state OPEN, host_stat UP, allocation known. It returns
// the allocation's facility.
func (c *Cache) eligibleLocked(h *hostRec) (facilityID string, ok bool) {
	if h.out != nil || h.lockState != string(cuebot.LockOpen) || h.stat == nil || h.stat.state != string(cuebot.HardwareUp) {
		return "", false
	}
	a := c.st.allocs[h.allocID]
	if a == nil {
		return "", false
	}
	return a.facilityID, true
}

// reindexLocked puts h into exactly the existing groups it belongs to, under
// its current keys.
//
// It is also where capacity gains are noticed: a group waiting for floors
// (a checkout missed there) is bumped when h now fits them and did not
// before, or just joined the group (checked in, unlocked, up, re-tagged,
// newly subscribed).
func (c *Cache) reindexLocked(h *hostRec) {
	if h.out == nil && len(h.recent) > 0 {
		c.trimRecentLocked(h, c.effective(h))
	}
	var buf [8]*group
	was := append(buf[:0], h.groups...)
	prev := h.idx
	for _, g := range h.groups {
		g.remove(h)
	}
	h.groups = h.groups[:0]
	fac, ok := c.eligibleLocked(h)
	if !ok || len(c.groups) == 0 {
		return
	}
	v := c.effective(h)
	h.idx = v
	h.coreKey, h.memKey = c.coreKey(v.cores), c.memKey(v.memKB)
	for _, tag := range h.tags {
		for show := range c.st.subsByAlloc[h.allocID] {
			if g := c.groups[ClusterKey{FacilityID: fac, ShowID: show, Tag: tag}]; g != nil {
				g.insert(h)
				h.groups = append(h.groups, g)
				if len(g.wants) > 0 && g.gained(v, prev, h.stat.oses, h.threadMode == int(cuebot.ThreadAll), !slices.Contains(was, g)) {
					c.bumpGroupLocked(g)
				}
			}
		}
	}
}

// groupLocked returns the key's group, building it from the mirror (no
// query) if it does not exist.
func (c *Cache) groupLocked(key ClusterKey, now time.Time) *group {
	if g := c.groups[key]; g != nil {
		return g
	}
	g := newGroup(key, c.freeList, now)
	c.groups[key] = g
	for allocID := range c.st.allocsByShow[key.ShowID] {
		a := c.st.allocs[allocID]
		if a == nil || a.facilityID != key.FacilityID {
			continue
		}
		for h := range c.st.hostsByAlloc[allocID] {
			if _, ok := c.eligibleLocked(h); !ok || !slices.Contains(h.tags, key.Tag) {
				continue
			}
			if len(h.groups) == 0 {
				v := c.effective(h)
				h.idx = v
				h.coreKey, h.memKey = c.coreKey(v.cores), c.memKey(v.memKB)
			}
			g.insert(h)
			h.groups = append(h.groups, g)
		}
	}
	c.m.groupLoads.Inc()
	c.buildGen.Add(1)
	return g
}

func (c *Cache) viewLocked(h *hostRec, showID string) Host {
	v := c.effective(h)
	out := Host{
		Host: sizing.Host{ID: h.id, Name: h.name, AllocID: h.allocID, ThreadMode: h.threadMode, TotalCores: h.coresTotal,
			IdleCores: v.cores, IdleMemKB: v.memKB, IdleGPUs: v.gpus, IdleGPUMemKB: v.gpuMemKB},
		TotalGPUs: h.gpusTotal, TotalGPUMemKB: h.gpuMemTotalKB, LSN: h.lsn, Version: h.version,
	}
	if a := c.st.allocs[h.allocID]; a != nil {
		out.AllocName, out.FacilityID = a.name, a.facilityID
	}
	if s := c.st.subsByAlloc[h.allocID][showID]; s != nil {
		out.AllocAvailableCores = s.burst - s.cores
	}
	if s := h.stat; s != nil {
		out.OS, out.TotalMemKB, out.LastPing = s.os, s.memTotalKB, s.ping
	}
	return out
}

// Checkout finds a host for req and removes it from every group, so no
// other caller can get it until it is checked in. Groups are probed in the
// order of req.Tags; inside a group the strategy orders the walk and, with
// no Placement, the first host that passes Fits and req.Accept wins; with
// one, the candidates that pass are scored (see Placement).
func (c *Cache) Checkout(ctx context.Context, req Request) (Host, error) {
	if !c.Ready() {
		return Host{}, ErrNotReady
	}
	if err := ctx.Err(); err != nil {
		return Host{}, err
	}
	strategy := *c.cfg.Strategy
	if req.Strategy != nil {
		strategy = *req.Strategy
	}
	place := c.cfg.Placement
	coreHint, memHint := c.coreKey(req.CoresMin), c.memKey(req.MemMinKB)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var buf [4]*group
	probed := buf[:0]
	for _, tag := range req.Tags {
		g := c.groupLocked(ClusterKey{FacilityID: req.FacilityID, ShowID: req.ShowID, Tag: tag}, now)
		probed = append(probed, g)
		g.lastQueried = now
		fits := func(h *hostRec) (Host, bool) {
			if !h.servesOS(req.OS) {
				return Host{}, false
			}
			v := c.viewLocked(h, req.ShowID)
			v.Locality, v.LayerCores = h.localityOf(req.LayerID)
			return v, fitsResources(v, req.Profile) && (req.Accept == nil || req.Accept(v))
		}
		var h *hostRec
		var out Host
		if place != nil {
			h, out = c.placeLocked(g, &req, coreHint, memHint, strategy, place, fits)
		} else {
			h = g.find(coreHint, memHint, strategy, func(h *hostRec) bool {
				var ok bool
				out, ok = fits(h)
				return ok
			})
		}
		if h == nil {
			continue
		}
		for _, g := range h.groups {
			g.remove(h)
		}
		h.groups = h.groups[:0]
		l := &lease{at: now, handed: idle{out.IdleCores, out.IdleMemKB, out.IdleGPUs, out.IdleGPUMemKB}}
		h.out = l
		c.leases[h.id] = l
		c.m.hits.Inc()
		return out, nil
	}
	c.m.misses.Inc()
	w := c.missLocked(probed, want{floor: idle{max(req.CoresMin, 0), max(req.MemMinKB, 0), max(req.GPUsMin, 0), max(req.GPUMemMinKB, 0)},
		os: req.OS, threadable: req.Threadable})
	return Host{}, &NoCandidateError{Watch: w}
}

// Checkin returns a checked-out host (v.ID) to the index. v's idle values
// are the host row's after the caller's bookings, as Postgres returned
// them; pass the host Checkout returned (or call Release) if nothing was
// booked. Only v.ID and the four idle values are read.
//
// Ordering with the WAL (newest committed state wins, no stale
// resurrection): if the WAL already delivered a host-row change with exactly
// these values since the checkout (the caller's own booking, possibly
// followed by newer changes), v is already in, or older than, the mirror and
// is ignored. Otherwise v is assumed — the index uses min(v, WAL row) per
// dimension — until the WAL delivers a row equal to v (confirmed) or
// AssumeTTL passes (forgotten). Eligibility (lock, state, tags, allocation,
// deletion) always comes from the WAL, so a host locked, downed, re-tagged
// or deleted while checked out does not come back.
func (c *Cache) Checkin(v sizing.Host) {
	hostID := v.ID
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.leases[hostID]
	if l == nil {
		c.log.Debug("check-in of a host that is not checked out", "host", hostID)
		return
	}
	delete(c.leases, hostID)
	h := c.st.hosts[hostID]
	if h == nil || h.out != l {
		c.bumpLocked()
		return // deleted while out
	}
	h.out = nil
	got := idle{v.IdleCores, v.IdleMemKB, v.IdleGPUs, v.IdleGPUMemKB}
	switch {
	case got == l.handed:
		// Nothing booked: the WAL state stands.
	case l.many || slices.ContainsFunc(l.seen, func(row idle) bool { return confirms(row, got) }):
		c.m.assumptions.WithLabelValues("superseded").Inc()
	default:
		if h.assumed == nil {
			h.assumedListIndex = len(c.assumedList)
			c.assumedList = append(c.assumedList, h)
		}
		h.assumed = &assumption{v: got, until: c.now().Add(c.cfg.AssumeTTL)}
		c.m.assumptions.WithLabelValues("assumed").Inc()
	}
	h.version++
	c.reindexLocked(h)
	c.bumpLocked()
}

// Release checks a host in unchanged (nothing was booked on it).
func (c *Cache) Release(hostID string) {
	c.mu.Lock()
	l := c.leases[hostID]
	c.mu.Unlock()
	if l == nil {
		return
	}
	c.Checkin(sizing.Host{ID: hostID, IdleCores: l.handed.cores, IdleMemKB: l.handed.memKB, IdleGPUs: l.handed.gpus,
		IdleGPUMemKB: l.handed.gpuMemKB})
}

func (c *Cache) clearAssumptionLocked(h *hostRec) {
	h.assumed = nil
	i := h.assumedListIndex
	if i < 0 || i >= len(c.assumedList) || c.assumedList[i] != h {
		return
	}
	last := len(c.assumedList) - 1
	c.assumedList[i] = c.assumedList[last]
	c.assumedList[i].assumedListIndex = i
	c.assumedList = c.assumedList[:last]
	h.assumedListIndex = -1
}

// Lookup returns a cached host as a request of showID would see it, and
// whether it is currently indexed (available to Checkout).
func (c *Cache) Lookup(hostID, showID string) (h Host, indexed, found bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.st.hosts[hostID]
	if r == nil {
		return Host{}, false, false
	}
	return c.viewLocked(r, showID), len(r.groups) > 0, true
}

// Stats is a summary for status pages and tests.
type Stats struct {
	Hosts, Groups, Indexed, CheckedOut, Assumed int
	LastLSN                                     replication.LSN
	FreshAsOf                                   time.Time
}

// Stats returns the cache's counts.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{Hosts: len(c.st.hosts), Groups: len(c.groups), CheckedOut: len(c.leases), Assumed: len(c.assumedList),
		LastLSN: replication.LSN(c.lastLSN.Load()), FreshAsOf: time.Unix(0, c.freshAsOf.Load())}
	for _, h := range c.st.hosts {
		if len(h.groups) > 0 {
			s.Indexed++
		}
	}
	return s
}

// ---- housekeeping ----

func (c *Cache) janitor(ctx context.Context) {
	every := min(max(c.cfg.AssumeTTL/4, 50*time.Millisecond), time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.sweep(c.now())
		}
	}
}

// sweep forgets expired assumptions, returns leaked checkouts and evicts
// idle groups.
func (c *Cache) sweep(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	for i := 0; i < len(c.assumedList); {
		h := c.assumedList[i]
		if h.assumed.until.After(now) {
			i++
			continue
		}
		c.clearAssumptionLocked(h)
		c.reindexLocked(h)
		c.m.assumptions.WithLabelValues("expired").Inc()
		changed = true
	}
	for id, l := range c.leases {
		if now.Sub(l.at) < c.cfg.LeaseTimeout {
			continue
		}
		c.log.Warn("host checked out for longer than the lease timeout; returning it to the cache", "host", id, "since", l.at)
		delete(c.leases, id)
		if h := c.st.hosts[id]; h != nil && h.out == l {
			h.out = nil
			c.reindexLocked(h)
		}
		c.m.leaseExpired.Inc()
		changed = true
	}
	for key, g := range c.groups {
		if now.Sub(g.lastQueried) < c.cfg.GroupIdleTimeout {
			continue
		}
		g.each(func(_ uint32, it memItem) bool {
			it.h.groups = slices.DeleteFunc(it.h.groups, func(x *group) bool { return x == g })
			return true
		})
		delete(c.groups, key)
		c.bumpGroupLocked(g) // its watchers retry (and rebuild it) rather than wait
		c.m.groupEvictions.Inc()
		changed = true
	}
	if changed {
		c.bumpLocked()
	}
}

// checkInvariants walks every index and host and reports the first
// violation: an entry under stale keys, an ineligible or checked-out host in
// an index, a host missing from a group it belongs to, a group size that
// does not match its entries.
func (c *Cache) checkInvariants() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, g := range c.groups {
		n := 0
		var err error
		g.each(func(core uint32, it memItem) bool {
			n++
			h := it.h
			switch {
			case c.st.hosts[h.id] != h:
				err = fmt.Errorf("group %s indexes host %s that is not in the mirror", key, h.id)
			case h.out != nil:
				err = fmt.Errorf("group %s indexes checked-out host %s", key, h.id)
			case core != h.coreKey || it.mem != h.memKey || it.seq != h.seq:
				err = fmt.Errorf("group %s has host %s under (%d,%d), host says (%d,%d)", key, h.id, core, it.mem, h.coreKey, h.memKey)
			case !slices.Contains(h.groups, g):
				err = fmt.Errorf("group %s has host %s that does not list it", key, h.id)
			}
			if err == nil {
				v := c.effective(h)
				if c.coreKey(v.cores) != core || c.memKey(v.memKB) != it.mem {
					err = fmt.Errorf("group %s has host %s under stale buckets (%d,%d); its values give (%d,%d)",
						key, h.id, core, it.mem, c.coreKey(v.cores), c.memKey(v.memKB))
				}
			}
			return err == nil
		})
		if err != nil {
			return err
		}
		if n != g.size {
			return fmt.Errorf("group %s size %d but %d entries", key, g.size, n)
		}
	}
	for id, h := range c.st.hosts {
		fac, ok := c.eligibleLocked(h)
		for key, g := range c.groups {
			want := ok && key.FacilityID == fac && slices.Contains(h.tags, key.Tag) && c.st.subsByAlloc[h.allocID][key.ShowID] != nil
			if has := slices.Contains(h.groups, g); has != want {
				return fmt.Errorf("host %s: in group %s = %v, should be %v", id, key, has, want)
			}
		}
	}
	return nil
}
