// Package matcher finds hosts for the layers of a job and hands each
// (layer, host) pair to the dispatcher: the "find hosts for frames" half of
// the proactive loop (rust-scheduler §4.4).
//
// For each job of a cluster pass the matcher reads its dispatchable layers
// (package jobs; a pass of the loop reads every job's in one statement,
// PassLayers, and hands each job its own in its Turn) and works them one
// at a time in dispatch order. For a
// layer it takes an in-process layer permit (so two passes of this process
// never work the same layer), then makes up to host_candidate_attempts_per
// _layer checkouts from the host cache, each asking for a host carrying one
// of the layer's tags that this cluster covers and on which at least one
// frame fits by Cuebot's reservation rules (the Accept closure runs the same
// sizing.Policy the dispatcher uses, so a checked-out host always takes a
// frame unless Postgres disagrees; the host cache's floors come from the
// same policy). Each host goes to the dispatcher with
// the layer's remaining frames and comes back to the cache with the idle
// values Postgres returned. The loop ends when the layer runs out of frames,
// of attempts, or of candidates, or when the dispatcher reports a stop that
// another host cannot cure (job at its cap, a Redis cap, a limit_record
// full, the show not seeded, the job paused or killed since it was read,
// an error).
//
// A layer that found no host at all in this cluster backs off (jobs.Backoff)
// and is excluded from the next layer queries of the cluster until its
// schedule-after time, or until the hosts it missed gain capacity that may
// fit it: the host cache's miss carries a watch on the probed groups
// (NoCandidateError), taken atomically with the miss, and the backoff
// releases the layer as soon as it moves. A layer whose checked-out host
// took nothing (Postgres disagreed with the cache) has no such watch and
// waits out its backoff.
//
// Reservations (Options.Reservations, scheduler/reservations): Accept also
// refuses a host that holds a firm reservation for another layer unless the
// frame is an EASY backfill (it ends, by the layer's worst-case runtime,
// before the host's ready time); a booking refused by the script because a
// reservation appeared since (Stop reserved) moves on to another host. Every
// worked layer's outcome (blocked: no host; placed: frames dispatched) is
// reported, and feeds the blocked-time buckets that decide who may reserve.
//
// Concurrency: a semaphore bounds the layers being worked at once across the
// process (the reference sizes it to the database pool minus one), since
// each holds a connection during its booking transactions.
package matcher

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/sizing"
)

// ErrNoCandidate is what Hosts.Checkout returns when no host fits.
var ErrNoCandidate = errors.New("no host candidate")

// NoCandidateError is an ErrNoCandidate (errors.Is) that carries a watch on
// the hosts the request missed, taken with the miss. A Hosts whose misses
// carry one lets a backed-off layer be released as soon as those hosts gain
// capacity that may fit it, instead of when its backoff ends.
type NoCandidateError struct {
	Watch jobs.Watch
}

func (e *NoCandidateError) Error() string { return ErrNoCandidate.Error() }

// Is makes errors.Is(err, ErrNoCandidate) true.
func (e *NoCandidateError) Is(target error) bool { return target == ErrNoCandidate }

// HostRequest asks the host cache for one host for a layer.
type HostRequest struct {
	FacilityID string
	ShowID     string
	// Tags are the cluster's tags the layer carries, in probe order
	// (MANUAL, HOSTNAME, HARDWARE, ALLOC); the host must carry one.
	Tags []clusters.Tag
	// Floor is what the host must have idle (sizing.Policy.Floor: the
	// "whole host" sentinels are passed as one core and left to Accept).
	Floor sizing.Floor
	// OS is the job's OS ("" = any); Threadable gates thread-mode ALL hosts.
	OS         string
	Threadable bool
	// Accept reports whether at least one frame fits on h.
	Accept func(h sizing.Host) bool
	// LayerID is the layer asking (locality, the layer's cores on h).
	LayerID string
}

// Hosts is the host cache as the matcher uses it.
type Hosts interface {
	// Checkout removes a fitting host from the cache, so no other caller
	// gets it until Checkin; ErrNoCandidate when none fits, preferably as a
	// *NoCandidateError with a watch.
	Checkout(ctx context.Context, req HostRequest) (sizing.Host, error)
	// Checkin returns a checked-out host with its current idle values.
	Checkin(h sizing.Host)
}

