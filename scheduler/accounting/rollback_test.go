package accounting

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

// dumpDB is a point-in-time copy of every key of the farm's Redis DB
// (DUMP/PTTL), as an RDB snapshot holds it.
type dumpDB map[string][2]any

func (f *farm) dump() dumpDB {
	f.t.Helper()
	out := dumpDB{}
	keys, err := f.rdb.Keys(f.ctx, "*").Result()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, k := range keys {
		d, err := f.rdb.Dump(f.ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			f.t.Fatal(err)
		}
		ttl, _ := f.rdb.PTTL(f.ctx, k).Result()
		out[k] = [2]any{d, ttl}
	}
	return out
}

// restore replaces the DB's content with d: Redis restarted from an older
// snapshot.
func (f *farm) restore(d dumpDB) {
	f.t.Helper()
	// One MULTI/EXEC, as a real Redis loads a snapshot before it serves:
	// flushed and restored key by key, the service's polls could see the
	// empty Redis in between (on a loaded machine) and bootstrap once more.
	if _, err := f.rdb.TxPipelined(f.ctx, func(pipe redis.Pipeliner) error {
		pipe.FlushDB(f.ctx)
		for k, v := range d {
			ttl := v[1].(time.Duration)
			if ttl < 0 {
				ttl = 0
			}
			pipe.RestoreReplace(f.ctx, k, ttl, v[0].(string))
		}
		return nil
	}); err != nil {
		f.t.Fatal(err)
	}
}

// TestRolledBackRedisIsNotTrusted: Redis comes back with less than it
// acknowledged, markers and acct:epoch included (an older RDB restored, a
// failover to a replica that missed writes). The scheduler notices by
// itself (no sidecar runs here), within a poll: acct:seq below what it saw
// acknowledged under the same epoch, or an epoch of an older generation
// than the one it booked under. It closes every show at once (the booking
// script answers "not seeded" on every instance), the leader re-bootstraps
// from Postgres, and the counters end exact.
func TestRolledBackRedisIsNotTrusted(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 1000, folderMaxCores: -1, jobs: 2, jobMaxCores: -1, hosts: 1})
	const poll = 100 * time.Millisecond
	s, reg := f.runReady(Config{ManagedPollInterval: 50 * time.Millisecond, EpochPollInterval: poll,
		LeaderPollInterval: 100 * time.Millisecond, FlipSettle: 200 * time.Millisecond, InFlightGrace: 500 * time.Millisecond,
		RecomputeInterval: time.Hour})
	n := 0
	book := func(k int) {
		t.Helper()
		for i := 0; i < k; i++ {
			n++
			id := fmt.Sprintf("p-%d", n)
			if _, err := f.pub.Book(f.ctx, sh.booking(id, n%2, 100)); err != nil {
				t.Fatalf("book %s: %v", id, err)
			}
			sh.mustInsertProc(id, n%2, 100, 0)
		}
	}
	// stale is the acct:epoch of the rolled-back state. The leader may
	// re-bootstrap within a tick of the detection (its own recompute can be
	// what detects it), so right after the detection the gate is closed or
	// open on a new epoch, and a booking is refused (markers gone) or
	// accepted under the new bootstrap's marker: never on the stale state.
	waitClosed := func(kind, stale string) time.Duration {
		t.Helper()
		start := time.Now()
		d := eventually(t, 2*time.Second, "the gate closes on the rolled-back state", func() bool {
			return promread.Value(t, reg, "scheduler_accounting_rollbacks_detected_total", "kind", kind) >= 1
		})
		if s.Ready() {
			// The gate closes before the invalidation that the metric
			// counts, and a check that read Redis before it cannot open it.
			if ep, err := f.pub.Epoch(f.ctx); err != nil || ep == "" || ep == stale {
				t.Errorf("gate open after the rollback was detected, acct:epoch %q (%v)", ep, err)
			}
		}
		_, err := f.pub.Book(f.ctx, sh.booking("after-detect-"+kind, 0, 100))
		switch {
		case errors.Is(err, publisher.ErrShowNotSeeded):
		case err != nil:
			t.Errorf("booking right after the detection: %v, want not seeded or booked under the new bootstrap", err)
		default:
			if m, _ := f.rdb.HGet(f.ctx, publisher.ShowKey(sh.id), "seeded").Result(); m == stale {
				t.Errorf("booking right after the detection accepted under the rolled-back epoch %s", stale)
			}
			sh.mustInsertProc("after-detect-"+kind, 0, 100, 0)
		}
		eventually(t, 5*time.Second, "re-bootstrapped", s.Ready)
		t.Logf("%s rollback detected %v after the restore (poll %v), %v until booking resumed", kind, d.Round(time.Millisecond), poll, time.Since(start).Round(time.Millisecond))
		return d
	}

	// Same epoch, acct:seq rolled back.
	book(5)
	old := f.dump()
	book(5) // acknowledged, then lost
	ep0, _ := f.pub.Epoch(f.ctx)
	f.restore(old)
	waitClosed("seq", ep0)
	ep1, _ := f.pub.Epoch(f.ctx)

	// An epoch from before the last bootstrap.
	book(3)
	older := f.dump()
	if err := f.rdb.FlushDB(f.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "re-bootstrapped after the flush", func() bool {
		ep, _ := f.pub.Epoch(f.ctx)
		return ep != "" && ep != ep1 && s.Ready()
	})
	book(3)
	f.restore(older)
	waitClosed("epoch", ep1)
	if got := promread.Value(t, reg, "scheduler_accounting_bootstraps_total"); got != 4 {
		t.Errorf("bootstraps = %v, want 4 (startup, seq rollback, flush, epoch rollback)", got)
	}

	// The recompute drops the records of procs gone past the grace; then
	// Redis equals Postgres.
	time.Sleep(600 * time.Millisecond)
	if err := s.Recompute(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.requireNoDrift()
}

