// Package dispatch books a batch of one layer's frames on one host, or on
// several hosts in one transaction (DispatchGroup), and launches them on
// RQD.
//
// # Order of operations
//
//  1. Plan: size each frame with the shared sizing.Policy (Config.Policy,
//     Cuebot's reservation rules) against a local copy of the host's idle
//     values, stopping at the first frame that does not fit. Every planned frame gets a fresh
//     proc UUID.
//  2. Book in Redis first (publisher.BookAll), all planned frames in one
//     round trip (one script call per frame, pipelined in dispatch order;
//     each is atomic, so caps hold whatever runs between them). The
//     per-proc record the booking script writes is what makes every later
//     undo exact and idempotent. Each booking names the
//     host and carries the frame's backfill-until (now + the layer's
//     worst-case runtime, jobs.Layer.WorstCase), so the script refuses it
//     atomically when the host holds a firm reservation for another layer
//     and the frame would not end by the reservation's ready time (Stop
//     Reserved; scheduler/reservations). When the owner's frame starts on
//     its reserved host, Options.Reservations ends the reservation.
//  3. One Postgres transaction for the whole batch, in one round trip: the
//     limit locks, the claim and the host update pipelined as one implicit
//     transaction (one Sync, no BEGIN or COMMIT statement: it commits when
//     the last statement succeeds, any error rolls all of it back).
//     (a) If the layer is attached to limit_records, lock them (SELECT ...
//     FOR UPDATE, in key order) so two dispatchers cannot both use the last
//     slot of a limit. (b) One statement (ClaimSQL) computes the limits' headroom from
//     layer_stat running counts (a fresh snapshot taken after the locks),
//     claims the frames by primary key with FOR UPDATE SKIP LOCKED (a frame
//     another dispatcher is claiming is skipped, never waited for, so two
//     instances cannot deadlock on frame rows), moves them WAITING ->
//     RUNNING guarded by state WAITING, the int_version read with the
//     frame, no future ts_start_after, the show still being
//     scheduler-managed and the job still PENDING and not paused (a job
//     paused or killed after the pending query read it starts nothing: the
//     batch stops with JobStopped and its bookings are rolled back in
//     step 4), and inserts their procs. The job is read in the
//     statement's snapshot, without a lock: a pause or kill that commits
//     while the claim transaction runs is not seen, and the batch starts
//     as if it had committed just before (a pause leaves running frames
//     alone anyway; a kill racing that closely may miss the new procs).
//     Closing that window would take a share lock on the job row, making
//     every pause and kill wait for in-flight bookings and adding a
//     job-before-frame lock order that Cuebot's paths do not follow. (c) One statement
//     (HostTakeSQL) takes the started frames' resources off the host, summed
//     from the procs the claim inserted (so it needs no answer from the
//     claim and goes in the same round trip); Cuebot's verify_host_resources
//     trigger refuses an idle value below zero, in which case the cache was
//     stale and everything is rolled back.
//     The claim names a host per frame, so a batch may span several hosts
//     (DispatchGroup): it then locks its hosts in key order
//     (lockHostsSQL) before HostTakeSQL updates them all; if any host is
//     stale the batch rolls back and each host's part is committed on its
//     own, so the others still start.
//     Frames, then layer_stat/job_stat (the frame triggers), then host: the
//     same lock order as Cuebot's completion path, so the two do not
//     deadlock. The accounting tables are not touched: for a managed show
//     they belong to the recompute loop.
//  4. Redis bookings of frames that did not make it (claimed elsewhere,
//     trimmed by a limit, or all of them if the transaction failed) are
//     rolled back from their records. A transaction whose outcome stays
//     unknown (its connection lost, and Postgres unreachable for the
//     resolution too, tried again for up to 10 s) may have committed: it
//     launches nothing and its bookings are kept; Run settles it once
//     Postgres answers (committed frames put back to WAITING, an
//     uncommitted one's bookings rolled back), and without Run the
//     accounting reconcile and Cuebot's orphaned-proc check do, later.
//  5. LaunchFrame for each winner (skipped in dry-run mode). A launch
//     whose outcome is unknown (its deadline passed in flight) is first
//     checked against the host's RQD status report: a frame RQD runs
//     under our proc is launched (resolveUnknown). A failed launch is
//     compensated exactly once: one statement puts the frame back
//     to WAITING (exit status 299, version bumped) only while our proc still
//     exists, and one deletes our proc and gives its resources back to the
//     host in the same statement, so a proc already released by Cuebot's
//     completion path is never given back twice. Then the Redis booking is
//     released (idempotent against the sidecar, which sees the same proc
//     DELETE) and a best-effort KillRunningFrame covers a launch that
//     actually started.
//
// # Limits
//
// A node-locked limit (cuesched_limit.b_per_host) counts hosts, not frames:
// the booking script (step 2) takes or shares the host's seat atomically,
// against every instance's bookings, and refuses with a *SeatError when
// every seat is held by other hosts (Stop LimitReached, Result.Seat); the
// claim statement leaves it out of its frame count. The seat goes back when
// the release of the host's last proc under the limit reaches Redis.
//
// A layer attached to several limit_records books only while every one of
// them has room (the minimum headroom). Cuebot accepts a frame when any one
// of its limits has room, which lets a layer on two limits overrun one of
// them; the stricter rule never exceeds a limit. With one limit per layer,
// the normal case, the two agree. The locked headroom also caps how many
// frames one batch starts, which a per-frame check inside one statement
// could not do (all frames would see the counts from before the statement).
//
// Work after the commit (launch, compensation, rollbacks) runs on a context
// detached from the caller's, so a shutdown never leaves a committed but
// unlaunched frame behind. The launches have their own deadline
// (Config.LaunchTimeout) and the compensations theirs
// (Config.CompensateTimeout), started after the launches returned; the
// scheduler derives both, and its drain, from the configured timeouts
// (config.DispatchBudget). A transaction whose outcome is unknown (the
// connection lost before its end was read) is resolved by looking for the
// procs on a fresh connection.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/runframe"
	"github.com/cuesched/cuesched/scheduler/sizing"
)

