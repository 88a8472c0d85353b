package accounting

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// cuebotBooked is a farm with a managed show A and an unmanaged show B
// whose procs Cuebot booked before the scheduler ever ran: on A 1.5 + 2
// cores on job 0 and 0.5 core + 1 GPU on job 1, on B 1 core.
func cuebotBooked(t *testing.T) (f *farm, a, b *showFx) {
	t.Helper()
	f = newFarm(t)
	a = f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 2, jobMaxCores: 50, jobMaxGPUs: 4, hosts: 1})
	b = f.addShow(showSpec{managed: false, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: 50, hosts: 1})
	a.mustInsertProc("a1", 0, 150, 0)
	a.mustInsertProc("a2", 0, 200, 0)
	a.mustInsertProc("a3", 1, 50, 1)
	b.mustInsertProc("b1", 0, 100, 0)
	return f, a, b
}

func TestBootstrapSeedsManagedShowsOnly(t *testing.T) {
	t.Parallel()
	f, a, b := cuebotBooked(t)

	s, reg := f.service(Config{})
	if s.Ready() {
		t.Fatal("ready before bootstrap")
	}
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	if !s.Ready() {
		t.Fatalf("not ready after bootstrap: %v", s.ReadyErr())
	}
	// Charged as ceil(centicores/100) per proc: 2 + 2 + 1.
	if got := a.subCores(); got != 5 {
		t.Errorf("show A subscription = %d cores, want 5", got)
	}
	if got := f.counter(publisher.SubKey(a.id, a.alloc), "burst"); got != 100 {
		t.Errorf("burst = %d, want 100 (cores)", got)
	}
	if got := f.counter(publisher.FolderKey(a.folder), "int_max_cores"); got != -1 {
		t.Errorf("folder int_max_cores = %d, want -1 preserved", got)
	}
	if got := f.counter(publisher.JobKey(a.jobs[1].id), "int_gpus"); got != 1 {
		t.Errorf("job 1 gpus = %d", got)
	}
	if f.rdb.Exists(f.ctx, publisher.SubKey(b.id, b.alloc)).Val() != 0 {
		t.Error("a Cuebot-managed show was written to Redis")
	}
	f.requireNoDrift()

	// Only the managed show is bookable.
	if _, err := f.pub.Book(f.ctx, a.booking("a4", 0, 100)); err != nil {
		t.Errorf("booking on seeded show: %v", err)
	}
	if _, err := f.pub.Book(f.ctx, b.booking("b2", 0, 100)); !errors.Is(err, publisher.ErrShowNotSeeded) {
		t.Errorf("booking on Cuebot-managed show: %v, want not seeded", err)
	}
	// The Postgres accounting tables of the managed show are SUM(proc) in
	// centicores; the Cuebot show's are untouched.
	if got := f.pgInt(`SELECT int_cores FROM subscription WHERE pk_show = $1`, a.id); got != 400 {
		t.Errorf("PG subscription.int_cores = %d, want 400 centicores", got)
	}
	if got := f.pgInt(`SELECT int_cores FROM subscription WHERE pk_show = $1`, b.id); got != 0 {
		t.Errorf("Cuebot show's subscription touched: %d", got)
	}
	if got := promread.Value(t, reg, "scheduler_accounting_bootstraps_total"); got != 1 {
		t.Errorf("bootstraps = %v", got)
	}
}

