package cuebotemu_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type env struct {
	ctx  context.Context
	pool *pgxpool.Pool
	url  string
	fx   cuebotemu.Fixture
	emu  *cuebotemu.Emulator
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	url := cuebotdb.Database(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &env{ctx: ctx, pool: pool, url: url, fx: cuebotemu.Fixture{Pool: pool}, emu: cuebotemu.New(pool, nil)}
}

// farm is one show with one host, one job, one layer and some frames.
type farm struct {
	show             cuebotemu.ShowRows
	host, job, layer string
	frames           []string
}

func (e *env) farm(t *testing.T, managed bool, frames, maxRetries int) farm {
	t.Helper()
	var f farm
	var err error
	name := "s" + uuid.NewString()[:8]
	if f.show, err = e.fx.Show(e.ctx, name, managed, cuebot.SeedAllocLocalGeneral); err != nil {
		t.Fatal(err)
	}
	if f.host, err = e.fx.Host(e.ctx, name+"-h1", cuebot.SeedAllocLocalGeneral, 800, 32<<20, 8); err != nil {
		t.Fatal(err)
	}
	if f.job, err = e.fx.Job(e.ctx, f.show, name+"-job", maxRetries); err != nil {
		t.Fatal(err)
	}
	if f.layer, err = e.fx.Layer(e.ctx, f.job, name+"-render"); err != nil {
		t.Fatal(err)
	}
	if f.frames, err = e.fx.Frames(e.ctx, f.job, f.layer, frames); err != nil {
		t.Fatal(err)
	}
	return f
}

func (e *env) int(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var v int64
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func (e *env) str(t *testing.T, sql string, args ...any) string {
	t.Helper()
	var v string
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// accounting returns the cores of the five accounting rows of the farm.
func (e *env) accounting(t *testing.T, f farm) [5]int64 {
	t.Helper()
	return [5]int64{
		e.int(t, `SELECT int_cores FROM subscription WHERE pk_show = $1 AND pk_alloc = $2`, f.show.ShowID, cuebot.SeedAllocLocalGeneral),
		e.int(t, `SELECT int_cores FROM layer_resource WHERE pk_layer = $1`, f.layer),
		e.int(t, `SELECT int_cores FROM job_resource WHERE pk_job = $1`, f.job),
		e.int(t, `SELECT int_cores FROM folder_resource WHERE pk_folder = $1`, f.show.FolderID),
		e.int(t, `SELECT int_cores FROM point WHERE pk_point = $1`, f.show.PointID),
	}
}

func (e *env) hostIdle(t *testing.T, host string) [4]int64 {
	t.Helper()
	var v [4]int64
	if err := e.pool.QueryRow(e.ctx, `SELECT int_cores_idle, int_mem_idle, int_gpus_idle, int_gpu_mem_idle FROM host WHERE pk_host = $1`, host).Scan(&v[0], &v[1], &v[2], &v[3]); err != nil {
		t.Fatal(err)
	}
	return v
}

func (e *env) book(t *testing.T, f farm, frame string, cores int64) string {
	t.Helper()
	id, err := e.emu.Book(e.ctx, cuebotemu.Booking{FrameID: frame, HostID: f.host, Cores: cores, MemKB: 4 << 20, GPUs: 1, GPUMemKB: 1 << 20})
	if err != nil {
		t.Fatalf("book %s: %v", frame, err)
	}
	return id
}

func TestCompleteUnmanagedShowLikeCuebot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, false, 1, 3)
	idle0 := e.hostIdle(t, f.host)

	proc := e.book(t, f, f.frames[0], 250)
	if got := e.accounting(t, f); got != [5]int64{250, 250, 250, 250, 250} {
		t.Fatalf("accounting after Cuebot booking = %v, want 250 each", got)
	}
	if got := e.hostIdle(t, f.host); got != [4]int64{idle0[0] - 250, idle0[1] - 4<<20, idle0[2] - 1, idle0[3] - 1<<20} {
		t.Fatalf("host idle after booking = %v (was %v)", got, idle0)
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, f.frames[0]); got != "RUNNING" {
		t.Fatalf("frame state after booking = %s", got)
	}
	if got := e.int(t, `SELECT int_running_count FROM layer_stat WHERE pk_layer = $1`, f.layer); got != 1 {
		t.Fatalf("layer_stat running = %d", got)
	}
	time.Sleep(1100 * time.Millisecond) // a measurable clock for the usage counters

	out, err := e.emu.CompleteOutcome(e.ctx, cuebotemu.Completion{FrameID: f.frames[0], ProcID: proc, ExitStatus: 0, MaxRSSKB: 123456, RunTime: time.Second})
	if err != nil || out != cuebotemu.Completed {
		t.Fatalf("Complete = %v, %v", out, err)
	}

	var state string
	var exit, version, maxRSS, coreTime int64
	var stopped *time.Time
	if err := e.pool.QueryRow(e.ctx, `SELECT str_state, int_exit_status, int_version, int_mem_max_used, int_total_past_core_time, ts_stopped FROM frame WHERE pk_frame = $1`, f.frames[0]).
		Scan(&state, &exit, &version, &maxRSS, &coreTime, &stopped); err != nil {
		t.Fatal(err)
	}
	if state != "SUCCEEDED" || exit != 0 || version != 2 || maxRSS != 123456 || stopped == nil || coreTime < 2 {
		t.Fatalf("frame = %s exit=%d version=%d maxrss=%d coretime=%d stopped=%v", state, exit, version, maxRSS, coreTime, stopped)
	}
	if n := e.int(t, `SELECT count(*) FROM proc WHERE pk_proc = $1`, proc); n != 0 {
		t.Fatal("proc still exists")
	}
	if got := e.hostIdle(t, f.host); got != idle0 {
		t.Fatalf("host idle after release = %v, want %v", got, idle0)
	}
	if got := e.accounting(t, f); got != [5]int64{} {
		t.Fatalf("accounting after release = %v, want zeros (Cuebot decrements for unmanaged shows)", got)
	}
	if got := e.int(t, `SELECT int_gpus FROM subscription WHERE pk_show = $1`, f.show.ShowID); got != 0 {
		t.Fatalf("subscription gpus = %d", got)
	}
	checks := map[string]int64{
		`SELECT int_succeeded_count FROM layer_stat WHERE pk_layer = $1`:      1,
		`SELECT int_running_count FROM layer_stat WHERE pk_layer = $1`:        0,
		`SELECT int_frame_success_count FROM layer_usage WHERE pk_layer = $1`: 1,
		`SELECT int_max_rss FROM layer_mem WHERE pk_layer = $1`:               123456,
	}
	for q, want := range checks {
		if got := e.int(t, q, f.layer); got != want {
			t.Errorf("%s = %d, want %d", q, got, want)
		}
	}
	jobChecks := map[string]int64{
		`SELECT int_succeeded_count FROM job_stat WHERE pk_job = $1`:      1,
		`SELECT int_frame_success_count FROM job_usage WHERE pk_job = $1`: 1,
		`SELECT int_max_rss FROM job_mem WHERE pk_job = $1`:               123456,
	}
	for q, want := range jobChecks {
		if got := e.int(t, q, f.job); got != want {
			t.Errorf("%s = %d, want %d", q, got, want)
		}
	}
	if got := e.int(t, `SELECT int_clock_time_success FROM job_usage WHERE pk_job = $1`, f.job); got < 1 {
		t.Errorf("job clock time = %d", got)
	}
	if got := e.int(t, `SELECT int_clock_time_low FROM layer_usage WHERE pk_layer = $1`, f.layer); got < 1 {
		t.Errorf("layer clock time low = %d", got)
	}
	if got := e.int(t, `SELECT int_frame_success_count FROM show_stats WHERE pk_show = $1`, f.show.ShowID); got != 1 {
		t.Errorf("show_stats success = %d", got)
	}
	// The only frame succeeded: the job shuts down.
	if got := e.str(t, `SELECT str_state FROM job WHERE pk_job = $1`, f.job); got != "FINISHED" {
		t.Errorf("job state = %s, want FINISHED", got)
	}
	if got := e.int(t, `SELECT count(*) FROM frame_history WHERE pk_frame = $1 AND int_ts_stopped > 0`, f.frames[0]); got != 1 {
		t.Errorf("closed frame_history rows = %d", got)
	}
	if s := e.emu.Stats(); s.Completed != 1 || s.Released != 1 || s.Booked != 1 {
		t.Errorf("stats = %+v", s)
	}
}

// bookLikeDispatcher books a frame of a scheduler-managed show with plain
// SQL, as cuesched's dispatcher does: frame guarded by version and WAITING,
// proc INSERT, host idle decrement; no accounting tables.
func bookLikeDispatcher(t *testing.T, e *env, f farm, frame string, cores int64) string {
	t.Helper()
	proc := uuid.NewString()
	err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(e.ctx, `UPDATE frame SET str_state = 'RUNNING', str_host = (SELECT str_name FROM host WHERE pk_host = $2),
			int_cores = $3, int_mem_reserved = 1048576, ts_started = now(), ts_updated = now(), int_version = int_version + 1
			WHERE pk_frame = $1 AND str_state = 'WAITING' AND int_version = 0`, frame, f.host, cores)
		if err != nil || tag.RowsAffected() != 1 {
			return fmt.Errorf("frame update: %v (%d rows)", err, tag.RowsAffected())
		}
		if _, err := tx.Exec(e.ctx, `INSERT INTO proc (pk_proc, pk_host, pk_show, pk_layer, pk_job, pk_frame, int_cores_reserved, int_mem_reserved)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 1048576)`, proc, f.host, f.show.ShowID, f.layer, f.job, frame, cores); err != nil {
			return err
		}
		_, err = tx.Exec(e.ctx, `UPDATE host SET int_cores_idle = int_cores_idle - $2, int_mem_idle = int_mem_idle - 1048576 WHERE pk_host = $1 AND int_cores_idle >= $2`, f.host, cores)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return proc
}

func TestCompleteManagedShowOnlyDeletesProc(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, true, 2, 3)
	idle0 := e.hostIdle(t, f.host)

	// Listen for Cuebot's NOTIFY on a dedicated connection.
	conn, err := pgx.Connect(e.ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(e.ctx)
	if _, err := conn.Exec(e.ctx, `LISTEN acct_release`); err != nil {
		t.Fatal(err)
	}

	proc := bookLikeDispatcher(t, e, f, f.frames[0], 250)
	if err := e.emu.Complete(e.ctx, cuebotemu.Completion{FrameID: f.frames[0], ProcID: proc, ExitStatus: 0, MaxRSSKB: 10}); err != nil {
		t.Fatal(err)
	}
	if got := e.hostIdle(t, f.host); got != idle0 {
		t.Fatalf("host idle = %v, want %v", got, idle0)
	}
	if n := e.int(t, `SELECT count(*) FROM proc`); n != 0 {
		t.Fatalf("%d procs left", n)
	}
	// The accounting tables of a managed show are not Cuebot's to change:
	// they stay at what the recompute wrote (0 here), never go negative.
	if got := e.accounting(t, f); got != [5]int64{} {
		t.Fatalf("accounting of managed show changed: %v", got)
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, f.frames[0]); got != "SUCCEEDED" {
		t.Fatalf("frame state %s", got)
	}
	if got := e.str(t, `SELECT str_state FROM job WHERE pk_job = $1`, f.job); got != "PENDING" {
		t.Fatalf("job with a waiting frame left is %s", got)
	}
	wctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil {
		t.Fatalf("no acct_release notification: %v", err)
	}
	var payload map[string]any
	if err := json.Unmarshal([]byte(n.Payload), &payload); err != nil {
		t.Fatalf("payload %q: %v", n.Payload, err)
	}
	want := map[string]any{"show": f.show.ShowID, "alloc": cuebot.SeedAllocLocalGeneral, "folder": f.show.FolderID,
		"job": f.job, "layer": f.layer, "dept": f.show.DeptID, "cores": float64(-2), "gpus": float64(0)}
	for k, v := range want {
		if payload[k] != v {
			t.Errorf("payload[%s] = %v, want %v (payload %s)", k, payload[k], v, n.Payload)
		}
	}
}

func TestFailedFramesRetryThenDie(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, false, 1, 1) // one retry
	frame := f.frames[0]

	proc := e.book(t, f, frame, 100)
	if err := e.emu.Complete(e.ctx, cuebotemu.Completion{FrameID: frame, ProcID: proc, ExitStatus: 1}); err != nil {
		t.Fatal(err)
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, frame); got != "WAITING" {
		t.Fatalf("first failure: state %s, want WAITING (retries remain)", got)
	}
	proc = e.book(t, f, frame, 100)
	if got := e.int(t, `SELECT int_retries FROM frame WHERE pk_frame = $1`, frame); got != 1 {
		t.Fatalf("retries after second start = %d, want 1", got)
	}
	if err := e.emu.Complete(e.ctx, cuebotemu.Completion{FrameID: frame, ProcID: proc, ExitStatus: 1}); err != nil {
		t.Fatal(err)
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, frame); got != "DEAD" {
		t.Fatalf("second failure: state %s, want DEAD", got)
	}
	if got := e.int(t, `SELECT int_exit_status FROM frame WHERE pk_frame = $1`, frame); got != 1 {
		t.Fatalf("exit status %d", got)
	}
	if got := e.int(t, `SELECT int_frame_fail_count FROM show_stats WHERE pk_show = $1`, f.show.ShowID); got != 2 {
		t.Fatalf("show_stats fail = %d", got)
	}
	if got := e.int(t, `SELECT int_frame_fail_count FROM job_usage WHERE pk_job = $1`, f.job); got != 2 {
		t.Fatalf("job_usage fail = %d", got)
	}
	if got := e.int(t, `SELECT int_dead_count FROM layer_stat WHERE pk_layer = $1`, f.layer); got != 1 {
		t.Fatalf("layer_stat dead = %d", got)
	}
	if got := e.accounting(t, f); got != [5]int64{} {
		t.Fatalf("accounting = %v", got)
	}
	// A dead frame keeps the job from finishing.
	if got := e.str(t, `SELECT str_state FROM job WHERE pk_job = $1`, f.job); got != "PENDING" {
		t.Fatalf("job state %s", got)
	}
}