// Accounting is the Redis booking API (publisher.Publisher).
type Accounting interface {
	// BookAll books in one round trip; one result and error per booking,
	// as publisher.Publisher.Book has for each.
	BookAll(ctx context.Context, bs []publisher.Booking) ([]publisher.Result, []error)
	Rollback(ctx context.Context, procID string) (publisher.RollbackResult, error)
	Release(ctx context.Context, procIDs ...string) (publisher.ReleaseResult, error)
}

// Launcher reaches RQD (rqdclient.Pool).
type Launcher interface {
	LaunchFrame(ctx context.Context, host string, rf *rqdpb.RunFrame) error
	KillRunningFrame(ctx context.Context, host, frameID, reason string) error
	// RunningProcs is what host's RQD reports running: the proc
	// (RunFrame.resource_id) of each frame.
	RunningProcs(ctx context.Context, host string) (map[string]bool, error)
}

// Config holds the dispatch knobs.
type Config struct {
	// Policy sizes the frames: the one the matcher's Accept uses (built
	// once by package scheduler), so a host the matcher checked out takes
	// a frame unless Postgres disagrees. Its MinMemKB is also written to
	// proc.int_mem_used.
	Policy sizing.Policy
	// SoftLimit and HardLimit scale the reserved memory into the RunFrame
	// memory limits (1.6, 2.0).
	SoftLimit, HardLimit float64
	// DryRun books in Postgres and Redis but does not call RQD.
	DryRun bool
	// LaunchTimeout bounds the LaunchFrame calls of a batch after the
	// commit (default 60 s; the scheduler derives it from
	// rqd.request_timeout, config.DispatchBudget).
	LaunchTimeout time.Duration
	// CompensateTimeout is the separate deadline of a batch's
	// compensations (and of ending a reservation its owner booked),
	// started when the launches have returned (default
	// config.CompensateBudget, 20 s). A launch that used its whole budget
	// therefore still has its booking undone.
	CompensateTimeout time.Duration
	// Schema adapts the booking statement to the database (nil: a database
	// at Cuebot V47 or later).
	Schema *jobs.Schema
	// BookTimeout bounds the time from the first booking script call to the
	// end of the transaction (default 30 s); past it the transaction is
	// abandoned and the bookings rolled back. The accounting recompute
	// relies on this bound (it must stay below its in-flight grace).
	BookTimeout time.Duration
}

