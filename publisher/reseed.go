package publisher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Mark is the point in Redis's history at which a recompute's Postgres
// snapshot begins: acct:seq and Redis time, read atomically *before* the
// snapshot is taken.
type Mark struct {
	Seq    int64
	TimeMS int64
	// Epoch is acct:epoch at the same instant ("" while not bootstrapped):
	// with Seq, a State the lineage check can judge.
	Epoch string
}

// Mark reads acct:seq, acct:epoch and TIME in one MULTI/EXEC.
func (p *Publisher) Mark(ctx context.Context) (Mark, error) {
	var seq, epoch *redis.StringCmd
	var tm *redis.TimeCmd
	_, err := p.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		seq = pipe.Get(ctx, SeqKey)
		epoch = pipe.Get(ctx, EpochKey)
		tm = pipe.Time(ctx)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Mark{}, fmt.Errorf("accounting mark: %w", err)
	}
	m := Mark{}
	if v, err := seq.Int64(); err == nil {
		m.Seq = v
	} else if !errors.Is(err, redis.Nil) {
		return Mark{}, fmt.Errorf("accounting mark: acct:seq: %w", err)
	}
	if v, err := epoch.Result(); err == nil {
		m.Epoch = v
	} else if !errors.Is(err, redis.Nil) {
		return Mark{}, fmt.Errorf("accounting mark: acct:epoch: %w", err)
	}
	t, err := tm.Result()
	if err != nil {
		return Mark{}, fmt.Errorf("accounting mark: TIME: %w", err)
	}
	m.TimeMS = t.UnixMilli()
	return m, nil
}

// ProcCharge is one proc as a Postgres snapshot sees it (non-local procs of
// a managed show), with the ids that name its five accounting keys.
type ProcCharge struct {
	ProcID     string
	ShowID     string
	AllocID    string // host.pk_alloc
	FolderID   string // job.pk_folder
	JobID      string
	LayerID    string
	DeptID     string // job.pk_dept
	Centicores int64  // proc.int_cores_reserved
	GPUs       int64  // proc.int_gpus_reserved
}

// Keys returns the five accounting keys the proc charges, in the order sub,
// folder, job, layer, point.
func (c ProcCharge) Keys() [5]string {
	return [5]string{SubKey(c.ShowID, c.AllocID), FolderKey(c.FolderID), JobKey(c.JobID), LayerKey(c.LayerID), PointKey(c.DeptID, c.ShowID)}
}

// TableCores is an amount of cores per accounting table.
type TableCores struct {
	Sub, Folder, Job, Layer, Point int64
}

// Add returns t + o.
func (t TableCores) Add(o TableCores) TableCores {
	return TableCores{t.Sub + o.Sub, t.Folder + o.Folder, t.Job + o.Job, t.Layer + o.Layer, t.Point + o.Point}
}

// ReconcileRequest is one bounded batch of one show.
type ReconcileRequest struct {
	ShowID string
	// Mark was read before the snapshot was taken.
	Mark Mark
	// Grace: a record booked less than Grace before Mark.TimeMS is never
	// dropped, even if the snapshot lacks its proc (its INSERT may still be
	// in flight).
	Grace time.Duration
	// MaxAge: refuse the batch (ErrSnapshotTooOld) if the snapshot is older.
	// Zero means half the tombstone TTL, the largest safe value.
	MaxAge time.Duration
	// Present: procs of the show in the snapshot (adopt or retarget).
	Present []ProcCharge
	// Drop: proc ids with a record for the show but absent from the snapshot.
	Drop []string
	// LiveBackends, when LiveKnown, are the pids of every PostgreSQL
	// backend, read after Mark and before the snapshot. A record booked
	// before Mark on a backend not among them (Booking.BackendPID) is
	// dropped without waiting for Grace: its connection is gone, so its
	// transaction ended before the snapshot, which would hold its proc had
	// it committed (a scheduler killed or cut before its COMMIT, a
	// database promoted under it).
	LiveBackends []uint32
	LiveKnown    bool
}

// ReconcileStats counts what a reconcile did.
type ReconcileStats struct {
	Adopted, Retargeted, Dropped int
	// SkippedReleased: in the snapshot but released since (tombstone).
	SkippedReleased int
	// KeptInFlight: absent from the snapshot but possibly in flight.
	KeptInFlight int
	// DroppedOrphaned: of Dropped, those dropped within the grace because
	// their booking's backend was gone.
	DroppedOrphaned int
	// Drift is the cores moved per table.
	Drift TableCores
}