func TestMemoryFailureRetriesPastMax(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, false, 1, 0) // no retries at all
	proc := e.book(t, f, f.frames[0], 100)
	if err := e.emu.Complete(e.ctx, cuebotemu.Completion{FrameID: f.frames[0], ProcID: proc, ExitStatus: 1, ExitSignal: 33}); err != nil {
		t.Fatal(err)
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, f.frames[0]); got != "WAITING" {
		t.Fatalf("OOM frame state %s, want WAITING", got)
	}
}

// TestMemoryGuardKill: Cuebot's memory guard marks the frame 33 before the
// kill, RQD reports an ordinary kill (status 1, signal 9): the frame is
// retried past its retries, keeps 33, and its max RSS reaches the frame and
// layer_mem.
func TestMemoryGuardKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, false, 1, 0) // no retries at all
	proc := e.book(t, f, f.frames[0], 100)
	if ok, err := e.emu.MarkMemoryKill(e.ctx, f.frames[0]); err != nil || !ok {
		t.Fatalf("mark memory kill: %v %v", ok, err)
	}
	const rss = 9 << 20
	if err := e.emu.Complete(e.ctx, cuebotemu.Completion{FrameID: f.frames[0], ProcID: proc, ExitStatus: 1, ExitSignal: 9, MaxRSSKB: rss}); err != nil {
		t.Fatal(err)
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, f.frames[0]); got != "WAITING" {
		t.Fatalf("memory-killed frame state %s, want WAITING", got)
	}
	if got := e.int(t, `SELECT int_exit_status FROM frame WHERE pk_frame = $1`, f.frames[0]); got != cuebotemu.ExitMemoryFailure {
		t.Fatalf("exit status %d, want 33", got)
	}
	if got := e.int(t, `SELECT int_mem_max_used FROM frame WHERE pk_frame = $1`, f.frames[0]); got != rss {
		t.Fatalf("int_mem_max_used %d", got)
	}
	if got := e.int(t, `SELECT int_max_rss FROM layer_mem WHERE pk_layer = $1`, f.layer); got != rss {
		t.Fatalf("layer_mem.int_max_rss %d", got)
	}
}