// Options are the dependencies of a Dispatcher.
type Options struct {
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// Reservations, when set, hears of every batch in which the owner of
	// the host's firm reservation started a frame there, so the
	// reservation ends (scheduler/reservations).
	Reservations OwnerBooked
}

// OwnerBooked ends a host reservation once its owner layer runs a frame on
// the host.
type OwnerBooked interface {
	OwnerBooked(ctx context.Context, hostID, layerID string)
}

// Dispatcher books and launches. It is safe for concurrent use.
type Dispatcher struct {
	pool   *pgxpool.Pool
	acct   Accounting
	rqd    Launcher
	cfg    Config
	limits runframe.Limits
	log    hclog.Logger
	m      *metrics
	claim  string // claimGroupSQL of ClaimSQL adapted to the schema
	resv   OwnerBooked
	// pids: whether a connection's PgConn().PID() is its server backend
	// (pidUnknown until the first connection is checked; pidPooler behind
	// a pooler such as PgBouncer, where it is not).
	pids atomic.Int32
	// afterCommit, if set (tests only), runs between the commit and the
	// launches, given the anchored launch deadline: a scheduler stalled
	// there (SIGSTOP, a paused VM).
	afterCommit func(launchBy time.Time)
	// unresolved queues booking transactions of unknown outcome for Run.
	unresolved chan unresolvedBatch
	// committed counts the frames this dispatcher's transactions started;
	// hostTake re-prepares HostTakeSQL as it doubles.
	committed   atomic.Int64
	hostTakeSQL []string
}

const (
	pidUnknown int32 = iota
	pidReal
	pidPooler
)

