package faults

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/accounting"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// inFlightGrace is the accounting recompute's in-flight grace
// (accounting.in_flight_grace, left at its default by the harness): a
// booking charged in Redis whose proc never committed, on a backend that
// lives on, is dropped by the first recompute after it.
const inFlightGrace = 60 * time.Second

// bookTimeout is the dispatcher's bound from the booking script to the end
// of its transaction (dispatch Config.BookTimeout default).
const bookTimeout = 30 * time.Second

// finish waits for the queue to drain and checks every guarantee:
// invariants held at every sample, every frame ran exactly once (or again
// only after a failed run), the hosts are whole, nothing is left in Redis
// but what Postgres holds, and every process is up.
func (e *env) finish(drainTimeout time.Duration) {
	t := e.t
	t.Helper()
	e.waitDrained(drainTimeout)
	e.smp.finish(t)
	e.checkLaunches()
	e.checkHostsWhole()
	e.comp.mu.Lock()
	if len(e.comp.failed) > 0 {
		t.Errorf("completions Cuebot could not process: %v", e.comp.failed)
	}
	e.comp.mu.Unlock()
	e.checkAccounting()
	e.checkRecovered()
}

// checkLaunches: no frame was started while another run of it was live
// (fakerqd DoubleLaunches), and a frame was started more than once only
// after a run that failed or was killed (a legitimate retry).
func (e *env) checkLaunches() {
	t := e.t
	t.Helper()
	if d := e.fake.DoubleLaunches(); len(d) > 0 {
		t.Errorf("frames started while another run of them was live: %v", d)
	}
	type run struct {
		proc string
		at   time.Time
	}
	runs := map[string][]run{}
	total, failedLaunches := 0, 0
	for _, l := range e.fake.Launches() {
		if l.RunFrame == nil {
			continue
		}
		if !l.Started {
			failedLaunches++
			continue
		}
		total++
		runs[l.RunFrame.GetFrameId()] = append(runs[l.RunFrame.GetFrameId()], run{l.RunFrame.GetResourceId(), l.At})
	}
	outcome := map[string]string{} // proc -> how its run ended
	for _, c := range e.fake.Completions() {
		switch {
		case c.Killed:
			outcome[c.ResourceID] = "killed"
		case c.ExitStatus != 0 || c.ExitSignal != 0:
			outcome[c.ResourceID] = fmt.Sprintf("exit %d/%d", c.ExitStatus, c.ExitSignal)
		default:
			outcome[c.ResourceID] = "ok"
		}
	}
	again := 0
	for frame, rs := range runs {
		for i := 0; i < len(rs)-1; i++ {
			again++
			if o := outcome[rs[i].proc]; o == "ok" || o == "" {
				if o == "" {
					o = "never completed"
				}
				t.Errorf("frame %s started %d times; run %d (proc %s, %s) ended %s, so the next start was not a retry",
					frame, len(rs), i+1, rs[i].proc, rs[i].at.Format("15:04:05.000"), o)
			}
		}
	}
	var frames int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM frame f JOIN job j ON j.pk_job = f.pk_job JOIN show s ON s.pk_show = j.pk_show
		WHERE s.b_scheduler_managed AND f.str_state = 'SUCCEEDED'`).Scan(&frames); err != nil {
		t.Fatal(err)
	}
	if len(runs) < frames {
		t.Errorf("%d managed frames SUCCEEDED but only %d were ever started on RQD", frames, len(runs))
	}
	e.note("launches: %d runs of %d frames (%d restarted after a failed run), %d launches refused, %d orphaned procs cleared",
		total, len(runs), again, failedLaunches, len(e.reaper.clearedFrames()))
}

func (e *env) checkHostsWhole() {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM host WHERE int_cores_idle <> int_cores OR int_mem_idle <> int_mem
		OR int_gpus_idle <> int_gpus OR int_gpu_mem_idle <> int_gpu_mem`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	if n != 0 {
		e.t.Errorf("%d hosts are not whole again at quiescence (idle != total)", n)
	}
}

// leak is a booking record left in Redis for a proc that never existed.
type leak struct {
	why   string
	proc  string
	keys  []string
	cores int64
	gpus  int64
	ts    time.Time
}

