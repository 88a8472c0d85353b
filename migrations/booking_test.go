package migrations_test

// These tests replay, with plain SQL, what Cuebot (and a scheduler that
// books like it) writes when it books and releases a frame, and check that
// the baseline's triggers have Cuebot's side effects and refusals.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/jackc/pgx/v5"
)

const (
	jobID   = "job-1"
	layerID = "layer-1"
	hostID  = "host-1"
	hostNm  = "render01"
)

func frameID(n int) string { return "frame-" + string(rune('0'+n)) }

// farm is a migrated database with one activated job (one layer, three
// WAITING frames, 1 core / 4 GB each) in show "testing", and one open,
// UP 8-core 16 GB host in local.general.
func farm(t *testing.T) *pgx.Conn {
	t.Helper()
	conn := connect(t, schemaDB(t))
	exec(t, conn, `INSERT INTO job (pk_job, pk_folder, pk_show, str_name, str_visible_name, str_shot, str_user,
	                                str_state, pk_facility, pk_dept)
	               VALUES ($1, $2, $3, 'testing-sh01-bob_job', 'testing-sh01-bob_job', 'sh01', 'bob', 'STARTUP', $4, $5)`,
		jobID, cuebot.SeedFolderTesting, cuebot.SeedShowTesting, cuebot.SeedFacilityLocal, cuebot.SeedDeptPipeline)
	exec(t, conn, `INSERT INTO layer (pk_layer, pk_job, str_name, str_cmd, str_range, str_type, str_tags)
	               VALUES ($1, $2, 'render', 'echo hi', '1-3', 'RENDER', 'general | desktop')`, layerID, jobID)
	for i := 1; i <= 3; i++ {
		exec(t, conn, `INSERT INTO frame (pk_frame, pk_layer, pk_job, str_name, str_state, int_number,
		                                  int_dispatch_order, int_layer_order, ts_updated, ts_llu)
		               VALUES ($1, $2, $3, $4, 'SETUP', $5, $6, 1, now(), now())`,
			frameID(i), layerID, jobID, "000"+string(rune('0'+i))+"-render", i, i-1)
	}
	// Activation, as Cuebot's activateJob does it.
	exec(t, conn, `UPDATE frame SET str_state = 'WAITING' WHERE pk_job = $1 AND str_state = 'SETUP'`, jobID)
	exec(t, conn, `UPDATE layer_stat SET int_waiting_count = 3, int_total_count = int_total_count + 3 WHERE pk_layer = $1`, layerID)
	exec(t, conn, `UPDATE job_stat SET int_waiting_count = 3 WHERE pk_job = $1`, jobID)
	exec(t, conn, `UPDATE job SET str_state = 'PENDING', int_frame_count = 3, int_layer_count = 1 WHERE pk_job = $1`, jobID)

	exec(t, conn, `INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_cores_idle,
	                                 int_mem, int_mem_idle, int_procs)
	               VALUES ($1, $2, $3, 'OPEN', 800, 800, $4, $4, 1)`, hostID, cuebot.SeedAllocLocalGeneral, hostNm, 16*cuebot.GB)
	exec(t, conn, `INSERT INTO host_stat (pk_host_stat, pk_host, int_mem_total, int_mem_free, str_os)
	               VALUES ($1, $1, $2, $2, 'linux')`, hostID, 16*cuebot.GB)
	exec(t, conn, `INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type, b_constant)
	               VALUES ('tag-1', $1, 'general', 'ALLOC', true), ('tag-2', $1, 'beefy', 'MANUAL', false)`, hostID)
	return conn
}

type booking struct {
	proc, frame       string
	cores, mem, gpus  int64
	gpuMem, frameVers int64
}

