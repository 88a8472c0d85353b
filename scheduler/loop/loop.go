// Package loop is the scheduler's proactive loop: workers take clusters
// from the feed, query the cluster's pending jobs, let the matcher work
// them, and hand the cluster back with a sleep that depends on what the
// pass found (rust-scheduler §4.1–4.2).
//
//	no jobs                                 -> cluster_empty_sleep (30 s)
//	a query or a booking failed (database,  -> error backoff: cluster_error_
//	  Redis or host-cache error) and          backoff_min (200 ms) doubling
//	  nothing was booked                      per consecutive failure up to
//	                                          _max (2 s), jittered to [d/2, d]
//	                                          (scheduler_pass_errors_total)
//	no bookable job, but waiting work held  -> cluster_saturated_sleep
//	  back by a burst or a cap
//	jobs, but no frame booked               -> cluster_saturated_sleep (5 s)
//	an allocation cluster at its burst      -> cluster_saturated_sleep (its
//	                                           headroom returns as frames end,
//	                                           seen only in Redis)
//	the show is not seeded yet (a managed   -> NotSeededSleep (250 ms): the
//	  flip waiting for the loop leader)        leader's seed is seen in Redis
//	                                           only, so look again soon
//	frames booked                           -> no sleep: go round again
//
// The saturated sleep is an upper bound. With a Capacity (the host cache),
// a pass takes a watch of its cluster's host groups before its first query
// and sleeps on it: when a host of those groups gains idle resources that
// fit a layer that missed there (a frame finished and the WAL says so, a
// check-in returned a host, a host came up), the cluster is handed out again
// at once, and the layers that missed there are released from their
// backoff by the same generations (see scheduler/hostcache, "Capacity
// wake-ups", and jobs.Backoff). Capacity changes that fit nobody who missed
// wake nobody, so a busy farm does not turn the sleeps and backoffs off.
//
// cluster_buffer_size workers run passes in parallel, each working up to
// job_buffer_size jobs of its pass at once. Before each pass a worker waits
// on the gates: the accounting service's (nothing is booked while Redis is
// being bootstrapped or re-bootstrapped) and the host cache's (its first
// snapshot). A job that finds its show unseeded, or its allocation cluster
// at burst, stops the pass from starting more jobs; jobs already running
// finish their batches rather than being cancelled mid-booking.
//
// The scheduler package (scheduler.New) assembles the loop with the feed,
// the matcher and the accounting gate; this package keeps only the loop.
package loop

import (
	"context"
	"errors"
	"math"
	"math/rand"
	randv2 "math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
)

// Gate blocks booking while accounting is not ready (bootstrap, Redis
// re-bootstrap). Wait returns nil when booking may proceed.
type Gate interface {
	Wait(ctx context.Context) error
}

// Capacity tells the pipeline when hosts gain capacity (the host cache's
// capacity generations; see scheduler/hostcache).
type Capacity interface {
	// Watch returns a watch of the host groups of c's tags. It moves when
	// one of them gains capacity that may fit a checkout that missed there
	// since the watch was taken.
	Watch(c *clusters.Cluster) clusters.Watch
	// Changed returns a channel closed at the next capacity change
	// anywhere; take a new one after every wake-up.
	Changed() <-chan struct{}
}

// Releases tells the pipeline when a show's procs are released
// (scheduler/releases): the headroom of work held back by a cap or burst.
type Releases interface {
	// Watch returns a watch that moves at a release of show's procs after
	// it was taken (no sooner than the Board's minimum).
	Watch(show string) clusters.Watch
	// Changed returns a channel closed when a watch may have moved; take
	// a new one after every wake-up.
	Changed() <-chan struct{}
}

// Worker is what works the jobs of a pass (matcher.Matcher).
type Worker interface {
	ProcessInTurn(ctx context.Context, c *clusters.Cluster, job jobs.Job, turn matcher.Turn) (matcher.Outcome, error)
}

// PassReader is optionally implemented by the Worker (matcher.Matcher): it
// reads the dispatchable layers of every job of a pass in one statement,
// handed to each job in its Turn (matcher.Turn.Read), instead of one layer
// query per job. On an error every job reads its own, as without it.
type PassReader interface {
	PassLayers(ctx context.Context, c *clusters.Cluster, js []jobs.Job) (*matcher.PassRead, error)
}