// New returns a Dispatcher. rqd may be nil in dry-run mode.
func New(pool *pgxpool.Pool, acct Accounting, rqd Launcher, cfg Config, o Options) *Dispatcher {
	if cfg.LaunchTimeout <= 0 {
		cfg.LaunchTimeout = time.Minute
	}
	if cfg.CompensateTimeout <= 0 {
		cfg.CompensateTimeout = 20 * time.Second
	}
	if cfg.BookTimeout <= 0 {
		cfg.BookTimeout = 30 * time.Second
	}
	if cfg.SoftLimit == 0 {
		cfg.SoftLimit = 1.6
	}
	if cfg.HardLimit == 0 {
		cfg.HardLimit = 2.0
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	d := &Dispatcher{
		pool: pool, acct: acct, rqd: rqd, cfg: cfg,
		limits: runframe.Limits{Soft: cfg.SoftLimit, Hard: cfg.HardLimit, CoreUnit: cfg.Policy.Unit()},
		log:    log.Named("dispatch"),
		m:      newMetrics(o.Registerer),
		resv:   o.Reservations,

		unresolved:  make(chan unresolvedBatch, unresolvedQueueLen),
		hostTakeSQL: hostTakeSQLs(),
	}
	claim := ClaimSQL
	if cfg.Schema != nil {
		claim = cfg.Schema.Adapt(ClaimSQL)
	}
	d.claim = claimGroupSQL(claim)
	return d
}

// Stop says why a batch ended before every frame it was given ran.
type Stop int

const (
	// Done: every frame was dispatched or found claimed elsewhere.
	Done Stop = iota
	// HostFull: the next frame does not fit on this host.
	HostFull
	// JobAtCap: the job's remaining core budget is used up.
	JobAtCap
	// Capped: a Redis cap refused the booking (Result.Limit says which).
	Capped
	// NotSeeded: the show's accounting is not seeded yet (managed flip or
	// Redis re-bootstrap in progress).
	NotSeeded
	// LimitReached: a limit_record of the layer has no room.
	LimitReached
	// HostStale: Postgres has less idle on the host than the cache said.
	HostStale
	// Failed: a database, Redis or protocol error; Result.Err has it.
	Failed
	// JobStopped: the job was paused, or left PENDING (killed, finished),
	// after it was read: nothing was started and the bookings were rolled
	// back. Its other layers need not be tried either.
	JobStopped
	// Reserved: the host holds a firm reservation for another layer and
	// the booking script refused the frame (not an admissible backfill);
	// another host may take it. Result.Reserved says whose.
	Reserved
)

var stopNames = [...]string{"done", "host_full", "job_at_cap", "capped", "not_seeded", "limit_reached", "host_stale", "failed", "job_stopped", "reserved"}

func (s Stop) String() string {
	if int(s) < len(stopNames) {
		return stopNames[s]
	}
	return fmt.Sprintf("Stop(%d)", int(s))
}

// Result reports one batch.
type Result struct {
	// Host carries the idle values after the batch: the ones Postgres
	// returned when the transaction committed (and compensations), else
	// the host as given.
	Host sizing.Host
	// Dispatched are the frames now running (booked, in dry-run mode).
	Dispatched []string
	// Claimed are frames another dispatcher took (or that stopped being
	// WAITING): drop them for this pass.
	Claimed []string
	// LaunchFailed are frames whose launch failed and were put back to
	// WAITING.
	LaunchFailed []string
	// CoresBooked is the centicores of Dispatched.
	CoresBooked int64
	Stop        Stop
	// Limit is the cap that refused a booking when Stop is Capped.
	Limit *publisher.LimitError
	// Reserved is the reservation that refused a booking when Stop is
	// Reserved.
	Reserved *publisher.ReservedError
	// Seat is the refusal by a node-locked limit (every seat held by other
	// hosts) when Stop is LimitReached because of one.
	Seat *publisher.SeatError
	// Backfilled counts the frames started as EASY backfills on a host
	// reserved for another layer.
	Backfilled int
	// Err is the error behind Stop == Failed.
	Err error
}

type planned struct {
	frame jobs.Frame
	res   sizing.Reservation
	proc  string
	resv  string // publisher.Result.Reservation of its booking
}

// Dispatch books frames (in order) of layer l on host h and launches them.
func (d *Dispatcher) Dispatch(ctx context.Context, l *jobs.Layer, frames []jobs.Frame, h sizing.Host) Result {
	return d.DispatchGroup(ctx, l, []Part{{Host: h, Frames: frames}})[0]
}

// Part is one host's share of a group batch: the frames to book there, in
// dispatch order.
type Part struct {
	Host   sizing.Host
	Frames []jobs.Frame
}

// DispatchGroup books frames of layer l on several hosts (parts) in one
// Postgres transaction and launches them: one host batch per part, each
// planned against its host, booked in Redis and launched as Dispatch does,
// with one claim and one host update for all of them. The job's core
// budget carries from part to part. results[i] reports parts[i]. If a
// host's idle value would go below zero (a stale cache) the transaction
// rolls back and each host's batch is committed on its own, so one stale
// host costs the others nothing but a second round trip.
func (d *Dispatcher) DispatchGroup(ctx context.Context, l *jobs.Layer, parts []Part) []Result {
	start := time.Now()
	ps := d.dispatch(ctx, l, parts)
	out := make([]Result, len(ps))
	for i, x := range ps {
		out[i] = x.out
		d.m.batches.WithLabelValues(x.out.Stop.String()).Inc()
	}
	d.m.batchDuration.Observe(time.Since(start).Seconds())
	return out
}

// part is one host's batch in flight.
type part struct {
	Part
	out    Result
	plan   []planned
	booked []planned
	// base is the index of the part's first booked frame in the
	// transaction's arrays (the limit headroom counts across parts).
	base int
	// The part's outcome in the transaction.
	won               wonFrames
	after             sizing.Host
	room              int
	stale, jobStopped bool
	err               error
	launched          []planned
	failed            []error
}

func (d *Dispatcher) dispatch(ctx context.Context, l *jobs.Layer, parts []Part) []*part {
	ps := make([]*part, len(parts))
	shape := l.Shape
	nplanned := 0

	// 1. Plan, each part against its host; the job's budget carries over.
	for i, p := range parts {
		x := &part{Part: p, out: Result{Host: p.Host, Stop: Done}, room: -1}
		ps[i] = x
		sized, why := d.cfg.Policy.Plan(p.Host, shape, len(p.Frames))
		switch why {
		case sizing.Fits:
		case sizing.JobAtCap:
			x.out.Stop = JobAtCap
		default:
			x.out.Stop = HostFull
		}
		x.plan = make([]planned, len(sized))
		for j, r := range sized {
			x.plan[j] = planned{frame: p.Frames[j], res: r, proc: uuid.NewString()}
			shape.JobCoresLive += r.Cores
		}
		nplanned += len(sized)
	}
	if nplanned == 0 {
		return ps
	}
	d.m.planned.Add(float64(nplanned))

	// 2. Book in Redis. The bookings go out in one round trip, in dispatch
	// order (publisher.BookAll: each is one atomic script, so caps hold
	// whatever runs between them); the frames kept are the ones whose
	// booking succeeded, and the first refusal in a part's dispatch order
	// says why that part stops.
	//
	// The connection of step 3 is taken first and held until the end of
	// the transaction: each booking record names its backend
	// (Booking.BackendPID), so once that backend is gone the accounting
	// reconcile knows the transaction is over and drops a record whose
	// proc never committed at once, not after the in-flight grace.
	bctx, cancelBook := context.WithTimeout(ctx, d.cfg.BookTimeout)
	defer cancelBook()
	bookDeadline, _ := bctx.Deadline()
	conn, err := d.pool.Acquire(bctx)
	if err != nil {
		for _, x := range ps {
			if len(x.plan) > 0 {
				x.out.Stop, x.out.Err = Failed, fmt.Errorf("dispatch: acquire connection: %w", err)
			}
		}
		return ps
	}
	held := true
	release := func() {
		if held {
			held = false
			conn.Release()
		}
	}
	defer release()
	pid := d.backendPID(bctx, conn)
	until := time.Time{}
	if wc := l.WorstCase(); wc > 0 {
		until = time.Now().Add(wc)
	}
	var bs []publisher.Booking
	for _, x := range ps {
		for _, p := range x.plan {
			b := d.booking(l, x.Host, p, until)
			b.BackendPID = pid
			bs = append(bs, b)
		}
	}
	results, errs := d.acct.BookAll(bctx, bs)
	var live []*part
	nbooked, at := 0, 0
	for _, x := range ps {
		n := len(x.plan)
		d.keepBooked(x, errs[at:at+n], results[at:at+n])
		at += n
		if len(x.booked) > 0 {
			x.base = nbooked
			nbooked += len(x.booked)
			live = append(live, x)
		}
	}
	if len(live) == 0 {
		return ps
	}

	// 3. The Postgres transaction: one for every part; if a host was
	// stale, then one per part.
	var resolvedBy time.Time
	commit := func(parts []*part) bool {
		start := time.Now()
		by, stale := d.commit(bctx, conn, l, parts)
		d.m.txDuration.Observe(time.Since(start).Seconds())
		if by.After(resolvedBy) {
			resolvedBy = by
		}
		return stale
	}
	if commit(live) && len(live) > 1 {
		d.m.groupsSplit.Inc()
		for _, x := range live {
			commit([]*part{x})
		}
	}
	release()

	// 4. Roll back what did not make it.
	for _, x := range live {
		d.settle(l, x)
	}
	if resolvedBy.Before(bookDeadline) {
		resolvedBy = bookDeadline
	}
	d.launchAll(ctx, l, ps, resolvedBy)
	return ps
}

// keepBooked keeps the part's frames whose booking succeeded (errs and
// results are its plan's) and sets its stop from the first refusal.
func (d *Dispatcher) keepBooked(x *part, errs []error, results []publisher.Result) {
	refused := false
	for i, p := range x.plan {
		err := errs[i]
		if err == nil {
			p.resv = results[i].Reservation
			x.booked = append(x.booked, p)
			continue
		}
		var le *publisher.LimitError
		var re *publisher.ReservedError
		var se *publisher.SeatError
		isLimit := errors.As(err, &le)
		isReserved := errors.As(err, &re)
		isSeat := errors.As(err, &se)
		if isLimit {
			d.m.lost.WithLabelValues(lostGate).Inc()
		}
		notSeeded := errors.Is(err, publisher.ErrShowNotSeeded)
		if !isLimit && !notSeeded && !isReserved && !isSeat {
			// Outcome unknown: undo whatever may have been charged.
			d.rollback(p.proc)
		}
		if refused {
			continue
		}
		refused = true
		switch {
		case isLimit:
			x.out.Stop, x.out.Limit = Capped, le
		case isReserved:
			x.out.Stop, x.out.Reserved = Reserved, re
		case isSeat:
			x.out.Stop, x.out.Seat = LimitReached, se
		case notSeeded:
			x.out.Stop = NotSeeded
		default:
			x.out.Stop, x.out.Err = Failed, err
		}
	}
	if x.out.Stop == Failed || x.out.Stop == NotSeeded {
		// Do not start part of a batch whose bookings failed for reasons
		// that are not about caps.
		for _, p := range x.booked {
			d.rollback(p.proc)
		}
		x.booked = nil
	}
}

// settle rolls back the Redis bookings of a part's frames that did not
// start and sets its result from the transaction's outcome, leaving the
// winners in x.launched.
func (d *Dispatcher) settle(l *jobs.Layer, x *part) {
	winners := make(map[string]bool, len(x.won.frames))
	for _, id := range x.won.frames {
		winners[id] = true
	}
	// A transaction of unknown outcome may have committed: its bookings
	// stay until Run settles it (an over-count until then, never an
	// under-count that would let the gate pass more than a cap).
	keep := errors.Is(x.err, errUnresolved)
	for i, p := range x.booked {
		if winners[p.frame.ID] && x.err == nil && !x.stale {
			x.launched = append(x.launched, p)
			continue
		}
		if !keep {
			d.rollback(p.proc)
		}
		switch {
		case x.err != nil || x.stale || x.jobStopped:
		case x.room >= 0 && x.base+i >= x.room:
			if x.out.Stop == Done || x.out.Stop == HostFull {
				x.out.Stop = LimitReached
			}
		default:
			x.out.Claimed = append(x.out.Claimed, p.frame.ID)
		}
	}
	switch {
	case x.err != nil:
		x.out.Stop, x.out.Err = Failed, x.err
		x.launched = nil
		return
	case x.stale:
		d.m.lost.WithLabelValues(lostHostPG).Add(float64(len(x.booked)))
		x.out.Stop = HostStale
		x.launched = nil
		return
	case x.jobStopped:
		d.log.Debug("job paused or no longer pending; nothing started", "job", l.JobName, "layer", l.Name, "host", x.Host.Name)
		x.out.Stop = JobStopped
		x.launched = nil
		return
	}
	if len(x.out.Claimed) > 0 {
		d.m.lost.WithLabelValues(lostFrame).Add(float64(len(x.out.Claimed)))
	}
	if len(x.launched) > 0 {
		x.out.Host = x.after
	}
}

// launchAll is step 5 for every part with winners.
//
// Launch (or not, in dry run), compensating failures. The launches
// and what follows them have separate deadlines: a launch that used
// its whole budget must not leave its compensation an expired context
// (the frame would stay RUNNING with a proc and booked cores, never
// started).
//
// The launch deadline is anchored before the commit: the end of the
// booking budget (or of the resolution of an unknown outcome),
// resolvedBy, plus LaunchTimeout. A scheduler stalled after its commit
// (SIGSTOP, a paused VM, a long GC) would otherwise start a fresh launch
// budget when it resumes and could start a frame whose proc Cuebot's
// orphaned-proc check had cleared and whose frame already runs again
// elsewhere: the frame would run twice at once. With the anchor no
// launch leaves later than Book + commit resolution + Launch after the
// booking began (config.DispatchBudget, below Cuebot's interval); past
// it the launch is not sent and the booking is compensated.
func (d *Dispatcher) launchAll(ctx context.Context, l *jobs.Layer, ps []*part, resolvedBy time.Time) {
	n := 0
	for _, x := range ps {
		n += len(x.launched)
	}
	if n == 0 {
		return
	}
	launchBy := resolvedBy.Add(d.cfg.LaunchTimeout)
	if d.afterCommit != nil {
		d.afterCommit(launchBy)
	}
	if now := time.Now().Add(d.cfg.LaunchTimeout); now.Before(launchBy) {
		launchBy = now
	}
	lctx, cancelLaunch := context.WithDeadline(context.WithoutCancel(ctx), launchBy)
	var wg sync.WaitGroup
	for _, x := range ps {
		if len(x.launched) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.failed = d.launch(lctx, l, x.Host, x.launched)
		}()
	}
	wg.Wait()
	cancelLaunch()
	post, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.CompensateTimeout)
	defer cancel()
	d.resolveUnknown(post, ps)
	nfailed := 0
	for _, x := range ps {
		for _, e := range x.failed {
			if e != nil {
				nfailed++
			}
		}
	}
	d.m.compensateQueue.Add(float64(nfailed))
	now := time.Now()
	for _, x := range ps {
		owner := false
		for i, p := range x.launched {
			if x.failed[i] != nil {
				if after, ok := d.compensate(post, x.Host, p, x.won.version(p.frame.ID), x.failed[i]); ok {
					x.out.Host = after
				}
				d.m.compensateQueue.Dec()
				x.out.LaunchFailed = append(x.out.LaunchFailed, p.frame.ID)
				continue
			}
			x.out.Dispatched = append(x.out.Dispatched, p.frame.ID)
			x.out.CoresBooked += p.res.Cores
			switch p.resv {
			case publisher.ReservationOwner:
				owner = true
			case publisher.ReservationBackfill:
				x.out.Backfilled++
			}
			d.m.frames.WithLabelValues(l.ShowName).Inc()
			d.m.timeToBook.Observe(now.Sub(p.frame.Eligible).Seconds())
			d.m.observeMemory(l.Shape, p.res.MemKB)
		}
		if owner && d.resv != nil {
			// The owner runs on its host: the reservation has done its job.
			d.resv.OwnerBooked(post, x.Host.ID, l.ID)
		}
	}
}