// TestRaceTraceT0toT6 is the reference design's trace: a booking lands
// between a reseed's read of Postgres and its write to Redis. With the
// acct:seq CAS the reseed retried; here nothing needs a retry, and the
// booking must survive either way.
func TestRaceTraceT0toT6(t *testing.T) {
	t.Parallel()
	for _, committed := range []bool{true, false} {
		t.Run(fmt.Sprintf("insert_committed=%v", committed), func(t *testing.T) {
			t.Parallel()
			f := newFarm(t)
			sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
			// t0: 5 procs x 10 cores.
			for i := 0; i < 5; i++ {
				sh.mustInsertProc(fmt.Sprintf("p%d", i), 0, 1000, 0)
			}
			s, reg := f.service(Config{InFlightGrace: time.Hour})
			if err := s.Bootstrap(f.ctx); err != nil {
				t.Fatal(err)
			}
			if sh.subCores() != 50 {
				t.Fatalf("t0: %d", sh.subCores())
			}
			// t1: the recompute reads Postgres (SUM = 50); t2: a booking of
			// +10 (Lua, then INSERT proc — or not yet committed); t3: the
			// recompute writes.
			s.hooks.afterSnapshot = func([]string, publisher.Mark) {
				if _, err := f.pub.Book(f.ctx, sh.booking("p5", 0, 1000)); err != nil {
					t.Errorf("t2 booking: %v", err)
				}
				if committed {
					sh.mustInsertProc("p5", 0, 1000, 0)
				}
			}
			if err := s.Recompute(f.ctx); err != nil {
				t.Fatal(err)
			}
			s.hooks.afterSnapshot = nil
			if got := sh.subCores(); got != 60 {
				t.Fatalf("t3..t6: Redis int_cores = %d after the recompute, want 60 (booking lost)", got)
			}
			if got := promread.Value(t, reg, "scheduler_accounting_recompute_retries_total"); got != 0 {
				t.Errorf("retries = %v, want 0: no CAS to retry on", got)
			}
			if !committed {
				sh.mustInsertProc("p5", 0, 1000, 0)
			}
			// The next cycle sees the INSERT: still 60, once.
			if err := s.Recompute(f.ctx); err != nil {
				t.Fatal(err)
			}
			if got := sh.subCores(); got != 60 {
				t.Fatalf("next cycle: %d, want 60", got)
			}
			f.requireNoDrift()
		})
	}
}

func TestRecomputeHealsEveryDriftKind(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: 40, jobs: 2, jobMaxCores: 30, hosts: 1})
	s, reg := f.service(Config{InFlightGrace: 200 * time.Millisecond})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	book := func(proc string, j int, centi int64) {
		t.Helper()
		if _, err := f.pub.Book(f.ctx, sh.booking(proc, j, centi)); err != nil {
			t.Fatal(err)
		}
	}
	// 1. A lost release: proc deleted, decrement never published.
	book("lost-release", 0, 400)
	sh.mustInsertProc("lost-release", 0, 400, 0)
	if err := f.deleteProc(f.ctx, "lost-release"); err != nil {
		t.Fatal(err)
	}
	// 2. A crash between the booking script and the INSERT.
	book("never-inserted", 1, 300)
	// 3. A proc booked by Cuebot (no record).
	sh.mustInsertProc("cuebot", 1, 500, 0)
	// 4. A live booking.
	book("live", 0, 100)
	sh.mustInsertProc("live", 0, 100, 0)
	// 5. A counter edited by hand, and a drained key stale-high.
	f.rdb.HSet(f.ctx, publisher.JobKey(sh.jobs[0].id), "int_cores", 77)
	f.rdb.HSet(f.ctx, publisher.PointKey(sh.dept, sh.id), "int_gpus", 3)
	// 6. The job moved to another folder while its proc ran.
	other := uuid.NewString()
	f.exec(`INSERT INTO folder (pk_folder, pk_show, str_name, pk_dept) VALUES ($1, $2, 'other', $3)`, other, sh.id, sh.dept)
	f.exec(`UPDATE job SET pk_folder = $2 WHERE pk_job = $1`, sh.jobs[0].id, other)

	time.Sleep(300 * time.Millisecond) // past the in-flight grace
	if err := s.Recompute(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.ReseedLimits(f.ctx); err != nil { // the new folder's caps
		t.Fatal(err)
	}
	f.requireNoDrift()
	if got := sh.subCores(); got != 6 {
		t.Errorf("subscription = %d cores, want 6 (live 1 + cuebot 5)", got)
	}
	if got := f.counter(publisher.FolderKey(other), "int_cores"); got != 1 {
		t.Errorf("moved job's folder = %d, want 1", got)
	}
	if got := promread.Value(t, reg, "scheduler_accounting_records_reconciled_total", "action", "adopted"); got != 1 {
		t.Errorf("adopted = %v", got)
	}
	if got := promread.Value(t, reg, "scheduler_accounting_records_reconciled_total", "action", "dropped"); got != 2 {
		t.Errorf("dropped = %v", got)
	}
	if got := promread.Value(t, reg, "scheduler_accounting_drift_corrected_total", "table", "subscription"); got == 0 {
		t.Error("no subscription drift counted")
	}
	// A release arriving late for the dropped record is a counted no-op.
	r, err := f.pub.Release(f.ctx, "lost-release")
	if err != nil || r.NeverBooked != 1 {
		t.Fatalf("late release = %+v, %v", r, err)
	}
	f.requireNoDrift()
	// The Postgres accounting tables were dual-written, exact centicores.
	if got := f.pgInt(`SELECT int_cores FROM subscription WHERE pk_show = $1`, sh.id); got != 600 {
		t.Errorf("PG subscription = %d, want 600", got)
	}
	if got := f.pgInt(`SELECT int_cores FROM folder_resource WHERE pk_folder = $1`, other); got != 100 {
		t.Errorf("PG folder_resource(other) = %d, want 100", got)
	}
	if got := f.pgInt(`SELECT int_cores FROM job_resource WHERE pk_job = $1`, sh.jobs[1].id); got != 500 {
		t.Errorf("PG job_resource = %d, want 500", got)
	}
	if got := f.pgInt(`SELECT int_cores FROM layer_resource WHERE pk_layer = $1`, sh.jobs[0].layer); got != 100 {
		t.Errorf("PG layer_resource = %d, want 100", got)
	}
	if got := f.pgInt(`SELECT int_cores FROM point WHERE pk_show = $1`, sh.id); got != 600 {
		t.Errorf("PG point = %d, want 600", got)
	}
}