// Add returns s + o.
func (s ReconcileStats) Add(o ReconcileStats) ReconcileStats {
	return ReconcileStats{Adopted: s.Adopted + o.Adopted, Retargeted: s.Retargeted + o.Retargeted, Dropped: s.Dropped + o.Dropped,
		SkippedReleased: s.SkippedReleased + o.SkippedReleased, KeptInFlight: s.KeptInFlight + o.KeptInFlight,
		DroppedOrphaned: s.DroppedOrphaned + o.DroppedOrphaned, Drift: s.Drift.Add(o.Drift)}
}

// Reconcile runs one reconcile script call (see package lua). The caller
// bounds the batch size.
func (p *Publisher) Reconcile(ctx context.Context, r ReconcileRequest) (ReconcileStats, error) {
	if err := checkID("show id", r.ShowID); err != nil {
		return ReconcileStats{}, fmt.Errorf("accounting reconcile: %w", err)
	}
	maxAge := r.MaxAge
	if maxAge <= 0 || maxAge > p.tombTTL/2 {
		maxAge = p.tombTTL / 2
	}
	args := make([]any, 0, 6+9*len(r.Present)+len(r.Drop))
	live := "-"
	if r.LiveKnown {
		var b strings.Builder
		for i, pid := range r.LiveBackends {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatUint(uint64(pid), 10))
		}
		live = b.String()
	}
	args = append(args, r.ShowID, r.Mark.Seq, r.Mark.TimeMS, r.Grace.Milliseconds(), maxAge.Milliseconds(), live, len(r.Present))
	for _, c := range r.Present {
		if c.ShowID != r.ShowID {
			return ReconcileStats{}, fmt.Errorf("accounting reconcile show %s: proc %s belongs to show %s", r.ShowID, c.ProcID, c.ShowID)
		}
		if err := checkID("proc id", c.ProcID); err != nil {
			return ReconcileStats{}, fmt.Errorf("accounting reconcile show %s: %w", r.ShowID, err)
		}
		if c.Centicores < 0 || c.GPUs < 0 {
			return ReconcileStats{}, fmt.Errorf("accounting reconcile show %s: proc %s has negative reservation %d centicores %d gpus", r.ShowID, c.ProcID, c.Centicores, c.GPUs)
		}
		k := c.Keys()
		args = append(args, c.ProcID, k[0], k[1], k[2], k[3], k[4], ChargeCores(c.Centicores), c.Centicores, c.GPUs)
	}
	for _, id := range r.Drop {
		args = append(args, id)
	}
	rk := RepairKeys(r.ShowID)
	v, err := p.reconcile.Run(ctx, p.rdb, []string{SeqKey, ShowProcsKey(r.ShowID), rk[0], rk[1], rk[2]}, args...).Int64Slice()
	if err != nil {
		return ReconcileStats{}, fmt.Errorf("accounting reconcile show %s: %w", r.ShowID, err)
	}
	if len(v) >= 2 && v[0] == -1 {
		return ReconcileStats{}, fmt.Errorf("accounting reconcile show %s: snapshot is %v old (max %v): %w",
			r.ShowID, time.Duration(v[1])*time.Millisecond, maxAge, ErrSnapshotTooOld)
	}
	if len(v) >= 2 && v[0] == -2 {
		return ReconcileStats{}, fmt.Errorf("accounting reconcile show %s: acct:seq is %d, below %d read before the snapshot: %w",
			r.ShowID, v[1], r.Mark.Seq, ErrSeqRolledBack)
	}
	if len(v) != 12 || v[0] != 1 {
		return ReconcileStats{}, fmt.Errorf("accounting reconcile show %s: unexpected reply %v", r.ShowID, v)
	}
	return ReconcileStats{
		Adopted: int(v[1]), Retargeted: int(v[2]), Dropped: int(v[3]), SkippedReleased: int(v[4]), KeptInFlight: int(v[5]),
		DroppedOrphaned: int(v[11]),
		Drift:           TableCores{v[6], v[7], v[8], v[9], v[10]},
	}, nil
}

// RepairStats counts what a repair corrected.
type RepairStats struct {
	// Scanned is the number of records the scan counted.
	Scanned   int
	KeysFixed int
	Drift     TableCores
}

