// Package shard splits the scheduler's clusters between the live scheduler
// instances (scheduler.work_split), so several instances add throughput
// instead of planning the same work.
//
// # Coordination
//
// It is built on what the accounting loops' leader election already
// trusts: PostgreSQL session advisory locks held on one dedicated
// connection per instance (not a pooled one), whose session carries
// idle_session_timeout = scheduler.work_split_lease. Nothing else is
// shared and there is no protocol of our own:
//
//   - membership: each instance holds one member lock (class "cssm", the
//     lowest free slot 0..MaxMembers-1). The live members are the granted
//     member locks in pg_locks; a dead instance's session, and with it its
//     locks, ends when its socket closes (kill -9, crash) or, for a stalled
//     process or a vanished host, once the server has heard nothing for the
//     lease.
//   - shares: a share is a unit of clusters (Unit: an allocation, with a
//     show's non-allocation tag clusters as their own share, or a single
//     cluster), locked by a 32-bit hash of its key (class "cssu"). Only the
//     instance holding a share's lock hands its clusters to workers.
//   - balance: every instance computes the same assignment from the same
//     inputs (the sorted live member slots and the sorted share ids):
//     rendezvous hashing with bounded load, each member owning at most
//     ceil(shares/members). An instance locks what it is assigned and
//     releases what it is not, once no pass of that share is in flight. A
//     share the previous owner still holds is simply retried next step: the
//     lock, not the arithmetic, decides who books.
//
// # Renewal and fencing
//
// Every step (scheduler.work_split_renew, a tenth of the lease by default)
// is one query on the lock session: it reads the granted advisory locks of
// both classes, which renews the lease (it resets the session's idle
// timer) and proves the session still holds this instance's locks. The
// server cannot end the session before lease after that query was sent,
// so the instance trusts its shares until sent + lease − renew (its
// fence). The matcher asks Fence before every booking batch (an in-memory
// check, no statement): a process that stalled past its fence, or whose
// last renewal failed, books nothing more for those shares, and it stops
// before the server ends its session, which is what lets another instance
// take them. What can still overlap is a session an administrator
// terminated (pg_terminate_backend): the holder learns at its next step;
// the booking gate and the claim keep that overlap from double-booking, as
// they do for the instances of work_split: none.
//
// # Hand-over bounds
//
// A dead instance's shares are picked up within lease + renew of its last
// renewal (its session ends at most lease after it, and the survivors
// take the shares at their next step); an instance killed on a live host
// closes its socket at once, so its shares move within one renew. A share
// that moves because an instance joined changes hands once its last pass
// ends: the old holder sees the new member within one renew and the new
// one, stepping every renew/10 while it waits, takes the share soon after. With one live instance it owns every
// share after its first step, and booking is as with work_split: none.
package shard

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
)

// Unit names how clusters group into shares.
type Unit string

// Units (scheduler.work_split values other than none).
const (
	// ByAllocation: one share per (facility, allocation), holding every
	// show's allocation cluster of it, and one per (facility, show) for the
	// show's MANUAL/HOSTNAME/HARDWARE tag clusters. Instances never plan on
	// the same allocation's hosts at once (fewer races), and the feed's
	// one-pass-per-allocation order (show tiers) holds across instances.
	ByAllocation Unit = "allocation"
	// ByCluster: one share per cluster (facility, show, tags): the finest
	// balance; shows of one allocation may race for its hosts.
	ByCluster Unit = "cluster"
)

// MaxMembers bounds the member slots (instances of one facility scope).
const MaxMembers = 64

// Advisory lock classes (two-int form, objsubid 2): "cssm" and "cssu",
// with the low 16 bits replaced by a hash of the scope, so instances
// scoped to different facilities split their own clusters only.
const (
	memberClassBase int32 = 0x63730000
	unitClassBase   int32 = 0x63750000
)

