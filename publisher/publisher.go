package publisher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/lua"
)

// Options configures a Publisher. The zero value is usable.
type Options struct {
	// Logger defaults to a null logger.
	Logger hclog.Logger
	// Registerer receives the publisher's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// MetricsPrefix names the metrics (default "scheduler_accounting", e.g.
	// scheduler_accounting_limit_exceeded_total). The sidecar passes its own.
	MetricsPrefix string
	// ReleasesOnly registers only the release metrics: for a caller that
	// never books or rolls back (the sidecar), so it does not export
	// always-zero booking series.
	ReleasesOnly bool
	// TombstoneTTL is how long a release tombstone keeps a recompute from
	// re-adopting a proc whose release it did not see (default 10m). It must
	// exceed the time between a recompute's snapshot and its last reconcile
	// batch; the recompute refuses batches older than half of it.
	TombstoneTTL time.Duration
	// ReleaseChunk bounds the procs released per script call (default 512),
	// so a huge source transaction does not block Redis; see ReleaseBatch.
	ReleaseChunk int
}

// Publisher is the typed API over the accounting scripts. It is safe for
// concurrent use.
type Publisher struct {
	rdb       redis.UniversalClient
	log       hclog.Logger
	m         *metrics
	tombTTL   time.Duration
	chunk     int
	book      *redis.Script
	release   *redis.Script
	reconcile *redis.Script
	repair    *redis.Script
	seed      *redis.Script
	limits    *redis.Script
	// invalidate closes every show when the state rolled back (lineage.go).
	invalidate *redis.Script
	// sidecarState is sidecar_state.lua (SaveSidecarState).
	sidecarState *redis.Script
	repairSeq    atomic.Uint64
	// seqHigh is the highest acct:seq seen acknowledged (lineage.go).
	seqMu   sync.Mutex
	seqHigh int64
	seqTerm int64 // resets of seqHigh (new epochs adopted)
	// seqFault: a booking of this term acknowledged with a seq that went
	// back (lineage.go); booking stops until the next term.
	seqFault *seqFault
}

// DefaultTombstoneTTL is Options.TombstoneTTL's default.
const DefaultTombstoneTTL = 10 * time.Minute

// New returns a Publisher over client (a *redis.Client for one node or a
// failover client for Sentinel; see NewClient).
func New(client redis.UniversalClient, opts Options) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("publisher: nil redis client")
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.MetricsPrefix == "" {
		opts.MetricsPrefix = "scheduler_accounting"
	}
	if opts.TombstoneTTL <= 0 {
		opts.TombstoneTTL = DefaultTombstoneTTL
	}
	if opts.TombstoneTTL < time.Second {
		return nil, fmt.Errorf("publisher: tombstone TTL %v is below 1s", opts.TombstoneTTL)
	}
	if opts.ReleaseChunk <= 0 {
		opts.ReleaseChunk = 512
	}
	m, err := newMetrics(opts.MetricsPrefix, opts.Registerer, opts.ReleasesOnly)
	if err != nil {
		return nil, fmt.Errorf("publisher: register metrics: %w", err)
	}
	return &Publisher{
		rdb:        client,
		log:        opts.Logger.Named("publisher"),
		m:          m,
		tombTTL:    opts.TombstoneTTL,
		chunk:      opts.ReleaseChunk,
		book:       redis.NewScript(lua.Book()),
		release:    redis.NewScript(lua.Release()),
		reconcile:  redis.NewScript(lua.Reconcile()),
		repair:     redis.NewScript(lua.Repair()),
		seed:       redis.NewScript(lua.Seed()),
		limits:     redis.NewScript(lua.Limits()),
		invalidate: newInvalidateScript(),

		sidecarState: redis.NewScript(lua.SidecarState()),
	}, nil
}

// Client returns the Redis client the publisher uses.
func (p *Publisher) Client() redis.UniversalClient { return p.rdb }

// TombstoneTTL returns the configured tombstone lifetime.
func (p *Publisher) TombstoneTTL() time.Duration { return p.tombTTL }

// Load loads every script into the server's script cache (SCRIPT LOAD).
// Optional: every call falls back from EVALSHA to EVAL on NOSCRIPT anyway.
func (p *Publisher) Load(ctx context.Context) error {
	for _, s := range []*redis.Script{p.book, p.release, p.reconcile, p.repair} {
		if err := s.Load(ctx, p.rdb).Err(); err != nil {
			return fmt.Errorf("publisher: script load: %w", err)
		}
	}
	return nil
}