func TestInFlightBookingIsNeverErased(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	s, _ := f.service(Config{InFlightGrace: time.Hour})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, sh.booking("slow", 0, 800)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // its INSERT is slow: several cycles pass
		if err := s.Recompute(f.ctx); err != nil {
			t.Fatal(err)
		}
		if got := sh.subCores(); got != 8 {
			t.Fatalf("cycle %d: %d cores, want the in-flight 8 kept", i, got)
		}
	}
	sh.mustInsertProc("slow", 0, 800, 0)
	if err := s.Recompute(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := sh.subCores(); got != 8 {
		t.Fatalf("after INSERT: %d, want 8 (counted once)", got)
	}
	f.requireNoDrift()
}

func TestLimitReseedCopiesCapsOnly(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: 10, jobMaxGPUs: 1, hosts: 1})
	s, reg := f.service(Config{})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, sh.booking("p1", 0, 600)); err != nil {
		t.Fatal(err)
	}
	// Admin changes in Postgres (no Redis hook).
	f.exec(`UPDATE subscription SET int_burst = 5050, int_size = 2000 WHERE pk_show = $1`, sh.id)
	f.exec(`UPDATE job_resource SET int_max_cores = 750, int_priority = 42 WHERE pk_job = $1`, sh.jobs[0].id)
	f.exec(`UPDATE folder_resource SET int_max_cores = 99, int_max_gpus = -7 WHERE pk_folder = $1`, sh.folder)
	if err := s.ReseedLimits(f.ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, field string
		want       int64
	}{
		{publisher.SubKey(sh.id, sh.alloc), "burst", 50},
		{publisher.SubKey(sh.id, sh.alloc), "size", 20},
		{publisher.SubKey(sh.id, sh.alloc), "int_cores", 6}, // booked counter untouched
		{publisher.JobKey(sh.jobs[0].id), "int_max_cores", 7},
		{publisher.JobKey(sh.jobs[0].id), "int_priority", 42},
		{publisher.FolderKey(sh.folder), "int_max_cores", 0}, // 99 centicores: under one core, a cap of 0 (books nothing)
		{publisher.FolderKey(sh.folder), "int_max_gpus", 0},  // -7: not the -1 sentinel, so a cap (Cuebot books nothing)
	} {
		if got := f.counter(c.key, c.field); got != c.want {
			t.Errorf("%s %s = %d, want %d", c.key, c.field, got, c.want)
		}
	}
	if got := promread.Value(t, reg, "scheduler_accounting_reseed_cycles_total", "kind", "limit", "result", "ok"); got != 1 {
		t.Errorf("limit reseed cycles = %v", got)
	}
	// The new caps bind at once: the 99-centicore folder cap as 0 cores.
	_, err := f.pub.Book(f.ctx, sh.booking("p2", 0, 200))
	var le *publisher.LimitError
	if !errors.As(err, &le) || le.Table != "folder" || le.Limit != 0 {
		t.Fatalf("booking above the folder cap: %v", err)
	}
	f.exec(`UPDATE folder_resource SET int_max_cores = -1 WHERE pk_folder = $1`, sh.folder)
	if err := s.ReseedLimits(f.ctx); err != nil {
		t.Fatal(err)
	}
	_, err = f.pub.Book(f.ctx, sh.booking("p2", 0, 200))
	if !errors.As(err, &le) || le.Table != "job" || le.Limit != 7 {
		t.Fatalf("booking above the job cap: %v", err)
	}
}