func TestStaleAndOrphanReports(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, false, 2, 3)
	proc := e.book(t, f, f.frames[0], 100)

	// A report naming a proc that does not exist, for a frame that another
	// proc runs: orphan path, nothing changes.
	out, err := e.emu.CompleteOutcome(e.ctx, cuebotemu.Completion{FrameID: f.frames[0], ProcID: uuid.NewString(), ExitStatus: 0})
	if err != nil || out != cuebotemu.Orphan {
		t.Fatalf("orphan report: %v %v", out, err)
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, f.frames[0]); got != "RUNNING" {
		t.Fatalf("frame state %s after orphan report for a frame with a proc", got)
	}
	// A report for another frame than the proc runs: dropped.
	out, err = e.emu.CompleteOutcome(e.ctx, cuebotemu.Completion{FrameID: f.frames[1], ProcID: proc, ExitStatus: 0})
	if err != nil || out != cuebotemu.Stale {
		t.Fatalf("duplicate report: %v %v", out, err)
	}
	if n := e.int(t, `SELECT count(*) FROM proc WHERE pk_proc = $1`, proc); n != 1 {
		t.Fatal("a stale report released a proc that runs another frame")
	}
	// The real report, then a resend of it: the second is an orphan no-op.
	c := cuebotemu.Completion{FrameID: f.frames[0], ProcID: proc, ExitStatus: 0}
	if err := e.emu.Complete(e.ctx, c); err != nil {
		t.Fatal(err)
	}
	v := e.int(t, `SELECT int_version FROM frame WHERE pk_frame = $1`, f.frames[0])
	if out, err := e.emu.CompleteOutcome(e.ctx, c); err != nil || out != cuebotemu.Orphan {
		t.Fatalf("resent report: %v %v", out, err)
	}
	if got := e.int(t, `SELECT int_version FROM frame WHERE pk_frame = $1`, f.frames[0]); got != v {
		t.Fatal("resent report changed the frame")
	}
	// A frame RUNNING without any proc (proc lost): the orphan path stops it.
	proc2 := e.book(t, f, f.frames[1], 100)
	if _, err := e.pool.Exec(e.ctx, `UPDATE proc SET pk_frame = NULL WHERE pk_proc = $1`, proc2); err != nil {
		t.Fatal(err)
	}
	if err := e.emu.Release(e.ctx, proc2); err != nil {
		t.Fatal(err)
	}
	if out, err := e.emu.CompleteOutcome(e.ctx, cuebotemu.Completion{FrameID: f.frames[1], ProcID: proc2, ExitStatus: 0}); err != nil || out != cuebotemu.Orphan {
		t.Fatalf("orphan: %v %v", out, err)
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, f.frames[1]); got != "SUCCEEDED" {
		t.Fatalf("orphaned frame state %s", got)
	}
	if got := e.accounting(t, f); got != [5]int64{} {
		t.Fatalf("accounting = %v", got)
	}
	if err := e.emu.Release(e.ctx, proc2); !errors.Is(err, cuebotemu.ErrNotFound) {
		t.Fatalf("release of a gone proc: %v", err)
	}
}

func TestKillFrameAndHostDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, false, 3, 3)
	idle0 := e.hostIdle(t, f.host)
	for _, fr := range f.frames {
		e.book(t, f, fr, 200)
	}
	if err := e.emu.KillFrame(e.ctx, f.frames[0]); err != nil {
		t.Fatal(err)
	}
	if got := e.str(t, `SELECT str_state || ':' || int_exit_status FROM frame WHERE pk_frame = $1`, f.frames[0]); got != "WAITING:299" {
		t.Fatalf("killed frame = %s", got)
	}
	if err := e.emu.KillFrame(e.ctx, f.frames[0]); !errors.Is(err, cuebotemu.ErrNotFound) {
		t.Fatalf("second kill: %v", err)
	}
	n, err := e.emu.HostDown(e.ctx, e.str(t, `SELECT str_name FROM host WHERE pk_host = $1`, f.host))
	if err != nil || n != 2 {
		t.Fatalf("HostDown = %d, %v", n, err)
	}
	for _, fr := range f.frames[1:] {
		if got := e.str(t, `SELECT str_state || ':' || int_exit_status FROM frame WHERE pk_frame = $1`, fr); got != "WAITING:399" {
			t.Fatalf("frame of down host = %s", got)
		}
	}
	if got := e.str(t, `SELECT str_state FROM host_stat WHERE pk_host = $1`, f.host); got != "DOWN" {
		t.Fatalf("host_stat %s", got)
	}
	if got := e.hostIdle(t, f.host); got != idle0 {
		t.Fatalf("host idle %v, want %v", got, idle0)
	}
	if got := e.accounting(t, f); got != [5]int64{} {
		t.Fatalf("accounting %v", got)
	}
	if got := e.int(t, `SELECT int_waiting_count FROM job_stat WHERE pk_job = $1`, f.job); got != 3 {
		t.Fatalf("job_stat waiting %d", got)
	}
}

