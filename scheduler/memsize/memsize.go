// Package memsize turns measured RSS into what a pass books: it reads the
// layers' RSS history and OOM bumps, records memory kills in cuesched's
// ledger, and writes the result into each layer's sizing.Shape (SizedMemKB,
// FrameMemKB, RSSKB), which the one sizing.Policy then reads for the host
// cache's floors, the matcher's Accept, the reservations and the
// dispatcher's Plan alike.
//
// # History
//
// A layer's samples are frame.int_mem_max_used (KB; Cuebot writes RQD's
// max_rss there when a run ends) of its last sizing.window_frames
// SUCCEEDED frames that stopped within sizing.max_age, newest first. One
// query reads them for every layer of a pass's job that is not cached
// (sizing.history_ttl), never per host tried. sizing.History.Decide makes
// the size: the quantile plus headroom, within the clamps, raised to the
// layer's bump; fewer than min_samples samples book the request.
//
// # OOM policy
//
// A WAITING frame whose last run was a memory kill (sizing.MemoryKill on
// the frame's int_exit_status, int_mem_max_used and int_mem_reserved)
// books its own raised size, sizing.History.RetryKB, at least the layer's:
// it is dispatched as a one-frame copy of its layer with Shape.FrameMemKB
// set. RetryKB has no upper bound but sizing.max_memory, so on a host with
// less memory than it the retry books the host's whole memory instead, if
// that holds the killed run's max RSS (Shape.FrameFloorKB): a retry is
// never sized out of every host that could run it. Until the layer is
// sized (history or a bump), a layer with recorded kills starts at most
// sizing.probe_frames new frames at once: its request is known to be too
// small, and a wave launched at it would only add kills. The kill is recorded once in cuesched_frame_oom (keyed by frame and
// ts_stopped, so two instances or a failover record it once); when the
// layer's kills since its last bump within sizing.oom_bump_window reach
// sizing.oom_bump_kills, the same transaction raises cuesched_layer_oom's
// bump to the largest retry size among them. The transaction holds an
// advisory lock per layer, so two instances recording kills of one layer
// at once count each other's.
//
// # Cuebot's ratchet
//
// Cuebot still handles every completion: on a memory kill it raises
// layer.int_mem_min to the killed run's reservation plus the service's
// minimum memory increase (2 GB by default) and turns the layer's memory
// optimizer off (layer.b_optimize), and on success its optimizer may lower
// int_mem_min. cuesched does not undo these writes (it never writes a
// Cuebot table) but decides what they mean: a layer with history books
// from RSS, so int_mem_min does not matter to it; a layer without history
// books its request, and the request is layer.int_mem_min unless cuesched
// has recorded a memory kill of the layer, in which case it is the
// submitted minimum (layer_history.int_mem_min, written by Cuebot's insert
// trigger) when that is lower: the rise is Cuebot's ratchet, and a single
// kill raises only the killed frame. A raise of a layer without recorded
// kills (cuegui, an operator) is a request and is honoured.
package memsize

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/sizing"
)

