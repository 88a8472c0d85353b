package sidecar

import (
	"context"
	"errors"
	"fmt"
	"github.com/cuesched/cuesched/shared/appname"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/metrics"
	"github.com/cuesched/cuesched/shared/replication"

	"github.com/cuesched/cuesched/shared/redact"
)

// Config configures a Sidecar. DatabaseURL and SlotName are required; the
// rest has defaults.
type Config struct {
	// DatabaseURL is the Cuebot database (an ordinary libpq URL; the role
	// needs the REPLICATION attribute).
	DatabaseURL string
	// SlotName is the permanent logical replication slot.
	SlotName string
	// Publications streamed (default cuesched_accounting, cuesched_proc).
	Publications []string
	// CreateSlot creates the slot (with a snapshot that seeds the sidecar)
	// when it is missing; otherwise a missing slot stops Run.
	CreateSlot bool
	// RecreateLostSlot creates the slot when it is missing (or was
	// invalidated) and Redis holds a sidecar checkpoint: the slot existed
	// and was lost, typically in a failover to a promoted standby (before
	// PostgreSQL 17's failover slots, logical slots are not on standbys).
	// The new slot's snapshot requests the re-bootstrap that covers what
	// the lost slot never streamed. Without a checkpoint (a first start, a
	// mistyped slot name, an emptied Redis) it still takes CreateSlot.
	RecreateLostSlot bool
	// MaxRetainedWAL (bytes) makes the sidecar WARN loudly and set
	// sidecar_slot_retained_wal_exceeded when the slot retains more WAL.
	// 0 disables the check.
	MaxRetainedWAL int64
	// StandbyRetry is how often a standby (slot busy) or a disconnected
	// sidecar retries (default 1s).
	StandbyRetry time.Duration
	// StatusInterval is the replication standby-status interval, which is
	// also how often an idle stream gets a keepalive (default 2s).
	StatusInterval time.Duration
	// CheckpointInterval bounds how long a position reached by transactions
	// that released nothing waits for its checkpoint (default 1s).
	CheckpointInterval time.Duration
	// SlotPollInterval is how often pg_replication_slots is polled for the
	// lag and retained-WAL metrics (default 10s).
	SlotPollInterval time.Duration
	// TombstoneTTL is passed to the publisher (0 = its default).
	TombstoneTTL time.Duration

	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// Health, when set, gets a readiness check named "sidecar".
	Health *metrics.Health
}

// Sidecar is one release publisher process.
type Sidecar struct {
	cfg    Config
	log    hclog.Logger
	m      *sidecarMetrics
	rdb    redis.UniversalClient
	c      *consumer
	stream *replication.Stream

	mu      sync.Mutex
	started bool
	pool    *pgxpool.Pool
	slot    SlotState
}

// Status is a point-in-time view of a sidecar.
type Status struct {
	// Active: this sidecar holds the slot and streams. Standby: another
	// consumer holds it and this one is waiting.
	Active, Standby bool
	// Checkpoint is the highest LSN the Redis checkpoint is known to hold;
	// Applied the end of the last transaction applied.
	Checkpoint, Applied LSN
	ManagedShows        int
	// RedisFailingSince is non-zero while Redis calls are being retried.
	RedisFailingSince time.Time
	Stream            replication.Status
	// Slot is the last poll of pg_replication_slots.
	Slot SlotState
}

// New builds a sidecar over the Redis client rdb (see publisher.NewClient).
func New(cfg Config, rdb redis.UniversalClient) (*Sidecar, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("sidecar: no database URL")
	}
	if !replication.ValidSlotName(cfg.SlotName) {
		return nil, fmt.Errorf("sidecar: slot name %q must be 1-63 lower-case letters, digits or underscores", cfg.SlotName)
	}
	if rdb == nil {
		return nil, errors.New("sidecar: nil redis client")
	}
	if len(cfg.Publications) == 0 {
		cfg.Publications = []string{"cuesched_accounting", "cuesched_proc"}
	}
	if cfg.StandbyRetry <= 0 {
		cfg.StandbyRetry = time.Second
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = 2 * time.Second
	}
	if cfg.CheckpointInterval <= 0 {
		cfg.CheckpointInterval = time.Second
	}
	if cfg.SlotPollInterval <= 0 {
		cfg.SlotPollInterval = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	log := cfg.Logger.Named("sidecar").With("slot", cfg.SlotName)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m.retainedLimit.Set(float64(cfg.MaxRetainedWAL))
	pub, err := publisher.New(rdb, publisher.Options{
		Logger: log, Registerer: cfg.Registerer, MetricsPrefix: "sidecar_accounting", ReleasesOnly: true, TombstoneTTL: cfg.TombstoneTTL,
	})
	if err != nil {
		return nil, err
	}
	s := &Sidecar{cfg: cfg, log: log, m: m, rdb: rdb}
	s.c = &consumer{
		log: log, m: m, pub: pub, rdb: rdb,
		flushEvery: cfg.CheckpointInterval,
		now:        time.Now,
		state:      managedState{shows: map[string]bool{}},
		c:          newCaches(),
	}
	stream, err := replication.New(replication.Config{
		ConnString: cfg.DatabaseURL,
		// The scheduler's guardrail and `cuesched migrate status` know a
		// sidecar's walsender by this name, whatever the slot is called.
		ApplicationName: appname.Sidecar,
		Slot:            cfg.SlotName,
		Kind:            replication.PermanentSlot,
		CreateSlot:      cfg.CreateSlot,
		MayCreate:       s.mayRecreate,
		Publications:    cfg.Publications,
		ExplicitAck:     true,
		StatusInterval:  cfg.StatusInterval,
		// A standby retries the busy slot every StandbyRetry (jittered
		// between half and all of it); so does a disconnected sidecar.
		MinBackoff: cfg.StandbyRetry,
		MaxBackoff: cfg.StandbyRetry,
		Logger:     log,
		Metrics:    replication.NewMetrics(cfg.Registerer, "sidecar_replication_"),
	}, s.c)
	if err != nil {
		return nil, fmt.Errorf("sidecar: %w", err)
	}
	s.stream = stream
	s.c.ack = stream.Ack
	if cfg.Health != nil {
		cfg.Health.SetCheck("sidecar", s.ready)
	}
	return s, nil
}