// Config holds the loop's knobs.
type Config struct {
	ClusterBuffer  int // clusters processed concurrently (3)
	JobBuffer      int // jobs processed concurrently per pass (3)
	MaxJobsPerPass int // LIMIT of the pending-job query (20)
	CoreUnit       int // centicores per core (100)
	AgeRelief      time.Duration
	EmptySleep     time.Duration // 30 s
	SaturatedSleep time.Duration // 5 s
	// ErrorBackoffMin and ErrorBackoffMax bound the retry of a cluster
	// whose pass failed (200 ms doubling up to 1 s): a database failover
	// or restart is not an empty cluster, booking resumes within about
	// ErrorBackoffMax of the database coming back.
	ErrorBackoffMin, ErrorBackoffMax time.Duration
	// NotSeededSleep paces a show whose accounting is not seeded yet (a
	// flip to managed; 250 ms, at most SaturatedSleep): it is booked
	// within about this long of the leader's seed.
	NotSeededSleep time.Duration
	// Lottery draws each pass's jobs weighted by effective priority
	// (queue.job_order: lottery) instead of strict priority order.
	Lottery bool
	// LotterySeed seeds the draws; 0 picks a random seed.
	LotterySeed int64
	// FramesPerJob is the cap the matcher puts on a job's frames in one
	// pass, under its lottery budget (queue.dispatch_frames_per_job_limit;
	// 0: none). A budget beyond it cannot be spent whatever the farm's
	// room, so the lottery's room judgement counts each budget up to it.
	FramesPerJob int
	// Schema adapts the job query to the database (nil: current).
	Schema *jobs.Schema
	// Live, if set, gives the job query the show's live use (the
	// accounting store's counters) instead of a sum over the show's procs
	// (jobs.PendingQuery.Live).
	Live jobs.LiveSource
	// PassTimeout bounds one pass (queue.pass_timeout, 2 m): a pass stuck
	// on the database ends (reason timeout) and its worker moves on.
	// Work after a batch's commit runs on its own deadlines (dispatch).
	PassTimeout time.Duration
}

// Options are the pipeline's dependencies.
type Options struct {
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// Gate, if set, is waited on before every pass.
	Gate Gate
	// Capacity, if set, cuts a saturated cluster's sleep short when hosts
	// of its groups gain capacity for a layer that missed there.
	Capacity Capacity
	// Releases, if set, cuts short the sleep of a cluster whose work is
	// held back by a cap or burst (reasons capped and alloc_full; also
	// saturated, beside Capacity: the pending query leaves out jobs at
	// their cap) when its show's procs are released.
	Releases Releases
	// Booked, if set, runs after a pass that dispatched frames, before the
	// cluster goes back to the feed (the show tiers re-read the show's
	// usage there, so its next rank includes what it just booked).
	Booked func(ctx context.Context, c *clusters.Cluster)
}

// Loop runs passes until its context ends.
type Loop struct {
	db       jobs.DB
	feed     *clusters.Feed
	worker   Worker
	cfg      Config
	gate     Gate
	capacity Capacity
	releases Releases
	booked   func(ctx context.Context, c *clusters.Cluster)
	log      hclog.Logger
	m        *metrics

	drawMu sync.Mutex
	draws  *rand.Rand
	// workMu guards working: per cluster key, the jobs its passes in
	// flight hold (job id -> passes); a pass's pending query leaves them
	// out, so passes of one cluster in flight together work disjoint jobs.
	// queryMu (cluster key -> *sync.Mutex) makes a cluster's pending
	// query and the taking of its jobs one step.
	workMu  sync.Mutex
	working map[string]map[string]int
	queryMu sync.Map
	shares  sync.Map // cluster key -> passPlan
	fails   sync.Map // cluster key -> consecutive failed passes (int)
}