// TestDualWriteAboveLoweredCaps: a recompute must write a booked total that
// exceeds a cap lowered after the procs booked, despite Cuebot's triggers.
func TestDualWriteAboveLoweredCaps(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: 100, jobMaxGPUs: 10, hosts: 1})
	sh.mustInsertProc("p1", 0, 3000, 4)
	f.exec(`UPDATE subscription SET int_burst = 1000 WHERE pk_show = $1`, sh.id)
	f.exec(`UPDATE job_resource SET int_max_cores = 1000, int_max_gpus = 1 WHERE pk_job = $1`, sh.jobs[0].id)
	s, _ := f.service(Config{})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.pgInt(`SELECT int_cores FROM subscription WHERE pk_show = $1`, sh.id); got != 3000 {
		t.Errorf("subscription.int_cores = %d, want 3000", got)
	}
	if got := f.pgInt(`SELECT int_burst FROM subscription WHERE pk_show = $1`, sh.id); got != 1000 {
		t.Errorf("burst not restored: %d", got)
	}
	if got := f.pgInt(`SELECT int_cores + int_gpus * 1000000 + int_max_cores * 1000 + int_max_gpus FROM job_resource WHERE pk_job = $1`, sh.jobs[0].id); got != 3000+4000000+1000000+1 {
		t.Errorf("job_resource = %d", got)
	}
}

func TestAuditFindsEveryKindOfDrift(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: 20, hosts: 1})
	s, _ := f.service(Config{})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.requireNoDrift()
	f.rdb.HSet(f.ctx, publisher.SubKey(sh.id, sh.alloc), "int_cores", 9)
	f.rdb.HSet(f.ctx, publisher.JobKey(sh.jobs[0].id), "int_max_cores", 21)
	sh.mustInsertProc("cuebot", 0, 100, 0)
	rep, err := Audit(f.ctx, f.pool, f.pub)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.Write(&b)
	has := func(want Drift) bool {
		for _, d := range rep.Drifts {
			if d == want {
				return true
			}
		}
		return false
	}
	for _, want := range []Drift{
		{Kind: "counter", Key: publisher.SubKey(sh.id, sh.alloc), Field: "int_cores", Redis: "9", Postgres: "1"},
		{Kind: "cap", Key: publisher.JobKey(sh.jobs[0].id), Field: "int_max_cores", Redis: "21", Postgres: "20"},
		{Kind: "record", Key: "acct:proc:cuebot", Redis: "(missing)", Postgres: "proc exists"},
	} {
		if !has(want) {
			t.Errorf("audit lacks %+v:\n%s", want, b.String())
		}
	}
	if !strings.Contains(b.String(), "7 differences") {
		t.Errorf("summary:\n%s", b.String())
	}
	other := f.addShow(showSpec{managed: true, burstCores: 1, folderMaxCores: -1, jobs: 1, jobMaxCores: 1, hosts: 1})
	rep, err = Audit(f.ctx, f.pool, f.pub)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range rep.Drifts {
		if d.Kind == "marker" && d.Key == publisher.ShowKey(other.id) {
			found = true
		}
	}
	if !found {
		t.Error("unseeded managed show not reported")
	}
}