// BookingSHA is the SHA-1 of the booking script (for redis-benchmark and
// redis-cli EVALSHA).
func (p *Publisher) BookingSHA() string { return p.book.Hash() }

// Booking is one proc's reservation as the dispatcher writes it to
// Postgres. Cores are in centicores (proc.int_cores_reserved); the publisher
// converts them at this boundary (ChargeCores) and records the exact value.
type Booking struct {
	ProcID   string
	ShowID   string
	AllocID  string // the host's allocation
	FolderID string // the job's folder
	JobID    string
	LayerID  string
	DeptID   string // the job's department
	// Centicores is proc.int_cores_reserved (> 0).
	Centicores int64
	GPUs       int64
	// Seed optionally carries caps the caller read from Postgres; they are
	// written only where Redis has no value yet (a job created after the last
	// limit reseed), so a new job is never treated as uncapped.
	Seed *SeedCaps
	// HostID, when set, makes the booking honour the host's firm
	// reservation (acct:resv:host:{HostID}): refused with a
	// *ReservedError unless LayerID owns it or BackfillUntil is set and no
	// later than the reservation's ready time.
	HostID string
	// BackfillUntil is when the frame ends at the latest (now + the layer's
	// worst-case runtime); zero claims no backfill (no runtime history).
	BackfillUntil time.Time
	// BackendPID, when set, is the PostgreSQL backend of the one
	// connection the booking's transaction will run on (held from before
	// the booking to the end of the transaction). The record keeps it, so a
	// reconcile drops the record as soon as that backend is gone and the
	// proc is not in its snapshot (ReconcileRequest.LiveBackends), instead
	// of after the in-flight grace. 0: none (the grace applies).
	BackendPID uint32
	// Seats are the layer's node-locked limits (cuesched_limit.b_per_host):
	// the booking needs HostID and is refused with a *SeatError unless the
	// host already holds a seat of each or a seat is free (fewer than Max
	// hosts hold one). The seat is the host's while it has a booked proc
	// under the limit; the release of its last one gives it back.
	Seats []Seat
}

// Seat is a node-locked limit of a booking: its id and max seats (hosts).
type Seat struct {
	Limit string
	Max   int64
}

// SeedCaps are caps in Postgres units (centicores; GPUs verbatim), from
// job_resource and folder_resource, converted like WriteLimits converts them
// (JobCapCores, JobCapGPUs, FolderCapCores, FolderCapGPUs): -1 is unlimited
// for a folder only; a job cap, and every other folder value, is a cap.
type SeedCaps struct {
	JobMaxCores    int64
	JobMaxGPUs     int64
	FolderMaxCores int64
	FolderMaxGPUs  int64
}

func (b *Booking) validate() error {
	for _, f := range []struct{ what, v string }{
		{"proc id", b.ProcID}, {"show id", b.ShowID}, {"alloc id", b.AllocID}, {"folder id", b.FolderID},
		{"job id", b.JobID}, {"layer id", b.LayerID}, {"dept id", b.DeptID},
	} {
		if err := checkID(f.what, f.v); err != nil {
			return err
		}
	}
	if b.Centicores <= 0 {
		return fmt.Errorf("centicores must be > 0 (proc.int_cores_reserved), got %d", b.Centicores)
	}
	if b.GPUs < 0 {
		return fmt.Errorf("gpus must be >= 0, got %d", b.GPUs)
	}
	if b.HostID != "" {
		if err := checkID("host id", b.HostID); err != nil {
			return err
		}
	}
	if len(b.Seats) > 0 && b.HostID == "" {
		return errors.New("a node-locked limit (Seats) needs the host id")
	}
	for _, st := range b.Seats {
		if err := checkID("limit id", st.Limit); err != nil {
			return err
		}
		if strings.Contains(st.Limit, ",") {
			return fmt.Errorf("limit id %q contains a comma", st.Limit)
		}
	}
	if !b.BackfillUntil.IsZero() && b.BackfillUntil.UnixMilli() < 0 {
		return fmt.Errorf("backfill-until %v is before 1970", b.BackfillUntil)
	}
	return nil
}

// Result of a booking that charged (or had already charged) the proc.
type Result struct {
	// Seq is acct:seq after the booking (for a duplicate: when the original
	// booking was made).
	Seq int64
	// Duplicate: the proc was already booked; nothing changed this time.
	Duplicate bool
	// Cores is what the booking charged, in whole cores.
	Cores int64
	// Reservation says how the booking met a reservation on its host:
	// ReservationOwner (the booking's layer owns it: the caller ends it once
	// the proc is committed), ReservationBackfill (an EASY backfill), or ""
	// (no live reservation, or HostID not given).
	Reservation string
}

