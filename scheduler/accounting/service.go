package accounting

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
)

// Config tunes the loops. Zero fields take the defaults in brackets.
type Config struct {
	// RecomputeInterval: booked-counter recompute [120s].
	RecomputeInterval time.Duration
	// LimitReseedInterval: caps Postgres -> Redis [300s].
	LimitReseedInterval time.Duration
	// ManagedPollInterval: the leader's check for managed flips, unseeded
	// shows and an emptied Redis [2s].
	ManagedPollInterval time.Duration
	// LeaderPollInterval: how often a follower tries the loop lock, and how
	// often the leader checks it still holds it [1s].
	LeaderPollInterval time.Duration
	// EpochPollInterval: how often every instance checks acct:epoch and
	// acct:seq to open or close its booking gate, and to notice a rolled
	// back accounting state (publisher.State) [250ms].
	EpochPollInterval time.Duration
	// InFlightGrace: a record absent from the snapshot is dropped only if it
	// was booked at least this long before the snapshot began. It must exceed
	// the longest time a dispatcher can take between the booking script and
	// the commit of its proc INSERT (the dispatcher bounds that with a
	// deadline and rolls back on timeout) [60s].
	InFlightGrace time.Duration
	// FlipSettle: a show flipped to managed is seeded only once it has been
	// managed this long, so Cuebot bookings that were in flight at the flip
	// have committed and are in the seed's snapshot (the show answers "not
	// seeded" meanwhile); and every seeded show (flip or bootstrap) is
	// reconciled again this long after its seed, to adopt stragglers [10s].
	FlipSettle time.Duration
	// BatchSize bounds the entries (procs) of one reconcile script call, so
	// no single script blocks Redis long [500].
	BatchSize int
	// LockKey is the advisory lock key of the loops [DefaultLockKey].
	LockKey int64
	// LeaderSessionTimeout is the idle_session_timeout (PostgreSQL 14+) of
	// every instance's lock session: the server ends a session whose client
	// has sent nothing for this long, releasing the lock of a leader that
	// stalled (SIGSTOP, frozen VM), so another instance takes the loops over
	// about this long after the stall. A healthy instance queries it every
	// LeaderPollInterval, so it must be several polls
	// [max(5 × LeaderPollInterval, 3s); never below 3 × LeaderPollInterval].
	LeaderSessionTimeout time.Duration
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.RecomputeInterval, 120*time.Second)
	def(&c.LimitReseedInterval, 300*time.Second)
	def(&c.ManagedPollInterval, 2*time.Second)
	def(&c.LeaderPollInterval, time.Second)
	def(&c.EpochPollInterval, 250*time.Millisecond)
	def(&c.InFlightGrace, 60*time.Second)
	def(&c.FlipSettle, 10*time.Second)
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.LockKey == 0 {
		c.LockKey = DefaultLockKey
	}
	c.LeaderSessionTimeout = sessionTimeout(c.LeaderPollInterval, c.LeaderSessionTimeout)
}

// Service runs the accounting loops of one scheduler instance: the booking
// gate on every instance, and leader election plus bootstrap, managed-flip
// seeding, limit reseed and recompute on the leader.
type Service struct {
	cfg Config
	st  *store
	pub *publisher.Publisher
	log hclog.Logger
	m   *metrics
	ld  *leader

	gateMu  sync.Mutex
	ready   bool
	readyCh chan struct{} // closed while ready
	reason  string
	// rollbacks counts gate closings for a detected rollback: a check that
	// read Redis before one may not open the gate after it (gate.go).
	rollbacks int64

	// known is the epoch this instance books under and knownGen its
	// generation (publisher.EpochGeneration); watcher and bootstrap only.
	lineageMu sync.Mutex
	known     string
	knownGen  int64
	// recycled is the known epoch this instance last closed its database
	// connections for (recycleLocked): once per lost epoch.
	recycled string

	isLeader atomic.Bool
	terms    atomic.Int64 // leadership terms started by this instance

	// followUps: shows to reconcile again after FlipSettle; flipSeen: when
	// an unseeded managed show was first seen (leader only).
	followMu  sync.Mutex
	followUps map[string]time.Time
	flipSeen  map[string]time.Time

	warnedUnattended atomic.Bool

	// identity is this database's (read once); foreign is set while the
	// accounting Redis is bound to another database.
	identity atomic.Pointer[publisher.Identity]
	foreign  atomic.Bool

	hooks hooks
}

// hooks let tests stop a loop at a precise point.
type hooks struct {
	afterSnapshot func(shows []string, mark publisher.Mark)
}