// statusTimeout bounds resolveUnknown's status call to one host's RQD; it
// is taken from the compensation's budget (Config.CompensateTimeout).
const statusTimeout = 5 * time.Second

// resolveUnknown asks RQD about the launches whose outcome is unknown (the
// deadline passed, or the call was cancelled, while it was in flight: the
// request may have reached RQD and the frame be running). A frame that
// its host's RQD reports running under this booking's proc was launched:
// it is kept, not compensated. Compensating it would put a running frame
// back in the queue, and a frame that ended before the compensation's
// best-effort kill would run a second time. One ReportStatus a host
// (GetRunningFrameStatus is broken on Python RQD), the hosts concurrently,
// each within statusTimeout; when RQD does not answer, the launch stays
// failed and is compensated, as before.
func (d *Dispatcher) resolveUnknown(ctx context.Context, ps []*part) {
	var wg sync.WaitGroup
	for _, x := range ps {
		if !slices.ContainsFunc(x.failed, outcomeUnknown) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			running, err := d.rqd.RunningProcs(sctx, x.Host.Name)
			for i, p := range x.launched {
				cause := x.failed[i]
				if !outcomeUnknown(cause) {
					continue
				}
				switch {
				case err != nil:
					d.m.unknownLaunches.WithLabelValues("no_answer").Inc()
					d.log.Warn("launch outcome unknown and RQD's status did not answer; putting the frame back",
						"host", x.Host.Name, "frame", p.frame.Name, "proc", p.proc, "launch_error", cause, "error", err)
				case running[p.proc]:
					d.m.unknownLaunches.WithLabelValues("running").Inc()
					d.log.Warn("launch reply lost but RQD runs the frame; kept as launched",
						"host", x.Host.Name, "frame", p.frame.Name, "proc", p.proc, "launch_error", cause)
					x.failed[i] = nil
				default:
					d.m.unknownLaunches.WithLabelValues("not_running").Inc()
				}
			}
		}()
	}
	wg.Wait()
}