func TestUnmanagedShowIsClosedForBooking(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 10, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	s, reg := f.service(Config{FlipSettle: 50 * time.Millisecond})
	if err := s.SyncManaged(f.ctx); err != nil { // bootstrap: seeds at once
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, sh.booking("p1", 0, 100)); err != nil {
		t.Fatal(err)
	}
	sh.setManaged(false)
	if err := s.SyncManaged(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, sh.booking("p2", 0, 100)); !errors.Is(err, publisher.ErrShowNotSeeded) {
		t.Fatalf("booking after unmanage: %v", err)
	}
	// Flipped back: not seeded until it has been managed for FlipSettle.
	sh.setManaged(true)
	if err := s.SyncManaged(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, sh.booking("p2", 0, 100)); !errors.Is(err, publisher.ErrShowNotSeeded) {
		t.Fatalf("booking while the flip settles: %v", err)
	}
	if got := promread.Value(t, reg, "scheduler_accounting_unseeded_shows"); got != 1 {
		t.Errorf("unseeded gauge = %v, want 1", got)
	}
	time.Sleep(60 * time.Millisecond)
	if err := s.SyncManaged(f.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, sh.booking("p2", 0, 100)); err != nil {
		t.Fatalf("booking after re-manage: %v", err)
	}
	if got := promread.Value(t, reg, "scheduler_accounting_unseeded_shows"); got != 0 {
		t.Errorf("unseeded gauge = %v, want 0", got)
	}
}

// TestOrphanOfGoneBackendDroppedAtOnce: a booking record names the backend
// its transaction runs on (Booking.BackendPID). Once that backend is gone
// and the proc is not in the snapshot, the record is orphaned: the
// recompute, and a re-bootstrap (after a promotion or a rolled-back Redis),
// drop it at once, long before the in-flight grace (an hour here). A
// record whose backend is alive is kept until its INSERT commits.
func TestOrphanOfGoneBackendDroppedAtOnce(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	s, reg := f.service(Config{InFlightGrace: time.Hour})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(f.ctx, f.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	book := func(proc string, centi int64, pid uint32) {
		b := sh.booking(proc, 0, centi)
		b.BackendPID = pid
		if _, err := f.pub.Book(f.ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(c *pgx.Conn) {
		pid := c.PgConn().PID()
		if err := c.Close(f.ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, testenv.Patience(10*time.Second), "the closed backend leaves pg_stat_activity", func() bool {
			return f.pgInt(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)) == 0
		})
	}
	live := connect()
	defer live.Close(f.ctx)
	dead := connect()
	book("inflight", 800, live.PgConn().PID())
	book("orphan", 300, dead.PgConn().PID())
	book("nopid", 200, 0)
	gone(dead)
	if err := s.Recompute(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := sh.subCores(); got != 10 {
		t.Fatalf("after the recompute: %d cores, want 10 (the orphan's 3 dropped; in flight 8 and pid-less 2 kept)", got)
	}
	if n := promread.Value(t, reg, "scheduler_accounting_records_reconciled_total", "action", "dropped_orphaned"); n != 1 {
		t.Errorf("dropped_orphaned = %v, want 1", n)
	}
	// The in-flight booking commits on its connection: counted once.
	if _, err := live.Exec(f.ctx, `INSERT INTO proc (pk_proc, pk_host, pk_job, pk_show, pk_layer, int_cores_reserved, int_mem_reserved, int_gpus_reserved)
		VALUES ($1, $2, $3, $4, $5, 800, 1048576, 0)`, "inflight", sh.hosts[0], sh.jobs[0].id, sh.id, sh.jobs[0].layer); err != nil {
		t.Fatal(err)
	}
	// A re-bootstrap (the accounting invalidated, as after a promotion or
	// a rolled-back Redis) drops an orphan as the recompute does.
	dead2 := connect()
	book("orphan2", 400, dead2.PgConn().PID())
	book("tail", 100, 0) // orphan2 is not the last write before the mark (seq < seq0)
	gone(dead2)
	if _, _, err := f.pub.Invalidate(f.ctx, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.SyncManaged(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := sh.subCores(); got != 11 {
		t.Fatalf("after the re-bootstrap: %d cores, want 11 (8 committed + 2 and 1 pid-less, orphan2 dropped)", got)
	}
	if n := promread.Value(t, reg, "scheduler_accounting_records_reconciled_total", "action", "dropped_orphaned"); n != 2 {
		t.Errorf("dropped_orphaned = %v, want 2", n)
	}
}