// New returns a Service. pool is the Cuebot database; the leader's lock
// connection is opened separately from pool's configuration.
func New(pool *pgxpool.Pool, pub *publisher.Publisher, cfg Config, logger hclog.Logger, reg prometheus.Registerer) (*Service, error) {
	if pool == nil || pub == nil {
		return nil, errors.New("accounting: nil pool or publisher")
	}
	cfg.defaults()
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("accounting: register metrics: %w", err)
	}
	log := logger.Named("accounting")
	s := &Service{
		cfg: cfg, st: newStore(pool, log.Named("snapshot"), m.visWaits), pub: pub, log: log, m: m,
		ld:        newLeader(pool.Config().ConnConfig.Copy(), cfg.LockKey, cfg.LeaderPollInterval, cfg.LeaderSessionTimeout, log.Named("leader")),
		readyCh:   make(chan struct{}),
		reason:    "accounting not started",
		followUps: map[string]time.Time{},
		flipSeen:  map[string]time.Time{},
	}
	return s, nil
}

// Run runs until ctx is done: the gate watcher and the leader campaign.
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.watchEpoch(ctx) }()
	go func() { defer wg.Done(); s.ld.campaign(ctx, s.lead) }()
	wg.Wait()
	return nil
}

// lead runs the loops while this instance holds the lock.
func (s *Service) lead(ctx context.Context) {
	s.terms.Add(1)
	s.isLeader.Store(true)
	s.m.leader.Set(1)
	defer func() {
		s.isLeader.Store(false)
		s.m.leader.Set(0)
		s.log.Info("loop leadership ended")
	}()
	fence := s.ld.fence
	bootstrapped := s.managedTick(ctx, fence)
	if !bootstrapped && ctx.Err() == nil {
		// A new leader heals whatever its predecessor left half done.
		s.recomputeCycle(ctx, fence)
	}
	recompute := time.NewTicker(s.cfg.RecomputeInterval)
	limits := time.NewTicker(s.cfg.LimitReseedInterval)
	managed := time.NewTicker(s.cfg.ManagedPollInterval)
	defer recompute.Stop()
	defer limits.Stop()
	defer managed.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-managed.C:
			s.managedTick(ctx, fence)
		case <-recompute.C:
			s.recomputeCycle(ctx, fence)
		case <-limits.C:
			s.limitCycle(ctx, fence)
		}
	}
}

func noFence(context.Context) error { return nil }

// Bootstrap seeds every managed show (caps, records, counters, markers) and
// then writes a new acct:epoch, blocking. Run calls it on the leader when
// acct:epoch is missing; it is exported for tools and tests, which must
// ensure a single writer themselves.
func (s *Service) Bootstrap(ctx context.Context) error { return s.bootstrap(ctx, noFence) }

// Recompute runs one recompute cycle over every seeded managed show.
func (s *Service) Recompute(ctx context.Context) error { return s.recompute(ctx, nil, noFence) }

// ReseedLimits runs one limit reseed.
func (s *Service) ReseedLimits(ctx context.Context) error { return s.reseedLimits(ctx, noFence) }

// SyncManaged runs one managed-shows check (bootstrap if Redis is empty,
// seed newly managed shows, unseed unmanaged ones, due follow-ups).
func (s *Service) SyncManaged(ctx context.Context) error {
	_, err := s.syncManaged(ctx, noFence)
	return err
}

func (s *Service) managedTick(ctx context.Context, fence func(context.Context) error) (bootstrapped bool) {
	b, err := s.syncManaged(ctx, fence)
	if err != nil && ctx.Err() == nil {
		s.log.Warn("managed-shows check failed", "error", err)
	}
	return b
}

// checkSidecar is the deployment guardrail: with managed shows and no sidecar
// streaming the slot, Cuebot's releases never reach Redis and the counters
// only grow until the farm stops booking those shows. It sets
// scheduler_accounting_sidecar_unattended and warns once per occurrence.
func (s *Service) checkSidecar(ctx context.Context, managed int) {
	unattended := false
	if managed > 0 {
		n, err := s.st.activeSidecarSlots(ctx)
		if err != nil {
			s.log.Debug("sidecar slot check failed", "error", err)
			return
		}
		unattended = n == 0
	}
	if unattended {
		s.m.unattended.Set(1)
		if !s.warnedUnattended.Swap(true) {
			s.log.Warn("scheduler-managed shows exist but no sidecar is streaming the release slot: "+
				"releases will not reach Redis and booked counters will only grow (start `cuesched sidecar`)",
				"managed_shows", managed)
		}
		return
	}
	s.m.unattended.Set(0)
	if s.warnedUnattended.Swap(false) {
		s.log.Info("a sidecar is streaming the release slot again")
	}
}