// book does Cuebot's booking transaction (startFrameAndProc + procCreated)
// for a Cuebot-managed show.
func book(ctx context.Context, conn *pgx.Conn, b booking) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			UPDATE frame SET str_state = 'RUNNING', str_host = $2, int_cores = $3, int_mem_reserved = $4,
			       int_gpus = $5, int_gpu_mem_reserved = $6, ts_updated = now(), ts_started = now(),
			       ts_stopped = NULL, int_version = int_version + 1
			 WHERE pk_frame = $1 AND str_state = 'WAITING' AND int_version = $7`,
			b.frame, hostNm, b.cores, b.mem, b.gpus, b.gpuMem, b.frameVers)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errLostRace
		}
		args := pgx.NamedArgs{"proc": b.proc, "host": hostID, "frame": b.frame,
			"cores": b.cores, "mem": b.mem, "gpus": b.gpus, "gpumem": b.gpuMem}
		steps := []string{
			`INSERT INTO proc (pk_proc, pk_host, pk_show, pk_layer, pk_job, pk_frame, int_cores_reserved,
			                   int_mem_reserved, int_mem_pre_reserved, int_mem_used, int_gpus_reserved,
			                   int_gpu_mem_reserved, int_gpu_mem_pre_reserved, b_local)
			 SELECT @proc, @host, j.pk_show, f.pk_layer, f.pk_job, f.pk_frame, @cores, @mem, @mem, 262144,
			        @gpus, @gpumem, @gpumem, false
			   FROM frame f JOIN job j ON j.pk_job = f.pk_job WHERE f.pk_frame = @frame`,
			`UPDATE host SET int_cores_idle = int_cores_idle - @cores, int_mem_idle = int_mem_idle - @mem,
			        int_gpus_idle = int_gpus_idle - @gpus, int_gpu_mem_idle = int_gpu_mem_idle - @gpumem
			  WHERE pk_host = @host`,
			`UPDATE subscription SET int_cores = int_cores + @cores, int_gpus = int_gpus + @gpus
			  WHERE pk_show = (SELECT pk_show FROM proc WHERE pk_proc = @proc)
			    AND pk_alloc = (SELECT pk_alloc FROM host WHERE pk_host = @host)`,
			`UPDATE layer_resource SET int_cores = int_cores + @cores, int_gpus = int_gpus + @gpus
			  WHERE pk_layer = (SELECT pk_layer FROM proc WHERE pk_proc = @proc)`,
			`UPDATE job_resource SET int_cores = int_cores + @cores, int_gpus = int_gpus + @gpus
			  WHERE pk_job = (SELECT pk_job FROM proc WHERE pk_proc = @proc)`,
			`UPDATE folder_resource SET int_cores = int_cores + @cores, int_gpus = int_gpus + @gpus
			  WHERE pk_folder = (SELECT j.pk_folder FROM proc p JOIN job j ON j.pk_job = p.pk_job WHERE p.pk_proc = @proc)`,
			`UPDATE point SET int_cores = int_cores + @cores, int_gpus = int_gpus + @gpus
			  WHERE (pk_dept, pk_show) = (SELECT j.pk_dept, j.pk_show FROM proc p JOIN job j ON j.pk_job = p.pk_job WHERE p.pk_proc = @proc)`,
		}
		for _, s := range steps {
			if _, err := tx.Exec(ctx, s, args); err != nil {
				return err
			}
		}
		return nil
	})
}

type lostRace struct{}

func (lostRace) Error() string { return "frame no longer WAITING at the expected version" }

var errLostRace error = lostRace{}

// release does Cuebot's frame completion (stopFrame) and unbookProc for a
// Cuebot-managed show, in its two transactions.
func release(ctx context.Context, conn *pgx.Conn, b booking, state cuebot.FrameState, exit int) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			UPDATE frame SET str_state = $2, int_exit_status = $3, ts_stopped = now() + interval '1 second',
			       ts_updated = now(), int_mem_max_used = 1048576, int_version = int_version + 1
			 WHERE pk_frame = $1 AND str_state = 'RUNNING'`, b.frame, string(state), exit)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errLostRace
		}
		_, err = tx.Exec(ctx, `UPDATE proc SET pk_frame = NULL WHERE pk_frame = $1`, b.frame)
		return err
	})
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var show, layer, job string
		var cores, mem, gpus, gpuMem int64
		err := tx.QueryRow(ctx, `DELETE FROM proc WHERE pk_proc = $1
			RETURNING pk_show, pk_layer, pk_job, int_cores_reserved, int_mem_reserved, int_gpus_reserved, int_gpu_mem_reserved`,
			b.proc).Scan(&show, &layer, &job, &cores, &mem, &gpus, &gpuMem)
		if err != nil {
			return err
		}
		steps := []struct {
			sql  string
			args []any
		}{
			{`UPDATE host SET int_cores_idle = int_cores_idle + $2, int_mem_idle = int_mem_idle + $3,
			         int_gpus_idle = int_gpus_idle + $4, int_gpu_mem_idle = int_gpu_mem_idle + $5 WHERE pk_host = $1`,
				[]any{hostID, cores, mem, gpus, gpuMem}},
			{`UPDATE subscription SET int_cores = int_cores - $3, int_gpus = int_gpus - $4
			   WHERE pk_show = $1 AND pk_alloc = (SELECT pk_alloc FROM host WHERE pk_host = $2)`,
				[]any{show, hostID, cores, gpus}},
			{`UPDATE layer_resource SET int_cores = int_cores - $2, int_gpus = int_gpus - $3 WHERE pk_layer = $1`,
				[]any{layer, cores, gpus}},
			{`UPDATE job_resource SET int_cores = int_cores - $2, int_gpus = int_gpus - $3 WHERE pk_job = $1`,
				[]any{job, cores, gpus}},
			{`UPDATE folder_resource SET int_cores = int_cores - $2, int_gpus = int_gpus - $3
			   WHERE pk_folder = (SELECT pk_folder FROM job WHERE pk_job = $1)`, []any{job, cores, gpus}},
			{`UPDATE point SET int_cores = int_cores - $2, int_gpus = int_gpus - $3
			   WHERE (pk_dept, pk_show) = (SELECT pk_dept, pk_show FROM job WHERE pk_job = $1)`, []any{job, cores, gpus}},
		}
		for _, s := range steps {
			if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
				return err
			}
		}
		return nil
	})
}