// BookingObserver is optionally implemented by Hosts: it is told which
// layer a batch booked on a checked-out host, and how many frames and
// centicores, just before the host's check-in (the host cache's locality
// and per-layer cores).
type BookingObserver interface {
	Booked(h sizing.Host, layerID string, frames int, cores int64)
}

// Dispatcher books and launches a batch (dispatch.Dispatcher).
type Dispatcher interface {
	Dispatch(ctx context.Context, l *jobs.Layer, frames []jobs.Frame, h sizing.Host) dispatch.Result
}

// GroupDispatcher is optionally implemented by the Dispatcher
// (dispatch.Dispatcher): it books one layer's frames on several hosts in
// one transaction, one result per part (Config.HostsPerBatch).
type GroupDispatcher interface {
	DispatchGroup(ctx context.Context, l *jobs.Layer, parts []dispatch.Part) []dispatch.Result
}

// Config holds the matcher's knobs.
type Config struct {
	// Attempts is host_candidate_attempts_per_layer (10).
	Attempts int
	// FramesPerLayer is dispatch_frames_per_layer_limit (20).
	FramesPerLayer int
	// FramesPerJob is dispatch_frames_per_job_limit: the frames one job
	// books in one pass over all its layers (0: no cap).
	FramesPerJob int
	// MaxConcurrentLayers bounds layers worked at once (pool size - 1).
	MaxConcurrentLayers int
	// PermitPerFrame is the layer permit duration per frame (2 s).
	PermitPerFrame time.Duration
	// Policy sizes frames: the very value the dispatcher was given (package
	// scheduler builds it once), so Accept and the booking agree.
	Policy sizing.Policy
	// Schema adapts the layer query to the database (nil: current).
	Schema *jobs.Schema
	// HostQuarantine keeps a host whose RQD refused or could not be reached
	// out of this process's checkouts for this long (default 30 s), so an
	// unreachable host does not swallow every pass's attempts while its
	// idle resources keep getting restored by compensation.
	HostQuarantine time.Duration
	// Spread caps one layer's share of a host (queue.layer_spread; the
	// zero Spread caps nothing).
	Spread Spread
	// HostsPerBatch (queue.hosts_per_transaction) is how many hosts one
	// booking transaction may span: when the host checked out cannot take
	// all of a layer's remaining frames, more are checked out (each with
	// the same Accept, the job's budget counting the frames planned on the
	// others) until the frames are placed or this many hosts are held.
	// 0 or 1: one host per transaction. Needs a GroupDispatcher.
	HostsPerBatch int
	// SeatPacking (queue.seat_packing) places a layer under node-locked
	// limits on hosts holding a seat first (see seats.go); it needs
	// Options.Seats.
	SeatPacking bool
}

// Options are the dependencies of a Matcher.
type Options struct {
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	Backoff    *jobs.Backoff
	Permits    *Permits
	// Guard, when set, holds idle GPUs' cores and memory back from CPU
	// work while GPU work waits (gpuguard.Guard).
	Guard Guard
	// Reservations, when set, keeps layers off hosts reserved for others
	// (except EASY backfills) and hears every layer's outcome.
	Reservations Reservations
	// Sizer, when set, sizes the layers of each job from their RSS
	// history and memory kills (memsize.Sizer) before they are matched.
	Sizer Sizer
	// Fence, when set, is asked before every booking batch of a cluster
	// (scheduler.work_split: the instance must still hold the cluster's
	// share within its lease, package shard); an error ends the layer
	// without booking and the job without its other layers.
	Fence func(c *clusters.Cluster) error
	// Seats reads which hosts hold a seat of a node-locked limit
	// (publisher.Publisher), for Config.SeatPacking.
	Seats Seats
}

// Sizer sizes a job's layers for a pass (memsize.Sizer.Size): it sets
// their sizing.Shape and may split or trim them; on error the layers it
// returns are still usable (at their requests).
type Sizer interface {
	Size(ctx context.Context, layers []*jobs.Layer) ([]*jobs.Layer, error)
}

// Warmer is optionally implemented by the Sizer (memsize.Sizer.Warm): it
// reads the histories of a pass's layers (every job's) in one statement
// before each job sizes its own from them.
type Warmer interface {
	Warm(ctx context.Context, layers []*jobs.Layer) error
}