// ErrRepairSuperseded: another repair of the same show started meanwhile
// (e.g. a new leader); this one stopped without writing further.
var ErrRepairSuperseded = errors.New("repair superseded by another session")

// RepairOptions tune Repair.
type RepairOptions struct {
	// Batch bounds the records scanned and the keys fixed per script call
	// (default 500).
	Batch int
	// Before, if set, runs before every script call and aborts the repair
	// with its error (the loops' leadership fence).
	Before func(context.Context) error
}

// Repair rewrites every booked counter of the show to the sum of its
// records, over a zero baseline of the given keys (the show's accounting
// keys that exist in Postgres), in bounded script calls (see package lua:
// the repair session keeps its sums exact while bookings continue).
func (p *Publisher) Repair(ctx context.Context, showID string, baseline []string, o RepairOptions) (RepairStats, error) {
	var st RepairStats
	if err := checkID("show id", showID); err != nil {
		return st, fmt.Errorf("accounting repair: %w", err)
	}
	if o.Batch <= 0 {
		o.Batch = 500
	}
	before := o.Before
	if before == nil {
		before = func(context.Context) error { return nil }
	}
	rk := RepairKeys(showID)
	keys := []string{ShowProcsKey(showID), rk[0], rk[1], rk[2]}
	gen := strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatUint(p.repairSeq.Add(1), 36)
	ttl := p.tombTTL.Milliseconds()
	step := func(args ...any) ([]any, error) {
		if err := before(ctx); err != nil {
			return nil, err
		}
		v, err := p.repair.Run(ctx, p.rdb, keys, append([]any{args[0], gen, ttl}, args[1:]...)...).Slice()
		if err != nil {
			return nil, fmt.Errorf("accounting repair show %s (%v): %w", showID, args[0], err)
		}
		if code, _ := intAt(v, 0); code != 1 {
			return nil, fmt.Errorf("accounting repair show %s: %w", showID, ErrRepairSuperseded)
		}
		return v, nil
	}
	if _, err := step("start"); err != nil {
		return st, err
	}
	for cursor := "0"; ; {
		// SSCAN's COUNT is a hint that a hashtable set often overshoots:
		// ask for a quarter batch to keep each step short.
		v, err := step("scan", cursor, max(o.Batch/4, 1))
		if err != nil {
			return st, err
		}
		next, _ := v[1].(string)
		n, _ := intAt(v, 2)
		st.Scanned += int(n)
		if next == "0" || next == "" {
			break
		}
		cursor = next
	}
	// Keys to check: the baseline plus every key a record charges.
	seen := make(map[string]bool, len(baseline))
	var all []string
	for _, k := range baseline {
		if !seen[k] {
			seen[k] = true
			all = append(all, k)
		}
	}
	for _, h := range rk[1:] {
		ks, err := p.rdb.HKeys(ctx, h).Result()
		if err != nil {
			return st, fmt.Errorf("accounting repair show %s: %w", showID, err)
		}
		for _, k := range ks {
			if !seen[k] {
				seen[k] = true
				all = append(all, k)
			}
		}
	}
	for start := 0; start < len(all); start += o.Batch {
		end := min(start+o.Batch, len(all))
		args := make([]any, 0, 1+end-start)
		args = append(args, "fix")
		for _, k := range all[start:end] {
			args = append(args, k)
		}
		v, err := step(args...)
		if err != nil {
			return st, err
		}
		n, _ := intAt(v, 1)
		st.KeysFixed += int(n)
		var d [5]int64
		for i := range d {
			d[i], _ = intAt(v, 2+i)
		}
		st.Drift = st.Drift.Add(TableCores{d[0], d[1], d[2], d[3], d[4]})
	}
	_, err := step("finish")
	return st, err
}

// ShowProcs returns the proc ids holding a record for the show. It iterates
// with SSCAN (never one O(n) SMEMBERS that would block Redis on a big show);
// a proc booked or released meanwhile may or may not be listed.
func (p *Publisher) ShowProcs(ctx context.Context, showID string) ([]string, error) {
	seen := map[string]struct{}{}
	var ids []string
	for cursor := uint64(0); ; {
		page, next, err := p.rdb.SScan(ctx, ShowProcsKey(showID), cursor, "", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("accounting show procs %s: %w", showID, err)
		}
		for _, id := range page {
			if _, dup := seen[id]; !dup {
				seen[id] = struct{}{}
				ids = append(ids, id)
			}
		}
		if next == 0 {
			return ids, nil
		}
		cursor = next
	}
}