// Errors of Fence.
var (
	ErrNotOwner     = errors.New("shard: this instance does not hold the cluster's share")
	ErrLeaseExpired = errors.New("shard: the work-split lease was not renewed in time (fence passed)")
)

// Key is the share of cluster c under unit u.
func (u Unit) Key(c *clusters.Cluster) string {
	if u == ByAllocation {
		if a := c.AllocID(); a != "" {
			return c.FacilityID + "/alloc/" + a
		}
		return c.FacilityID + "/show/" + c.ShowID
	}
	return c.Key()
}

// ID is the lock id of a share key.
func ID(key string) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int32(h.Sum32())
}

// Config holds the split's knobs.
type Config struct {
	Unit Unit
	// Lease is the lock session's idle_session_timeout (10 s).
	Lease time.Duration
	// Renew is the step interval (Lease/10); it must be below Lease/2.
	Renew time.Duration
	// Scope separates instance groups that split different clusters (the
	// facility id; "" for all).
	Scope string
}

// Options are the split's dependencies.
type Options struct {
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// Clusters lists the cluster set (the feed's).
	Clusters func() []*clusters.Cluster
	// InFlight lists the clusters with a pass in flight (the feed's): a
	// share is released only when none of its clusters is.
	InFlight func() []*clusters.Cluster
	// Changed runs after the owned set changed (the feed's Poke).
	Changed func()
}

type owned struct {
	ids map[int32]struct{}
}

// Shard is one instance's side of the split. Owns and Fence are safe for
// concurrent use and take no lock; Step and Run belong to one goroutine.
type Shard struct {
	cfg     *pgx.ConnConfig
	c       Config
	o       Options
	log     hclog.Logger
	m       *metrics
	epoch   time.Time
	mclass  int32
	uclass  int32
	owned   atomic.Pointer[owned] // shares whose clusters may be handed out
	holding atomic.Pointer[owned] // shares whose locks are held (owned + releasing)
	fence   atomic.Int64          // ns since epoch until which the locks are trusted

	mu      sync.Mutex // serialises Step and Close (pgx.Conn is not safe for concurrent use)
	conn    *pgx.Conn
	slot    int32 // member slot held; -1 none
	held    map[int32]struct{}
	members []int32
	// unsettled: the last step left a wanted share to another holder or a
	// share to release after its pass; the next step comes sooner.
	unsettled atomic.Bool
}

// New returns a split over the lock session dialled from cfg.
func New(cfg *pgx.ConnConfig, c Config, o Options) *Shard {
	if c.Lease <= 0 {
		c.Lease = 10 * time.Second
	}
	if c.Renew <= 0 {
		c.Renew = c.Lease / 10
	}
	if c.Unit == "" {
		c.Unit = ByAllocation
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(c.Scope))
	scope := int32(h.Sum32() & 0xffff)
	s := &Shard{cfg: cfg.Copy(), c: c, o: o, log: log.Named("work-split"), m: newMetrics(o.Registerer),
		epoch: time.Now(), mclass: memberClassBase | scope, uclass: unitClassBase | scope, slot: -1, held: map[int32]struct{}{}}
	s.owned.Store(&owned{})
	s.holding.Store(&owned{})
	return s
}

// Owns reports whether this instance hands c's clusters out (the feed's
// filter). Lock-free.
func (s *Shard) Owns(c *clusters.Cluster) bool {
	_, ok := s.owned.Load().ids[ID(s.c.Unit.Key(c))]
	return ok
}

// Fence is asked before every booking batch of c: nil while this instance
// holds c's share and its lease is within its fence.
func (s *Shard) Fence(c *clusters.Cluster) error {
	if _, ok := s.holding.Load().ids[ID(s.c.Unit.Key(c))]; !ok {
		s.m.fenced.Inc()
		return ErrNotOwner
	}
	if time.Since(s.epoch).Nanoseconds() >= s.fence.Load() {
		s.m.fenced.Inc()
		return ErrLeaseExpired
	}
	return nil
}