// Result.Reservation values.
const (
	ReservationOwner    = "owner"
	ReservationBackfill = "backfill"
)

// Book checks the booking against the subscription burst and the folder and
// job caps and, if it fits, charges it atomically. A nil error means the
// proc is charged (Result.Duplicate says whether by this call). Otherwise the
// error is a *LimitError (a cap; nothing charged), a *ReservedError (the
// host is reserved for another layer; nothing charged), a *SeatError (no
// seat of a node-locked limit for the host; nothing charged), a *NotSeededError
// (errors.Is ErrShowNotSeeded: wait for the seed), ErrAlreadyReleased, or a
// Redis/transport error (the outcome is unknown: Rollback is safe to call).
func (p *Publisher) Book(ctx context.Context, b Booking) (Result, error) {
	return p.doBook(ctx, b, "check")
}

// ForceBook charges the booking without checking caps or the seeding gate
// (still idempotent per proc). Use it to record a proc that exists whatever
// the caps say; a rollback is Rollback, not a negated ForceBook.
func (p *Publisher) ForceBook(ctx context.Context, b Booking) (Result, error) {
	return p.doBook(ctx, b, "force")
}

func (p *Publisher) doBook(ctx context.Context, b Booking, mode string) (Result, error) {
	if err := b.validate(); err != nil {
		p.m.bookings.WithLabelValues("error").Inc()
		return Result{}, fmt.Errorf("accounting book: %w", err)
	}
	if err := p.fenced(); err != nil && mode == "check" {
		p.m.bookings.WithLabelValues("error").Inc()
		return Result{}, fmt.Errorf("accounting book proc %s: %w", b.ProcID, err)
	}
	keys, args := bookCall(b, mode)
	hw, term := p.SeqMark()
	start := time.Now()
	v, err := p.book.Run(ctx, p.rdb, keys, args...).Slice()
	p.m.bookingLatency.Observe(time.Since(start).Seconds())
	return p.bookReply(b, v, err, hw, term)
}