// TestLateAdoptionKeepsTheHighWaterMark forces the interleaving behind a
// flake of TestRolledBackRedisIsNotTrusted on a loaded machine: the epoch
// watch adopts a fresh bootstrap's epoch and opens the gate, bookings are
// acknowledged under it, Redis rolls back, and only then does the
// bootstrap's own adoption of its epoch run (its goroutine was slow). That
// late adoption must not reset the high-water mark to the rolled-back
// acct:seq: the next check still sees the rollback.
func TestLateAdoptionKeepsTheHighWaterMark(t *testing.T) {
	t.Parallel()
	f, s, reg, epoch := lostFive(t)
	s.adoptEpoch(f.ctx, epoch)
	s.checkEpoch(f.ctx)
	if got := promread.Value(t, reg, "scheduler_accounting_rollbacks_detected_total", "kind", "seq"); got != 1 {
		t.Fatalf("seq rollbacks detected = %v after a late adoption of the same epoch, want 1", got)
	}
}

// TestRecomputeAfterARollbackDoesNotHideIt: a recompute that runs on a
// rolled-back Redis before any watch polled it would adopt the procs whose
// bookings Redis lost and raise acct:seq by as many, back to what was
// acknowledged: every later poll would find Redis whole. The recompute's
// mark is judged like a poll instead: the rollback is detected there,
// every show is closed, and nothing is adopted.
func TestRecomputeAfterARollbackDoesNotHideIt(t *testing.T) {
	t.Parallel()
	f, s, reg, _ := lostFive(t)
	before, err := f.pub.State(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Recompute(f.ctx)
	if !errors.Is(err, publisher.ErrSeqRolledBack) {
		t.Fatalf("recompute on a rolled-back Redis: %v, want ErrSeqRolledBack", err)
	}
	if got := promread.Value(t, reg, "scheduler_accounting_rollbacks_detected_total", "kind", "seq"); got != 1 {
		t.Errorf("seq rollbacks detected = %v, want 1", got)
	}
	if n, err := f.rdb.Exists(f.ctx, "acct:proc:p-6").Result(); err != nil || n != 0 {
		t.Errorf("a lost booking's proc was adopted by the refused recompute (exists %d, %v)", n, err)
	}
	if after, _ := f.pub.State(f.ctx); after.Seq != before.Seq {
		t.Errorf("acct:seq %d -> %d across the refused recompute", before.Seq, after.Seq)
	}
}

// lostFive stages a rollback by hand: a service whose watch polls acct:epoch
// once at start and that runs no follow-up reconcile on its own (each test
// makes every later step itself), ten bookings acknowledged under its
// epoch with their procs committed, then Redis restored to before the
// last five. It returns the epoch they were booked under.
func lostFive(t *testing.T) (*farm, *Service, *prometheus.Registry, string) {
	t.Helper()
	f, s, reg, epoch, _ := lostFiveOf(t)
	return f, s, reg, epoch
}

// lostFiveOf is lostFive with the show the ten procs were booked for.
func lostFiveOf(t *testing.T) (*farm, *Service, *prometheus.Registry, string, *showFx) {
	t.Helper()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 1000, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	s, reg := f.runReady(Config{ManagedPollInterval: 50 * time.Millisecond, EpochPollInterval: time.Hour,
		LeaderPollInterval: 100 * time.Millisecond, FlipSettle: time.Hour, InFlightGrace: 500 * time.Millisecond,
		RecomputeInterval: time.Hour})
	epoch, err := f.pub.Epoch(f.ctx)
	if err != nil || epoch == "" {
		t.Fatalf("epoch %q: %v", epoch, err)
	}
	var old dumpDB
	for i := 1; i <= 10; i++ {
		if i == 6 {
			old = f.dump()
		}
		id := fmt.Sprintf("p-%d", i)
		if _, err := f.pub.Book(f.ctx, sh.booking(id, 0, 100)); err != nil {
			t.Fatalf("book %s: %v", id, err)
		}
		sh.mustInsertProc(id, 0, 100, 0)
	}
	f.restore(old)
	return f, s, reg, epoch, sh
}

// TestRollbackRecyclesPooledBackends: Redis comes back from a snapshot
// taken before five procs were released and one more was booked (a
// failover to a replica that missed them). The five records are back;
// each names the backend its booking ran on, a connection of the
// scheduler's pool that lives on, so the re-bootstrap could not tell they
// ended and would keep them for the in-flight grace (an hour here),
// holding the show's cap. The instance that finds the rollback closes its
// pool's connections: once those backends are gone the re-bootstrap, or
// its follow-up reconcile, drops the five records, and the counters equal
// Postgres again long before the grace. With recycleLocked a no-op
// this test fails at its wait.
func TestRollbackRecyclesPooledBackends(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	s, reg := f.runReady(Config{ManagedPollInterval: 50 * time.Millisecond, EpochPollInterval: 100 * time.Millisecond,
		LeaderPollInterval: 100 * time.Millisecond, FlipSettle: 300 * time.Millisecond, InFlightGrace: time.Hour,
		RecomputeInterval: time.Hour})
	// Booked as the dispatcher books: on a connection of the pool, which
	// the record names, and committed on it.
	var procs []string
	pids := map[uint32]bool{}
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("released-%d", i)
		pids[sh.bookOnPool(f.pool, f.pub, id)] = true
		procs = append(procs, id)
	}
	snap := f.dump()
	sh.releaseThenLose(procs)
	if got := sh.subCores(); got != 1 {
		t.Fatalf("after the releases: %d cores, want 1 (the lost booking)", got)
	}
	var alive int64
	for pid := range pids {
		alive += f.pgInt(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid))
	}
	if alive == 0 {
		t.Fatal("no booking's backend is alive before the rollback: the test exercises nothing")
	}
	f.restore(snap)
	start := time.Now()
	eventually(t, 10*time.Second, "the rollback detected", func() bool {
		return promread.Value(t, reg, "scheduler_accounting_rollbacks_detected_total", "kind", "seq") >= 1
	})
	sh.requireRecycledAndDropped(s, reg, procs)
	t.Logf("the five restored records dropped %v after the rollback", time.Since(start).Round(time.Millisecond))
}