// New returns a pipeline over feed and worker.
func New(db jobs.DB, feed *clusters.Feed, worker Worker, cfg Config, o Options) *Loop {
	if cfg.ClusterBuffer <= 0 {
		cfg.ClusterBuffer = 3
	}
	if cfg.JobBuffer <= 0 {
		cfg.JobBuffer = 3
	}
	if cfg.MaxJobsPerPass <= 0 {
		cfg.MaxJobsPerPass = 20
	}
	if cfg.CoreUnit <= 0 {
		cfg.CoreUnit = 100
	}
	if cfg.EmptySleep <= 0 {
		cfg.EmptySleep = 30 * time.Second
	}
	if cfg.SaturatedSleep <= 0 {
		cfg.SaturatedSleep = 5 * time.Second
	}
	if cfg.PassTimeout <= 0 {
		cfg.PassTimeout = 2 * time.Minute
	}
	if cfg.NotSeededSleep <= 0 {
		cfg.NotSeededSleep = 250 * time.Millisecond
	}
	cfg.NotSeededSleep = min(cfg.NotSeededSleep, cfg.SaturatedSleep)
	if cfg.ErrorBackoffMin <= 0 {
		cfg.ErrorBackoffMin = 200 * time.Millisecond
	}
	if cfg.ErrorBackoffMax < cfg.ErrorBackoffMin {
		cfg.ErrorBackoffMax = max(time.Second, cfg.ErrorBackoffMin)
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	seed := cfg.LotterySeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	return &Loop{db: db, feed: feed, worker: worker, cfg: cfg, gate: o.Gate, capacity: o.Capacity, releases: o.Releases, booked: o.Booked, log: log.Named("pipeline"), m: newMetrics(o.Registerer),
		draws: rand.New(rand.NewSource(seed)), working: map[string]map[string]int{}}
}

// MaxLotteryFramesPerJob is a lottery pass's frames a job on a farm with
// room (queue.dispatch_frames_per_job_limit still caps each job); once a
// pass finds less room, the next passes plan the room found (SlotBudgets).
const MaxLotteryFramesPerJob = 40

// passPlan is a cluster's lottery plan: the frames its next pass hands out.
type passPlan struct {
	frames float64
}

// SlotBudgets splits the frames a tight pass expects to start (slots: what
// the cluster's last pass found room for) across its jobs in proportion to
// their effective priority (floored at 1), by systematic sampling at offset
// u in [0, 1): each job gets the floor or the ceiling of its exact share, on
// average the share itself, and the budgets sum to about slots. So the
// frames are split by weight whatever the draw order, instead of the first
// job drawn taking all of a pass smaller than its share. A job below its
// minimum cores (first in the draw) gets at least 1. A job with a budget of
// 0 sits the pass out. A lone job has no budget (0), as in LotteryBudgets.
func SlotBudgets(js []jobs.Job, slots, u float64) []int {
	out := make([]int, len(js))
	if len(js) < 2 {
		return out
	}
	total := totalWeight(js)
	at := u
	for i, j := range js {
		next := at + slots*weight(j)/total
		out[i] = int(math.Floor(next) - math.Floor(at))
		if j.BelowMinCores {
			out[i] = max(out[i], 1)
		}
		at = next
	}
	return out
}

// withBudget returns the jobs whose budget is positive, and their budgets.
func withBudget(js []jobs.Job, budgets []int) ([]jobs.Job, []int) {
	var work []jobs.Job
	var kept []int
	for i, b := range budgets {
		if b > 0 {
			work, kept = append(work, js[i]), append(kept, b)
		}
	}
	return work, kept
}

// LotteryBudgets splits a pass of perJob × len(js) frames across its jobs in
// proportion to their effective priority (floored at 1), at least one frame
// each. A lone job has no budget (0).
func LotteryBudgets(js []jobs.Job, perJob int) []int {
	out := make([]int, len(js))
	if len(js) < 2 {
		return out
	}
	total := totalWeight(js)
	pass := float64(perJob * len(js))
	for i, j := range js {
		out[i] = max(int(math.Ceil(pass*weight(j)/total)), 1)
	}
	return out
}

// weight is a job's lottery weight: its effective priority, floored at 1.
func weight(j jobs.Job) float64 { return float64(max(j.Effective, 1)) }

func totalWeight(js []jobs.Job) float64 {
	var total float64
	for _, j := range js {
		total += weight(j)
	}
	return total
}

// errorBackoff is the sleep after the n-th consecutive failed pass of a
// cluster: ErrorBackoffMin doubled n-1 times, capped at ErrorBackoffMax,
// jittered to [d/2, d] so clusters that failed together do not retry in
// lockstep.
func (p *Loop) errorBackoff(n int) time.Duration {
	d := p.cfg.ErrorBackoffMin
	for i := 1; i < n && d < p.cfg.ErrorBackoffMax; i++ {
		d *= 2
	}
	d = min(d, p.cfg.ErrorBackoffMax)
	return d/2 + randv2.N(d/2+1)
}

// draw names the next lottery draw.
func (p *Loop) draw() string {
	p.drawMu.Lock()
	defer p.drawMu.Unlock()
	return strconv.FormatUint(p.draws.Uint64(), 36)
}

// spendable is what a job can book of a lottery budget in one pass: the
// budget, up to the matcher's per-job cap (FramesPerJob).
func (p *Loop) spendable(budget int) int {
	if p.cfg.FramesPerJob > 0 {
		return min(budget, p.cfg.FramesPerJob)
	}
	return budget
}

// uniform is the next draw in [0, 1) (SlotBudgets' offset).
func (p *Loop) uniform() float64 {
	p.drawMu.Lock()
	defer p.drawMu.Unlock()
	return p.draws.Float64()
}

// Run runs the feed's refresh loop and the workers until ctx ends. It
// returns nil on cancellation, after every pass in flight has finished.
func (p *Loop) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = p.feed.Run(ctx)
	}()
	if p.capacity != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.forwardWakeups(ctx, p.capacity.Changed)
		}()
	}
	if p.releases != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.forwardWakeups(ctx, p.releases.Changed)
		}()
	}
	for i := 0; i < p.cfg.ClusterBuffer; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.work(ctx)
		}()
	}
	wg.Wait()
	return nil
}

