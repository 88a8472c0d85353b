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
	// StatusInterval is the replication status/keepalive interval (500
	// ms). While no mirrored row changes, the keepalive it asks for is
	// what tells the cache it is current, so the staleness gauge of an
	// idle farm saws up to this interval: at the stream's 5 s default a
	// full farm whose frames ran long read 5 s stale with nothing behind.
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
		LeaseTimeout: 10 * time.Minute, StatusInterval: 500 * time.Millisecond,
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