// Slot is the member slot held (-1 none).
func (s *Shard) Slot() int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slot
}

// Members is the live member set seen by the last step.
func (s *Shard) Members() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.members)
}

// Owned is how many shares this instance hands out.
func (s *Shard) Owned() int { return len(s.owned.Load().ids) }

// Run steps every Renew until ctx ends, then closes the session (which
// releases every lock at once). While a hand-over is under way (a share
// this instance wants is still held by another, or one it gives up still
// has a pass in flight) it steps every Renew/10, so a share changes hands
// within about one Renew of the rebalance.
func (s *Shard) Run(ctx context.Context) error {
	defer s.Close()
	for {
		if err := s.Step(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("work split: step failed; this instance books none of its shares until a step succeeds", "error", err)
		}
		d := s.c.Renew
		if s.unsettled.Load() {
			d = max(s.c.Renew/10, 20*time.Millisecond)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Close drops every share and ends the lock session.
func (s *Shard) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked("closing")
	if s.conn != nil {
		_ = s.conn.Close(context.Background())
		s.conn = nil
	}
}

// Step renews the lease, reads the live members and takes or gives up
// shares. On any failure the instance owns nothing until a step succeeds.
func (s *Shard) Step(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil || s.conn.IsClosed() {
		if s.slot >= 0 || len(s.held) > 0 {
			s.lostLocked(ctx, "lock session closed")
		}
		if err := s.connectLocked(ctx); err != nil {
			return err
		}
	}
	sent := time.Since(s.epoch)
	rows, err := s.queryLocked(ctx, `SELECT classid::bigint, objid::bigint, pid = pg_backend_pid() FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 2
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND classid IN ($1::bigint::oid, $2::bigint::oid)`, int64(uint32(s.mclass)), int64(uint32(s.uclass)))
	if err != nil {
		s.lostLocked(ctx, "renewal failed")
		s.closeConnLocked()
		return fmt.Errorf("renew: %w", err)
	}
	var members []int32
	mine := map[int32]struct{}{}
	slotOK := false
	for _, r := range rows {
		switch {
		case r.class == s.mclass:
			members = append(members, r.obj)
			if r.mine && r.obj == s.slot {
				slotOK = true
			}
		case r.class == s.uclass && r.mine:
			mine[r.obj] = struct{}{}
		}
	}
	for id := range s.held {
		if _, ok := mine[id]; !ok {
			// Never expected on a live session: treat as lost.
			s.lostLocked(ctx, "a share lock is missing from the session")
			s.closeConnLocked()
			return errors.New("renew: a held share lock is missing")
		}
	}
	if s.slot >= 0 && !slotOK {
		s.lostLocked(ctx, "the member lock is missing from the session")
		s.closeConnLocked()
		return errors.New("renew: the member lock is missing")
	}
	s.fence.Store(int64(sent + s.c.Lease - s.c.Renew))
	s.m.renewals.Inc()
	if s.slot < 0 {
		if err := s.joinLocked(ctx, members); err != nil {
			return err
		}
		members = append(members, s.slot)
	}
	slices.Sort(members)
	members = slices.Compact(members)
	s.members = members
	s.m.members.Set(float64(len(members)))

	// The shares and the assignment.
	cs := s.o.Clusters()
	keyOf := map[int32]int{} // share id -> clusters
	for _, c := range cs {
		keyOf[ID(s.c.Unit.Key(c))]++
	}
	ids := make([]int32, 0, len(keyOf))
	for id := range keyOf {
		ids = append(ids, id)
	}
	want := Assign(ids, members)[s.slot]
	wanted := map[int32]struct{}{}
	for _, id := range want {
		wanted[id] = struct{}{}
	}
	busy := map[int32]struct{}{}
	if s.o.InFlight != nil {
		for _, c := range s.o.InFlight() {
			busy[ID(s.c.Unit.Key(c))] = struct{}{}
		}
	}
	var release, acquire []int32
	unsettled := false
	for id := range s.held {
		if _, ok := wanted[id]; ok {
			continue
		}
		if _, ok := busy[id]; !ok {
			release = append(release, id)
		} else {
			unsettled = true
		}
	}
	for _, id := range want {
		if _, ok := s.held[id]; !ok {
			acquire = append(acquire, id)
		}
	}
	if len(release) > 0 {
		if _, err := s.queryLocked(ctx, `SELECT $1::int4::bigint, k::bigint, pg_advisory_unlock($1::int4, k) FROM unnest($2::int4[]) k`, s.uclass, release); err != nil {
			s.lostLocked(ctx, "release failed")
			s.closeConnLocked()
			return fmt.Errorf("release shares: %w", err)
		}
		for _, id := range release {
			delete(s.held, id)
		}
		s.m.handoffs.WithLabelValues("released").Add(float64(len(release)))
		s.log.Info("work split: gave shares up to rebalance", "released", len(release), "members", len(members), "slot", s.slot)
	}
	if len(acquire) > 0 {
		got, err := s.queryLocked(ctx, `SELECT $1::int4::bigint, k::bigint, pg_try_advisory_lock($1::int4, k) FROM unnest($2::int4[]) k`, s.uclass, acquire)
		if err != nil {
			s.lostLocked(ctx, "acquire failed")
			s.closeConnLocked()
			return fmt.Errorf("acquire shares: %w", err)
		}
		n := 0
		for _, r := range got {
			if r.mine {
				s.held[r.obj] = struct{}{}
				n++
			}
		}
		unsettled = unsettled || n < len(acquire)
		s.m.handoffs.WithLabelValues("acquired").Add(float64(n))
		if n > 0 {
			s.log.Info("work split: took shares", "acquired", n, "members", len(members), "slot", s.slot)
		}
	}
	// Owned: held and still wanted (a share being released takes no new
	// pass); holding: every lock held (its passes in flight may finish).
	own, hold := &owned{ids: map[int32]struct{}{}}, &owned{ids: map[int32]struct{}{}}
	nclusters := 0
	for id := range s.held {
		hold.ids[id] = struct{}{}
		if _, ok := wanted[id]; ok {
			own.ids[id] = struct{}{}
			nclusters += keyOf[id]
		}
	}
	s.publishLocked(own, hold, nclusters)
	s.unsettled.Store(unsettled)
	return nil
}

type lockRow struct {
	class, obj int32
	mine       bool
}

// queryLocked runs a query returning (class, obj, bool) rows on the lock
// session, with a deadline.
func (s *Shard) queryLocked(ctx context.Context, sql string, args ...any) ([]lockRow, error) {
	qctx, cancel := context.WithTimeout(ctx, min(s.c.Renew, 5*time.Second))
	defer cancel()
	rows, err := s.conn.Query(qctx, sql, args...)
	if err != nil {
		return nil, err
	}
	var out []lockRow
	for rows.Next() {
		var c, o int64
		var b bool
		if err := rows.Scan(&c, &o, &b); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, lockRow{class: int32(uint32(c)), obj: int32(uint32(o)), mine: b})
	}
	rows.Close()
	return out, rows.Err()
}

// joinLocked takes the lowest free member slot.
func (s *Shard) joinLocked(ctx context.Context, members []int32) error {
	taken := map[int32]bool{}
	for _, m := range members {
		taken[m] = true
	}
	for slot := int32(0); slot < MaxMembers; slot++ {
		if taken[slot] {
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, min(s.c.Renew, 5*time.Second))
		var ok bool
		err := s.conn.QueryRow(qctx, `SELECT pg_try_advisory_lock($1, $2)`, s.mclass, slot).Scan(&ok)
		cancel()
		if err != nil {
			s.closeConnLocked()
			return fmt.Errorf("join: %w", err)
		}
		if ok {
			s.slot = slot
			s.log.Info("work split: joined", "slot", slot, "members", len(members)+1)
			return nil
		}
	}
	return fmt.Errorf("join: all %d member slots are taken", MaxMembers)
}

// connectLocked opens the lock session with the lease as its
// idle_session_timeout and TCP keepalives (as the accounting leader's).
func (s *Shard) connectLocked(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, s.cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	ms := strconv.FormatInt(s.c.Lease.Milliseconds(), 10)
	secs := func(d time.Duration) string { return strconv.FormatInt(max(int64(math.Ceil(d.Seconds())), 1), 10) }
	if _, err := conn.Exec(cctx, `SELECT set_config('idle_session_timeout', $1, false)`, ms); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42704" {
			_ = conn.Close(context.Background())
			return fmt.Errorf("set idle_session_timeout: %w", err)
		}
		s.log.Warn("work split: the server has no idle_session_timeout (PostgreSQL < 14): a stalled instance keeps its shares until its TCP session ends")
	}
	if _, err := conn.Exec(cctx, `SELECT set_config('tcp_keepalives_idle', $1, false),
		set_config('tcp_keepalives_interval', $2, false), set_config('tcp_keepalives_count', '3', false)`,
		secs(s.c.Lease), secs(s.c.Renew)); err != nil && conn.IsClosed() {
		return fmt.Errorf("set tcp_keepalives: %w", err)
	}
	s.conn = conn
	return nil
}