// forwardWakeups pokes the feed at every change changed reports (host
// capacity, releases), so workers waiting for a cluster look at the
// sleeping clusters' watches.
func (p *Loop) forwardWakeups(ctx context.Context, changed func() <-chan struct{}) {
	for {
		ch := changed()
		select {
		case <-ctx.Done():
			return
		case <-ch:
			p.feed.Poke()
		}
	}
}

func (p *Loop) work(ctx context.Context) {
	for ctx.Err() == nil {
		if p.gate != nil {
			if err := p.gate.Wait(ctx); err != nil {
				return
			}
		}
		c, err := p.feed.Next(ctx)
		if err != nil {
			return
		}
		r := p.Pass(ctx, c)
		if r.Dispatched > 0 && p.booked != nil {
			p.booked(ctx, c)
		}
		p.feed.DonePass(c, r.Sleep, r.Wake, r.Dispatched > 0)
	}
}

// Reason says how a pass ended.
type Reason string

// Pass outcomes (label values of scheduler_passes_total).
const (
	Booked     Reason = "booked"
	Saturated  Reason = "saturated"
	NoJobs     Reason = "no_jobs"
	Capped     Reason = "capped"
	QueryError Reason = "query_error"
	// Failed: jobs were found, but a booking stopped on a database, Redis
	// or host-cache error and nothing was booked.
	Failed    Reason = "failed"
	AllocFull Reason = "alloc_full"
	NotSeeded Reason = "not_seeded"
	Cancelled Reason = "cancelled"
	// TimedOut: the pass reached queue.pass_timeout (a query or a lock
	// wait that did not end); the cluster sleeps the saturated sleep.
	TimedOut Reason = "timeout"
	// Busy: another pass of the same cluster in flight holds every
	// pending job (queue.stream.passes_per_cluster); the cluster does not
	// sleep on it, the passes holding the jobs decide.
	Busy Reason = "busy"
)

// PassResult reports one pass.
type PassResult struct {
	Jobs       int
	Dispatched int
	Reason     Reason
	Sleep      time.Duration
	// Wake, set for a saturated pass when the pipeline has a Capacity,
	// ends the sleep early: it was taken before the pass's first query, so
	// no capacity gain after the pass's misses can go unnoticed.
	Wake clusters.Watch
}

