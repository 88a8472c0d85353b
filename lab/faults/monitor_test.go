package faults

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// completer hands every frame the fake RQD finishes to the Cuebot emulator
// and, like RQD resending a FrameCompleteReport Cuebot could not process,
// retries until it is processed (Postgres may be restarting or cut).
type completer struct {
	emu    *cuebotemu.Emulator
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	pending map[string]int // proc (resource) id -> reports in flight
	doneAt  map[string]time.Time
	failed  []string
	retries atomic.Int64
}

func newCompleter(ctx context.Context, emu *cuebotemu.Emulator) *completer {
	c := &completer{emu: emu, pending: map[string]int{}, doneAt: map[string]time.Time{}}
	c.ctx, c.cancel = context.WithCancel(ctx)
	return c
}

func (c *completer) onComplete(fc fakerqd.FrameCompletion) {
	c.mu.Lock()
	c.pending[fc.ResourceID]++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.pending[fc.ResourceID]--; c.pending[fc.ResourceID] <= 0 {
			delete(c.pending, fc.ResourceID)
		}
		c.mu.Unlock()
	}()
	backoff := 50 * time.Millisecond
	deadline := time.Now().Add(testenv.Patience(2 * time.Minute))
	for {
		ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
		err := c.emu.Complete(ctx, cuebotemu.FromFakeRQD(fc))
		cancel()
		if err == nil {
			c.mu.Lock()
			c.doneAt[fc.ResourceID] = time.Now()
			c.mu.Unlock()
			return
		}
		if c.ctx.Err() != nil {
			return
		}
		c.retries.Add(1)
		if time.Now().After(deadline) {
			c.mu.Lock()
			c.failed = append(c.failed, fmt.Sprintf("completion of %s (proc %s) on %s: %v", fc.FrameName, fc.ResourceID, fc.Host, err))
			c.mu.Unlock()
			return
		}
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// completedAt is when Cuebot processed the completion of proc's frame
// (and so deleted the proc).
func (c *completer) completedAt(proc string) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.doneAt[proc]
	return t, ok
}

func (c *completer) inFlight() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bool, len(c.pending))
	for id := range c.pending {
		out[id] = true
	}
	return out
}

// reaper is Cuebot's orphaned-proc check: RQD reports the frames it runs,
// and a proc whose frame its host does not run (and that is not being
// reported as complete) is cleared after a while: the proc is released and
// the frame goes back to WAITING (FRAME_CLEARED). A scheduler killed
// between its commit and LaunchFrame leaves exactly such a proc; without
// this the frame would stay RUNNING forever, in production as here.
//
// Cuebot waits 300 s, longer than a scheduler may take from the start of a
// booking to its LaunchFrame (launchBound: the dispatcher anchors its
// launch deadline there, config.DispatchBudget), so it never clears a proc
// whose launch can still come. The reaper waits only a few seconds for a
// proc booked before a scheduler was killed (that launch never comes);
// any other proc it leaves alone until launchBound after its booking (a
// launch slowed past a few seconds by a loaded machine still comes, and a
// proc cleared under it would be booked and started again). It is paused
// while a scheduler is frozen and until that scheduler's launch deadline
// has passed (a thawed scheduler may still launch what it committed
// before the freeze).
type reaper struct {
	e     *env
	after time.Duration

	mu          sync.Mutex
	pausedUntil time.Time
	cleared     []string // frame ids
	stopc       chan struct{}
	done        chan struct{}
}

// launchBound is the longest a scheduler of these tests may take from the
// start of a booking to its LaunchFrame: the booking budget
// (accounting.in_flight_grace / 2, the default), the commit resolution
// and the launch budget (2 x rqd.request_timeout). Past it the dispatcher
// sends no launch.
func launchBound() time.Duration {
	c := config.Default()
	c.RQD.RequestTimeout = config.Duration(rqdRequestTimeout)
	b := c.DispatchBudget()
	return b.Book + config.CommitResolveBudget + b.Launch
}