// requireRecycledAndDropped waits until the restored records of procs are
// dropped and the gate is open again (long before an hour's grace), then
// requires one recycle of the pool and Redis equal to Postgres, the lost
// booking's proc adopted.
func (sh *showFx) requireRecycledAndDropped(s *Service, reg *prometheus.Registry, procs []string) {
	f, t := sh.f, sh.f.t
	t.Helper()
	keys := make([]string, len(procs))
	for i, p := range procs {
		keys[i] = publisher.ProcKey(p)
	}
	eventually(t, 10*time.Second, "the released procs' records dropped (not kept for the hour's grace)", func() bool {
		n, err := f.rdb.Exists(f.ctx, keys...).Result()
		return err == nil && n == 0 && s.Ready()
	})
	if got := promread.Value(t, reg, "scheduler_accounting_connections_recycled_total"); got != 1 {
		t.Errorf("connections recycled %v times, want once", got)
	}
	if got := sh.subCores(); got != 1 {
		t.Errorf("after the re-bootstrap: %d cores, want 1 (the lost booking's proc, adopted)", got)
	}
	f.requireNoDrift()
}

// TestLeaderRecyclesWhenAnotherInstanceFoundTheRollback: as
// TestRollbackRecyclesPooledBackends, but another instance finds the
// rollback and deletes acct:epoch, and this instance's epoch watch does
// not poll before its loop leader re-bootstraps. The leader closes its
// connections when it finds the epoch gone, before the bootstrap's
// snapshot, so the five restored records naming its pooled backends are
// dropped (by the bootstrap or its follow-up reconcile) instead of kept
// for the hour's grace. Without that, nothing closes them: the watch never
// sees the epoch it booked under go.
func TestLeaderRecyclesWhenAnotherInstanceFoundTheRollback(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	s, reg := f.runReady(Config{ManagedPollInterval: 50 * time.Millisecond, EpochPollInterval: time.Hour,
		LeaderPollInterval: 100 * time.Millisecond, FlipSettle: 300 * time.Millisecond, InFlightGrace: time.Hour,
		RecomputeInterval: time.Hour})
	eventually(t, 5*time.Second, "the instance leads", s.IsLeader)
	var procs []string
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("released-%d", i)
		sh.bookOnPool(f.pool, f.pub, id)
		procs = append(procs, id)
	}
	snap := f.dump()
	epoch, err := f.pub.Epoch(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	sh.releaseThenLose(procs)
	f.restore(snap)
	// Another instance's watch finds the rollback: it closes every show
	// and deletes acct:epoch.
	if _, _, err := f.pub.Invalidate(f.ctx, epoch); err != nil {
		t.Fatal(err)
	}
	sh.requireRecycledAndDropped(s, reg, procs)
}