// counts returns waiting, running, succeeded, dead, depend counts of the
// layer and of the job.
func counts(t *testing.T, conn *pgx.Conn) (layer, job [5]int64) {
	t.Helper()
	ctx := context.Background()
	if err := conn.QueryRow(ctx, `SELECT int_waiting_count, int_running_count, int_succeeded_count, int_dead_count, int_depend_count
		FROM layer_stat WHERE pk_layer = $1`, layerID).Scan(&layer[0], &layer[1], &layer[2], &layer[3], &layer[4]); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT int_waiting_count, int_running_count, int_succeeded_count, int_dead_count, int_depend_count
		FROM job_stat WHERE pk_job = $1`, jobID).Scan(&job[0], &job[1], &job[2], &job[3], &job[4]); err != nil {
		t.Fatal(err)
	}
	return layer, job
}

func wantCounts(t *testing.T, conn *pgx.Conn, want [5]int64) {
	t.Helper()
	l, j := counts(t, conn)
	if l != want || j != want {
		t.Fatalf("counts (waiting, running, succeeded, dead, depend): layer_stat %v, job_stat %v, want %v", l, j, want)
	}
}

type accounting struct {
	hostCores, hostMem, sub, layer, job, folder, point int64
	subTier, jobTier, folderTier, pointTier            float64
}

func readAccounting(t *testing.T, conn *pgx.Conn) accounting {
	t.Helper()
	var a accounting
	err := conn.QueryRow(context.Background(), `
		SELECT h.int_cores_idle, h.int_mem_idle, s.int_cores, lr.int_cores, jr.int_cores, fr.int_cores, p.int_cores,
		       s.float_tier::float8, jr.float_tier::float8, fr.float_tier::float8, p.float_tier::float8
		  FROM host h, subscription s, layer_resource lr, job_resource jr, folder_resource fr, point p
		 WHERE h.pk_host = $1 AND s.pk_subscription = $2 AND lr.pk_layer = $3 AND jr.pk_job = $4
		   AND fr.pk_folder = $5 AND p.pk_point = $6`,
		hostID, cuebot.SeedSubLocalGeneral, layerID, jobID, cuebot.SeedFolderTesting, cuebot.SeedPointTesting).Scan(
		&a.hostCores, &a.hostMem, &a.sub, &a.layer, &a.job, &a.folder, &a.point,
		&a.subTier, &a.jobTier, &a.folderTier, &a.pointTier)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The full cycle: WAITING -> RUNNING -> SUCCEEDED with Cuebot's writes.
func TestBookingAndReleaseTriggerEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := farm(t)

	// Insert triggers created the child rows, keyed by the parent's id.
	for _, q := range []string{
		`SELECT count(*) FROM job_stat WHERE pk_job_stat = 'job-1' AND pk_job = 'job-1'`,
		`SELECT count(*) FROM job_resource WHERE pk_job_resource = 'job-1' AND int_max_cores = 10000 AND int_max_gpus = 100`,
		`SELECT count(*) FROM job_usage WHERE pk_job_usage = 'job-1'`,
		`SELECT count(*) FROM job_mem WHERE pk_job_mem = 'job-1'`,
		`SELECT count(*) FROM job_history WHERE pk_job = 'job-1' AND int_ts_started > 0 AND dt_last_modified = current_date`,
		`SELECT count(*) FROM layer_stat WHERE pk_layer_stat = 'layer-1' AND int_total_count = 3`,
		`SELECT count(*) FROM layer_resource WHERE pk_layer_resource = 'layer-1'`,
		`SELECT count(*) FROM layer_usage WHERE pk_layer_usage = 'layer-1'`,
		`SELECT count(*) FROM layer_mem WHERE pk_layer_mem = 'layer-1'`,
		`SELECT count(*) FROM layer_history WHERE pk_layer = 'layer-1' AND str_type = 'RENDER'`,
		`SELECT count(*) FROM frame WHERE pk_job = 'job-1' AND str_state = 'WAITING' AND ts_eligible IS NOT NULL AND int_version = 0`,
		`SELECT count(*) FROM vs_waiting WHERE pk_show = '00000000-0000-0000-0000-000000000000'`,
	} {
		var n int
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil || n != 1 && !strings.Contains(q, "FROM frame") || strings.Contains(q, "FROM frame") && n != 3 {
			t.Fatalf("%s: %d (%v)", q, n, err)
		}
	}
	wantCounts(t, conn, [5]int64{3, 0, 0, 0, 0})

	b := booking{proc: "proc-1", frame: frameID(1), cores: 100, mem: 4 * cuebot.GB}
	if err := book(ctx, conn, b); err != nil {
		t.Fatalf("booking: %v", err)
	}
	wantCounts(t, conn, [5]int64{2, 1, 0, 0, 0})
	a := readAccounting(t, conn)
	if a.hostCores != 700 || a.hostMem != 12*cuebot.GB || a.sub != 100 || a.layer != 100 || a.job != 100 || a.folder != 100 || a.point != 100 {
		t.Fatalf("after booking: %+v", a)
	}
	// tier(100, size 100000) = 0.001 -> 0.00; tier(100, min 100) = 1; soft tiers with min 0 = 1.
	if a.subTier != 0 || a.jobTier != 1 || a.folderTier != 1 || a.pointTier != 1 {
		t.Fatalf("tiers after booking: %+v", a)
	}
	var histState, histHost, histAlloc string
	var started, stopped int64
	if err := conn.QueryRow(ctx, `SELECT str_state, str_host, pk_alloc, int_ts_started, int_ts_stopped FROM frame_history WHERE pk_frame = $1`,
		b.frame).Scan(&histState, &histHost, &histAlloc, &started, &stopped); err != nil {
		t.Fatalf("frame_history row: %v", err)
	}
	if histState != "RUNNING" || histHost != hostNm || histAlloc != cuebot.SeedAllocLocalGeneral || started == 0 || stopped != 0 {
		t.Fatalf("open frame_history row: %s %s %s %d %d", histState, histHost, histAlloc, started, stopped)
	}
	var lsStarted *time.Time
	if err := conn.QueryRow(ctx, `SELECT ts_started FROM layer_stat WHERE pk_layer = $1`, layerID).Scan(&lsStarted); err != nil || lsStarted == nil {
		t.Fatalf("layer_stat.ts_started not stamped: %v", err)
	}

	// A proc DELETE alone gives nothing back: there is no trigger on it.
	if err := release(ctx, conn, b, cuebot.FrameSucceeded, 0); err != nil {
		t.Fatalf("release: %v", err)
	}
	wantCounts(t, conn, [5]int64{2, 0, 1, 0, 0})
	a = readAccounting(t, conn)
	if a.hostCores != 800 || a.hostMem != 16*cuebot.GB || a.sub != 0 || a.layer != 0 || a.job != 0 || a.folder != 0 || a.point != 0 {
		t.Fatalf("after release: %+v", a)
	}
	if a.subTier != -100000 || a.jobTier != -100 || a.folderTier != 1 {
		t.Fatalf("tiers after release: %+v", a)
	}
	var exit int
	if err := conn.QueryRow(ctx, `SELECT str_state, int_exit_status, int_ts_stopped FROM frame_history WHERE pk_frame = $1`,
		b.frame).Scan(&histState, &exit, &stopped); err != nil || histState != "RUNNING" || exit != 0 || stopped == 0 {
		t.Fatalf("closed frame_history row: %s exit %d stopped %d (%v)", histState, exit, stopped, err)
	}
	var lsStopped *time.Time
	if err := conn.QueryRow(ctx, `SELECT ts_stopped FROM layer_stat WHERE pk_layer = $1`, layerID).Scan(&lsStopped); err != nil || lsStopped == nil {
		t.Fatalf("layer_stat.ts_stopped not stamped: %v", err)
	}
}

// The non-negative idle check rejects an over-booking and the whole
// booking transaction rolls back.
func TestOverBookingRejectedByHostCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := farm(t)
	if err := book(ctx, conn, booking{proc: "proc-1", frame: frameID(1), cores: 600, mem: 4 * cuebot.GB}); err != nil {
		t.Fatal(err)
	}
	before := readAccounting(t, conn)

	for _, tc := range []struct {
		b   booking
		msg string
	}{
		{booking{proc: "proc-2", frame: frameID(2), cores: 300, mem: cuebot.GB}, "unable to allocate additional core units"},
		{booking{proc: "proc-2", frame: frameID(2), cores: 100, mem: 13 * cuebot.GB}, "unable to allocate additional memory"},
		{booking{proc: "proc-2", frame: frameID(2), cores: 100, mem: cuebot.GB, gpus: 1}, "unable to allocate additional GPU units"},
		{booking{proc: "proc-2", frame: frameID(2), cores: 100, mem: cuebot.GB, gpuMem: 1}, "unable to allocate additional GPU memory"},
		{booking{proc: "proc-2", frame: frameID(2), cores: 0, mem: cuebot.GB}, "failed to allocate proc, tried to allocate 0 cores"},
	} {
		err := book(ctx, conn, tc.b)
		if err == nil {
			t.Fatalf("booking %+v succeeded on a full host", tc.b)
		}
		pe := pgError(t, err)
		if pe.Code != "P0001" || pe.Message != tc.msg {
			t.Fatalf("booking %+v: %s %q, want P0001 %q", tc.b, pe.Code, pe.Message, tc.msg)
		}
		if after := readAccounting(t, conn); after != before {
			t.Fatalf("a refused booking changed accounting: %+v -> %+v", before, after)
		}
		wantCounts(t, conn, [5]int64{2, 1, 0, 0, 0})
	}
	// A second proc for the same frame violates c_proc_uk.
	_, err := conn.Exec(ctx, `INSERT INTO proc (pk_proc, pk_host, pk_frame, int_cores_reserved, int_mem_reserved)
		VALUES ('proc-dup', $1, $2, 100, 1)`, hostID, frameID(1))
	if pe := pgError(t, err); pe.Code != "23505" || pe.ConstraintName != "c_proc_uk" {
		t.Fatalf("duplicate proc: %v", err)
	}
	// The version guard: booking with a stale version updates nothing.
	if err := book(ctx, conn, booking{proc: "proc-3", frame: frameID(2), cores: 100, mem: 1, frameVers: 7}); err != errLostRace {
		t.Fatalf("stale version: %v", err)
	}
}

// Subscription burst and job caps are checked on increments only, with
// Cuebot's messages; the burst bypass used by recalculation works.
func TestSubscriptionAndJobResourceChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := farm(t)
	exec(t, conn, `UPDATE subscription SET int_burst = 150 WHERE pk_subscription = $1`, cuebot.SeedSubLocalGeneral)
	if err := book(ctx, conn, booking{proc: "proc-1", frame: frameID(1), cores: 100, mem: 1}); err != nil {
		t.Fatal(err)
	}
	err := book(ctx, conn, booking{proc: "proc-2", frame: frameID(2), cores: 100, mem: 1})
	if pe := pgError(t, err); pe.Code != "P0001" || pe.Message != "subscription has exceeded burst size" {
		t.Fatalf("over burst: %v", err)
	}
	// Changing burst and cores together bypasses the check.
	exec(t, conn, `UPDATE subscription SET int_cores = 500, int_burst = 500 WHERE pk_subscription = $1`, cuebot.SeedSubLocalGeneral)
	// A decrease is never checked, even below zero.
	exec(t, conn, `UPDATE subscription SET int_burst = 10 WHERE pk_subscription = $1`, cuebot.SeedSubLocalGeneral)
	exec(t, conn, `UPDATE subscription SET int_cores = -5 WHERE pk_subscription = $1`, cuebot.SeedSubLocalGeneral)
	exec(t, conn, `UPDATE subscription SET int_burst = 100000, int_cores = 100 WHERE pk_subscription = $1`, cuebot.SeedSubLocalGeneral)

	exec(t, conn, `UPDATE job_resource SET int_max_cores = 150 WHERE pk_job = $1`, jobID)
	err = book(ctx, conn, booking{proc: "proc-2", frame: frameID(2), cores: 100, mem: 1})
	if pe := pgError(t, err); pe.Message != "job has exceeded max cores" {
		t.Fatalf("over job max cores: %v", err)
	}
	exec(t, conn, `UPDATE job_resource SET int_max_cores = 10000 WHERE pk_job = $1`, jobID)
	_, err = conn.Exec(ctx, `UPDATE job_resource SET int_gpus = 101 WHERE pk_job = $1`, jobID)
	if pe := pgError(t, err); pe.Message != "job has exceeded max GPU units" {
		t.Fatalf("over job max gpus (default 100): %v", err)
	}
	// Raising a cap in the same statement skips the check.
	exec(t, conn, `UPDATE job_resource SET int_gpus = 101, int_max_gpus = 50 WHERE pk_job = $1`, jobID)
	// Folders have no database cap.
	exec(t, conn, `UPDATE folder_resource SET int_max_cores = 1 WHERE pk_folder = $1`, cuebot.SeedFolderTesting)
	exec(t, conn, `UPDATE folder_resource SET int_cores = int_cores + 1000 WHERE pk_folder = $1`, cuebot.SeedFolderTesting)
}

// The frame BEFORE-update rewrites and the history close/delete rules.
func TestFrameStateRewrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := farm(t)
	state := func(f string) (s string, v int) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT str_state, int_version FROM frame WHERE pk_frame = $1`, f).Scan(&s, &v); err != nil {
			t.Fatal(err)
		}
		return s, v
	}

	// WAITING with a dependency becomes DEPEND (version bumped), and back
	// to WAITING when the count drops to 0 (bumped again).
	exec(t, conn, `UPDATE frame SET int_depend_count = 1 WHERE pk_frame = $1`, frameID(3))
	if s, v := state(frameID(3)); s != "DEPEND" || v != 1 {
		t.Fatalf("wait->dep: %s v%d", s, v)
	}
	wantCounts(t, conn, [5]int64{2, 0, 0, 0, 1})
	exec(t, conn, `UPDATE frame SET int_depend_count = 0 WHERE pk_frame = $1`, frameID(3))
	if s, v := state(frameID(3)); s != "WAITING" || v != 2 {
		t.Fatalf("dep->wait: %s v%d", s, v)
	}
	wantCounts(t, conn, [5]int64{3, 0, 0, 0, 0})

	// A checkpointing frame sent back to WAITING becomes CHECKPOINT.
	b := booking{proc: "proc-1", frame: frameID(1), cores: 100, mem: 1}
	if err := book(ctx, conn, b); err != nil {
		t.Fatal(err)
	}
	exec(t, conn, `UPDATE frame SET str_checkpoint_state = 'ENABLED' WHERE pk_frame = $1`, frameID(1))
	if err := release(ctx, conn, b, cuebot.FrameWaiting, 1); err != nil {
		t.Fatal(err)
	}
	if s, _ := state(frameID(1)); s != "CHECKPOINT" {
		t.Fatalf("checkpoint rewrite: %s", s)
	}
	var ckpt int
	if err := conn.QueryRow(ctx, `SELECT int_checkpoint_count FROM frame_history WHERE pk_frame = $1`, frameID(1)).Scan(&ckpt); err != nil || ckpt != 1 {
		t.Fatalf("history checkpoint count %d (%v)", ckpt, err)
	}

	// Exit 299 (cleared) deletes the open history row.
	b2 := booking{proc: "proc-2", frame: frameID(2), cores: 100, mem: 1}
	if err := book(ctx, conn, b2); err != nil {
		t.Fatal(err)
	}
	if err := release(ctx, conn, b2, cuebot.FrameWaiting, cuebot.ExitFrameCleared); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM frame_history WHERE pk_frame = $1`, frameID(2)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("cleared run left %d history rows (%v)", n, err)
	}

	// SUCCEEDED cannot be eaten; nothing can go back to SETUP.
	exec(t, conn, `UPDATE frame SET str_state = 'SUCCEEDED' WHERE pk_frame = $1`, frameID(3))
	exec(t, conn, `UPDATE frame SET str_state = 'EATEN' WHERE pk_frame = $1`, frameID(3))
	if s, _ := state(frameID(3)); s != "SUCCEEDED" {
		t.Fatalf("eaten rewrite: %s", s)
	}
	_, err := conn.Exec(ctx, `UPDATE frame SET str_state = 'SETUP' WHERE pk_frame = $1`, frameID(3))
	if err == nil || !strings.Contains(err.Error(), "int_setup_count") {
		t.Fatalf("transition into SETUP: %v", err)
	}

	// With DISABLE_HISTORY no history row is opened.
	exec(t, conn, `INSERT INTO config (pk_config, str_key) VALUES ('cfg-dh', 'DISABLE_HISTORY')`)
	b3 := booking{proc: "proc-3", frame: frameID(2), cores: 100, mem: 1, frameVers: 2}
	if err := book(ctx, conn, b3); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM frame_history WHERE pk_frame = $1`, frameID(2)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("history written while disabled: %d (%v)", n, err)
	}
}