func newReaper(e *env, after time.Duration) *reaper {
	return &reaper{e: e, after: after, stopc: make(chan struct{}), done: make(chan struct{})}
}

// pause stops clearing until d from now (a frozen scheduler may hold a
// committed proc it will still launch when it thaws).
func (r *reaper) pause(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if u := time.Now().Add(d); u.After(r.pausedUntil) {
		r.pausedUntil = u
	}
}

func (r *reaper) run() {
	go func() {
		defer close(r.done)
		prev := map[string]bool{}
		tick := time.NewTicker(400 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.stopc:
				return
			case <-tick.C:
			}
			r.mu.Lock()
			paused := time.Now().Before(r.pausedUntil)
			r.mu.Unlock()
			if paused {
				prev = map[string]bool{}
				continue
			}
			prev = r.pass(prev)
		}
	}()
}

// pass clears procs found missing from RQD in two passes in a row.
func (r *reaper) pass(prev map[string]bool) map[string]bool {
	e := r.e
	live := e.comp.inFlight()
	for _, rf := range e.fake.Running("") {
		live[rf.GetResourceId()] = true
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	rows, err := e.pool.Query(ctx, `SELECT pk_proc, pk_frame, ts_booked, now() FROM proc
		WHERE pk_frame IS NOT NULL AND NOT b_local AND ts_booked < now() - $1::interval`,
		fmt.Sprintf("%d milliseconds", r.after.Milliseconds()))
	if err != nil {
		return prev
	}
	type pf struct {
		proc, frame string
		booked, now time.Time
	}
	procs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pf, error) {
		var p pf
		err := row.Scan(&p.proc, &p.frame, &p.booked, &p.now)
		return p, err
	})
	if err != nil {
		return prev
	}
	kills := e.schedulerKills()
	missing := map[string]bool{}
	for _, p := range procs {
		if live[p.proc] {
			continue
		}
		// A proc whose launch can still come is not an orphan, however
		// slow the launch (a loaded machine): its scheduler launches it
		// or undoes it by launchBound after the booking. Before that only
		// a proc booked before a scheduler was killed is judged.
		if p.now.Sub(p.booked) < launchBound() && !killedSince(kills, p.booked) {
			continue
		}
		missing[p.proc] = true
		if !prev[p.proc] {
			continue
		}
		// The proc judged, never whatever proc its frame has by now: a
		// proc that completed meanwhile is gone (ErrNotFound) and its
		// frame's next run is left alone.
		err := e.emu.ClearProc(ctx, p.proc)
		switch {
		case err == nil:
			r.mu.Lock()
			r.cleared = append(r.cleared, p.frame)
			r.mu.Unlock()
			e.note("Cuebot cleared orphaned proc %s (frame %s never reached RQD)", p.proc, p.frame)
		case errors.Is(err, cuebotemu.ErrNotFound):
		default:
			missing[p.proc] = false
		}
	}
	return missing
}

// schedulerKills are the times a scheduler process was killed (kill -9).
func (e *env) schedulerKills() []time.Time {
	e.mu.Lock()
	scheds := append([]*daemon(nil), e.schedulers...)
	e.mu.Unlock()
	var out []time.Time
	for _, d := range scheds {
		d.mu.Lock()
		out = append(out, d.kills...)
		d.mu.Unlock()
	}
	return out
}

// killedSince reports whether a kill came at or after t.
func killedSince(kills []time.Time, t time.Time) bool {
	for _, k := range kills {
		if !k.Before(t) {
			return true
		}
	}
	return false
}

func (r *reaper) stop() {
	select {
	case <-r.stopc:
		return
	default:
	}
	close(r.stopc)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
	}
}

func (r *reaper) clearedFrames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.cleared...)
}