// Run streams until ctx is cancelled (returning nil) or a non-retriable
// error occurs (a missing slot without CreateSlot, bad permissions, a
// missing publication, wal_level not logical).
func (s *Sidecar) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("sidecar: Run called twice")
	}
	s.started = true
	pcfg, err := pgxpool.ParseConfig(s.cfg.DatabaseURL)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("sidecar: database URL: %w", redact.Error(err, s.cfg.DatabaseURL))
	}
	pcfg.MaxConns = 4
	if pcfg.ConnConfig.RuntimeParams["application_name"] == "" {
		pcfg.ConnConfig.RuntimeParams["application_name"] = appname.Sidecar
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("sidecar: database pool: %w", redact.Error(err, s.cfg.DatabaseURL))
	}
	s.pool = pool
	s.c.pool = pool
	s.c.vis = replication.NewVisibility(pool, replication.VisibilityOptions{Logger: s.log,
		Waits: s.m.visWaits, Reads: s.m.visReads, What: "its releases and cap changes", Now: s.c.now})
	s.mu.Unlock()
	defer pool.Close()
	// Refuse a database without the rollout now, with what to run,
	// instead of failing at the first change the stream decodes.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = migrations.CheckApplied(cctx, pool, s.cfg.Publications...)
	cancel()
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	// A Redis that accounts for another database is refused before the
	// slot is touched (each session binds it again before streaming).
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	id, err := publisher.DatabaseIdentity(ictx, pool)
	if err == nil {
		err = s.c.pub.CheckIdentity(ictx, id)
	}
	cancel()
	if errors.Is(err, publisher.ErrIdentityMismatch) {
		return fmt.Errorf("sidecar: %w", err)
	}

	mctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.monitor(mctx, pool) }()
	s.log.Info("sidecar starting", "publications", s.cfg.Publications, "create_slot", s.cfg.CreateSlot, "standby_retry", s.cfg.StandbyRetry)
	err = s.stream.Run(ctx)
	stop()
	wg.Wait()
	s.m.active.Set(0)
	s.m.standby.Set(0)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	if errors.Is(err, replication.ErrSlotMissing) || errors.Is(err, replication.ErrSlotLost) {
		return fmt.Errorf("%w\n  the slot is gone and Redis holds no sidecar checkpoint that proves it existed%s.\n"+
			"  Operator step (after a database failover, or the first start): run this sidecar once with --create-slot;\n"+
			"  it creates the slot and the scheduler re-bootstraps the Redis accounting from Postgres", err, s.recreateHint())
	}
	return err
}