func TestBookRespectsCuebotTriggers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, false, 2, 3)
	// More cores than the host has idle: verify_host_resources refuses and
	// nothing is left behind.
	_, err := e.emu.Book(e.ctx, cuebotemu.Booking{FrameID: f.frames[0], HostID: f.host, Cores: 900, MemKB: 1})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "P0001" {
		t.Fatalf("over-booking error = %v, want P0001", err)
	}
	if n := e.int(t, `SELECT count(*) FROM proc`); n != 0 {
		t.Fatal("failed booking left a proc")
	}
	if got := e.str(t, `SELECT str_state FROM frame WHERE pk_frame = $1`, f.frames[0]); got != "WAITING" {
		t.Fatalf("frame %s", got)
	}
	e.book(t, f, f.frames[0], 100)
	if _, err := e.emu.Book(e.ctx, cuebotemu.Booking{FrameID: f.frames[0], HostID: f.host, Cores: 100}); !errors.Is(err, cuebotemu.ErrFrameNotWaiting) {
		t.Fatalf("double booking: %v", err)
	}
}

func TestFakeRQDCallbackCompletesFrames(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.farm(t, false, 5, 3)
	idle0 := e.hostIdle(t, f.host)
	errs := make(chan error, 10)
	fake, err := fakerqd.Start(fakerqd.Config{
		Default:    fakerqd.Behavior{RunTime: 20 * time.Millisecond},
		OnComplete: e.emu.FakeRQDCallback(e.ctx, func(_ fakerqd.FrameCompletion, err error) { errs <- err }),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	conn, err := grpc.NewClient(fake.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rqdpb.NewRqdInterfaceClient(conn)
	hostName := e.str(t, `SELECT str_name FROM host WHERE pk_host = $1`, f.host)
	for i, fr := range f.frames {
		proc := e.book(t, f, fr, 100)
		rf := &rqdpb.RunFrame{ResourceId: proc, JobId: f.job, JobName: "job", FrameId: fr, FrameName: fmt.Sprintf("%04d-render", i+1),
			LayerId: f.layer, Command: "true", UserName: "tester", NumCores: 100, HardMemoryLimit: 2 << 20, SoftMemoryLimit: 1 << 20}
		if _, err := client.LaunchFrame(fakerqd.WithHost(e.ctx, hostName), &rqdpb.RqdStaticLaunchFrameRequest{RunFrame: rf}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for e.int(t, `SELECT count(*) FROM frame WHERE pk_job = $1 AND str_state = 'SUCCEEDED'`, f.job) != 5 ||
		e.int(t, `SELECT count(*) FROM proc`) != 0 || e.str(t, `SELECT str_state FROM job WHERE pk_job = $1`, f.job) != "FINISHED" {
		select {
		case err := <-errs:
			t.Fatalf("completion error: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("frames did not complete")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.hostIdle(t, f.host); got != idle0 {
		t.Fatalf("host idle %v, want %v", got, idle0)
	}
	if got := e.str(t, `SELECT str_state FROM job WHERE pk_job = $1`, f.job); got != "FINISHED" {
		t.Fatalf("job %s", got)
	}
}