// violationsSQL lists, in one snapshot, what must never be true of
// Postgres: a managed show's procs above a subscription burst (or on an
// allocation it does not subscribe to), a folder or job above its core or
// GPU cap, a limit_record with more running frames than its max, a host
// with idle resources below zero or above its total, a proc with a
// negative reservation, and any trace of dispatch in a show left to Cuebot.
const violationsSQL = `
SELECT 'subscription burst ' || sh.str_name || '/' || a.str_name, SUM(p.int_cores_reserved)::bigint, COALESCE(MAX(s.int_burst), 0)::bigint
  FROM proc p JOIN host h ON h.pk_host = p.pk_host JOIN alloc a ON a.pk_alloc = h.pk_alloc
  JOIN show sh ON sh.pk_show = p.pk_show AND sh.b_scheduler_managed
  LEFT JOIN subscription s ON s.pk_show = p.pk_show AND s.pk_alloc = h.pk_alloc
 WHERE $1
 GROUP BY sh.str_name, a.str_name HAVING SUM(p.int_cores_reserved) > COALESCE(MAX(s.int_burst), 0)
UNION ALL
SELECT 'folder cores ' || j.pk_folder, SUM(p.int_cores_reserved)::bigint, MAX(fr.int_max_cores)::bigint
  FROM proc p JOIN job j ON j.pk_job = p.pk_job JOIN folder_resource fr ON fr.pk_folder = j.pk_folder
 WHERE $1 AND fr.int_max_cores > 0
 GROUP BY j.pk_folder HAVING SUM(p.int_cores_reserved) > MAX(fr.int_max_cores)
UNION ALL
SELECT 'folder gpus ' || j.pk_folder, SUM(p.int_gpus_reserved)::bigint, MAX(fr.int_max_gpus)::bigint
  FROM proc p JOIN job j ON j.pk_job = p.pk_job JOIN folder_resource fr ON fr.pk_folder = j.pk_folder
 WHERE $1 AND fr.int_max_gpus > 0
 GROUP BY j.pk_folder HAVING SUM(p.int_gpus_reserved) > MAX(fr.int_max_gpus)
UNION ALL
SELECT 'job cores ' || p.pk_job, SUM(p.int_cores_reserved)::bigint, MAX(jr.int_max_cores)::bigint
  FROM proc p JOIN job_resource jr ON jr.pk_job = p.pk_job
 WHERE $1 AND jr.int_max_cores > 0
 GROUP BY p.pk_job HAVING SUM(p.int_cores_reserved) > MAX(jr.int_max_cores)
UNION ALL
SELECT 'job gpus ' || p.pk_job, SUM(p.int_gpus_reserved)::bigint, MAX(jr.int_max_gpus)::bigint
  FROM proc p JOIN job_resource jr ON jr.pk_job = p.pk_job
 WHERE $1 AND jr.int_max_gpus > 0
 GROUP BY p.pk_job HAVING SUM(p.int_gpus_reserved) > MAX(jr.int_max_gpus)
UNION ALL
SELECT 'limit ' || lr.str_name, count(*)::bigint, MAX(lr.int_max_value)::bigint
  FROM frame f JOIN layer_limit ll ON ll.pk_layer = f.pk_layer JOIN limit_record lr ON lr.pk_limit_record = ll.pk_limit_record
 WHERE f.str_state = 'RUNNING'
 GROUP BY lr.pk_limit_record, lr.str_name HAVING count(*) > MAX(lr.int_max_value)
UNION ALL
SELECT 'host idle below zero ' || h.str_name, LEAST(h.int_cores_idle, h.int_mem_idle, h.int_gpus_idle, h.int_gpu_mem_idle)::bigint, 0::bigint
  FROM host h WHERE h.int_cores_idle < 0 OR h.int_mem_idle < 0 OR h.int_gpus_idle < 0 OR h.int_gpu_mem_idle < 0
UNION ALL
SELECT 'host idle above its total ' || h.str_name, h.int_mem_idle, h.int_mem
  FROM host h WHERE h.int_cores_idle > h.int_cores OR h.int_mem_idle > h.int_mem OR h.int_gpus_idle > h.int_gpus OR h.int_gpu_mem_idle > h.int_gpu_mem
UNION ALL
SELECT 'proc with a negative reservation ' || p.pk_proc, LEAST(p.int_cores_reserved, p.int_mem_reserved, p.int_gpus_reserved, p.int_gpu_mem_reserved)::bigint, 0::bigint
  FROM proc p WHERE p.int_cores_reserved <= 0 OR p.int_mem_reserved < 0 OR p.int_gpus_reserved < 0 OR p.int_gpu_mem_reserved < 0
UNION ALL
SELECT 'Cuebot-managed frame touched ' || f.str_name || ' ' || f.str_state, COALESCE(f.int_version, 0)::bigint, 0::bigint
  FROM frame f JOIN job j ON j.pk_job = f.pk_job JOIN show sh ON sh.pk_show = j.pk_show
 WHERE NOT sh.b_scheduler_managed AND NOT $2 AND (f.str_state <> 'WAITING' OR COALESCE(f.int_version, 0) <> 0)
UNION ALL
SELECT 'Cuebot-managed proc ' || p.pk_proc, 0::bigint, 0::bigint
  FROM proc p JOIN show sh ON sh.pk_show = p.pk_show WHERE NOT sh.b_scheduler_managed AND NOT $2`