// Proc update triggers: memory growth charged to the host (and refused
// past zero), layer change moves layer_resource.
func TestProcUpdateTriggers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := farm(t)
	if err := book(ctx, conn, booking{proc: "proc-1", frame: frameID(1), cores: 100, mem: 4 * cuebot.GB}); err != nil {
		t.Fatal(err)
	}
	exec(t, conn, `UPDATE proc SET int_mem_reserved = $2 WHERE pk_proc = $1`, "proc-1", 6*cuebot.GB)
	if a := readAccounting(t, conn); a.hostMem != 10*cuebot.GB {
		t.Fatalf("host idle memory after growing the proc: %d", a.hostMem)
	}
	_, err := conn.Exec(ctx, `UPDATE proc SET int_mem_reserved = $2 WHERE pk_proc = $1`, "proc-1", 17*cuebot.GB)
	if pe := pgError(t, err); pe.Message != "unable to allocate additional memory" {
		t.Fatalf("growing past the host: %v", err)
	}

	exec(t, conn, `INSERT INTO layer (pk_layer, pk_job, str_name, str_cmd, str_range, str_type) VALUES ('layer-2', $1, 'comp', 'c', '1', 'RENDER')`, jobID)
	exec(t, conn, `UPDATE proc SET pk_layer = 'layer-2' WHERE pk_proc = 'proc-1'`)
	var l1, l2 int64
	if err := conn.QueryRow(ctx, `SELECT (SELECT int_cores FROM layer_resource WHERE pk_layer = 'layer-1'),
		(SELECT int_cores FROM layer_resource WHERE pk_layer = 'layer-2')`).Scan(&l1, &l2); err != nil || l1 != 0 || l2 != 100 {
		t.Fatalf("layer move: layer-1 %d layer-2 %d (%v)", l1, l2, err)
	}
}