// takeJobs runs the cluster's pending query leaving out the jobs its other
// passes in flight hold, and holds the jobs found for this pass (one step
// per cluster, so two passes never take the same job).
func (p *Loop) takeJobs(ctx context.Context, c *clusters.Cluster, pq *jobs.PendingQuery) ([]jobs.Job, error) {
	key := c.Key()
	v, _ := p.queryMu.LoadOrStore(key, &sync.Mutex{})
	qm := v.(*sync.Mutex)
	qm.Lock()
	defer qm.Unlock()
	p.workMu.Lock()
	for id := range p.working[key] {
		pq.Exclude = append(pq.Exclude, id)
	}
	p.workMu.Unlock()
	js, err := jobs.Pending(ctx, p.db, *pq)
	if err != nil || len(js) == 0 {
		return nil, err
	}
	p.workMu.Lock()
	defer p.workMu.Unlock()
	held := p.working[key]
	if held == nil {
		held = map[string]int{}
		p.working[key] = held
	}
	for _, j := range js {
		held[j.ID]++
	}
	return js, nil
}

// releaseJobs gives back the jobs takeJobs held for a pass.
func (p *Loop) releaseJobs(c *clusters.Cluster, js []jobs.Job) {
	if len(js) == 0 {
		return
	}
	key := c.Key()
	p.workMu.Lock()
	defer p.workMu.Unlock()
	held := p.working[key]
	for _, j := range js {
		if held[j.ID]--; held[j.ID] <= 0 {
			delete(held, j.ID)
		}
	}
	if len(held) == 0 {
		delete(p.working, key)
	}
}

// Pass works one cluster once.
func (p *Loop) Pass(ctx context.Context, c *clusters.Cluster) PassResult {
	pctx, cancel := context.WithTimeout(ctx, p.cfg.PassTimeout)
	p.m.inFlight.Inc()
	r := p.pass(pctx, c)
	p.m.inFlight.Dec()
	cancel()
	if ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded) {
		p.log.Warn("pass reached its deadline (queue.pass_timeout): a query or lock wait did not end; moving on",
			"cluster", c.Key(), "timeout", p.cfg.PassTimeout, "dispatched", r.Dispatched)
		if r.Dispatched == 0 {
			r = PassResult{Jobs: r.Jobs, Reason: TimedOut, Sleep: p.cfg.SaturatedSleep, Wake: r.Wake}
		}
	}
	if r.Reason == QueryError || r.Reason == Failed {
		n := 1
		if v, ok := p.fails.Load(c.Key()); ok {
			n = v.(int) + 1
		}
		p.fails.Store(c.Key(), n)
		r.Sleep = p.errorBackoff(n)
		p.m.errorBackoff.Observe(r.Sleep.Seconds())
	} else if r.Reason != Cancelled {
		p.fails.Delete(c.Key())
	}
	p.m.passes.WithLabelValues(string(r.Reason)).Inc()
	p.m.perPass.WithLabelValues(c.Type().Label()).Observe(float64(r.Dispatched))
	return r
}