// errNotSent marks a launch the dispatcher did not send (its deadline had
// passed): its outcome is known.
var errNotSent = errors.New("launch not sent")

// outcomeUnknown reports whether a failed launch may have reached RQD: its
// deadline passed or it was cancelled while the call was in flight.
func outcomeUnknown(err error) bool {
	if err == nil || errors.Is(err, errNotSent) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// booking is one planned frame's Redis booking. It names the host, so the
// booking script honours the host's firm reservation (scheduler/
// reservations), and carries the frame's backfill-until (now + the layer's
// worst-case runtime; zero without history, which never backfills).
func (d *Dispatcher) booking(l *jobs.Layer, h sizing.Host, p planned, until time.Time) publisher.Booking {
	return publisher.Booking{
		ProcID: p.proc, ShowID: l.ShowID, AllocID: h.AllocID, FolderID: l.FolderID, JobID: l.JobID,
		LayerID: l.ID, DeptID: l.DeptID, Centicores: p.res.Cores, GPUs: p.res.GPUs,
		Seed: &publisher.SeedCaps{JobMaxCores: l.JobMaxCores, JobMaxGPUs: l.JobMaxGPUs,
			FolderMaxCores: l.FolderMaxCores, FolderMaxGPUs: l.FolderMaxGPUs},
		HostID: h.ID, BackfillUntil: until, Seats: seats(l),
	}
}

// backendPID is the server backend of conn, 0 when it cannot be known:
// behind a pooler (PgBouncer) the client-side pid is the pooler's, and a
// transaction may run on any server backend. Checked once, on the first
// connection (SELECT pg_backend_pid()).
func (d *Dispatcher) backendPID(ctx context.Context, conn *pgxpool.Conn) uint32 {
	pid := conn.Conn().PgConn().PID()
	switch d.pids.Load() {
	case pidReal:
		return pid
	case pidPooler:
		return 0
	}
	var server int32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&server); err != nil {
		return 0 // decided on a later batch
	}
	if uint32(server) != pid {
		if d.pids.CompareAndSwap(pidUnknown, pidPooler) {
			d.log.Info("the database connections go through a pooler: booking records do not name their backend, "+
				"so a booking whose transaction never committed is dropped after accounting.in_flight_grace",
				"client_pid", pid, "server_pid", server)
		}
		return 0
	}
	d.pids.Store(pidReal)
	return pid
}