// Folder, job and host insert/delete triggers.
func TestStructuralTriggers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := farm(t)

	exec(t, conn, `INSERT INTO folder (pk_folder, pk_parent_folder, pk_show, str_name, pk_dept)
		VALUES ('folder-2', $1, $2, 'lighting', $3)`, cuebot.SeedFolderTesting, cuebot.SeedShowTesting, cuebot.SeedDeptPipeline)
	var level int
	var maxCores int64
	var def bool
	if err := conn.QueryRow(ctx, `SELECT fl.int_level, fr.int_max_cores, f.b_default FROM folder f
		JOIN folder_level fl ON fl.pk_folder_level = f.pk_folder JOIN folder_resource fr ON fr.pk_folder_resource = f.pk_folder
		WHERE f.pk_folder = 'folder-2'`).Scan(&level, &maxCores, &def); err != nil || level != 1 || maxCores != cuebot.Unlimited || def {
		t.Fatalf("sub-folder rows: level %d max %d default %v (%v)", level, maxCores, def, err)
	}

	// Moving a job with booked cores moves them between folder_resource rows.
	if err := book(ctx, conn, booking{proc: "proc-1", frame: frameID(1), cores: 200, mem: 1}); err != nil {
		t.Fatal(err)
	}
	exec(t, conn, `UPDATE job SET pk_folder = 'folder-2' WHERE pk_job = $1`, jobID)
	var f1, f2 int64
	if err := conn.QueryRow(ctx, `SELECT (SELECT int_cores FROM folder_resource WHERE pk_folder = $1),
		(SELECT int_cores FROM folder_resource WHERE pk_folder = 'folder-2')`, cuebot.SeedFolderTesting).Scan(&f1, &f2); err != nil || f1 != 0 || f2 != 200 {
		t.Fatalf("after job move: %d / %d (%v)", f1, f2, err)
	}

	// A host with procs cannot be deleted; without, its stat and tags go too.
	if _, err := conn.Exec(ctx, `DELETE FROM host WHERE pk_host = $1`, hostID); err == nil {
		t.Fatal("deleted a host that still has a proc")
	}
	exec(t, conn, `DELETE FROM proc`)
	exec(t, conn, `UPDATE host SET int_cores_idle = int_cores WHERE pk_host = $1`, hostID)
	exec(t, conn, `DELETE FROM host WHERE pk_host = $1`, hostID)
	var n int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM host_stat) + (SELECT count(*) FROM host_tag)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("host delete left %d rows (%v)", n, err)
	}

	// Finishing archives into the history tables; deleting removes all
	// child rows.
	exec(t, conn, `UPDATE job SET str_state = 'FINISHED', str_visible_name = NULL, ts_stopped = now() WHERE pk_job = $1`, jobID)
	var stopped, frames int64
	if err := conn.QueryRow(ctx, `SELECT int_ts_stopped, int_frame_count FROM job_history WHERE pk_job = $1`, jobID).Scan(&stopped, &frames); err != nil || stopped == 0 || frames != 3 {
		t.Fatalf("job_history after finish: stopped %d frames %d (%v)", stopped, frames, err)
	}
	exec(t, conn, `DELETE FROM job WHERE pk_job = $1`, jobID)
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM frame) + (SELECT count(*) FROM layer) + (SELECT count(*) FROM layer_stat)
		+ (SELECT count(*) FROM job_stat) + (SELECT count(*) FROM job_resource) + (SELECT count(*) FROM layer_resource)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("job delete left %d child rows (%v)", n, err)
	}
	var archived bool
	if err := conn.QueryRow(ctx, `SELECT b_archived FROM job_history WHERE pk_job = $1`, jobID).Scan(&archived); err != nil || !archived {
		t.Fatalf("job_history not archived (%v)", err)
	}
}