func (p *Loop) pass(ctx context.Context, c *clusters.Cluster) PassResult {
	var wake, released clusters.Watch
	if p.capacity != nil {
		wake = p.capacity.Watch(c)
	}
	if p.releases != nil {
		released = p.releases.Watch(c.ShowID)
	}
	start := time.Now()
	pq := jobs.PendingQuery{
		ShowID: c.ShowID, FacilityID: c.FacilityID, Tags: c.TagNames(), Limit: p.cfg.MaxJobsPerPass,
		CoreUnit: p.cfg.CoreUnit, AgeRelief: p.cfg.AgeRelief, Schema: p.cfg.Schema, Live: p.cfg.Live,
	}
	if p.cfg.Lottery {
		pq.Lottery, pq.Draw = true, p.draw()
	}
	js, err := p.takeJobs(ctx, c, &pq)
	p.m.jobQuery.Observe(time.Since(start).Seconds())
	defer p.releaseJobs(c, js)
	if p.feed != nil {
		// A full page of jobs may leave work for another pass of the
		// cluster (queue.stream.passes_per_cluster).
		p.feed.More(c, err == nil && len(js) >= p.cfg.MaxJobsPerPass)
	}
	if err != nil {
		if ctx.Err() != nil {
			return PassResult{Reason: Cancelled}
		}
		p.log.Warn("pending-job query failed; retrying the cluster after a short backoff", "cluster", c.Key(), "error", err)
		p.m.errors.WithLabelValues("job_query").Inc()
		return PassResult{Reason: QueryError}
	}
	p.m.jobsQueried.Add(float64(len(js)))
	if len(js) == 0 && len(pq.Exclude) > 0 {
		// Every pending job is another pass's: those passes decide how
		// the cluster sleeps.
		return PassResult{Reason: Busy, Wake: wake}
	}
	if len(js) == 0 {
		// Work held back only by a burst or a cap gets its headroom back
		// as the show's frames end: look again at the next release of the
		// show's procs (Releases), or after the saturated sleep.
		capped, err := jobs.Capped(ctx, p.db, pq)
		switch {
		case err != nil && ctx.Err() != nil:
			return PassResult{Reason: Cancelled}
		case err != nil:
			p.log.Warn("capped-work query failed; retrying the cluster after a short backoff", "cluster", c.Key(), "error", err)
			p.m.errors.WithLabelValues("job_query").Inc()
			return PassResult{Reason: QueryError}
		case capped:
			return PassResult{Reason: Capped, Sleep: p.cfg.SaturatedSleep, Wake: released}
		}
		return PassResult{Reason: NoJobs, Sleep: p.cfg.EmptySleep}
	}

	// A job that finds the show unseeded or this allocation at its burst
	// stops the pass from starting more jobs; jobs already running finish
	// their batches (cancelling them would only roll bookings back).
	var (
		mu        sync.Mutex
		total     int
		offered   int // frames the jobs offered to hosts (matcher.Outcome.Planned)
		idle      int // the budgets of jobs that worked no layer
		stop      bool
		allocFull bool
		notSeeded bool
		failed    bool
		wg        sync.WaitGroup
		sem       = make(chan struct{}, p.cfg.JobBuffer)
	)
	stopped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return stop
	}
	// With the lottery, the jobs take their first pick of the free hosts in
	// draw order (a chain of turns), so a scarce slot goes to the job drawn
	// first — the draw's odds — not to whichever query returned first; and
	// each job's frames this pass are its weighted share of the pass, so the
	// few slots of a saturated farm are split by priority, not all handed
	// to the one job drawn first.
	//
	// A cluster's first pass assumes room (a cold farm fills at full
	// speed): MaxLotteryFramesPerJob a job, each job's share rounded up,
	// at least one. Once a pass finds less room than its jobs could
	// spend, the cluster's passes plan the room the last one found and
	// split it by SlotBudgets, so a pass's budgets add up to about the
	// room it finds and the frames follow the weights whatever the draw
	// order; a pass that spends every budget doubles the next, up to the
	// first pass's frames again (see the update after the pass).
	var budgets []int
	n := len(js)
	roomy := float64(MaxLotteryFramesPerJob * n)
	plan, planned := passPlan{frames: roomy}, 0
	work := js
	if p.cfg.Lottery {
		if v, ok := p.shares.Load(c.Key()); ok {
			plan = v.(passPlan)
		}
		passFrames := plan.frames
		if passFrames < roomy {
			budgets = SlotBudgets(js, passFrames, p.uniform())
		} else {
			budgets = LotteryBudgets(js, MaxLotteryFramesPerJob)
		}
		if n > 1 {
			// A job whose share rounds to none sits the pass out.
			work, budgets = withBudget(js, budgets)
			if passFrames < roomy && len(budgets) > 0 {
				// The probe: one frame more for the job drawn last.
				// It starts only if the room is more than the plan,
				// after every other job had its share.
				budgets[len(budgets)-1]++
			}
		}
		for _, b := range budgets {
			planned += p.spendable(b)
		}
	}
	var read *matcher.PassRead
	if pr, ok := p.worker.(PassReader); ok {
		if read, err = pr.PassLayers(ctx, c, work); err != nil {
			if ctx.Err() != nil {
				return PassResult{Reason: Cancelled}
			}
			p.log.Debug("layer query of the pass failed; each job reads its own", "cluster", c.Key(), "error", err)
			read = nil
		}
	}
	prev := make(chan struct{})
	close(prev)
	for i, j := range work {
		turn := matcher.Turn{Alone: len(js) == 1}
		turn.Read = read
		if p.cfg.Lottery {
			next := make(chan struct{})
			turn.Wait, turn.Done, turn.Budget = prev, func() { close(next) }, budgets[i]
			prev = next
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil || stopped() {
			break
		}
		wg.Add(1)
		p.m.jobsInFlight.Inc()
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out, err := p.worker.ProcessInTurn(ctx, c, j, turn)
			p.m.jobsInFlight.Dec()
			p.m.jobsProcessed.Inc()
			mu.Lock()
			defer mu.Unlock()
			total += out.Dispatched
			offered += out.Planned
			if out.Layers == 0 && budgets != nil {
				idle += p.spendable(budgets[i])
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				p.log.Warn("job processing failed", "job", j.Name, "error", err)
				failed = true
			}
			failed = failed || out.Failed
			if out.StopShow || out.AllocFull {
				stop = true
				allocFull = allocFull || out.AllocFull
				notSeeded = notSeeded || out.StopShow
			}
		}()
	}
	wg.Wait()

	if offered > 0 {
		p.m.planned.Add(float64(offered))
		p.m.delivered.Add(float64(total))
		p.m.delivery.Observe(min(float64(total)/float64(offered), 1))
	}
	if planned > 0 {
		// A pass whose jobs spent every budget they could work, the
		// probe frame included, found more room than it planned: the
		// next pass plans twice the frames, up to the roomy plan. (At the
		// edge of the room the probe is what grows the plan: growing it
		// on every pass that spent exactly its plan handed the excess of
		// every other pass to the jobs drawn first, the bias the split
		// exists to remove.) A pass that did not spend them found the
		// room there is: the next pass plans that many for the jobs that
		// could work, at least one (a pass with room to spare gives up
		// its roomy plan only below half of it). A job
		// that worked no layer (a limit without seats, no host for its
		// tags, its layers held by another pass) says nothing of the
		// room: the plan is scaled so the jobs that could work get what
		// they started, and work that cannot run does not shrink the
		// plan of the work that can. Each budget counts up to the
		// matcher's per-job cap (spendable): frames above it cannot start
		// whatever the room, so a farm with room whose high-priority jobs
		// reached the cap is not judged tight.
		runnable := planned - idle
		switch {
		case total >= runnable && ctx.Err() == nil:
			p.shares.Store(c.Key(), passPlan{frames: min(plan.frames*2, roomy)})
		case total < runnable && (plan.frames < roomy || total*2 < runnable):
			p.shares.Store(c.Key(), passPlan{frames: max(float64(total)*float64(planned)/float64(runnable), 1)})
		}
	}
	res := PassResult{Jobs: len(js), Dispatched: total}
	switch {
	case ctx.Err() != nil:
		res.Reason = Cancelled
	case notSeeded && total == 0:
		// The loop leader seeds the show (a flip to managed) and nothing
		// but Redis tells: look again shortly rather than sleep through
		// the seed.
		res.Reason, res.Sleep = NotSeeded, p.cfg.NotSeededSleep
	case failed && total == 0:
		// A database, Redis or host-cache error (a failover, a restart):
		// retry soon (Pass sets the backoff), not after the saturated
		// sleep, and never the empty one.
		p.m.errors.WithLabelValues("booking").Inc()
		res.Reason = Failed
	case allocFull:
		// Its headroom comes back as the show's frames end, which only
		// Redis sees (no WAL event wakes the cluster): the next release
		// of the show's procs, or the saturated sleep.
		res.Reason, res.Sleep, res.Wake = AllocFull, p.cfg.SaturatedSleep, released
	case total == 0:
		// Hosts gaining capacity, or the show's procs released (a job
		// the pending query left out at its cap gets headroom back).
		res.Reason, res.Sleep, res.Wake = Saturated, p.cfg.SaturatedSleep, anyWatch(wake, released)
	default:
		res.Reason = Booked
	}
	return res
}

// anyWatch moves when one of ws moves; nil entries are left out, and none
// left is nil (only the time ends the sleep).
func anyWatch(ws ...clusters.Watch) clusters.Watch {
	var out watches
	for _, w := range ws {
		if w != nil {
			out = append(out, w)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return out
}

type watches []clusters.Watch

func (ws watches) Moved() bool {
	for _, w := range ws {
		if w.Moved() {
			return true
		}
	}
	return false
}

// AllGates waits on every gate in turn (nil when there is none).
func AllGates(gs []Gate) Gate {
	if len(gs) == 0 {
		return nil
	}
	return GateFunc(func(ctx context.Context) error {
		for _, g := range gs {
			if err := g.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// GateFunc adapts a function to Gate.
type GateFunc func(ctx context.Context) error

// Wait implements Gate.
func (f GateFunc) Wait(ctx context.Context) error { return f(ctx) }