func (s *Service) syncManaged(ctx context.Context, fence func(context.Context) error) (bootstrapped bool, err error) {
	if err := s.identityGuard(ctx, false); errors.Is(err, publisher.ErrIdentityMismatch) {
		return false, err
	}
	known := s.knownEpoch()
	epoch, err := s.pub.Epoch(ctx)
	if err != nil {
		s.setGate(false, "accounting: Redis unreachable: "+err.Error())
		return false, err // nothing to do until it answers
	}
	if epoch == "" {
		// The epoch this instance booked under is gone: its connections
		// close before the bootstrap's snapshot, whether or not the epoch
		// watch polled in between (another instance may have found the
		// rollback and deleted acct:epoch).
		s.epochGone(known)
		return true, s.bootstrap(ctx, fence)
	}
	managed, err := s.st.managedShows(ctx)
	if err != nil {
		return false, err
	}
	s.checkSidecar(ctx, len(managed))
	seeded, err := s.pub.Seeded(ctx, managed)
	if err != nil {
		return false, err
	}
	var unseeded, todo []string
	now := time.Now()
	s.followMu.Lock()
	for _, sh := range managed {
		if seeded[sh] {
			delete(s.flipSeen, sh)
			continue
		}
		unseeded = append(unseeded, sh)
		first, ok := s.flipSeen[sh]
		if !ok {
			first = now
			s.flipSeen[sh] = now
			s.log.Info("show is managed but not seeded: not bookable until its caps and counters are seeded",
				"show", sh, "seed_in", s.cfg.FlipSettle)
		}
		if now.Sub(first) >= s.cfg.FlipSettle {
			todo = append(todo, sh)
		}
	}
	s.followMu.Unlock()
	s.m.unseeded.Set(float64(len(unseeded)))
	if len(todo) > 0 {
		if err := s.seedShows(ctx, todo, epoch, "seed", fence); err != nil {
			return false, err
		}
		s.m.unseeded.Set(float64(len(unseeded) - len(todo)))
	}

	// Shows flipped back to Cuebot: close them for booking.
	isManaged := make(map[string]bool, len(managed))
	for _, sh := range managed {
		isManaged[sh] = true
	}
	marked, err := s.pub.SeededShows(ctx)
	if err != nil {
		return false, err
	}
	for _, sh := range marked {
		if !isManaged[sh] {
			if err := fence(ctx); err != nil {
				return false, err
			}
			if err := s.pub.Unseed(ctx, sh); err != nil {
				return false, err
			}
			s.log.Info("show no longer managed: closed for booking", "show", sh)
		}
	}

	// Follow-up reconciles of recently seeded shows.
	now = time.Now()
	var due []string
	s.followMu.Lock()
	for sh, at := range s.followUps {
		if !now.Before(at) {
			due = append(due, sh)
			delete(s.followUps, sh)
		}
	}
	s.followMu.Unlock()
	if len(due) > 0 {
		sort.Strings(due)
		if err := s.recompute(ctx, due, fence); err != nil {
			return false, err
		}
	}
	return false, nil
}

func (s *Service) bootstrap(ctx context.Context, fence func(context.Context) error) error {
	start := time.Now()
	s.setGate(false, "accounting: bootstrapping Redis from Postgres")
	s.m.bootstraps.Inc()
	epoch, err := s.pub.NewEpoch(ctx)
	if err != nil {
		s.m.reseedCycles.WithLabelValues("bootstrap", "error").Inc()
		return fmt.Errorf("bootstrap: %w", err)
	}
	// The term fence: from here only this bootstrap's markers and epoch are
	// accepted (a stalled former leader's are refused by the seed script).
	err = fence(ctx)
	if err == nil {
		// Bind the keyspace to this database first: a Redis that
		// accounts for another one is refused, never re-seeded.
		err = s.identityGuard(ctx, true)
	}
	if err == nil {
		err = s.pub.BeginBootstrap(ctx, epoch)
	}
	var managed []string
	if err == nil {
		managed, err = s.st.managedShows(ctx)
	}
	if err == nil {
		s.log.Info("bootstrap: seeding every managed show before any booking", "shows", len(managed), "epoch", epoch)
		err = s.seedShows(ctx, managed, epoch, "", fence)
	}
	if err == nil {
		if err = fence(ctx); err == nil {
			err = s.pub.SetEpoch(ctx, epoch)
		}
		if err == nil {
			s.adoptEpoch(ctx, epoch)
		}
	}
	s.m.reseedDuration.WithLabelValues("bootstrap").Observe(time.Since(start).Seconds())
	if err != nil {
		s.m.reseedCycles.WithLabelValues("bootstrap", "error").Inc()
		return fmt.Errorf("bootstrap: %w", err)
	}
	s.m.reseedCycles.WithLabelValues("bootstrap", "ok").Inc()
	// The gate opens on what Redis holds now, as the epoch watch would
	// open it: the epoch this bootstrap wrote may already be gone (a
	// rollback detected meanwhile invalidated it), and then booking stays
	// paused until the next bootstrap.
	s.checkEpoch(ctx)
	s.log.Info("bootstrap done", "shows", len(managed), "duration", time.Since(start))
	return nil
}