// DB is what the sizer needs of a pgx pool.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Options are a Sizer's dependencies.
type Options struct {
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// TTL is sizing.history_ttl (0: read every time).
	TTL time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Sizer sizes the layers of a pass. It is safe for concurrent use.
type Sizer struct {
	db  DB
	h   sizing.History
	ttl time.Duration
	now func() time.Time
	log hclog.Logger
	m   *metrics

	mu       sync.Mutex
	cache    map[string]entry      // layer id -> its history
	recorded map[killKey]time.Time // kills this process wrote (or found written)
}

type entry struct {
	read time.Time
	hist History
}

type killKey struct {
	frame   string
	stopped int64
}

// History is what the sizer read of one layer.
type History struct {
	LayerID string
	// MemMinKB is layer.int_mem_min; SubmittedKB layer_history.int_mem_min
	// (MemMinKB when the layer has no history row).
	MemMinKB, SubmittedKB int64
	// SamplesKB are the RSS peaks, newest first.
	SamplesKB []int64
	// BumpKB and Bumps are the layer's cuesched_layer_oom row (0: none);
	// Kills counts its rows in cuesched_frame_oom.
	BumpKB int64
	Bumps  int
	Kills  int
	// Succeeded is layer_stat.int_succeeded_count in the same snapshot as
	// the samples: a threadable layer probes while it is below
	// sizing.History.NeedSamples, so the probes end on the successes whose
	// samples this read holds, never on a newer count than the samples
	// (a cached read with fewer samples than needed and a newer count
	// would start the whole layer at its request).
	Succeeded int64
}

// RequestKB is what the layer books without history: its minimum, except
// a rise of it that followed recorded memory kills (Cuebot's ratchet),
// which is undone to the submitted minimum.
func (h History) RequestKB() int64 {
	if h.Kills > 0 && h.SubmittedKB > 0 && h.SubmittedKB < h.MemMinKB {
		return h.SubmittedKB
	}
	return h.MemMinKB
}

// New returns a Sizer for the policy's History.
func New(db DB, h sizing.History, o Options) *Sizer {
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	return &Sizer{db: db, h: h, ttl: max(o.TTL, 0), now: now, log: log.Named("memsize"), m: newMetrics(o.Registerer),
		cache: map[string]entry{}, recorded: map[killKey]time.Time{}}
}

// historySQL reads, for the layers $1, their minimum and submitted minimum,
// bump, recorded kills, succeeded count and up to $3 RSS peaks of succeeded frames that
// stopped within $2 seconds, newest first. It only reads.
const historySQL = `
SELECT l.pk_layer, l.int_mem_min,
       COALESCE((SELECT lh.int_mem_min FROM layer_history lh WHERE lh.pk_layer = l.pk_layer LIMIT 1), l.int_mem_min),
       COALESCE(lo.int_bump_kb, 0), COALESCE(lo.int_bumps, 0),
       (SELECT count(*) FROM cuesched_frame_oom o WHERE o.pk_layer = l.pk_layer),
       COALESCE((SELECT ls.int_succeeded_count FROM layer_stat ls WHERE ls.pk_layer = l.pk_layer), 0),
       COALESCE((SELECT array_agg(s.rss ORDER BY s.ts_stopped DESC)
                   FROM (SELECT f.int_mem_max_used AS rss, f.ts_stopped
                           FROM frame f
                          WHERE f.pk_layer = l.pk_layer AND f.str_state = 'SUCCEEDED'
                            AND f.int_mem_max_used > 0
                            AND f.ts_stopped > now() - make_interval(secs => $2::float8)
                          ORDER BY f.ts_stopped DESC
                          LIMIT $3) s), '{}'::bigint[])
FROM layer l
LEFT JOIN cuesched_layer_oom lo ON lo.pk_layer = l.pk_layer
WHERE l.pk_layer = ANY($1::text[])`

// Read reads the history of the layers (no cache). It only reads.
func (s *Sizer) Read(ctx context.Context, layerIDs []string) (map[string]History, error) {
	out := make(map[string]History, len(layerIDs))
	if len(layerIDs) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, historySQL, layerIDs, s.h.MaxAge.Seconds(), max(s.h.WindowFrames, 1))
	if err != nil {
		return nil, fmt.Errorf("memory history: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var h History
		var bumps int32
		var kills int64
		if err := rows.Scan(&h.LayerID, &h.MemMinKB, &h.SubmittedKB, &h.BumpKB, &bumps, &kills, &h.Succeeded, &h.SamplesKB); err != nil {
			return nil, fmt.Errorf("memory history: %w", err)
		}
		h.Bumps, h.Kills = int(bumps), int(kills)
		out[h.LayerID] = h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("memory history: %w", err)
	}
	s.m.historyReads.Add(float64(len(layerIDs)))
	return out, nil
}

// Decide is the layer's decision from its history.
func (s *Sizer) Decide(h History) sizing.Decision {
	return s.h.Decide(sizing.Input{RequestKB: h.RequestKB(), SamplesKB: h.SamplesKB, BumpKB: h.BumpKB})
}

// histories returns the layers' histories, reading the ones not cached in
// one query. A cached read made before the layer had NeedSamples
// successes, with fewer samples than that, is read again as soon as the
// layer's succeeded count (the pass's query) has grown past it: the
// samples that end a layer's probes or its request are read when they
// exist, not a TTL later (at most NeedSamples extra reads per layer).
func (s *Sizer) histories(ctx context.Context, layers []*jobs.Layer) (map[string]History, error) {
	now := s.now()
	need := int64(s.h.NeedSamples())
	out := make(map[string]History, len(layers))
	var miss []string
	s.mu.Lock()
	for _, l := range layers {
		if e, ok := s.cache[l.ID]; ok && s.ttl > 0 && now.Sub(e.read) < s.ttl &&
			(int64(len(e.hist.SamplesKB)) >= need || e.hist.Succeeded >= need || l.Succeeded <= e.hist.Succeeded) {
			out[l.ID] = e.hist
			continue
		}
		if _, dup := out[l.ID]; !dup && !contains(miss, l.ID) {
			miss = append(miss, l.ID)
		}
	}
	s.mu.Unlock()
	if len(miss) == 0 {
		return out, nil
	}
	read, err := s.Read(ctx, miss)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, h := range read {
		out[id] = h
		if s.ttl > 0 {
			s.cache[id] = entry{read: now, hist: h}
		}
	}
	// Forget entries long expired, so the cache follows the live layers.
	if len(s.cache) > 4096 {
		for id, e := range s.cache {
			if now.Sub(e.read) > s.ttl {
				delete(s.cache, id)
			}
		}
	}
	return out, nil
}

// Warm reads the histories of the layers that are not cached in one
// statement and caches them, so that Size finds them: a pass reads the
// histories of every job's layers at once instead of one read per job
// (matcher.PassLayers). It reads nothing without a cache (history_ttl 0:
// Size reads every time anyway). An error is returned for logging only;
// Size reads again and handles it.
func (s *Sizer) Warm(ctx context.Context, layers []*jobs.Layer) error {
	if s == nil || !s.h.Enabled() || s.ttl <= 0 || len(layers) == 0 {
		return nil
	}
	_, err := s.histories(ctx, layers)
	return err
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// Kill is one memory kill read from a WAITING frame.
type Kill struct {
	FrameID, LayerID     string
	Stopped              time.Time
	ExitStatus           int64
	MaxRSSKB, ReservedKB int64
	RetryKB              int64
}

// Size sizes the layers of one job of a pass, in place, and returns the
// layers to work: a frame whose last run was a memory kill is split off
// into a one-frame copy of its layer carrying its own size (ahead of its
// layer), and a threadable layer still probing keeps only the frames its
// probes may still start. With sizing off it returns layers as they are.
// An error reading the history leaves the layers at their requests, less
// what only the history makes safe to start (see unread; the error is
// returned for logging, the returned layers are usable).
func (s *Sizer) Size(ctx context.Context, layers []*jobs.Layer) ([]*jobs.Layer, error) {
	if s == nil || !s.h.Enabled() || len(layers) == 0 {
		return layers, nil
	}
	hist, err := s.histories(ctx, layers)
	if err != nil {
		return s.unread(layers), err
	}
	var kills []Kill
	out := make([]*jobs.Layer, 0, len(layers))
	for _, l := range layers {
		h, ok := hist[l.ID]
		if !ok {
			out = append(out, l)
			continue
		}
		if s.h.MemoryOn() && h.Kills == 0 {
			// A kill seen now, not yet in the ledger, counts as one.
			for _, f := range l.Frames {
				if !f.Stopped.IsZero() && sizing.MemoryKill(f.ExitStatus, f.MaxRSSKB, f.ReservedKB) {
					h.Kills = 1
					break
				}
			}
		}
		d := s.Decide(h)
		if s.h.MemoryOn() && d.MemKB > 0 {
			l.SizedMemKB = d.MemKB
		}
		if s.h.ThreadableOn() && l.Threadable && len(h.SamplesKB) >= s.h.NeedSamples() {
			l.RSSKB = d.RSSKB
		}
		if s.h.ThreadableOn() && l.Threadable && l.RSSKB == 0 && s.h.ProbeFrames > 0 && h.Succeeded < int64(s.h.NeedSamples()) {
			// Probing: at most probe_frames frames run at the request
			// until enough have succeeded (whether or not they left RSS
			// samples: a layer whose frames report none is not held).
			// The succeeded count is the history read's own (h), never
			// the pass's newer one: a success whose sample this read
			// does not hold must not end the probes.
			left := max(int64(s.h.ProbeFrames)-l.Running, 0)
			if int64(len(l.Frames)) > left {
				l.Frames = l.Frames[:left]
			}
			if len(l.Frames) == 0 {
				continue
			}
		}
		if !s.h.MemoryOn() {
			out = append(out, l)
			continue
		}
		layerKB := d.MemKB
		// A layer booking its request with memory kills recorded (and no
		// history or bump yet to size it) holds its new frames to
		// probe_frames at once until the bump decision: its request is
		// known to be too small, so launching a whole wave at it only
		// adds kills. Its killed frames retry at their own sizes.
		hold := int64(-1)
		if d.Source == sizing.SourceRequest && h.Kills > 0 && s.h.ProbeFrames > 0 {
			hold = max(int64(s.h.ProbeFrames)-l.Running, 0)
		}
		keep := l.Frames[:0:0]
		for _, f := range l.Frames {
			if f.Stopped.IsZero() || !sizing.MemoryKill(f.ExitStatus, f.MaxRSSKB, f.ReservedKB) {
				if hold < 0 || int64(len(keep)) < hold {
					keep = append(keep, f)
				}
				continue
			}
			k := Kill{FrameID: f.ID, LayerID: l.ID, Stopped: f.Stopped, ExitStatus: f.ExitStatus,
				MaxRSSKB: f.MaxRSSKB, ReservedKB: f.ReservedKB, RetryKB: s.h.RetryKB(f.MaxRSSKB, f.ReservedKB)}
			kills = append(kills, k)
			c := *l
			c.Frames = []jobs.Frame{f}
			c.FrameMemKB = max(k.RetryKB, layerKB)
			// On hosts smaller than the retry it books the whole host,
			// as long as that holds what the killed run used.
			c.FrameFloorKB = min(max(f.MaxRSSKB, layerKB), c.FrameMemKB)
			out = append(out, &c)
			s.m.retries.Inc()
		}
		l.Frames = keep
		if len(keep) > 0 {
			out = append(out, l)
		}
	}
	if len(kills) > 0 {
		if bumps, err := s.Record(ctx, kills); err != nil {
			s.log.Warn("recording memory kills failed; retried next pass", "error", err)
		} else if len(bumps) > 0 {
			s.applyBumps(out, bumps)
		}
	}
	return out, nil
}

// unread is what a pass may book when the history could not be read: the
// layers at their requests, except what the history alone makes safe to
// start. A threadable layer (threadable sizing on) is left out, since
// without its history it cannot tell its probes from its sized frames (at
// its request every waiting frame would start, the wave the probes exist
// to prevent), and so is a frame whose last run was a memory kill, which
// would retry at the size that was killed. The next pass reads again.
func (s *Sizer) unread(layers []*jobs.Layer) []*jobs.Layer {
	out := make([]*jobs.Layer, 0, len(layers))
	for _, l := range layers {
		if s.h.ThreadableOn() && l.Threadable && s.h.ProbeFrames > 0 {
			continue
		}
		if s.h.MemoryOn() {
			keep := l.Frames[:0:0]
			for _, f := range l.Frames {
				if f.Stopped.IsZero() || !sizing.MemoryKill(f.ExitStatus, f.MaxRSSKB, f.ReservedKB) {
					keep = append(keep, f)
				}
			}
			if len(keep) == 0 {
				continue
			}
			l.Frames = keep
		}
		out = append(out, l)
	}
	return out
}

// applyBumps raises the layers just bumped (this pass's copy and the
// cache), so the frames after the kill that made the bump book it.
func (s *Sizer) applyBumps(layers []*jobs.Layer, bumps map[string]int64) {
	s.mu.Lock()
	for id, kb := range bumps {
		if e, ok := s.cache[id]; ok {
			e.hist.BumpKB = max(e.hist.BumpKB, kb)
			e.hist.Bumps++
			s.cache[id] = e
		}
	}
	s.mu.Unlock()
	for _, l := range layers {
		if kb, ok := bumps[l.ID]; ok && kb > l.SizedMemKB {
			l.SizedMemKB = kb
		}
	}
}

// recordSQL inserts the kills $1.. into the ledger (each once) and, for
// every layer that got a new kill, counts its kills since its last bump
// within the window $8 (seconds); a count of at least $9 raises the
// layer's bump to the largest retry size among them. It returns the bumps
// made.
const recordSQL = `
WITH k AS (
    SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[])
        AS k(pk_frame, ts_stopped, pk_layer, int_exit_status, int_max_rss_kb, int_reserved_kb, int_retry_kb)
), ins AS (
    INSERT INTO cuesched_frame_oom (pk_frame, ts_stopped, pk_layer, int_exit_status, int_max_rss_kb, int_reserved_kb, int_retry_kb)
    SELECT pk_frame, ts_stopped, pk_layer, int_exit_status, int_max_rss_kb, int_reserved_kb, int_retry_kb FROM k
    ON CONFLICT DO NOTHING
    RETURNING pk_layer, ts_stopped, int_retry_kb
), counted AS (
    -- The ledger as of this statement (the new rows are not in it) plus
    -- the new rows: the layer's kills since its last bump, in the window.
    SELECT x.pk_layer, count(*) AS n, max(x.int_retry_kb) AS retry
      FROM (SELECT o.pk_layer, o.ts_stopped, o.int_retry_kb FROM cuesched_frame_oom o
             WHERE o.pk_layer IN (SELECT pk_layer FROM ins)
            UNION ALL
            SELECT pk_layer, ts_stopped, int_retry_kb FROM ins) x
      LEFT JOIN cuesched_layer_oom lo ON lo.pk_layer = x.pk_layer
     WHERE x.ts_stopped > now() - make_interval(secs => $8::float8)
       AND (lo.ts_bumped IS NULL OR x.ts_stopped > lo.ts_bumped)
     GROUP BY x.pk_layer
), bump AS (
    INSERT INTO cuesched_layer_oom AS lo (pk_layer, int_bump_kb)
    SELECT pk_layer, retry FROM counted WHERE n >= $9
    ON CONFLICT (pk_layer) DO UPDATE
       SET int_bump_kb = GREATEST(lo.int_bump_kb, EXCLUDED.int_bump_kb), int_bumps = lo.int_bumps + 1, ts_bumped = now()
    RETURNING pk_layer, int_bump_kb
)
SELECT (SELECT count(*) FROM ins), bump.pk_layer, bump.int_bump_kb FROM (SELECT 1) one LEFT JOIN bump ON true`

// Record writes kills into the ledger in one transaction, holding an
// advisory lock per layer (in layer order) so instances recording kills
// of one layer at once count each other's, and returns the bumps it made
// (layer id -> bump KB). Kills already recorded (by this or another
// instance) are skipped.
func (s *Sizer) Record(ctx context.Context, kills []Kill) (map[string]int64, error) {
	now := s.now()
	s.mu.Lock()
	fresh := kills[:0:0]
	for _, k := range kills {
		if _, ok := s.recorded[killKey{k.FrameID, k.Stopped.UnixMicro()}]; !ok {
			fresh = append(fresh, k)
		}
	}
	s.mu.Unlock()
	if len(fresh) == 0 {
		return nil, nil
	}
	var (
		frames, layers              []string
		stopped                     []time.Time
		exits, rss, reserved, retry []int64
		lockLayers                  []string
	)
	for _, k := range fresh {
		frames, layers, stopped = append(frames, k.FrameID), append(layers, k.LayerID), append(stopped, k.Stopped)
		exits, rss, reserved, retry = append(exits, k.ExitStatus), append(rss, k.MaxRSSKB), append(reserved, k.ReservedKB), append(retry, k.RetryKB)
		if !contains(lockLayers, k.LayerID) {
			lockLayers = append(lockLayers, k.LayerID)
		}
	}
	sort.Strings(lockLayers)
	bumps := map[string]int64{}
	var inserted int64
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		for _, id := range lockLayers {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('cuesched_layer_oom'), hashtext($1))`, id); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, recordSQL, frames, stopped, layers, exits, rss, reserved, retry,
			s.h.OOMBumpWindow.Seconds(), max(s.h.OOMBumpKills, 1))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var layer *string
			var kb *int64
			if err := rows.Scan(&inserted, &layer, &kb); err != nil {
				return err
			}
			if layer != nil && kb != nil {
				bumps[*layer] = *kb
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("record memory kills: %w", err)
	}
	s.m.kills.Add(float64(inserted))
	s.m.bumps.Add(float64(len(bumps)))
	for id, kb := range bumps {
		s.log.Info("layer memory raised after repeated kills", "layer", id, "bump_kb", kb, "kills", s.h.OOMBumpKills, "window", s.h.OOMBumpWindow)
	}
	s.mu.Lock()
	for _, k := range fresh {
		s.recorded[killKey{k.FrameID, k.Stopped.UnixMicro()}] = now
		// The cached read counts the kill too: once the killed frame
		// runs again (its retry), it is no longer a WAITING frame the
		// pass sees, and a read cached from before the kill would lift
		// the killed-layer hold until the TTL ends.
		if e, ok := s.cache[k.LayerID]; ok {
			e.hist.Kills++
			s.cache[k.LayerID] = e
		}
	}
	if len(s.recorded) > 65536 {
		for k, t := range s.recorded {
			if now.Sub(t) > s.h.OOMBumpWindow {
				delete(s.recorded, k)
			}
		}
	}
	s.mu.Unlock()
	return bumps, nil
}