// BookAll books several procs in one round trip: the booking script once
// per booking, pipelined in the given order. Each booking is atomic on its
// own and checked exactly as Book checks it (the scripts are not one
// transaction: another client's booking may run between two of them). It
// returns, per booking, what Book would have returned for it. A NOSCRIPT
// reply (a restarted or failed-over Redis has an empty script cache; a
// script that got it did nothing) loads the script and sends those
// bookings once more. A transport error fails every booking it reached,
// with the outcome unknown, as for Book (Rollback is safe to call).
func (p *Publisher) BookAll(ctx context.Context, bs []Booking) ([]Result, []error) {
	results, errs := make([]Result, len(bs)), make([]error, len(bs))
	type call struct {
		i    int
		keys []string
		args []any
		cmd  *redis.Cmd
	}
	calls := make([]*call, 0, len(bs))
	fence := p.fenced()
	for i, b := range bs {
		if fence != nil {
			p.m.bookings.WithLabelValues("error").Inc()
			errs[i] = fmt.Errorf("accounting book proc %s: %w", b.ProcID, fence)
			continue
		}
		if err := b.validate(); err != nil {
			p.m.bookings.WithLabelValues("error").Inc()
			errs[i] = fmt.Errorf("accounting book: %w", err)
			continue
		}
		keys, args := bookCall(b, "check")
		calls = append(calls, &call{i: i, keys: keys, args: args})
	}
	hw, term := p.SeqMark()
	for attempt := 0; len(calls) > 0; attempt++ {
		start := time.Now()
		pipe := p.rdb.Pipeline()
		for _, c := range calls {
			c.cmd = p.book.EvalSha(ctx, pipe, c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx) // errors are per command, read below
		took := time.Since(start).Seconds()
		var again []*call
		for _, c := range calls {
			v, err := c.cmd.Slice()
			if err != nil && attempt == 0 && isNoScript(err) {
				again = append(again, c)
				continue
			}
			p.m.bookingLatency.Observe(took)
			results[c.i], errs[c.i] = p.bookReply(bs[c.i], v, err, hw, term)
		}
		if len(again) > 0 {
			if err := p.book.Load(ctx, p.rdb).Err(); err != nil {
				for _, c := range again {
					results[c.i], errs[c.i] = p.bookReply(bs[c.i], nil, err, hw, term)
				}
				break
			}
		}
		calls = again
	}
	return results, errs
}

// bookCall is the booking script's keys and arguments for b (validated).
func bookCall(b Booking, mode string) ([]string, []any) {
	cores := ChargeCores(b.Centicores)
	rk := RepairKeys(b.ShowID)
	keys := []string{
		SubKey(b.ShowID, b.AllocID), FolderKey(b.FolderID), JobKey(b.JobID), LayerKey(b.LayerID),
		PointKey(b.DeptID, b.ShowID), SeqKey, ProcKey(b.ProcID), ShowKey(b.ShowID), ShowProcsKey(b.ShowID), TombKey(b.ProcID),
		rk[0], rk[1], rk[2],
	}
	args := []any{mode, b.ProcID, b.ShowID, cores, b.Centicores, b.GPUs, "", "", "", ""}
	if s := b.Seed; s != nil {
		args[6], args[7] = JobCapCores(s.JobMaxCores), JobCapGPUs(s.JobMaxGPUs)
		args[8], args[9] = FolderCapCores(s.FolderMaxCores), FolderCapGPUs(s.FolderMaxGPUs)
	}
	// ARGV[11..13] host, layer, backfill-until; [14] backend pid; [15] the
	// node-locked limits' count, then their (id, max) pairs.
	host, layer, until, pid := "", "", "", ""
	if b.HostID != "" {
		host, layer = b.HostID, b.LayerID
		if !b.BackfillUntil.IsZero() {
			until = strconv.FormatInt(b.BackfillUntil.UnixMilli(), 10)
		}
		keys = append(keys, ResvHostKey(b.HostID))
	}
	if b.BackendPID != 0 {
		pid = strconv.FormatUint(uint64(b.BackendPID), 10)
	}
	args = append(args, host, layer, until, pid, len(b.Seats))
	for _, st := range b.Seats {
		args = append(args, st.Limit, max(st.Max, 0))
	}
	return keys, args
}

// bookReply reads the booking script's reply v (or the call's error err)
// for b; hw and term are the seq mark read before the call (SeqMark).
func (p *Publisher) bookReply(b Booking, v []any, err error, hw, term int64) (Result, error) {
	cores := ChargeCores(b.Centicores)
	if err != nil {
		p.m.bookings.WithLabelValues("error").Inc()
		return Result{}, fmt.Errorf("accounting book proc %s (show %s): %w", b.ProcID, b.ShowID, err)
	}
	code, err := intAt(v, 0)
	if err != nil {
		p.m.bookings.WithLabelValues("error").Inc()
		return Result{}, fmt.Errorf("accounting book proc %s: unexpected reply %v", b.ProcID, v)
	}
	switch code {
	case 1, 2:
		seq, _ := intAt(v, 1)
		if code == 1 {
			// A new booking's seq is above every one acknowledged
			// before it was sent (a duplicate's is its original's).
			if err := p.checkSeq(seq, hw, term); err != nil {
				p.m.bookings.WithLabelValues("error").Inc()
				return Result{}, fmt.Errorf("accounting book proc %s: acknowledged with acct:seq %d, not above %d: %w", b.ProcID, seq, hw, err)
			}
			p.m.bookings.WithLabelValues("booked").Inc()
		} else {
			p.m.bookings.WithLabelValues("duplicate").Inc()
		}
		p.observeSeqIn(seq, term)
		r := Result{Seq: seq, Duplicate: code == 2, Cores: cores}
		if len(v) > 2 {
			r.Reservation, _ = v[2].(string)
		}
		return r, nil
	case 0:
		if len(v) < 4 {
			break
		}
		table, _ := v[1].(string)
		if table == TableSeat && len(v) >= 5 {
			se := &SeatError{Host: b.HostID}
			se.Held, _ = intAt(v, 2)
			se.Max, _ = intAt(v, 3)
			se.Limit, _ = v[4].(string)
			p.m.bookings.WithLabelValues("seat").Inc()
			return Result{}, se
		}
		if table == TableReservation && len(v) >= 7 {
			until, _ := intAt(v, 2)
			ready, _ := intAt(v, 3)
			why, _ := v[4].(string)
			re := &ReservedError{Host: b.HostID, ReadyAt: time.UnixMilli(ready), Backfill: why == "backfill"}
			re.OwnerLayer, _ = v[5].(string)
			re.OwnerJob, _ = v[6].(string)
			if until > 0 {
				re.Until = time.UnixMilli(until)
			}
			p.m.bookings.WithLabelValues("reserved").Inc()
			return Result{}, re
		}
		cur, _ := intAt(v, 2)
		limit, _ := intAt(v, 3)
		le := &LimitError{Table: table, ShowID: b.ShowID, AllocID: b.AllocID, Folder: b.FolderID, Job: b.JobID,
			Current: cur, Limit: limit, Delta: cores, Missing: len(v) > 4}
		if table == TableFolderGPUs || table == TableJobGPUs {
			le.Delta = b.GPUs
		}
		p.m.bookings.WithLabelValues("limit_exceeded").Inc()
		p.m.limitExceeded.WithLabelValues(table).Inc()
		return Result{}, le
	case 3:
		p.m.bookings.WithLabelValues("unseeded").Inc()
		return Result{}, &NotSeededError{ShowID: b.ShowID}
	case 4:
		p.m.bookings.WithLabelValues("released").Inc()
		return Result{}, fmt.Errorf("accounting book proc %s: %w", b.ProcID, ErrAlreadyReleased)
	}
	p.m.bookings.WithLabelValues("error").Inc()
	return Result{}, fmt.Errorf("accounting book proc %s: unexpected reply %v", b.ProcID, v)
}

// ReleaseResult counts what a release call did, per proc.
type ReleaseResult struct {
	// Applied is false only for a ReleaseBatch whose LSN was not newer than
	// the stored checkpoint (a replay): nothing changed.
	Applied bool
	// StoredLSN is the checkpoint after the call (ReleaseBatch only).
	StoredLSN uint64
	// Released procs had a record: their charges were undone.
	Released int
	// AlreadyReleased procs had no record but a tombstone (a replayed release).
	AlreadyReleased int
	// NeverBooked procs had neither: never charged through Redis (e.g. booked
	// by Cuebot before the show was managed and not yet adopted). Counted
	// no-ops; the tombstone they leave stops a later adoption.
	NeverBooked int
}

// Release undoes the charges of procs that are gone (their proc rows were
// deleted), from their per-proc records, and leaves tombstones. Releasing a
// proc twice, or one never booked through Redis, changes nothing.
func (p *Publisher) Release(ctx context.Context, procIDs ...string) (ReleaseResult, error) {
	return p.releaseChunks(ctx, "release", "", procIDs)
}

// Release is one proc of a source transaction, for ReleaseBatch.
type Release struct {
	ProcID string
}

// ReleaseBatch applies the releases of one source transaction whose commit
// LSN is lsn (> 0), exactly once: if lsn is not greater than the stored
// checkpoint (acct:sidecar:lsn) nothing changes and Applied is false;
// otherwise every release is applied and the checkpoint becomes lsn, in the
// same script. A batch larger than Options.ReleaseChunk is applied in
// several script calls with the checkpoint written by the last one; a crash
// in between replays the whole batch, and the per-proc records make the
// replayed part a no-op. An empty batch only advances the checkpoint
// (keepalive).
func (p *Publisher) ReleaseBatch(ctx context.Context, lsn uint64, rels []Release) (ReleaseResult, error) {
	if lsn == 0 {
		return ReleaseResult{}, errors.New("accounting release batch: LSN must be > 0")
	}
	ids := make([]string, len(rels))
	for i, r := range rels {
		if err := checkID("proc id", r.ProcID); err != nil {
			return ReleaseResult{}, fmt.Errorf("accounting release batch at %s: release %d: %w", FormatLSN(lsn), i, err)
		}
		ids[i] = r.ProcID
	}
	if len(ids) > p.chunk {
		// Check for a replay before applying the first chunk.
		stored, ok, err := p.Checkpoint(ctx)
		if err != nil {
			return ReleaseResult{}, err
		}
		if ok && stored >= lsn {
			p.m.releases.WithLabelValues("stale_batch").Add(float64(len(ids)))
			return ReleaseResult{Applied: false, StoredLSN: stored}, nil
		}
	}
	return p.releaseChunks(ctx, "release", FormatLSN(lsn), ids)
}

// Checkpoint returns the stored sidecar LSN; ok is false when there is none
// (a new or emptied Redis: the sidecar must recompute before streaming).
func (p *Publisher) Checkpoint(ctx context.Context) (lsn uint64, ok bool, err error) {
	s, err := p.rdb.Get(ctx, LSNKey).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("accounting checkpoint: %w", err)
	}
	v, err := ParseLSN(s)
	if err != nil {
		return 0, false, fmt.Errorf("accounting checkpoint: %s holds %w", LSNKey, err)
	}
	return v, true, nil
}