// TestStaleEmptyPollSparesTheNewEpoch forces the interleaving behind a
// flake of TestRollbackRecyclesPooledBackends on a loaded machine: the
// epoch watch reads acct:epoch empty (the rollback's Invalidate deleted
// it), then stalls while the re-bootstrap writes and adopts a new epoch
// and opens the gate. The stalled poll must act on the epoch it knew when
// it read, which is gone and already recycled, not on the new one: it
// neither closes the new epoch's connections nor its gate. A rollback
// judged under the old epoch and acted on late spares them too.
func TestStaleEmptyPollSparesTheNewEpoch(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	s, reg := f.runReady(Config{ManagedPollInterval: 50 * time.Millisecond, EpochPollInterval: time.Hour,
		LeaderPollInterval: 100 * time.Millisecond, FlipSettle: time.Hour, InFlightGrace: time.Hour,
		RecomputeInterval: time.Hour})
	old := s.knownEpoch()
	if old == "" {
		t.Fatal("no epoch known after the bootstrap")
	}
	recycles := func() float64 { return promread.Value(t, reg, "scheduler_accounting_connections_recycled_total") }
	// Another instance found a rollback: it deleted acct:epoch; this
	// instance's leader re-bootstraps under a new epoch.
	if err := f.rdb.Del(f.ctx, "acct:epoch").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the re-bootstrap under a new epoch", func() bool {
		return s.knownEpoch() != old && s.Ready()
	})
	before := recycles()
	if s.epochGone(old) {
		t.Error("a poll that read acct:epoch empty under the old epoch acted after the new one was adopted")
	}
	if got := recycles(); got != before {
		t.Errorf("connections recycled %v times after the stale poll, want %v (the new epoch's pool was closed)", got, before)
	}
	if !s.Ready() {
		t.Error("the stale poll closed the re-bootstrapped gate")
	}
	// So does a rollback judged under the old epoch and acted on after the
	// new one was adopted (Invalidate finds the epoch replaced: a no-op).
	s.rolledBack(f.ctx, publisher.State{Epoch: old}, "seq", "judged under the old epoch", old)
	if got := recycles(); got != before {
		t.Errorf("connections recycled %v times after a rollback judged under the old epoch, want %v (the new epoch's pool was closed)", got, before)
	}
	// A poll that read it empty under the epoch it knows still recycles.
	if !s.epochGone(s.knownEpoch()) {
		t.Error("a poll that found the known epoch gone did not act")
	}
	if got := recycles(); got != before+1 {
		t.Errorf("connections recycled %v times after the known epoch was found gone, want %v", got, before+1)
	}
}