// seedShows makes shows bookable: caps, then records and counters from a
// snapshot, then the marker. kind "" is the bootstrap (metrics by caller).
func (s *Service) seedShows(ctx context.Context, shows []string, epoch, kind string, fence func(context.Context) error) error {
	start := time.Now()
	err := s.seedShowsInner(ctx, shows, epoch, fence)
	if kind != "" {
		s.m.reseedDuration.WithLabelValues(kind).Observe(time.Since(start).Seconds())
		if err != nil {
			s.m.reseedCycles.WithLabelValues(kind, "error").Inc()
		} else {
			s.m.reseedCycles.WithLabelValues(kind, "ok").Inc()
		}
	}
	return err
}

func (s *Service) seedShowsInner(ctx context.Context, shows []string, epoch string, fence func(context.Context) error) error {
	if len(shows) == 0 {
		return nil
	}
	for attempt := 0; ; attempt++ {
		mark, err := s.mark(ctx)
		if err != nil {
			return err
		}
		sn, err := s.st.load(ctx, shows, true)
		if err != nil {
			return err
		}
		if err := fence(ctx); err != nil {
			return err
		}
		var all publisher.Limits
		for _, sh := range shows {
			l := sn.limits[sh]
			all.Subs, all.Folders = append(all.Subs, l.Subs...), append(all.Folders, l.Folders...)
			all.Jobs, all.Points = append(all.Jobs, l.Jobs...), append(all.Points, l.Points...)
		}
		all.LSN = sn.lsn
		if _, err := s.pub.WriteLimits(ctx, all, s.cfg.BatchSize); err != nil {
			return err
		}
		err = s.reconcileShows(ctx, sn, mark, fence, func(sh string) error {
			if err := fence(ctx); err != nil {
				return err
			}
			if err := s.pub.MarkSeeded(ctx, sh, epoch); err != nil {
				return err
			}
			s.log.Info("show seeded: bookable", "show", sh, "procs", len(sn.procs[sh]))
			s.followMu.Lock()
			s.followUps[sh] = time.Now().Add(s.cfg.FlipSettle)
			s.followMu.Unlock()
			return nil
		})
		if errors.Is(err, publisher.ErrSnapshotTooOld) && attempt == 0 {
			s.m.recomputeRetries.Inc()
			continue
		}
		if err != nil {
			return err
		}
		return s.dualWrite(ctx, sn, fence)
	}
}