// recalculate_subs rebuilds Cuebot-managed shows' subscriptions from
// proc and leaves scheduler-managed shows alone; recalculate_tags fills
// host.str_tags.
func TestMaintenanceFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := farm(t)
	if err := book(ctx, conn, booking{proc: "proc-1", frame: frameID(1), cores: 300, mem: 1}); err != nil {
		t.Fatal(err)
	}
	exec(t, conn, `UPDATE subscription SET int_cores = 7, int_burst = 7 WHERE pk_subscription = $1`, cuebot.SeedSubLocalGeneral)
	exec(t, conn, `UPDATE subscription SET int_cores = 9 WHERE pk_subscription = $1`, cuebot.SeedSubCloudGeneral)
	exec(t, conn, `SELECT recalculate_subs()`)
	var general, cloud, burst int64
	q := `SELECT (SELECT int_cores FROM subscription WHERE pk_subscription = $1), (SELECT int_burst FROM subscription WHERE pk_subscription = $1),
	             (SELECT int_cores FROM subscription WHERE pk_subscription = $2)`
	if err := conn.QueryRow(ctx, q, cuebot.SeedSubLocalGeneral, cuebot.SeedSubCloudGeneral).Scan(&general, &burst, &cloud); err != nil ||
		general != 300 || burst != 7 || cloud != 0 {
		t.Fatalf("recalculate_subs: general %d (burst %d) cloud %d (%v)", general, burst, cloud, err)
	}
	exec(t, conn, `UPDATE show SET b_scheduler_managed = true`)
	exec(t, conn, `UPDATE subscription SET int_cores = 42, int_burst = 100000 WHERE pk_subscription = $1`, cuebot.SeedSubLocalGeneral)
	exec(t, conn, `SELECT recalculate_subs()`)
	if err := conn.QueryRow(ctx, q, cuebot.SeedSubLocalGeneral, cuebot.SeedSubCloudGeneral).Scan(&general, &burst, &cloud); err != nil || general != 42 {
		t.Fatalf("recalculate_subs touched a managed show: %d (%v)", general, err)
	}

	exec(t, conn, `SELECT recalculate_tags($1)`, hostID)
	var tags string
	if err := conn.QueryRow(ctx, `SELECT str_tags FROM host WHERE pk_host = $1`, hostID).Scan(&tags); err != nil || tags != "general beefy" {
		t.Fatalf("recalculate_tags: %q (%v)", tags, err)
	}
}