// RollbackResult says whether a rollback found the booking.
type RollbackResult struct {
	// RolledBack: the booking's record existed and its charges were undone.
	RolledBack bool
}

// Rollback undoes a booking whose proc INSERT failed (or whose outcome is
// unknown), from its per-proc record. It is a no-op for a proc with no
// record. Unlike Release it leaves no tombstone: if the INSERT did commit
// after all, the next recompute adopts the proc again instead of losing it.
func (p *Publisher) Rollback(ctx context.Context, procID string) (RollbackResult, error) {
	if err := checkID("proc id", procID); err != nil {
		p.m.rollbacks.WithLabelValues("error").Inc()
		return RollbackResult{}, fmt.Errorf("accounting rollback: %w", err)
	}
	start := time.Now()
	v, err := p.release.Run(ctx, p.rdb, []string{SeqKey, LSNKey}, "rollback", "", 0, procID).Slice()
	p.m.rollbackLatency.Observe(time.Since(start).Seconds())
	if err != nil {
		p.m.rollbacks.WithLabelValues("error").Inc()
		return RollbackResult{}, fmt.Errorf("accounting rollback proc %s: %w", procID, err)
	}
	n, err := intAt(v, 1)
	if err != nil {
		p.m.rollbacks.WithLabelValues("error").Inc()
		return RollbackResult{}, fmt.Errorf("accounting rollback proc %s: unexpected reply %v", procID, v)
	}
	if n == 1 {
		p.m.rollbacks.WithLabelValues("rolled_back").Inc()
	} else {
		p.m.rollbacks.WithLabelValues("not_found").Inc()
	}
	return RollbackResult{RolledBack: n == 1}, nil
}