// checkAccounting waits for Redis to equal Postgres at quiescence:
// accounting.Audit reports no drift, no booked counter is non-zero (there
// are no procs), no booking record is left, and the show left to Cuebot has
// no key. The one tolerated difference is a booking charged by a scheduler
// that was killed, or cut from Postgres or Redis, between the booking script
// and the end of its transaction: its rollback never ran or never reached
// Redis, and the recompute drops the record once the in-flight grace has
// passed (by design: see package publisher). The default suite accepts such
// records when each is provably that (booked, by Redis's clock, within
// BookTimeout before a kill or cut; never launched; no proc row) and the
// counters differ by exactly their charges; the full suite waits for the
// grace and requires zero drift.
func (e *env) checkAccounting() {
	t := e.t
	t.Helper()
	e.mu.Lock()
	kills := append([]time.Time(nil), e.disruptions...)
	e.mu.Unlock()
	deadline := time.Now().Add(testenv.Patience(30 * time.Second))
	launched := map[string]bool{}
	for _, l := range e.fake.Launches() {
		if l.RunFrame != nil {
			launched[l.RunFrame.GetResourceId()] = true
		}
	}
	var problems []string
	var leaks []leak
	for {
		ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
		problems, leaks = e.accountingDiff(ctx, kills, launched)
		cancel()
		if len(problems) == 0 && (len(leaks) == 0 || !fullMode()) {
			break
		}
		if fullMode() {
			// The recompute drops a record once it is older than the
			// grace: wait for the youngest, plus a few recompute cycles.
			for _, l := range leaks {
				if d := l.ts.Add(inFlightGrace + 15*time.Second); d.After(deadline) {
					deadline = d
				}
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(problems) > 0 {
		t.Errorf("Redis does not equal Postgres at quiescence:\n%s", strings.Join(problems, "\n"))
		return
	}
	if len(leaks) > 0 {
		if fullMode() {
			var recs []string
			for _, l := range leaks {
				recs = append(recs, fmt.Sprintf("%s (booked %s, %s)", l.proc, l.ts.Format("15:04:05.000"), l.why))
			}
			t.Errorf("%d booking records without a proc still in Redis at %s, beyond the in-flight grace (%s) the recompute should drop them after:\n%s",
				len(leaks), time.Now().Format("15:04:05.000"), inFlightGrace, strings.Join(recs, "\n"))
			return
		}
		e.note("accounting: no drift except %d booking records the recompute drops %s after their booking (left by schedulers killed or cut between the booking script and the end of their transaction, or released while their show was Cuebot's)",
			len(leaks), inFlightGrace)
		for _, l := range leaks {
			e.note("  record %s: %d cores, %d GPUs, booked %s: %s", l.proc, l.cores, l.gpus, l.ts.Format("15:04:05.000"), l.why)
		}
		return
	}
	e.note("accounting: audit clean, Redis equals SUM(proc) = 0")
}

// accountingDiff returns the unexplained differences and the leaks that
// explain the rest.
func (e *env) accountingDiff(ctx context.Context, kills []time.Time, launched map[string]bool) ([]string, []leak) {
	var problems []string
	rep, err := accounting.Audit(ctx, e.pool, e.pub)
	if err != nil {
		return []string{"audit: " + err.Error()}, nil
	}
	// Booking records: none may be left but provable leaks.
	var leaks []leak
	records, err := scan(ctx, e.rdb, "acct:proc:*")
	if err != nil {
		return []string{"scan records: " + err.Error()}, nil
	}
	leakSum := map[string][2]int64{}
	for _, key := range records {
		proc := strings.TrimPrefix(key, "acct:proc:")
		rec, err := e.rdb.HGetAll(ctx, key).Result()
		if err != nil {
			return []string{"read " + key + ": " + err.Error()}, nil
		}
		var exists bool
		if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM proc WHERE pk_proc = $1)`, proc).Scan(&exists); err != nil {
			return []string{err.Error()}, nil
		}
		l := leak{proc: proc, cores: num(rec["cores"]), gpus: num(rec["gpus"]), ts: time.UnixMilli(num(rec["ts"]))}
		for _, f := range []string{"sub", "folder", "job", "layer", "point"} {
			l.keys = append(l.keys, rec[f])
		}
		why := ""
		switch {
		case exists:
			why = "its proc still exists at quiescence"
		case e.releasedWhileUnmanaged(proc, rec["show"]):
			// By design: see env.unmanagedWindows.
			l.why = "released while its show was Cuebot's"
		case launched[proc]:
			why = "it was launched on RQD, so its proc committed and was released: a release was lost"
		case !nearKill(l.ts, kills):
			why = fmt.Sprintf("booked at %s, not within %s before a scheduler was killed or cut (at %v)", l.ts.Format("15:04:05.000"), bookTimeout, fmtTimes(kills))
		}
		if why != "" {
			problems = append(problems, fmt.Sprintf("booking record %s (%v, %d cores, origin %s): %s", key, l.keys, l.cores, rec["origin"], why))
			continue
		}
		if l.why == "" {
			l.why = "booked by a scheduler killed or cut before its COMMIT"
		}
		leaks = append(leaks, l)
		for _, k := range l.keys {
			s := leakSum[k]
			leakSum[k] = [2]int64{s[0] + l.cores, s[1] + l.gpus}
		}
	}
	// Audit drifts: counters may differ by the leaks' charges exactly;
	// records only by the leaks; caps and markers not at all.
	leakRec := map[string]bool{}
	for _, l := range leaks {
		leakRec[publisher.ProcKey(l.proc)] = true
	}
	for _, d := range rep.Drifts {
		switch d.Kind {
		case "record":
			if leakRec[d.Key] && d.Postgres == "(no proc)" {
				continue
			}
		case "counter":
			i := 0
			if d.Field == "int_gpus" {
				i = 1
			}
			if num(d.Redis)-num(d.Postgres) == leakSum[d.Key][i] && leakSum[d.Key][i] != 0 {
				continue
			}
		}
		problems = append(problems, fmt.Sprintf("audit: %s %s %s: redis %s, postgres %s", d.Kind, d.Key, d.Field, d.Redis, d.Postgres))
	}
	// Every booked counter (of every job, also finished ones the audit does
	// not look at) equals SUM(proc) = 0, plus leaks.
	for _, pat := range []string{"acct:sub:*", "acct:folder:*", "acct:job:*", "acct:layer:*", "acct:point:*"} {
		keys, err := scan(ctx, e.rdb, pat)
		if err != nil {
			return []string{"scan: " + err.Error()}, nil
		}
		for _, k := range keys {
			v, err := e.rdb.HMGet(ctx, k, "int_cores", "int_gpus").Result()
			if err != nil {
				return []string{err.Error()}, nil
			}
			if c, g := num(v[0]), num(v[1]); c != leakSum[k][0] || g != leakSum[k][1] {
				problems = append(problems, fmt.Sprintf("%s: int_cores=%d int_gpus=%d, SUM(proc)=0 plus leaked bookings %v", k, c, g, leakSum[k]))
			}
		}
	}
	// The shows left to Cuebot have no subscription or point key (a
	// show that was managed once keeps its keys: see env.wasManaged).
	rows, err := e.pool.Query(ctx, `SELECT pk_show, str_name FROM show WHERE NOT b_scheduler_managed`)
	if err != nil {
		return []string{err.Error()}, nil
	}
	type show struct{ id, name string }
	var unmanaged []show
	for rows.Next() {
		var s show
		if err := rows.Scan(&s.id, &s.name); err != nil {
			rows.Close()
			return []string{err.Error()}, nil
		}
		if !e.wasManaged[s.id] {
			unmanaged = append(unmanaged, s)
		}
	}
	rows.Close()
	for _, sh := range unmanaged {
		keys, err := scan(ctx, e.rdb, "acct:*"+sh.id+"*")
		if err != nil {
			return []string{err.Error()}, nil
		}
		if len(keys) > 0 {
			problems = append(problems, fmt.Sprintf("Cuebot-managed show %s has Redis keys %v", sh.name, keys))
		}
	}
	sort.Strings(problems)
	return problems, leaks
}

// releasedWhileUnmanaged reports whether proc's frame completed while its
// show was flipped to Cuebot (so no release was due).
func (e *env) releasedWhileUnmanaged(proc, show string) bool {
	at, ok := e.comp.completedAt(proc)
	if !ok {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.unmanagedWindows[show] {
		if !at.Before(w[0].Add(-time.Second)) && (w[1].IsZero() || !at.After(w[1].Add(time.Second))) {
			return true
		}
	}
	return false
}

func nearKill(ts time.Time, kills []time.Time) bool {
	for _, k := range kills {
		if !ts.Before(k.Add(-bookTimeout)) && !ts.After(k.Add(time.Second)) {
			return true
		}
	}
	return false
}

func fmtTimes(ts []time.Time) string {
	var s []string
	for _, t := range ts {
		s = append(s, t.Format("15:04:05.000"))
	}
	return strings.Join(s, " ")
}

func scan(ctx context.Context, rdb redis.UniversalClient, pattern string) ([]string, error) {
	var out []string
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	return out, iter.Err()
}

// checkRecovered: every process is up, a sidecar streams the slot, one
// scheduler leads the accounting loops, and the sidecar's checkpoint has
// caught up with the WAL (releases flow).
func (e *env) checkRecovered() {
	t := e.t
	t.Helper()
	e.mu.Lock()
	ds := append(append([]*daemon(nil), e.schedulers...), e.sidecars...)
	e.mu.Unlock()
	for _, d := range ds {
		if !d.alive() {
			t.Errorf("%s is not running at the end", d.name)
		}
	}
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	var walNow string
	if err := e.pool.QueryRow(e.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&walNow); err != nil {
		t.Fatal(err)
	}
	w, err := parseLSN(walNow)
	if err != nil {
		t.Fatal(err)
	}
	for {
		holder, leader := e.slotHolder(), e.leader()
		cp, ok, _ := e.pub.Checkpoint(e.ctx)
		caught := ok && cp >= w
		if holder != "" && leader != "" && !strings.Contains(leader, ",") && caught {
			e.note("recovered: %s streams the slot, %s leads the accounting loops, checkpoint %X caught up", holder, leader, cp)
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("not recovered 20 s after quiescence: slot holder %q, loop leader %q, checkpoint %X (ok=%v) vs WAL %s",
				holder, leader, cp, ok, walNow)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func parseLSN(s string) (uint64, error) {
	var hi, lo uint64
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		return 0, err
	}
	return hi<<32 | lo, nil
}