// redisKey is one accounting hash the sampler watches, with the caps it
// must respect (whole cores as Redis holds them; 0 = no cap checked).
type redisKey struct {
	key              string
	maxCores, maxGPU int64
	// capField is the key's cap field in Redis (burst, int_max_cores) and
	// capValue what it must read when present (caps are static in these
	// runs; a flushed Redis lacks the field until the re-seed).
	capField string
	capValue int64
}

// sampler checks the invariants continuously, in Postgres (violationsSQL)
// and in Redis (every booked counter of the managed shows within its cap and
// never negative), from the start of the run to quiescence.
type sampler struct {
	e           *env
	caps        bool
	unmanagedOK bool
	keys        []redisKey

	mu         sync.Mutex
	violations []string
	seen       map[string]bool
	pgSamples  int
	rdSamples  int
	recSamples int
	pgErrors   int
	rdErrors   int
	stopc      chan struct{}
	done       chan struct{}
}

func (e *env) startSampler() *sampler {
	s := &sampler{e: e, caps: !e.o.NoCapSampling, unmanagedOK: e.o.UnmanagedTouched, seen: map[string]bool{}, stopc: make(chan struct{}), done: make(chan struct{})}
	s.loadKeys()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.loop(s.samplePG) }()
	go func() { defer wg.Done(); s.loop(s.sampleRedis) }()
	if e.o.StrictRecords {
		wg.Add(1)
		go func() { defer wg.Done(); s.loop(s.sampleRecords) }()
	}
	go func() { wg.Wait(); close(s.done) }()
	return s
}