// TestRollbackRecyclesOnEveryInstance: an instance that did not find the
// rollback itself closes its connections too, when it next sees the epoch
// it booked under replaced by the re-bootstrap. Its polls may miss the
// empty acct:epoch in between (here it polls only when the test says, after
// the re-bootstrap), so the replaced epoch is what it acts on. The
// re-bootstrap kept its bookings' records (their backends were alive); the
// next reconcile after its recycling drops them. Without the recycling on
// a replaced epoch this test fails: the records stay for the grace.
func TestRollbackRecyclesOnEveryInstance(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	cfg := Config{ManagedPollInterval: 50 * time.Millisecond, EpochPollInterval: 100 * time.Millisecond,
		LeaderPollInterval: 100 * time.Millisecond, FlipSettle: time.Hour, InFlightGrace: time.Hour, RecomputeInterval: time.Hour}
	s1, _ := f.runReady(cfg)
	eventually(t, 5*time.Second, "the first instance leads", s1.IsLeader)
	cfg.EpochPollInterval = time.Hour // one poll at start
	s2, pub2 := f.secondService(cfg)
	runService(t, s2)
	eventually(t, 5*time.Second, "the second instance's gate opens", s2.Ready)
	ctx := f.ctx
	var procs []string
	var pids []int32
	for i := 0; i < 3; i++ {
		id := fmt.Sprintf("s2-%d", i)
		pids = append(pids, int32(sh.bookOnPool(s2.st.pool, pub2, id)))
		procs = append(procs, id)
	}
	snap := f.dump()
	epoch, err := f.pub.Epoch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sh.releaseThenLose(procs) // the first instance acknowledges the lost booking
	f.restore(snap)
	eventually(t, 10*time.Second, "the first instance re-bootstrapped", func() bool {
		ep, err := f.pub.Epoch(ctx)
		return err == nil && ep != "" && ep != epoch && s1.Ready()
	})
	records := func() int64 {
		n, err := f.rdb.Exists(ctx, publisher.ProcKey(procs[0]), publisher.ProcKey(procs[1]), publisher.ProcKey(procs[2])).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := records(); n != 3 {
		t.Fatalf("%d of the second instance's 3 restored records after the re-bootstrap, want 3 (their backends were alive): the test exercises nothing", n)
	}
	s2.checkEpoch(ctx) // its next poll: the epoch it booked under is replaced
	eventually(t, 10*time.Second, "the second instance's booking backends gone", func() bool {
		return f.pgInt(`SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])`, pids) == 0
	})
	if err := s1.Recompute(ctx); err != nil {
		t.Fatal(err)
	}
	if n := records(); n != 0 {
		t.Errorf("%d of the second instance's restored records left after the recompute, want 0 (kept for the hour's grace)", n)
	}
	f.requireNoDrift()
}

// bookOnPool books proc id (job 0, one core) as the dispatcher does: on a
// connection of pool, whose backend the record names, and commits its proc
// on that connection. It returns the backend's pid.
func (s *showFx) bookOnPool(pool *pgxpool.Pool, pub *publisher.Publisher, id string) uint32 {
	t, ctx := s.f.t, s.f.ctx
	t.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	b := s.booking(id, 0, 100)
	b.BackendPID = conn.Conn().PgConn().PID()
	if _, err := pub.Book(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO proc (pk_proc, pk_host, pk_job, pk_show, pk_layer, int_cores_reserved, int_mem_reserved, int_gpus_reserved)
		VALUES ($1, $2, $3, $4, $5, 100, 1048576, 0)`, id, s.hosts[0], s.jobs[0].id, s.id, s.jobs[0].layer); err != nil {
		t.Fatal(err)
	}
	return b.BackendPID
}

// releaseThenLose ends procs as Cuebot and the sidecar do (DELETE, then the
// release), then books and commits one more proc, "lost", through the
// farm's publisher: a restore of a dump taken before loses that
// acknowledged booking, which is what lets that publisher's instance see
// the rollback (acct:seq below it); the re-bootstrap adopts its proc.
func (s *showFx) releaseThenLose(procs []string) {
	f := s.f
	f.t.Helper()
	for _, id := range procs {
		if err := f.deleteProc(f.ctx, id); err != nil {
			f.t.Fatal(err)
		}
	}
	if _, err := f.pub.Release(f.ctx, procs...); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, s.booking("lost", 0, 100)); err != nil {
		f.t.Fatal(err)
	}
	s.mustInsertProc("lost", 0, 100, 0)
}

// TestBookingFindsTheRollbackThePollCannot: Redis rolls back, and before
// any poll looks, a booking is acknowledged with an acct:seq at or below
// the high-water mark. The booking fails (publisher.ErrSeqWentBack) and
// the publisher refuses every booking since, so nothing is booked on the
// undercounting state in the window before a poll. Meanwhile acct:seq
// climbs back past the mark (other instances' bookings and releases): a
// poll comparing acct:seq alone would trust Redis again; the publisher's
// finding makes it act. Without that check in checkLineage the poll finds
// nothing and this test fails.
func TestBookingFindsTheRollbackThePollCannot(t *testing.T) {
	t.Parallel()
	f, s, reg, _, sh := lostFiveOf(t)
	if _, err := f.pub.Book(f.ctx, sh.booking("p-11", 0, 100)); !errors.Is(err, publisher.ErrSeqWentBack) {
		t.Fatalf("booking on the rolled-back Redis: %v, want ErrSeqWentBack", err)
	}
	if _, err := f.pub.Book(f.ctx, sh.booking("p-12", 0, 100)); !errors.Is(err, publisher.ErrSeqWentBack) {
		t.Fatalf("the booking after it: %v, want ErrSeqWentBack (refused before Redis)", err)
	}
	hw := f.pub.SeqHighWater()
	if err := f.rdb.Set(f.ctx, publisher.SeqKey, hw+100, 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.checkEpoch(f.ctx)
	if got := promread.Value(t, reg, "scheduler_accounting_rollbacks_detected_total", "kind", "seq"); got != 1 {
		t.Fatalf("seq rollbacks detected = %v with acct:seq back above the mark after a booking found the rollback, want 1", got)
	}
}