// reconcileShows reconciles and repairs every show of the snapshot, in
// bounded batches, with a fence check before each write; done (optional)
// runs after each show.
func (s *Service) reconcileShows(ctx context.Context, sn *snapshot, mark publisher.Mark, fence func(context.Context) error, done func(show string) error) error {
	for _, sh := range sn.shows {
		recs, err := s.pub.ShowProcs(ctx, sh)
		if err != nil {
			return err
		}
		present := sn.procs[sh]
		in := make(map[string]struct{}, len(present))
		for _, p := range present {
			in[p.ProcID] = struct{}{}
		}
		var drop []string
		for _, id := range recs {
			if _, ok := in[id]; !ok {
				drop = append(drop, id)
			}
		}
		var total publisher.ReconcileStats
		for len(present) > 0 || len(drop) > 0 {
			req := publisher.ReconcileRequest{ShowID: sh, Mark: mark, Grace: s.cfg.InFlightGrace,
				LiveBackends: sn.live, LiveKnown: sn.liveKnown}
			n := min(len(present), s.cfg.BatchSize)
			req.Present, present = present[:n], present[n:]
			m := min(len(drop), s.cfg.BatchSize-n)
			req.Drop, drop = drop[:m], drop[m:]
			if err := fence(ctx); err != nil {
				return err
			}
			st, err := s.pub.Reconcile(ctx, req)
			if errors.Is(err, publisher.ErrSeqRolledBack) {
				// Nothing changed: judge Redis now as the epoch watch
				// would (a re-bootstrap since the mark also lowers
				// acct:seq, and is adopted, not invalidated).
				s.checkEpoch(ctx)
			}
			if err != nil {
				return err
			}
			// Counted per batch: a cycle cut short later (a lost lock, a
			// shutdown) still applied this batch's changes to Redis.
			s.m.observeReconcile(st)
			total = total.Add(st)
		}
		rep, err := s.pub.Repair(ctx, sh, sn.baseline[sh], publisher.RepairOptions{Batch: s.cfg.BatchSize, Before: fence})
		s.m.observeDrift(rep.Drift) // what was repaired before any error
		if err != nil {
			return err
		}
		if total.Adopted+total.Dropped+total.Retargeted > 0 || rep.KeysFixed > 0 {
			s.log.Info("drift corrected", "show", sh, "adopted", total.Adopted, "dropped", total.Dropped,
				"dropped_orphaned", total.DroppedOrphaned,
				"retargeted", total.Retargeted, "keys_repaired", rep.KeysFixed,
				"sub_cores", total.Drift.Sub+rep.Drift.Sub, "job_cores", total.Drift.Job+rep.Drift.Job)
		}
		if done != nil {
			if err := done(sh); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Service) dualWrite(ctx context.Context, sn *snapshot, fence func(context.Context) error) error {
	if err := fence(ctx); err != nil {
		return err
	}
	n, err := s.st.writeTotals(ctx, sn)
	if err != nil {
		return err
	}
	s.m.observePG(n)
	return nil
}

func (s *Service) recomputeCycle(ctx context.Context, fence func(context.Context) error) {
	if err := s.recompute(ctx, nil, fence); err != nil && ctx.Err() == nil {
		s.log.Warn("recompute failed", "error", err)
	}
}

// recompute reconciles the given shows (nil: every seeded managed show)
// with a fresh snapshot and dual-writes the totals to Postgres.
func (s *Service) recompute(ctx context.Context, only []string, fence func(context.Context) error) error {
	start := time.Now()
	err := s.recomputeInner(ctx, only, fence)
	s.m.recomputeDuration.Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, errSkipped):
		s.m.recomputeCycles.WithLabelValues("skipped").Inc()
		return nil
	case err != nil && ctx.Err() != nil:
		return err // cancelled (shutdown or leadership lost): not a failed cycle
	case err != nil:
		s.m.recomputeCycles.WithLabelValues("error").Inc()
		return fmt.Errorf("recompute: %w", err)
	}
	s.m.recomputeCycles.WithLabelValues("ok").Inc()
	return nil
}

var errSkipped = errors.New("skipped")

func (s *Service) recomputeInner(ctx context.Context, only []string, fence func(context.Context) error) error {
	if err := s.identityGuard(ctx, false); errors.Is(err, publisher.ErrIdentityMismatch) {
		return err
	}
	epoch, err := s.pub.Epoch(ctx)
	if err != nil {
		return err
	}
	if epoch == "" {
		return errSkipped // the bootstrap owns an empty Redis
	}
	managed, err := s.st.managedShows(ctx)
	if err != nil {
		return err
	}
	if only != nil {
		want := map[string]bool{}
		for _, sh := range only {
			want[sh] = true
		}
		var m []string
		for _, sh := range managed {
			if want[sh] {
				m = append(m, sh)
			}
		}
		managed = m
	}
	seeded, err := s.pub.Seeded(ctx, managed)
	if err != nil {
		return err
	}
	var shows []string
	for _, sh := range managed {
		if seeded[sh] {
			shows = append(shows, sh)
		}
	}
	if len(shows) == 0 {
		return errSkipped
	}
	for attempt := 0; ; attempt++ {
		mark, err := s.mark(ctx)
		if err != nil {
			return err
		}
		sn, err := s.st.load(ctx, shows, true)
		if err != nil {
			return err
		}
		if s.hooks.afterSnapshot != nil {
			s.hooks.afterSnapshot(shows, mark)
		}
		err = s.reconcileShows(ctx, sn, mark, fence, nil)
		if errors.Is(err, publisher.ErrSnapshotTooOld) && attempt == 0 {
			s.m.recomputeRetries.Inc()
			continue
		}
		if err != nil {
			return err
		}
		if sn.skipped > 0 {
			s.log.Warn("procs without a job or layer row cannot be charged", "count", sn.skipped)
		}
		return s.dualWrite(ctx, sn, fence)
	}
}