// Guard says what CPU work must leave free on a host with idle GPUs.
type Guard interface {
	Keep(tags []string, idleGPUs int64) (cores, memKB int64)
	Held()
}

// Matcher works jobs. It is safe for concurrent use.
type Matcher struct {
	db      jobs.DB
	hosts   Hosts
	disp    Dispatcher
	cfg     Config
	permits *Permits
	backoff *jobs.Backoff
	guard   Guard
	resv    Reservations
	sizer   Sizer
	fence   func(c *clusters.Cluster) error
	seats   Seats
	sem     chan struct{}
	log     hclog.Logger
	m       *metrics

	qmu        sync.Mutex
	quarantine map[string]time.Time // host id -> until

	// seq numbers this process's batches; booked is each job's last
	// (PassRead staleness).
	seq    atomic.Uint64
	bmu    sync.Mutex
	booked map[string]bookedAt
}

// New returns a Matcher.
func New(db jobs.DB, hosts Hosts, disp Dispatcher, cfg Config, o Options) *Matcher {
	if cfg.Attempts <= 0 {
		cfg.Attempts = 10
	}
	if cfg.FramesPerLayer <= 0 {
		cfg.FramesPerLayer = 20
	}
	if cfg.MaxConcurrentLayers <= 0 {
		cfg.MaxConcurrentLayers = 19
	}
	if cfg.PermitPerFrame <= 0 {
		cfg.PermitPerFrame = 2 * time.Second
	}
	if cfg.HostQuarantine <= 0 {
		cfg.HostQuarantine = 30 * time.Second
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	p := o.Permits
	if p == nil {
		p = NewPermits()
	}
	return &Matcher{db: db, hosts: hosts, disp: disp, cfg: cfg, permits: p, backoff: o.Backoff, guard: o.Guard, resv: o.Reservations, sizer: o.Sizer, fence: o.Fence, seats: o.Seats,
		sem: make(chan struct{}, cfg.MaxConcurrentLayers), log: log.Named("matcher"), m: newMetrics(o.Registerer),
		quarantine: map[string]time.Time{}, booked: map[string]bookedAt{}}
}

// Held counts a layer newly held by the fail-fast backoff
// (scheduler_layer_holds_total{reason="fail_fast"}); failfast.Loop.Held.
func (m *Matcher) Held() { m.m.holds.WithLabelValues(string(HoldFailFast)).Inc() }

// quarantined reports whether host is held out after a failed launch.
func (m *Matcher) quarantined(host string) bool {
	m.qmu.Lock()
	defer m.qmu.Unlock()
	until, ok := m.quarantine[host]
	if !ok {
		return false
	}
	if time.Now().After(until) {
		delete(m.quarantine, host)
		return false
	}
	return true
}

func (m *Matcher) quarantineHost(host string) {
	m.qmu.Lock()
	m.quarantine[host] = time.Now().Add(m.cfg.HostQuarantine)
	m.qmu.Unlock()
	m.m.quarantined.Inc()
}

// Outcome of working one job.
type Outcome struct {
	// Dispatched frames.
	Dispatched int
	// Planned frames: those of the layers the job offered to hosts this
	// pass (each layer's frames, trimmed to the job's budget), the
	// pass's plan that Dispatched delivers on.
	Planned int
	// Layers worked (permit granted, at least one checkout tried).
	Layers int
	// StopShow: the show cannot book now (not seeded): skip its other jobs.
	StopShow bool
	// AllocFull: a booking hit this allocation cluster's subscription burst.
	AllocFull bool
	// Failed: a layer stopped on a database, Redis or host-cache error
	// (dispatch.Failed), not on a lack of hosts or headroom.
	Failed bool
}

// Turn orders a pass's jobs at the host cache. A job's first host checkout
// waits for Wait, and Done is called once that checkout has returned (or the
// job ends without one): the jobs drawn first get the first pick of the free
// hosts, while every job's queries and dispatches still overlap. Budget,
// when positive, caps the frames the job may start in this pass below
// FramesPerJob. Alone says the job is the only one of its pass (the layer
// spread cap is lifted for a job with one layer then). The zero Turn waits
// for nothing.
//
// Read, when set, is the layer read of the job's pass (PassLayers): the
// job takes its layers from it instead of querying its own, unless this
// process booked the job since the read (then it queries its own, as the
// read may predate that booking).
type Turn struct {
	Wait   <-chan struct{}
	Done   func()
	Budget int
	Alone  bool
	Read   *PassRead
}

// PassRead is PassLayers' read of a pass: every job's layers as
// jobs.PassLayers returns them, and the booking sequence number when it was
// taken.
type PassRead struct {
	Layers map[string][]*jobs.Layer
	seq    uint64
}

// stalePassRead bounds how long the matcher remembers which jobs it booked
// (far beyond any pass: queue.pass_timeout, 2 m by default).
const stalePassRead = 10 * time.Minute

// PassLayers reads the layers of every job of a cluster pass in one
// statement (jobs.PassLayers): the pass hands each job the read in its
// Turn instead of every job querying its own. At the job's turn its
// backed-off layers are left out and its cap applied (jobs.Dispatchable),
// so the job gets what its own query would have returned then, unless this
// process booked the job since the read: that job queries its own. The
// jobs' live use is the one Pending read (jobs.Job.Live), so the statement
// does not sum their procs again. With a
// Sizer that is a Warmer the histories of the layers read are read in one
// statement too, so each job's sizing finds them cached.
func (m *Matcher) PassLayers(ctx context.Context, c *clusters.Cluster, js []jobs.Job) (*PassRead, error) {
	ids := make([]string, len(js))
	live := make(map[string]jobs.Use, len(js))
	for i, j := range js {
		ids[i] = j.ID
		if j.Live != nil {
			live[j.ID] = *j.Live
		}
	}
	read := &PassRead{seq: m.seq.Load()}
	by, err := jobs.PassLayers(ctx, m.db, jobs.PassLayerQuery{
		JobIDs: ids, Tags: c.TagNames(), FramesPerLayer: m.cfg.FramesPerLayer, Schema: m.cfg.Schema, Live: live,
	})
	if err != nil {
		return nil, err
	}
	read.Layers = by
	if w, ok := m.sizer.(Warmer); ok {
		var all []*jobs.Layer
		for _, j := range js {
			all = append(all, by[j.ID]...)
		}
		if err := w.Warm(ctx, all); err != nil {
			m.log.Debug("memory history of the pass not read; each job reads its own", "cluster", c.Key(), "error", err)
		}
	}
	return read, nil
}

// bookedJob records that a batch of this process changed frames of job
// (started, lost or put back), after it did.
func (m *Matcher) bookedJob(job string) {
	now := time.Now()
	m.bmu.Lock()
	defer m.bmu.Unlock()
	m.booked[job] = bookedAt{seq: m.seq.Add(1), at: now}
	if len(m.booked) > 4096 {
		for id, b := range m.booked {
			if now.Sub(b.at) > stalePassRead {
				delete(m.booked, id)
			}
		}
	}
}

// bookedSince reports whether this process booked job after the read r.
func (m *Matcher) bookedSince(job string, r *PassRead) bool {
	m.bmu.Lock()
	defer m.bmu.Unlock()
	b, ok := m.booked[job]
	return ok && b.seq > r.seq
}

type bookedAt struct {
	seq uint64
	at  time.Time
}

// turn is one Process call's use of its Turn.
type turn struct {
	t      Turn
	waited bool
	done   bool
	solo   bool // the layer is the only work of the pass
}

// wait blocks until the job's turn (once); false if ctx ended first.
func (t *turn) wait(ctx context.Context) bool {
	if t.waited || t.t.Wait == nil {
		t.waited = true
		return true
	}
	select {
	case <-t.t.Wait:
		t.waited = true
		return true
	case <-ctx.Done():
		return false
	}
}

// pass hands the turn on (once).
func (t *turn) pass() {
	if !t.done {
		t.done = true
		if t.t.Done != nil {
			t.t.Done()
		}
	}
}

// Process works one job of a cluster pass.
func (m *Matcher) Process(ctx context.Context, c *clusters.Cluster, job jobs.Job) (Outcome, error) {
	return m.ProcessInTurn(ctx, c, job, Turn{})
}

// ProcessInTurn is Process with the job's place in the pass's order.
func (m *Matcher) ProcessInTurn(ctx context.Context, c *clusters.Cluster, job jobs.Job, order Turn) (Outcome, error) {
	var out Outcome
	t := &turn{t: order}
	defer t.pass()
	var layers []*jobs.Layer
	if order.Read != nil && !m.bookedSince(job.ID, order.Read) {
		layers = jobs.Dispatchable(order.Read.Layers[job.ID], m.backoff.Held(c.Key()))
	} else {
		var err error
		layers, err = jobs.Layers(ctx, m.db, jobs.LayerQuery{
			JobID: job.ID, Tags: c.TagNames(), FramesPerLayer: m.cfg.FramesPerLayer, Exclude: m.backoff.Held(c.Key()),
			Schema: m.cfg.Schema,
		})
		if err != nil {
			return out, err
		}
	}
	var err error
	if m.sizer != nil {
		if layers, err = m.sizer.Size(ctx, layers); err != nil {
			m.log.Warn("memory sizing failed; layers book their requests this pass", "job", job.Name, "error", err)
		}
	}
	t.solo = order.Alone && len(layers) == 1
	for _, l := range layers {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		if limit := m.frameLimit(order.Budget); limit > 0 {
			left := limit - out.Dispatched
			if left <= 0 {
				m.m.jobBudgetSpent.Inc()
				return out, nil
			}
			if len(l.Frames) > left {
				l.Frames = l.Frames[:left]
			}
		}
		r := m.processLayer(ctx, c, l, t)
		if r.worked {
			out.Planned += len(l.Frames)
		}
		out.Dispatched += r.dispatched
		if r.fenced {
			return out, nil
		}
		if r.stop == dispatch.Failed {
			out.Failed = true
		}
		if r.worked {
			out.Layers++
		}
		if r.stop == dispatch.NotSeeded {
			out.StopShow = true
			return out, nil
		}
		if r.stop == dispatch.Capped && r.table == publisher.TableSubscription && c.AllocID() != "" {
			out.AllocFull = true
			return out, nil
		}
		if r.stop == dispatch.JobAtCap || (r.stop == dispatch.Capped && (r.table == publisher.TableJob || r.table == publisher.TableFolder)) {
			// The rest of the job (or its folder) is capped too.
			return out, nil
		}
		if r.stop == dispatch.JobStopped {
			// Paused or killed since the pending query: none of its
			// layers may start.
			m.log.Debug("job stopped being dispatchable; skipping its other layers", "job", job.Name)
			return out, nil
		}
	}
	return out, nil
}

// frameLimit is a job's frame budget for one pass (0 = none).
func (m *Matcher) frameLimit(budget int) int {
	if budget > 0 && (m.cfg.FramesPerJob <= 0 || budget < m.cfg.FramesPerJob) {
		return budget
	}
	return m.cfg.FramesPerJob
}

type layerResult struct {
	dispatched int
	worked     bool
	stop       dispatch.Stop
	table      string
	// fenced: the work-split fence refused the batch (Options.Fence).
	fenced bool
}

func (m *Matcher) processLayer(ctx context.Context, c *clusters.Cluster, l *jobs.Layer, t *turn) layerResult {
	var r layerResult
	tags := c.MatchingTags(l.Tags)
	if len(tags) == 0 || len(l.Frames) == 0 {
		return r
	}
	// Before the semaphore: a job waiting for its turn must not hold a slot
	// the job ahead of it needs.
	if !t.wait(ctx) {
		return r
	}
	select {
	case m.sem <- struct{}{}:
	case <-ctx.Done():
		return r
	}
	defer func() { <-m.sem }()
	if !m.permits.Acquire(l.ID, time.Duration(len(l.Frames))*m.cfg.PermitPerFrame) {
		m.m.permitDenied.Inc()
		m.log.Trace("layer skipped: already being processed", "layer", l.Name)
		return r
	}
	defer m.permits.Release(l.ID)
	r.worked = true

	floor := m.cfg.Policy.Floor(l.Shape)
	// CPU work leaves an idle GPU's bundle free while GPU work waits.
	keep := func(h *sizing.Host) {}
	if m.guard != nil && l.GPUsMin <= 0 {
		clusterTags := c.TagNames()
		keep = func(h *sizing.Host) {
			h.KeepCores, h.KeepMemKB = m.guard.Keep(clusterTags, h.IdleGPUs)
		}
	}
	// One layer holds at most its share of a host (unless it is alone, or
	// packs onto its seat hosts).
	packing := m.packs(l)
	limit := m.spreadLimit(m.cfg.Policy.FrameCores(l.Shape), t.solo || packing)
	remaining := l.Frames
	attempts := 0
	idle := false        // a host took nothing: do not spin on this layer
	var watch jobs.Watch // of the last miss
	var refused []string // hosts the booking script found reserved for others
	seatStop := false    // the last stop was a node-locked limit's
	for !idle && attempts < m.cfg.Attempts && len(remaining) > 0 && ctx.Err() == nil {
		attempts++
		now := time.Now()
		fits := m.cfg.Policy.Fitter(l.Shape) // the job's live cores as of this attempt
		var seated seatView
		if packing {
			seated = m.seatView(ctx, l)
		}
		req := HostRequest{
			FacilityID: c.FacilityID, ShowID: c.ShowID, Tags: tags,
			Floor: floor, OS: l.OS, Threadable: l.Threadable, LayerID: l.ID,
			Accept: func(h sizing.Host) bool {
				if m.quarantined(h.ID) {
					return false
				}
				if packing && !seated.admits(h.ID) {
					return false
				}
				if slices.Contains(refused, h.ID) || (m.resv != nil && !m.resv.Admit(h.ID, l, now)) {
					return false
				}
				keep(&h)
				if limit != nil && !limit(&h) {
					return false
				}
				return fits(&h)
			},
		}
		host, err := m.hosts.Checkout(ctx, req)
		if packing && errors.Is(err, ErrNoCandidate) && seated.widen() {
			// No seat host takes a frame: a new host, while a seat is free.
			host, err = m.hosts.Checkout(ctx, req)
		}
		t.pass()
		if packing && seated.full() && errors.Is(err, ErrNoCandidate) {
			// Every seat is held and no seat host has room: the limit is
			// what stops the layer, not the farm.
			r.stop, seatStop = dispatch.LimitReached, true
			m.m.seatWaits.Inc()
			break
		}
		if errors.Is(err, ErrNoCandidate) {
			m.m.noCandidate.Inc()
			var nc *NoCandidateError
			if errors.As(err, &nc) {
				watch = nc.Watch
			}
			break
		}
		if err != nil {
			m.log.Warn("host checkout failed", "layer", l.Name, "error", err)
			r.stop = dispatch.Failed
			break
		}
		keep(&host)
		if host.KeepCores > 0 || host.KeepMemKB > 0 {
			m.guard.Held()
		}
		if limit != nil {
			kept := host.KeepCores
			limit(&host)
			if host.KeepCores > kept {
				m.m.spreadCapped.Inc()
			}
		}
		if m.fence != nil {
			if err := m.fence(c); err != nil {
				// This instance no longer holds the cluster's share (or
				// its lease is past its fence): another instance may
				// book it now. Book nothing more here.
				m.hosts.Checkin(host)
				m.log.Debug("work split: fence refused a batch", "cluster", c.Key(), "error", err)
				r.fenced = true
				return r
			}
		}
		parts := []dispatch.Part{{Host: host, Frames: remaining}}
		gd, group := m.disp.(GroupDispatcher)
		if group && m.cfg.HostsPerBatch > 1 && !packing {
			parts = m.moreHosts(ctx, req, l, parts, &fits, keep, limit)
		}
		var results []dispatch.Result
		if len(parts) == 1 {
			results = []dispatch.Result{m.disp.Dispatch(ctx, l, remaining, host)}
		} else {
			results = gd.DispatchGroup(ctx, l, parts)
		}

		drop := make(map[string]bool, len(remaining))
		stop, stopAt, retry := dispatch.Done, -1, false
		for i, res := range results {
			h := parts[i].Host
			if len(res.Dispatched)+len(res.Claimed)+len(res.LaunchFailed) > 0 {
				m.bookedJob(l.JobID)
			}
			res.Host.KeepCores, res.Host.KeepMemKB = 0, 0
			if o, ok := m.hosts.(BookingObserver); ok && len(res.Dispatched) > 0 {
				o.Booked(res.Host, l.ID, len(res.Dispatched), res.CoresBooked)
			}
			m.hosts.Checkin(res.Host)
			if len(res.LaunchFailed) > 0 {
				m.quarantineHost(h.ID)
			}
			for _, ids := range [][]string{res.Dispatched, res.Claimed, res.LaunchFailed} {
				for _, id := range ids {
					drop[id] = true
				}
			}
			switch res.Stop {
			case dispatch.Reserved:
				refused = append(refused, h.ID)
				retry = true
			case dispatch.HostStale:
				retry = true
			}
			r.dispatched += len(res.Dispatched)
			l.JobCoresLive += res.CoresBooked
			if res.Err != nil {
				m.log.Warn("dispatch failed", "layer", l.Name, "host", h.Name, "error", res.Err)
			}
			// The batch's stop: the first part's that ends the layer, else
			// the last part's.
			if stopAt < 0 {
				stop = res.Stop
				switch res.Stop {
				case dispatch.Done, dispatch.HostFull, dispatch.HostStale, dispatch.Reserved:
				default:
					stopAt = i
				}
				seatStop = res.Seat != nil
				if res.Limit != nil {
					r.table = res.Limit.Table
				}
			}
		}
		if len(drop) > 0 {
			kept := make([]jobs.Frame, 0, len(remaining))
			for _, f := range remaining {
				if !drop[f.ID] {
					kept = append(kept, f)
				}
			}
			remaining = kept
		}
		r.stop = stop
		switch stop {
		case dispatch.Done, dispatch.HostFull, dispatch.HostStale, dispatch.Reserved:
			// Reserved: the host was reserved since the checkout (the
			// booking script refused it); another host may take the frames.
			if len(drop) == 0 && !retry {
				// A host that took nothing: do not spin on this layer.
				// (Not by setting attempts to the maximum: they are
				// observed below, issue #26.)
				idle = true
			}
			continue
		}
		break
	}
	m.m.candidates.Observe(float64(attempts))
	if r.stop == dispatch.LimitReached {
		if seatStop {
			m.m.holds.WithLabelValues(string(HoldSeat)).Inc()
		} else {
			m.m.holds.WithLabelValues(string(HoldLimit)).Inc()
		}
	}
	blocked := r.dispatched == 0 && (r.stop == dispatch.Done || r.stop == dispatch.HostFull || r.stop == dispatch.Reserved)
	if m.resv != nil {
		o := OutcomeOther
		switch {
		case r.dispatched > 0:
			o = OutcomePlaced
		case blocked:
			o = OutcomeBlocked
		}
		m.resv.Observe(c, l, o, time.Now())
	}
	if r.dispatched > 0 {
		m.backoff.Booked(c.Key(), l.ID)
	} else if blocked {
		// No candidate (or none took a frame): hold the layer back here,
		// until the hosts it missed gain capacity (if the miss carried a
		// watch) or the backoff ends.
		d := m.backoff.MissedWatch(c.Key(), l.ID, watch)
		m.log.Trace("no host for layer; backing off", "layer", l.Name, "cluster", c.Key(), "for", d)
	}
	return r
}

// moreHosts grows a batch whose last host cannot take all its frames: it
// checks out more hosts with the same request (Accept sizing against the
// job's budget less the frames planned on the hosts before) and gives each
// the frames it takes, the last one the rest, until every frame has a
// host, a host takes none, no host fits or Config.HostsPerBatch are held.
// fits is the request's fitter, replaced as the budget shrinks; keep and
// limit are applied to each new host as to the first.
func (m *Matcher) moreHosts(ctx context.Context, req HostRequest, l *jobs.Layer, parts []dispatch.Part,
	fits *func(*sizing.Host) bool, keep func(*sizing.Host), limit func(*sizing.Host) bool) []dispatch.Part {
	shape := l.Shape
	for len(parts) < m.cfg.HostsPerBatch {
		last := &parts[len(parts)-1]
		sized, why := m.cfg.Policy.Plan(last.Host, shape, len(last.Frames))
		if why == sizing.JobAtCap || len(sized) == 0 || len(sized) >= len(last.Frames) {
			break
		}
		for _, r := range sized {
			shape.JobCoresLive += r.Cores
		}
		*fits = m.cfg.Policy.Fitter(shape)
		h, err := m.hosts.Checkout(ctx, req)
		if err != nil {
			if !errors.Is(err, ErrNoCandidate) {
				m.log.Debug("no further host for the batch", "layer", l.Name, "error", err)
			}
			break
		}
		keep(&h)
		if limit != nil {
			limit(&h)
		}
		rest := last.Frames[len(sized):]
		last.Frames = last.Frames[:len(sized):len(sized)]
		parts = append(parts, dispatch.Part{Host: h, Frames: rest})
	}
	return parts
}