func (s *Shard) closeConnLocked() {
	if s.conn != nil {
		_ = s.conn.Close(context.Background())
		s.conn = nil
	}
	s.slot = -1
	clear(s.held)
}

// lostLocked drops every share after the session failed. A step cut
// short by shutdown (its context ended) is no loss.
func (s *Shard) lostLocked(ctx context.Context, why string) {
	if (len(s.held) > 0 || s.slot >= 0) && ctx.Err() == nil {
		s.m.losses.Inc()
		s.log.Warn("work split: lease lost; booking none of this instance's shares until it rejoins", "reason", why, "shares", len(s.held))
	}
	s.dropLocked(why)
}

func (s *Shard) dropLocked(string) {
	s.fence.Store(0)
	s.publishLocked(&owned{}, &owned{}, 0)
	s.slot = -1
	clear(s.held)
}

func (s *Shard) publishLocked(own, hold *owned, nclusters int) {
	prev := s.owned.Load()
	s.holding.Store(hold)
	s.owned.Store(own)
	s.m.shares.Set(float64(len(own.ids)))
	s.m.clusters.Set(float64(nclusters))
	if !sameIDs(prev.ids, own.ids) && s.o.Changed != nil {
		s.o.Changed()
	}
}

func sameIDs(a, b map[int32]struct{}) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// Assign is the bounded-load rendezvous assignment of shares to members:
// shares in ascending order each go to the member of highest score that
// has fewer than ceil(shares/members). Every instance computes the same
// answer from the same inputs.
func Assign(shares, members []int32) map[int32][]int32 {
	out := map[int32][]int32{}
	if len(members) == 0 {
		return out
	}
	ss := slices.Clone(shares)
	slices.Sort(ss)
	ss = slices.Compact(ss)
	ms := slices.Clone(members)
	slices.Sort(ms)
	ms = slices.Compact(ms)
	limit := (len(ss) + len(ms) - 1) / len(ms)
	order := make([]int32, len(ms))
	for _, sh := range ss {
		copy(order, ms)
		sort.SliceStable(order, func(i, j int) bool { return score(sh, order[i]) > score(sh, order[j]) })
		for _, m := range order {
			if len(out[m]) < limit {
				out[m] = append(out[m], sh)
				break
			}
		}
	}
	return out
}

func score(share, member int32) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := 0; i < 4; i++ {
		b[i] = byte(uint32(share) >> (8 * i))
		b[4+i] = byte(uint32(member) >> (8 * i))
	}
	_, _ = h.Write(b[:])
	// fnv's low bits mix poorly on short inputs: finish with a mixer.
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}