// seats are the layer's node-locked limits as the booking script takes them.
func seats(l *jobs.Layer) []publisher.Seat {
	if len(l.SeatLimits) == 0 {
		return nil
	}
	out := make([]publisher.Seat, len(l.SeatLimits))
	for i, s := range l.SeatLimits {
		out[i] = publisher.Seat{Limit: s.ID, Max: s.Max}
	}
	return out
}

// rollback undoes a Redis booking whose proc did not commit.
func (d *Dispatcher) rollback(proc string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := d.acct.Rollback(ctx, proc); err != nil {
		d.m.accountingErrors.WithLabelValues("rollback").Inc()
		d.log.Warn("accounting rollback failed; the recompute will heal it", "proc", proc, "error", err)
	}
}

// launch calls RQD for every frame, concurrently; failed[i] is frame i's
// error.
func (d *Dispatcher) launch(ctx context.Context, l *jobs.Layer, h sizing.Host, ps []planned) []error {
	failed := make([]error, len(ps))
	if d.cfg.DryRun || d.rqd == nil {
		return failed
	}
	now := time.Now()
	var wg sync.WaitGroup
	for i, p := range ps {
		rf := d.limits.Build(runframe.Params{ProcID: p.proc, Layer: l, Frame: p.frame, Res: p.res, Now: now})
		wg.Add(1)
		d.m.launchQueue.Inc()
		go func() {
			defer wg.Done()
			defer d.m.launchQueue.Dec()
			start := time.Now()
			if late(ctx) {
				// Read from the clock, not ctx.Err(): right after a stall
				// the deadline's timer may not have fired yet.
				failed[i] = fmt.Errorf("launch of %s on %s %w: %w (the scheduler stalled after the commit)",
					rf.GetFrameName(), h.Name, errNotSent, context.DeadlineExceeded)
				return
			}
			failed[i] = d.rqd.LaunchFrame(ctx, h.Name, rf)
			d.m.launchDuration.Observe(time.Since(start).Seconds())
		}()
	}
	wg.Wait()
	return failed
}

// late reports whether ctx's deadline has passed by the clock.
func late(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}