// loadKeys lists the managed shows' accounting keys with their caps.
func (s *sampler) loadKeys() {
	e := s.e
	q := func(sql string, scan func(pgx.Rows) error) {
		rows, err := e.pool.Query(e.ctx, sql)
		if err != nil {
			e.t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	q(`SELECT s.pk_show, s.pk_alloc, s.int_burst FROM subscription s JOIN show sh ON sh.pk_show = s.pk_show WHERE sh.b_scheduler_managed`,
		func(r pgx.Rows) error {
			var show, alloc string
			var burst int64
			err := r.Scan(&show, &alloc, &burst)
			// A burst of 0 books nothing; the script has no "> 0" guard.
			s.keys = append(s.keys, redisKey{key: publisher.SubKey(show, alloc), maxCores: max(publisher.CapCores(burst), 0),
				capField: "burst", capValue: publisher.CapCores(burst)})
			if burst <= 0 {
				s.keys[len(s.keys)-1].maxCores = -2 // nothing may be booked
			}
			return err
		})
	q(`SELECT fr.pk_folder, fr.int_max_cores, fr.int_max_gpus FROM folder_resource fr JOIN folder f ON f.pk_folder = fr.pk_folder
		JOIN show sh ON sh.pk_show = f.pk_show WHERE sh.b_scheduler_managed`,
		func(r pgx.Rows) error {
			var id string
			var c, g int64
			err := r.Scan(&id, &c, &g)
			s.keys = append(s.keys, redisKey{key: publisher.FolderKey(id), maxCores: max(publisher.CapCores(c), 0), maxGPU: max(g, 0),
				capField: "int_max_cores", capValue: publisher.CapCores(c)})
			return err
		})
	q(`SELECT jr.pk_job, jr.int_max_cores, jr.int_max_gpus FROM job_resource jr JOIN job j ON j.pk_job = jr.pk_job
		JOIN show sh ON sh.pk_show = j.pk_show WHERE sh.b_scheduler_managed`,
		func(r pgx.Rows) error {
			var id string
			var c, g int64
			err := r.Scan(&id, &c, &g)
			s.keys = append(s.keys, redisKey{key: publisher.JobKey(id), maxCores: max(publisher.CapCores(c), 0), maxGPU: max(g, 0),
				capField: "int_max_cores", capValue: publisher.CapCores(c)})
			return err
		})
	q(`SELECT l.pk_layer FROM layer l JOIN job j ON j.pk_job = l.pk_job JOIN show sh ON sh.pk_show = j.pk_show WHERE sh.b_scheduler_managed`,
		func(r pgx.Rows) error {
			var id string
			err := r.Scan(&id)
			s.keys = append(s.keys, redisKey{key: publisher.LayerKey(id)})
			return err
		})
	q(`SELECT p.pk_dept, p.pk_show FROM point p JOIN show sh ON sh.pk_show = p.pk_show WHERE sh.b_scheduler_managed`,
		func(r pgx.Rows) error {
			var d, sh string
			err := r.Scan(&d, &sh)
			s.keys = append(s.keys, redisKey{key: publisher.PointKey(d, sh)})
			return err
		})
}

func (s *sampler) loop(sample func(ctx context.Context) error) {
	for {
		select {
		case <-s.stopc:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(s.e.ctx, 3*time.Second)
		err := sample(ctx)
		cancel()
		if err != nil {
			// Postgres or Redis restarting or cut: nothing to sample.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		time.Sleep(15 * time.Millisecond)
	}
}

func (s *sampler) samplePG(ctx context.Context) error {
	rows, err := s.e.pool.Query(ctx, violationsSQL, s.caps, s.unmanagedOK)
	if err != nil {
		s.count(&s.pgErrors)
		return err
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var what string
		var got, limit int64
		if err := rows.Scan(&what, &got, &limit); err != nil {
			s.count(&s.pgErrors)
			return err
		}
		found = append(found, fmt.Sprintf("postgres: %s: %d > %d", what, got, limit))
	}
	if err := rows.Err(); err != nil {
		s.count(&s.pgErrors)
		return err
	}
	s.mu.Lock()
	var fresh []string
	for _, v := range found {
		if job, ok := strings.CutPrefix(v, "postgres: job cores "); ok && !s.seen[v] {
			fresh = append(fresh, strings.TrimSuffix(strings.Fields(job)[0], ":"))
		}
	}
	s.pgSamples++
	s.addLocked(found...)
	s.mu.Unlock()
	// A job above its cap in Postgres means Redis let one booking too many
	// through: say what Redis held for that job at that moment, so a
	// failure names its cause (a proc without a record, a record whose
	// counter was not charged).
	for _, job := range fresh {
		s.e.note("first job cap violation: %s", s.dumpJob(ctx, job))
	}
	return nil
}

// dumpJob describes a job's accounting as Redis and Postgres hold it now:
// the counter and cap, the records charging the job and the procs, and
// which of either has no counterpart (with its tombstone, if any).
func (s *sampler) dumpJob(ctx context.Context, job string) string {
	var b strings.Builder
	h, err := s.e.rdb.HGetAll(ctx, publisher.JobKey(job)).Result()
	fmt.Fprintf(&b, "job %s: Redis %v (err %v)", job, h, err)
	type proc struct {
		show  string
		cores int64
		at    time.Time
	}
	procs := map[string]proc{}
	var show string
	rows, err := s.e.pool.Query(ctx, `SELECT pk_proc, pk_show, int_cores_reserved, ts_booked FROM proc WHERE pk_job = $1`, job)
	if err != nil {
		fmt.Fprintf(&b, "; Postgres read failed: %v", err)
	} else {
		for rows.Next() {
			var id string
			var p proc
			if err := rows.Scan(&id, &p.show, &p.cores, &p.at); err != nil {
				fmt.Fprintf(&b, "; Postgres read failed: %v", err)
				break
			}
			procs[id], show = p, p.show
		}
		rows.Close()
	}
	var sum int64
	for _, p := range procs {
		sum += p.cores
	}
	fmt.Fprintf(&b, "; Postgres: %d procs, %d centicores", len(procs), sum)
	ids, _ := s.e.rdb.SMembers(ctx, publisher.ShowProcsKey(show)).Result()
	recs := map[string]map[string]string{}
	var charged int64
	for _, id := range ids {
		r, err := s.e.rdb.HGetAll(ctx, publisher.ProcKey(id)).Result()
		if err != nil || r["job"] != publisher.JobKey(job) {
			continue
		}
		recs[id] = r
		charged += num(r["cores"])
	}
	fmt.Fprintf(&b, "; Redis: %d records charging the job, %d cores", len(recs), charged)
	for id, p := range procs {
		if _, ok := recs[id]; !ok {
			tomb, _ := s.e.rdb.Get(ctx, publisher.TombKey(id)).Result()
			fmt.Fprintf(&b, "; proc %s (%d centicores, booked %s) has no record (tombstone %q)", id, p.cores, p.at.Format("15:04:05.000"), tomb)
			// Read again after Redis: a proc still there was visible
			// throughout, so its record is truly missing.
			var n int
			var st string
			err := s.e.pool.QueryRow(ctx, `SELECT count(*), COALESCE(MAX(f.str_state), 'none') FROM proc p
				LEFT JOIN frame f ON f.pk_frame = p.pk_frame WHERE p.pk_proc = $1`, id).Scan(&n, &st)
			fmt.Fprintf(&b, " (after the Redis read: %d in Postgres, its frame %s, err %v)", n, st, err)
		}
	}
	for id, r := range recs {
		if _, ok := procs[id]; !ok {
			fmt.Fprintf(&b, "; record %s has no proc: %v", id, r)
		}
	}
	return b.String()
}

func (s *sampler) sampleRedis(ctx context.Context) error {
	pipe := s.e.rdb.Pipeline()
	cmds := make([]interface{ Val() []any }, len(s.keys))
	for i, k := range s.keys {
		fields := []string{"int_cores", "int_gpus"}
		if k.capField != "" {
			fields = append(fields, k.capField)
		}
		cmds[i] = pipe.HMGet(ctx, k.key, fields...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		s.count(&s.rdErrors)
		return err
	}
	var found []string
	for i, k := range s.keys {
		v := cmds[i].Val()
		cores, gpus := num(v[0]), num(v[1])
		if cores < 0 || gpus < 0 {
			found = append(found, fmt.Sprintf("redis: %s int_cores=%d int_gpus=%d below zero", k.key, cores, gpus))
		}
		if !s.caps || s.e.o.RedisOverCountOK {
			continue
		}
		switch {
		case k.maxCores == -2 && cores > 0:
			found = append(found, fmt.Sprintf("redis: %s int_cores=%d with a burst <= 0", k.key, cores))
		case k.maxCores > 0 && cores > k.maxCores:
			found = append(found, fmt.Sprintf("redis: %s int_cores=%d > cap %d", k.key, cores, k.maxCores))
		}
		if k.maxGPU > 0 && gpus > k.maxGPU {
			found = append(found, fmt.Sprintf("redis: %s int_gpus=%d > cap %d", k.key, gpus, k.maxGPU))
		}
		if k.capField != "" && v[2] != nil && num(v[2]) != k.capValue {
			found = append(found, fmt.Sprintf("redis: %s %s=%v, Postgres says %d", k.key, k.capField, v[2], k.capValue))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rdSamples++
	s.addLocked(found...)
	return nil
}

// sampleRecords checks that no booking is lost at any instant: a proc of a
// managed show that exists in Postgres before and after a read of Redis
// has its booking record in Redis during that read. (Only for runs without
// faults: a Redis flush, or a rollback after an ambiguous COMMIT, leaves
// procs without records until the re-bootstrap or the recompute adopts
// them, by design.)
func (s *sampler) sampleRecords(ctx context.Context) error {
	read := func() (map[string]bool, error) {
		rows, err := s.e.pool.Query(ctx, `SELECT p.pk_proc FROM proc p JOIN show sh ON sh.pk_show = p.pk_show
			WHERE sh.b_scheduler_managed AND NOT p.b_local`)
		if err != nil {
			return nil, err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		out := make(map[string]bool, len(ids))
		for _, id := range ids {
			out[id] = true
		}
		return out, nil
	}
	before, err := read()
	if err != nil {
		return err
	}
	ids := sortedKeys(before)
	pipe := s.e.rdb.Pipeline()
	cmds := make([]interface{ Val() int64 }, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.Exists(ctx, publisher.ProcKey(id))
	}
	if len(ids) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	after, err := read()
	if err != nil {
		return err
	}
	// A proc seen in both reads existed throughout the Redis read. Its
	// record is written before its INSERT, and the sidecar releases it
	// only once its DELETE is visible to new snapshots (sidecar,
	// replication.Visibility), so a proc without its record in between is a lost
	// booking or a release applied too early, at once, with no window.
	var found []string
	for i, id := range ids {
		if !after[id] || cmds[i].Val() != 0 {
			continue
		}
		why := "never booked, or rolled back"
		if n, _ := s.e.rdb.Exists(ctx, publisher.TombKey(id)).Result(); n > 0 {
			why = "released (tombstone) while the proc is still visible"
		}
		found = append(found, fmt.Sprintf("redis: proc %s exists in Postgres but its booking record is missing (%s)", id, why))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recSamples++
	s.addLocked(found...)
	return nil
}

func (s *sampler) count(n *int) {
	s.mu.Lock()
	*n++
	s.mu.Unlock()
}

// addLocked records violations once each (the first time seen; the time
// is part of the message).
func (s *sampler) addLocked(vs ...string) {
	at := time.Since(s.e.start).Seconds()
	for _, v := range vs {
		if s.seen[v] {
			continue
		}
		s.seen[v] = true
		if len(s.violations) < 40 {
			s.violations = append(s.violations, fmt.Sprintf("%s (first seen at %.3fs)", v, at))
		}
	}
}

func (s *sampler) stop() {
	select {
	case <-s.stopc:
	default:
		close(s.stopc)
	}
	<-s.done
}

// minSamples is how many samples of each kind a run must have taken.
const minSamples = 20

func (s *sampler) enoughSamples() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pgSamples >= minSamples && s.rdSamples >= minSamples && (!s.e.o.StrictRecords || s.recSamples >= minSamples)
}

// finish stops the sampler and fails the test on any violation.
func (s *sampler) finish(t testing.TB) {
	t.Helper()
	// The run is quiescent here, so the invariants must still hold: keep
	// sampling until there are enough samples (a loaded machine samples
	// less often during a short run), within a patient deadline.
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for !s.enoughSamples() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.violations) > 0 {
		t.Errorf("invariants violated (%d Postgres and %d Redis samples):\n%s", s.pgSamples, s.rdSamples, strings.Join(s.violations, "\n"))
	}
	if s.pgSamples < minSamples || s.rdSamples < minSamples {
		t.Errorf("too few samples: %d Postgres, %d Redis", s.pgSamples, s.rdSamples)
	}
	if s.e.o.StrictRecords && s.recSamples < minSamples {
		t.Errorf("too few booking-record samples: %d", s.recSamples)
	}
	s.e.note("sampler: %d Postgres samples (%d failed), %d Redis samples (%d failed) over %d keys, %d booking-record samples, no violation = %v",
		s.pgSamples, s.pgErrors, s.rdSamples, s.rdErrors, len(s.keys), s.recSamples, len(s.violations) == 0)
}

func num(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