func (p *Publisher) releaseChunks(ctx context.Context, mode, lsn string, ids []string) (ReleaseResult, error) {
	for i, id := range ids {
		if err := checkID("proc id", id); err != nil {
			p.m.releases.WithLabelValues("error").Inc()
			return ReleaseResult{}, fmt.Errorf("accounting release: proc %d: %w", i, err)
		}
	}
	res := ReleaseResult{Applied: true}
	ttl := p.tombTTL.Milliseconds()
	for start := 0; start < len(ids) || (start == 0 && lsn != ""); start += p.chunk {
		end := min(start+p.chunk, len(ids))
		chunkLSN := ""
		if end == len(ids) {
			chunkLSN = lsn
		}
		args := make([]any, 0, 3+end-start)
		args = append(args, mode, chunkLSN, ttl)
		for _, id := range ids[start:end] {
			args = append(args, id)
		}
		t0 := time.Now()
		v, err := p.release.Run(ctx, p.rdb, []string{SeqKey, LSNKey}, args...).Slice()
		p.m.releaseLatency.Observe(time.Since(t0).Seconds())
		if err != nil {
			p.m.releases.WithLabelValues("error").Add(float64(end - start))
			return res, fmt.Errorf("accounting release (%d procs, lsn %q): %w", end-start, lsn, err)
		}
		code, err := intAt(v, 0)
		if err != nil {
			return res, fmt.Errorf("accounting release: unexpected reply %v", v)
		}
		if code == 0 {
			// Stale batch: only the last chunk carries the LSN; earlier
			// chunks of this batch were idempotent replays.
			s, _ := v[1].(string)
			res.Applied = false
			res.StoredLSN, _ = ParseLSN(s)
			p.m.releases.WithLabelValues("stale_batch").Add(float64(end - start))
			return res, nil
		}
		r, _ := intAt(v, 1)
		d, _ := intAt(v, 2)
		u, _ := intAt(v, 3)
		res.Released += int(r)
		res.AlreadyReleased += int(d)
		res.NeverBooked += int(u)
		p.m.releases.WithLabelValues("released").Add(float64(r))
		p.m.releases.WithLabelValues("already_released").Add(float64(d))
		p.m.releases.WithLabelValues("never_booked").Add(float64(u))
		if end == len(ids) {
			break
		}
	}
	if lsn != "" {
		res.StoredLSN, _ = ParseLSN(lsn)
	}
	if res.NeverBooked > 0 {
		p.log.Debug("release of procs never booked through Redis (counted no-op)", "count", res.NeverBooked)
	}
	return res, nil
}

func intAt(v []any, i int) (int64, error) {
	if i >= len(v) {
		return 0, fmt.Errorf("reply has %d elements", len(v))
	}
	switch x := v[i].(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("element %d is %T", i, v[i])
}