// SubLimits are a subscription's size and burst in centicores.
type SubLimits struct {
	ShowID, AllocID string
	Size, Burst     int64
}

// FolderLimits are folder_resource caps (centicores, GPUs; -1 = unlimited,
// any other value is a cap).
type FolderLimits struct {
	FolderID, ShowID   string
	MinCores, MaxCores int64
	MinGPUs, MaxGPUs   int64
}

// JobLimits are job_resource caps (centicores, GPUs; no unlimited value: 0
// or a negative cap books nothing) and priority.
type JobLimits struct {
	JobID             string
	MaxCores, MaxGPUs int64
	Priority          int64
}

// PointLimits are a point's minimums.
type PointLimits struct {
	DeptID, ShowID    string
	MinCores, MinGPUs int64
}

// Limits is a set of caps to copy from Postgres to Redis.
type Limits struct {
	Subs    []SubLimits
	Folders []FolderLimits
	Jobs    []JobLimits
	Points  []PointLimits
	// LSN is the WAL position these caps are valid at: the end LSN of the
	// transaction that changed them (the sidecar), or the position read just
	// before the snapshot they come from (the limit reseed). A hash whose
	// caps were written from a later position is left alone. 0 writes
	// unordered (tools and tests).
	LSN uint64
}

// Len is the number of hashes written.
func (l Limits) Len() int { return len(l.Subs) + len(l.Folders) + len(l.Jobs) + len(l.Points) }

// WriteLimits writes cap fields with plain HSETs (pipelined, in chunks of
// chunk hashes; 0 = 500), converted to whole cores: subscriptions and
// minimums with CapCores, folder caps with FolderCapCores / FolderCapGPUs
// (-1 kept as unlimited), job caps with JobCapCores / JobCapGPUs. Every cap
// field is written, 0 included, so a cap lowered to 0 books nothing from the
// next booking on (a missing field is refused too, never read as 0). It
// never touches int_cores / int_gpus, so it cannot clobber a booking and
// needs no compare-and-swap on the counters. Caps are written in WAL order
// (limits.lua, Limits.LSN): a reseed from an older snapshot never reverts a
// cap change the sidecar already wrote. It reports how many hashes were
// skipped for that reason.
func (p *Publisher) WriteLimits(ctx context.Context, l Limits, chunk int) (skipped int, err error) {
	if chunk <= 0 {
		chunk = 500
	}
	type hset struct {
		key    string
		fields []any
	}
	all := make([]hset, 0, l.Len())
	for _, s := range l.Subs {
		all = append(all, hset{SubKey(s.ShowID, s.AllocID), []any{"size", CapCores(s.Size), "burst", CapCores(s.Burst)}})
	}
	for _, f := range l.Folders {
		all = append(all, hset{FolderKey(f.FolderID), []any{"int_min_cores", CapCores(f.MinCores), "int_max_cores", FolderCapCores(f.MaxCores),
			"int_min_gpus", f.MinGPUs, "int_max_gpus", FolderCapGPUs(f.MaxGPUs), "show_id", f.ShowID}})
	}
	for _, j := range l.Jobs {
		all = append(all, hset{JobKey(j.JobID), []any{"int_max_cores", JobCapCores(j.MaxCores), "int_max_gpus", JobCapGPUs(j.MaxGPUs), "int_priority", j.Priority}})
	}
	for _, pt := range l.Points {
		all = append(all, hset{PointKey(pt.DeptID, pt.ShowID), []any{"int_min_cores", CapCores(pt.MinCores), "int_min_gpus", pt.MinGPUs}})
	}
	stamp := ""
	if l.LSN != 0 {
		stamp = FormatLSN(l.LSN)
	}
	for start := 0; start < len(all); start += chunk {
		end := min(start+chunk, len(all))
		keys := make([]string, 0, end-start)
		args := []any{stamp}
		for _, h := range all[start:end] {
			keys = append(keys, h.key)
			args = append(args, len(h.fields)/2)
			args = append(args, h.fields...)
		}
		v, err := p.limits.Run(ctx, p.rdb, keys, args...).Slice()
		if err != nil {
			return skipped, fmt.Errorf("accounting write limits: %w", err)
		}
		n, _ := intAt(v, 1)
		skipped += int(n)
	}
	return skipped, nil
}