// mayRecreate is the stream's MayCreate: a missing or invalidated slot is
// re-created when Redis holds a sidecar checkpoint (the slot existed).
func (s *Sidecar) mayRecreate(ctx context.Context) (bool, string, error) {
	if !s.cfg.RecreateLostSlot {
		return false, "", nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lsn, ok, err := s.c.pub.Checkpoint(cctx)
	if err != nil || !ok {
		return false, "", err
	}
	s.m.slotRecreated.Inc()
	return true, fmt.Sprintf("Redis holds sidecar checkpoint %s, so the slot existed and was lost (a failover to a standby without it, or a dropped or invalidated slot); "+
		"the new slot's snapshot requests a re-bootstrap of the Redis accounting from Postgres", LSN(lsn)), nil
}

func (s *Sidecar) recreateHint() string {
	if !s.cfg.RecreateLostSlot {
		return " (sidecar.recreate_lost_slot is false)"
	}
	return ""
}

// Status reports the sidecar's state.
func (s *Sidecar) Status() Status {
	st := s.stream.Status()
	s.mu.Lock()
	slot := s.slot
	s.mu.Unlock()
	out := Status{
		Active:       st.Streaming,
		Standby:      !st.Streaming && errors.Is(st.LastError, replication.ErrSlotBusy),
		Checkpoint:   LSN(s.c.checkpointA.Load()),
		Applied:      LSN(s.c.appliedA.Load()),
		ManagedShows: int(s.c.managedCount.Load()),
		Stream:       st,
		Slot:         slot,
	}
	if f := s.c.redisFail.Load(); f != nil {
		out.RedisFailingSince = f.since
	}
	return out
}

// ready is the readiness check: an active sidecar whose Redis answers, or a
// healthy standby.
func (s *Sidecar) ready() error {
	if f := s.c.redisFail.Load(); f != nil {
		return fmt.Errorf("redis unavailable since %s (retrying, nothing acknowledged): %v", f.since.Format(time.RFC3339), f.err)
	}
	st := s.stream.Status()
	switch {
	case st.Streaming:
		return nil
	case errors.Is(st.LastError, replication.ErrSlotBusy):
		return nil // hot standby
	case st.Sessions == 0 || st.LastError == nil:
		return errors.New("starting")
	}
	return fmt.Errorf("not streaming: %v", st.LastError)
}

// monitor keeps the active/standby gauges current and polls the slot.
func (s *Sidecar) monitor(ctx context.Context, pool *pgxpool.Pool) {
	gauges := time.NewTicker(250 * time.Millisecond)
	defer gauges.Stop()
	poll := time.NewTimer(0)
	defer poll.Stop()
	var lastWarn time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-gauges.C:
			st := s.Status()
			s.m.active.Set(b2f(st.Active))
			s.m.standby.Set(b2f(st.Standby))
		case <-poll.C:
			poll.Reset(s.cfg.SlotPollInterval)
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			slot, err := Inspect(qctx, pool, s.cfg.SlotName)
			cancel()
			s.mu.Lock()
			if err == nil {
				s.slot = slot
			}
			s.mu.Unlock()
			if err != nil {
				if ctx.Err() == nil {
					s.m.slotPollErrors.Inc()
					s.log.Debug("slot poll failed", "error", err)
				}
				continue
			}
			s.m.slotExists.Set(b2f(slot.Exists))
			s.m.lagBytes.Set(float64(slot.LagBytes))
			s.m.retainedBytes.Set(float64(slot.RetainedBytes))
			over := s.cfg.MaxRetainedWAL > 0 && slot.RetainedBytes > s.cfg.MaxRetainedWAL
			// The WARN is written before the gauge flips, so whoever sees
			// the gauge at 1 finds the line that explains it in the log.
			if over && time.Since(lastWarn) >= time.Minute {
				lastWarn = time.Now()
				s.log.Warn("REPLICATION SLOT RETAINS TOO MUCH WAL: the sidecar is not keeping up or no sidecar streams; the database disk fills until the slot is consumed, dropped or invalidated (max_slot_wal_keep_size)",
					"retained_bytes", slot.RetainedBytes, "limit_bytes", s.cfg.MaxRetainedWAL, "slot_active", slot.Active, "lag_bytes", slot.LagBytes, "wal_status", slot.WALStatus)
			}
			s.m.retainedOver.Set(b2f(over))
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// SlotState is a poll of the sidecar's slot.
type SlotState struct {
	Exists bool
	Active bool
	// LagBytes is pg_current_wal_lsn() - confirmed_flush_lsn; RetainedBytes
	// is pg_current_wal_lsn() - restart_lsn.
	LagBytes, RetainedBytes int64
	WALStatus               string
	// ManagedShows counts shows with b_scheduler_managed = true.
	ManagedShows int
}

// Unattended reports the guardrail condition: some show is scheduler-managed
// but no sidecar streams the slot, so its releases do not reach Redis.
func (s SlotState) Unattended() bool { return s.ManagedShows > 0 && !s.Active }

// Inspect reads the slot's state and the number of managed shows (for the
// sidecar's metrics and for operator tooling such as `cuesched migrate
// status`). A missing slot is Exists = false, not an error.
func Inspect(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, slot string) (SlotState, error) {
	var st SlotState
	err := q.QueryRow(ctx, `
		SELECT s.active,
		       COALESCE((pg_current_wal_lsn() - s.confirmed_flush_lsn)::int8, 0),
		       COALESCE((pg_current_wal_lsn() - s.restart_lsn)::int8, 0),
		       COALESCE(s.wal_status, '')
		  FROM pg_replication_slots s WHERE s.slot_name = $1`, slot).Scan(&st.Active, &st.LagBytes, &st.RetainedBytes, &st.WALStatus)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return st, fmt.Errorf("sidecar: read slot %s: %w", slot, err)
	default:
		st.Exists = true
	}
	if err := q.QueryRow(ctx, `SELECT count(*) FROM show WHERE b_scheduler_managed`).Scan(&st.ManagedShows); err != nil {
		return st, fmt.Errorf("sidecar: count managed shows: %w", err)
	}
	return st, nil
}