// MarkSeeded opens the show for booking: its caps, records and counters are
// in Redis. epoch is the bootstrap epoch the seed belongs to.
func (p *Publisher) MarkSeeded(ctx context.Context, showID, epoch string) error {
	if err := checkID("show id", showID); err != nil {
		return fmt.Errorf("accounting mark seeded: %w", err)
	}
	if err := p.runSeed(ctx, []string{EpochKey, BootstrapKey, ShowKey(showID), ShowsKey},
		"mark", epoch, time.Now().UTC().Format(time.RFC3339Nano), showID); err != nil {
		return fmt.Errorf("accounting mark seeded %s: %w", showID, err)
	}
	return nil
}

// BeginBootstrap records epoch as the bootstrap under way (acct:bootstrap):
// from then on only markers of this epoch are accepted until it finishes,
// and any other bootstrap's SetEpoch is refused.
func (p *Publisher) BeginBootstrap(ctx context.Context, epoch string) error {
	if err := p.runSeed(ctx, []string{EpochKey, BootstrapKey}, "begin", epoch); err != nil {
		return fmt.Errorf("accounting begin bootstrap: %w", err)
	}
	return nil
}

// runSeed runs seed.lua; a refusal is ErrEpochSuperseded, with the epochs
// Redis holds.
func (p *Publisher) runSeed(ctx context.Context, keys []string, mode, epoch string, args ...any) error {
	if epoch == "" {
		return errors.New("empty epoch")
	}
	v, err := p.seed.Run(ctx, p.rdb, keys, append([]any{mode, epoch}, args...)...).Slice()
	if err != nil {
		return err
	}
	if code, _ := intAt(v, 0); code != 1 {
		cur, boot := "", ""
		if len(v) >= 3 {
			cur, _ = v[1].(string)
			boot, _ = v[2].(string)
		}
		return fmt.Errorf("%w: epoch %s, Redis has acct:epoch %q and acct:bootstrap %q", ErrEpochSuperseded, epoch, cur, boot)
	}
	return nil
}

// Unseed closes the show for booking (it is no longer managed). Its records
// and counters stay; a later seed reconciles them.
func (p *Publisher) Unseed(ctx context.Context, showID string) error {
	_, err := p.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Del(ctx, ShowKey(showID))
		pipe.SRem(ctx, ShowsKey, showID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("accounting unseed %s: %w", showID, err)
	}
	return nil
}

// Seeded reports which of the shows carry a seeding marker.
func (p *Publisher) Seeded(ctx context.Context, showIDs []string) (map[string]bool, error) {
	out := make(map[string]bool, len(showIDs))
	if len(showIDs) == 0 {
		return out, nil
	}
	pipe := p.rdb.Pipeline()
	cmds := make([]*redis.BoolCmd, len(showIDs))
	for i, s := range showIDs {
		cmds[i] = pipe.HExists(ctx, ShowKey(s), "seeded")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("accounting seeded: %w", err)
	}
	for i, s := range showIDs {
		out[s] = cmds[i].Val()
	}
	return out, nil
}

// SeededShows lists the shows in acct:shows.
func (p *Publisher) SeededShows(ctx context.Context) ([]string, error) {
	v, err := p.rdb.SMembers(ctx, ShowsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("accounting seeded shows: %w", err)
	}
	return v, nil
}

// Epoch returns acct:epoch, "" when it is missing (Redis is empty or the
// bootstrap has not finished).
func (p *Publisher) Epoch(ctx context.Context) (string, error) {
	v, err := p.rdb.Get(ctx, EpochKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("accounting epoch: %w", err)
	}
	return v, nil
}

// Bootstrapping returns acct:bootstrap, the epoch of the bootstrap under
// way or last begun ("" if none).
func (p *Publisher) Bootstrapping(ctx context.Context) (string, error) {
	v, err := p.rdb.Get(ctx, BootstrapKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("accounting bootstrap epoch: %w", err)
	}
	return v, nil
}

// SetEpoch writes acct:epoch (the end of a bootstrap), only if epoch is the
// bootstrap under way (BeginBootstrap); otherwise ErrEpochSuperseded.
func (p *Publisher) SetEpoch(ctx context.Context, epoch string) error {
	if err := p.runSeed(ctx, []string{EpochKey, BootstrapKey}, "finish", epoch); err != nil {
		return fmt.Errorf("accounting set epoch: %w", err)
	}
	return nil
}
