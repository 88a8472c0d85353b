package cuebotemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Frame states and exit statuses as Cuebot writes them.
const (
	StateWaiting    = "WAITING"
	StateRunning    = "RUNNING"
	StateSucceeded  = "SUCCEEDED"
	StateDead       = "DEAD"
	StateEaten      = "EATEN"
	StateDepend     = "DEPEND"
	StateCheckpoint = "CHECKPOINT"

	ExitFailedLaunch  = 256
	ExitSkipRetry     = 286
	ExitFrameCleared  = 299
	ExitFrameOrphan   = 301
	ExitFailedKill    = 302
	ExitDownHost      = 399
	ExitMemoryFailure = 33
	ExitDockerOOM     = 137

	// frameTimeNoRetry is Cuebot's FRAME_TIME_NO_RETRY: a frame that ran
	// longer than this is not retried.
	frameTimeNoRetry = 12 * time.Hour
	// memReservedMin is written to proc.int_mem_used at booking (KB).
	memReservedMin = 262144
)

// Completion is one FrameCompleteReport as Cuebot receives it from RQD.
type Completion struct {
	// FrameID is the reported frame (frame.pk_frame).
	FrameID string
	// ProcID is RQD's resource id, i.e. proc.pk_proc.
	ProcID string
	// Host is the render host's name (informational).
	Host       string
	ExitStatus int
	ExitSignal int
	// RunTime is the run time RQD reports (used for the timeout rules; the
	// usage counters use the database clock, as Cuebot does).
	RunTime time.Duration
	// MaxRSSKB is the frame's peak resident memory in KB.
	MaxRSSKB int64
	// NimbyLocked reports the host as NIMBY locked (a frame killed by NIMBY,
	// signal 15, is retried even past its retries).
	NimbyLocked bool
}

// Outcome says what Complete did with a report.
type Outcome int

const (
	// Completed: the frame was stopped and its proc released.
	Completed Outcome = iota + 1
	// Orphan: no proc; the frame was finalized if it was still RUNNING.
	Orphan
	// Stale: the report did not match the frame's current run; the proc was
	// released if it had no other frame, otherwise nothing changed.
	Stale
)

func (o Outcome) String() string {
	switch o {
	case Completed:
		return "completed"
	case Orphan:
		return "orphan"
	case Stale:
		return "stale"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Options tune the emulator.
type Options struct {
	// NotifyRelease makes the unbook transaction of a scheduler-managed
	// show send pg_notify('acct_release', …) as Cuebot's AccountingNotifier
	// does when accounting.notify.enabled is true (Cuebot's default).
	NotifyRelease bool
	// MaxAttempts bounds the retries of a transaction that hit a deadlock or
	// serialization failure (default 5).
	MaxAttempts int
}

// DefaultOptions is what New uses.
func DefaultOptions() Options { return Options{NotifyRelease: true, MaxAttempts: 5} }

// Stats counts what the emulator did.
type Stats struct {
	Completed, Orphans, Stale, Released, Killed, Booked uint64
}

// Emulator applies Cuebot's completion-side writes to a Cuebot database.
type Emulator struct {
	pool *pgxpool.Pool
	log  hclog.Logger
	opts Options

	completed, orphans, stale, released, killed, booked atomic.Uint64
}

// New returns an emulator writing through pool. A nil logger discards logs.
func New(pool *pgxpool.Pool, logger hclog.Logger) *Emulator {
	return NewWithOptions(pool, logger, DefaultOptions())
}

// NewWithOptions is New with explicit options.
func NewWithOptions(pool *pgxpool.Pool, logger hclog.Logger, opts Options) *Emulator {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if opts.MaxAttempts < 1 {
		opts.MaxAttempts = 5
	}
	return &Emulator{pool: pool, log: logger.Named("cuebotemu"), opts: opts}
}

// Stats returns the counters so far.
func (e *Emulator) Stats() Stats {
	return Stats{
		Completed: e.completed.Load(), Orphans: e.orphans.Load(), Stale: e.stale.Load(),
		Released: e.released.Load(), Killed: e.killed.Load(), Booked: e.booked.Load(),
	}
}

// ErrNotFound is returned when a named frame, proc or host does not exist.
var ErrNotFound = errors.New("cuebotemu: not found")

// procRow is a proc as Cuebot loads it (VirtualProc): the proc joined with
// its host, host_stat, allocation and job.
type procRow struct {
	id, host, hostName, show, job, layer string
	frame                                *string
	alloc, folder, dept                  string
	cores, gpus                          int64
	local                                bool
}

// frameRow is the frame as Cuebot's DispatchFrame/FrameDetail carry it.
type frameRow struct {
	state                  string
	version                int64
	retries, exitStatus    int64
	job, layer             string
	maxRetries             int64
	autoEat                bool
	timeoutMin, timeoutLLU int64
}

// stmt is one SQL statement with its arguments.
type stmt struct {
	sql  string
	args []any
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// loadProcSQL is Cuebot's getVirtualProc: $1 the proc.
const loadProcSQL = `
		SELECT p.pk_proc, p.pk_host, h.str_name, p.pk_show, p.pk_job, p.pk_layer, p.pk_frame,
		       h.pk_alloc, j.pk_folder, j.pk_dept,
		       p.int_cores_reserved, p.int_gpus_reserved, p.b_local
		  FROM proc p
		  JOIN host h       ON h.pk_host = p.pk_host
		  JOIN host_stat hs ON hs.pk_host = p.pk_host
		  JOIN alloc a      ON a.pk_alloc = h.pk_alloc
		  JOIN job j        ON j.pk_job = p.pk_job
		 WHERE p.pk_proc = $1`

func loadProc(ctx context.Context, q querier, procID string) (*procRow, error) {
	var p procRow
	err := q.QueryRow(ctx, loadProcSQL, procID).Scan(
		&p.id, &p.host, &p.hostName, &p.show, &p.job, &p.layer, &p.frame,
		&p.alloc, &p.folder, &p.dept, &p.cores, &p.gpus, &p.local)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load proc %s: %w", procID, err)
	}
	return &p, nil
}

// loadFrameSQL reads the frame as Cuebot's getDispatchFrame and
// getFrameDetail carry it (one statement): $1 the frame.
const loadFrameSQL = `
		SELECT f.str_state, COALESCE(f.int_version, 0) AS int_version, f.int_retries, f.int_exit_status,
		       f.pk_job, f.pk_layer, j.int_max_retries, j.b_autoeat, l.int_timeout, l.int_timeout_llu
		  FROM frame f
		  JOIN job j   ON j.pk_job = f.pk_job
		  JOIN layer l ON l.pk_layer = f.pk_layer
		 WHERE f.pk_frame = $1`

func loadFrame(ctx context.Context, q querier, frameID string) (*frameRow, error) {
	var f frameRow
	err := q.QueryRow(ctx, loadFrameSQL, frameID).Scan(
		&f.state, &f.version, &f.retries, &f.exitStatus, &f.job, &f.layer,
		&f.maxRetries, &f.autoEat, &f.timeoutMin, &f.timeoutLLU)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load frame %s: %w", frameID, err)
	}
	return &f, nil
}

func isMemoryFailure(c Completion, f *frameRow) bool {
	return c.ExitStatus == ExitMemoryFailure || c.ExitSignal == ExitMemoryFailure ||
		c.ExitStatus == ExitDockerOOM || f.exitStatus == ExitMemoryFailure
}

// resolveExitStatus keeps a memory-kill status Cuebot stored on the frame.
func resolveExitStatus(c Completion, f *frameRow) int {
	if f.exitStatus == ExitMemoryFailure {
		return ExitMemoryFailure
	}
	return c.ExitStatus
}

// nextState chooses the frame's state after a report (Cuebot's rules as the
// fact sheet and FrameCompleteHandler describe them; no layer-delay rules,
// no log-update timeout since the report carries no LLU time here).
func nextState(c Completion, f *frameRow) string {
	switch f.state {
	case StateWaiting, StateEaten:
		return f.state // set by hand before the kill
	case StateDead:
		if f.autoEat {
			return StateEaten
		}
		return StateDepend
	}
	if c.ExitStatus == 0 {
		return StateSucceeded
	}
	if c.ExitStatus == ExitSkipRetry || (f.maxRetries != 0 && c.ExitSignal == 119) {
		return StateWaiting
	}
	if (c.ExitStatus == ExitFailedLaunch || c.ExitSignal == ExitFailedLaunch) && f.retries < f.maxRetries {
		return StateWaiting
	}
	if c.NimbyLocked && c.ExitSignal == 15 {
		return StateWaiting
	}
	if f.autoEat {
		return StateEaten
	}
	if f.timeoutMin != 0 && c.RunTime > time.Duration(f.timeoutMin)*time.Minute {
		return StateDead
	}
	if c.RunTime > frameTimeNoRetry {
		return StateDead
	}
	if f.retries >= f.maxRetries && !isMemoryFailure(c, f) {
		return StateDead
	}
	return StateWaiting
}

// Complete handles one frame-complete report as Cuebot does (see the
// package documentation).
func (e *Emulator) Complete(ctx context.Context, c Completion) error {
	_, err := e.CompleteOutcome(ctx, c)
	return err
}

// stopFrameSQL is Cuebot's stopFrame transaction in one statement: the
// frame UPDATE guarded by state RUNNING and version, then, only if it
// matched, the layer's and job's max RSS raised and the proc detached from
// the frame. It returns whether the frame was stopped. Cuebot sends these
// as four statements of one JDBC transaction; one statement has the same
// effects and holds the layer_stat and job_stat rows that the frame
// triggers lock for the statement alone, not across four round trips (see
// the package doc). $1 frame, $2 new state, $3 exit status, $4 max RSS
// (KB), $5 version, $6 layer, $7 job.
const stopFrameSQL = `
WITH f AS (
    UPDATE frame
       SET str_state = $2,
           int_exit_status = $3,
           ts_stopped = current_timestamp + interval '1 second',
           ts_updated = current_timestamp,
           int_mem_max_used = $4,
           int_version = int_version + 1,
           int_total_past_core_time = int_total_past_core_time + COALESCE(round(
               interval_to_seconds(current_timestamp + interval '1 second' - ts_started) * int_cores / 100), 0),
           int_total_past_gpu_time = int_total_past_gpu_time + COALESCE(round(
               interval_to_seconds(current_timestamp + interval '1 second' - ts_started) * int_gpus), 0)
     WHERE pk_frame = $1 AND str_state = 'RUNNING' AND int_version = $5
    RETURNING pk_frame
), lm AS (
    UPDATE layer_mem SET int_max_rss = $4 WHERE pk_layer = $6 AND int_max_rss < $4 AND EXISTS (SELECT 1 FROM f)
), jm AS (
    UPDATE job_mem SET int_max_rss = $4 WHERE pk_job = $7 AND int_max_rss < $4 AND EXISTS (SELECT 1 FROM f)
), pd AS (
    UPDATE proc SET pk_frame = NULL WHERE pk_frame = $1 AND EXISTS (SELECT 1 FROM f)
)
SELECT EXISTS (SELECT 1 FROM f)`

// CompleteOutcome is Complete that also says which path the report took.
func (e *Emulator) CompleteOutcome(ctx context.Context, c Completion) (Outcome, error) {
	if c.FrameID == "" {
		return 0, errors.New("cuebotemu: completion has no frame id")
	}
	log := e.log.With("frame", c.FrameID, "proc", c.ProcID, "exit_status", c.ExitStatus, "exit_signal", c.ExitSignal)
	var p *procRow
	if c.ProcID != "" {
		var err error
		if p, err = loadProc(ctx, e.pool, c.ProcID); err != nil {
			return 0, err
		}
	}
	if p == nil {
		if err := e.finalizeOrphan(ctx, c); err != nil {
			return 0, err
		}
		e.orphans.Add(1)
		log.Debug("report without proc: orphan path")
		return Orphan, nil
	}
	if p.frame == nil || *p.frame != c.FrameID {
		e.stale.Add(1)
		if p.frame != nil {
			log.Debug("duplicate report: proc runs another frame now", "proc_frame", *p.frame)
			return Stale, nil
		}
		log.Debug("stale report: proc has no frame, releasing it")
		return Stale, e.release(ctx, p)
	}

	// Transaction A: stopFrame, as one statement (stopFrameSQL).
	f, err := loadFrame(ctx, e.pool, c.FrameID)
	if err != nil {
		return 0, err
	}
	if f == nil {
		return 0, fmt.Errorf("%w: frame %s", ErrNotFound, c.FrameID)
	}
	newState := nextState(c, f)
	var stopped bool
	err = e.retry(ctx, func() error {
		return e.pool.QueryRow(ctx, stopFrameSQL, c.FrameID, newState, resolveExitStatus(c, f), c.MaxRSSKB, f.version,
			f.layer, f.job).Scan(&stopped)
	})
	if err != nil {
		return 0, fmt.Errorf("stop frame %s: %w", c.FrameID, err)
	}
	if !stopped {
		// The frame moved on (killed, retried, eaten) while it ran: release
		// the proc unless it already runs something else.
		e.stale.Add(1)
		log.Debug("stale report: frame no longer RUNNING at the expected version")
		cur, err := loadProc(ctx, e.pool, p.id)
		if err != nil || cur == nil {
			return Stale, err
		}
		if cur.frame != nil && *cur.frame != c.FrameID {
			return Stale, nil
		}
		return Stale, e.release(ctx, cur)
	}

	// Post-completion (autocommit statements, as Cuebot's queued task).
	if err := e.updateUsage(ctx, c.FrameID, f.job, f.layer, p.show, c.ExitStatus); err != nil {
		return 0, err
	}
	if err := e.finishJobIfDone(ctx, f.job); err != nil {
		return 0, err
	}
	// Unbook: always, in this emulator (see package doc).
	if err := e.release(ctx, p); err != nil {
		return 0, err
	}
	e.completed.Add(1)
	log.Debug("frame completed", "state", newState)
	return Completed, nil
}

// finalizeOrphan stops a frame whose proc is gone, only if it is still
// RUNNING and no proc references it.
func (e *Emulator) finalizeOrphan(ctx context.Context, c Completion) error {
	f, err := loadFrame(ctx, e.pool, c.FrameID)
	if err != nil {
		return err
	}
	if f == nil || f.state != StateRunning {
		return nil
	}
	var owned bool
	if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM proc WHERE pk_frame = $1)`, c.FrameID).Scan(&owned); err != nil {
		return fmt.Errorf("orphan check: %w", err)
	}
	if owned {
		return nil
	}
	tag, err := e.pool.Exec(ctx, `
		UPDATE frame
		   SET str_state = $2, int_exit_status = $3,
		       ts_stopped = current_timestamp + interval '1 second', ts_updated = current_timestamp,
		       int_mem_max_used = $4, int_version = int_version + 1,
		       int_total_past_core_time = int_total_past_core_time + COALESCE(round(
		           interval_to_seconds(current_timestamp + interval '1 second' - ts_started) * int_cores / 100), 0),
		       int_total_past_gpu_time = int_total_past_gpu_time + COALESCE(round(
		           interval_to_seconds(current_timestamp + interval '1 second' - ts_started) * int_gpus), 0)
		 WHERE pk_frame = $1 AND str_state = 'RUNNING' AND int_version = $5`,
		c.FrameID, nextState(c, f), resolveExitStatus(c, f), c.MaxRSSKB, f.version)
	if err != nil {
		return fmt.Errorf("finalize orphaned frame %s: %w", c.FrameID, err)
	}
	if tag.RowsAffected() == 0 {
		return nil
	}
	var show string
	if err := e.pool.QueryRow(ctx, `SELECT pk_show FROM job WHERE pk_job = $1`, f.job).Scan(&show); err != nil {
		return fmt.Errorf("orphan usage: %w", err)
	}
	if err := e.updateUsage(ctx, c.FrameID, f.job, f.layer, show, c.ExitStatus); err != nil {
		return err
	}
	return e.finishJobIfDone(ctx, f.job)
}

// usageClockSQL reads what the usage counters are computed from: the run's
// seconds by the database clock (at least 1), its cores (centicores) and
// GPUs. $1 the frame.
const usageClockSQL = `
		SELECT COALESCE(interval_to_seconds(current_timestamp - ts_started), 1)::float8 AS clock,
		       COALESCE(int_cores, 100) AS cores, int_gpus AS gpus
		  FROM frame WHERE pk_frame = $1`

// UsageSQL is Cuebot's usage counters for a frame that succeeded, sent in
// this order in one round trip. Show: $1 show. Job, Layer: $1 job or
// layer, $2 core seconds, $3 GPU seconds, $4 clock seconds. JobHigh,
// LayerHigh, LayerLow: $1 job or layer, $2 clock seconds.
type UsageSQL struct {
	Show, Job, JobHigh, Layer, LayerHigh, LayerLow string
}

func succeededUsage() UsageSQL {
	return UsageSQL{
		Show: `UPDATE show_stats SET int_frame_success_count = int_frame_success_count + 1 WHERE pk_show = $1`,
		Job: `UPDATE job_usage SET int_core_time_success = int_core_time_success + $2,
		            int_gpu_time_success = int_gpu_time_success + $3,
		            int_clock_time_success = int_clock_time_success + $4,
		            int_frame_success_count = int_frame_success_count + 1
		      WHERE pk_job = $1`,
		JobHigh: `UPDATE job_usage SET int_clock_time_high = $2 WHERE pk_job = $1 AND int_clock_time_high < $2`,
		Layer: `UPDATE layer_usage SET int_core_time_success = int_core_time_success + $2,
		            int_gpu_time_success = int_gpu_time_success + $3,
		            int_clock_time_success = int_clock_time_success + $4,
		            int_frame_success_count = int_frame_success_count + 1
		      WHERE pk_layer = $1`,
		LayerHigh: `UPDATE layer_usage SET int_clock_time_high = $2 WHERE pk_layer = $1 AND int_clock_time_high < $2`,
		LayerLow:  `UPDATE layer_usage SET int_clock_time_low = $2 WHERE pk_layer = $1 AND ($2 < int_clock_time_low OR int_clock_time_low = 0)`,
	}
}

// finishJobSQL shuts a PENDING job down once nothing is waiting, running,
// dead, depending or checkpointing. $1 the job.
const finishJobSQL = `
			UPDATE job SET str_state = 'FINISHED', str_visible_name = NULL,
			       ts_stopped = current_timestamp, ts_updated = current_timestamp
			 WHERE pk_job = $1 AND str_state = 'PENDING'
			   AND EXISTS (SELECT 1 FROM job_stat s WHERE s.pk_job = $1
			                AND s.int_waiting_count + s.int_running_count + s.int_dead_count
			                  + s.int_depend_count + s.int_checkpoint_count = 0)`

// SucceededPath is the SQL Complete sends, one round trip a field in this
// order, for a report of exit status 0 from the proc that runs the frame,
// when the proc is not local and its show is scheduler-managed: the path
// nearly every completion on a farm of managed shows takes. It is here for
// benchmarks that replay Cuebot's side of the loop without the emulator
// (lab/e2e runs it in pgbench), so they send the emulator's own statements.
type SucceededPath struct {
	// LoadProc: $1 the proc. LoadFrame: $1 the frame (its columns are
	// named; int_version is 0 for a NULL version).
	LoadProc, LoadFrame string
	// StopFrame: $1 frame, $2 new state ('SUCCEEDED'), $3 exit status (0),
	// $4 max RSS (KB), $5 the version LoadFrame read, $6 layer, $7 job.
	StopFrame string
	// UsageClock: $1 the frame; columns clock, cores, gpus. Usage is sent
	// with clock = max(1, trunc(clock)), core seconds = max(1, trunc(clock
	// * cores / 100)) and GPU seconds = clock * gpus.
	UsageClock string
	Usage      UsageSQL
	// FinishJob: $1 the job.
	FinishJob string
	// Unbook, the one statement of the unbook transaction (BEGIN, Unbook,
	// COMMIT): $1 the proc, $2 the release notification's payload (JSON of
	// show, alloc, folder, job, layer, dept, cores as whole cores and gpus,
	// both negative; '' sends none).
	Unbook string
}

// Succeeded returns the statements of SucceededPath.
func Succeeded() SucceededPath {
	return SucceededPath{LoadProc: loadProcSQL, LoadFrame: loadFrameSQL, StopFrame: stopFrameSQL,
		UsageClock: usageClockSQL, Usage: succeededUsage(), FinishJob: finishJobSQL, Unbook: unbookSQL}
}

// updateUsage is Cuebot's updateUsageCounters: show_stats, job_usage and
// layer_usage from the database clock since ts_started.
func (e *Emulator) updateUsage(ctx context.Context, frameID, job, layer, show string, exitStatus int) error {
	var clock float64
	var cores, gpus int64
	err := e.pool.QueryRow(ctx, usageClockSQL, frameID).Scan(&clock, &cores, &gpus)
	if err != nil {
		return fmt.Errorf("usage of frame %s: %w", frameID, err)
	}
	clk := int64(clock)
	if clk < 1 {
		clk = 1
	}
	coreTime := int64(float32(clk) * (float32(cores) / 100)) // Java float arithmetic
	if coreTime < 1 {
		coreTime = 1
	}
	gpuTime := clk * gpus

	var stmts []stmt
	add := func(sql string, args ...any) { stmts = append(stmts, stmt{sql, args}) }
	if exitStatus > 0 {
		add(`UPDATE show_stats SET int_frame_fail_count = int_frame_fail_count + 1 WHERE pk_show = $1`, show)
	}
	if exitStatus == 0 {
		u := succeededUsage()
		add(u.Show, show)
		add(u.Job, job, coreTime, gpuTime, clk)
		add(u.JobHigh, job, clk)
		add(u.Layer, layer, coreTime, gpuTime, clk)
		add(u.LayerHigh, layer, clk)
		add(u.LayerLow, layer, clk)
	} else {
		add(`UPDATE job_usage SET int_core_time_fail = int_core_time_fail + $2,
		            int_clock_time_fail = int_clock_time_fail + $3,
		            int_frame_fail_count = int_frame_fail_count + 1
		      WHERE pk_job = $1`, job, coreTime, clk)
		add(`UPDATE layer_usage SET int_core_time_fail = int_core_time_fail + $2,
		            int_clock_time_fail = int_clock_time_fail + $3,
		            int_frame_fail_count = int_frame_fail_count + 1
		      WHERE pk_layer = $1`, layer, coreTime, clk)
	}
	// Cuebot's autocommit statements, sent in one round trip (a batch is
	// one implicit transaction: retried whole on a deadlock).
	err = e.retry(ctx, func() error {
		b := &pgx.Batch{}
		for _, s := range stmts {
			b.Queue(s.sql, s.args...)
		}
		return e.pool.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("usage counters of frame %s: %w", frameID, err)
	}
	return nil
}

// finishJobIfDone runs finishJobSQL.
func (e *Emulator) finishJobIfDone(ctx context.Context, job string) error {
	return e.retry(ctx, func() error {
		_, err := e.pool.Exec(ctx, finishJobSQL, job)
		if err != nil {
			return fmt.Errorf("finish job %s: %w", job, err)
		}
		return nil
	})
}

// Release runs Cuebot's unbook transaction for one proc (deleteVirtualProc).
// A proc that does not exist is ErrNotFound.
func (e *Emulator) Release(ctx context.Context, procID string) error {
	p, err := loadProc(ctx, e.pool, procID)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("%w: proc %s", ErrNotFound, procID)
	}
	return e.release(ctx, p)
}

type releasePayload struct {
	Show   string `json:"show"`
	Alloc  string `json:"alloc"`
	Folder string `json:"folder"`
	Job    string `json:"job"`
	Layer  string `json:"layer"`
	Dept   string `json:"dept"`
	Cores  int64  `json:"cores"`
	GPUs   int64  `json:"gpus"`
}

// unbookSQL starts the unbook transaction in one statement: DELETE the
// proc RETURNING its reservation, give the host its idle cores, memory,
// GPUs and GPU memory back, read whether the show is scheduler-managed
// and, for a managed show's non-local proc with a payload ($2 non-empty),
// send Cuebot's pg_notify('acct_release', $2). Cuebot sends these as
// separate statements of one transaction; one statement has the same
// effects and does not hold the host row across round trips (the
// scheduler's booking transactions wait on it). $1 proc, $2 payload. The
// last column reads n only so that its SELECT (the notification) runs: a
// CTE that nothing reads is not executed.
const unbookSQL = `
WITH d AS (
    DELETE FROM proc WHERE pk_proc = $1
    RETURNING pk_host, pk_show, pk_job, pk_layer, b_local,
              int_cores_reserved, int_mem_reserved, int_gpus_reserved, int_gpu_mem_reserved
), h AS (
    UPDATE host
       SET int_cores_idle = host.int_cores_idle + d.int_cores_reserved, int_mem_idle = host.int_mem_idle + d.int_mem_reserved,
           int_gpus_idle = host.int_gpus_idle + d.int_gpus_reserved,
           int_gpu_mem_idle = host.int_gpu_mem_idle + d.int_gpu_mem_reserved
      FROM d WHERE host.pk_host = d.pk_host
), m AS (
    SELECT d.*, s.b_scheduler_managed FROM d JOIN show s ON s.pk_show = d.pk_show
), n AS (
    SELECT pg_notify('acct_release', $2) FROM m WHERE m.b_scheduler_managed AND NOT m.b_local AND $2 <> ''
)
SELECT m.pk_host, m.pk_show, m.pk_job, m.pk_layer, m.b_local,
       m.int_cores_reserved, m.int_mem_reserved, m.int_gpus_reserved, m.int_gpu_mem_reserved,
       m.b_scheduler_managed, (SELECT count(*) FROM n)
FROM m`

// release is the unbook transaction for a loaded proc.
func (e *Emulator) release(ctx context.Context, p *procRow) error {
	deleted := false
	err := e.tx(ctx, func(tx pgx.Tx) error {
		deleted = false
		var host, show, job, layer string
		var cores, mem, gpus, gpuMem int64
		var local, managed bool
		payload := ""
		if e.opts.NotifyRelease {
			b, _ := json.Marshal(releasePayload{
				Show: p.show, Alloc: p.alloc, Folder: p.folder, Job: p.job, Layer: p.layer, Dept: p.dept,
				Cores: -p.cores / 100, GPUs: -p.gpus,
			})
			payload = string(b)
		}
		err := tx.QueryRow(ctx, unbookSQL, p.id, payload).Scan(
			&host, &show, &job, &layer, &local, &cores, &mem, &gpus, &gpuMem, &managed, nil)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // already gone: no host or accounting change
		}
		if err != nil {
			return fmt.Errorf("delete proc %s: %w", p.id, err)
		}
		deleted = true
		if local {
			for _, s := range []stmt{
				{`UPDATE layer_resource SET int_cores = int_cores - $2, int_gpus = int_gpus - $3 WHERE pk_layer = $1`, []any{layer, cores, gpus}},
				{`UPDATE job_resource SET int_local_cores = int_local_cores - $2, int_local_gpus = int_local_gpus - $3 WHERE pk_job = $1`, []any{job, cores, gpus}},
				{`UPDATE host_local SET int_cores_idle = int_cores_idle + $3, int_mem_idle = int_mem_idle + $4,
				         int_gpus_idle = int_gpus_idle + $5, int_gpu_mem_idle = int_gpu_mem_idle + $6
				   WHERE pk_job = $1 AND pk_host = $2`, []any{job, host, cores, mem, gpus, gpuMem}},
			} {
				if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
					return fmt.Errorf("release local proc %s: %w", p.id, err)
				}
			}
			return nil
		}
		if managed {
			return nil // the release reaches Redis through the sidecar (and the notification, if any)
		}
		for _, s := range []stmt{
			{`UPDATE subscription SET int_cores = int_cores - $3, int_gpus = int_gpus - $4 WHERE pk_show = $1 AND pk_alloc = $2`, []any{show, p.alloc, cores, gpus}},
			{`UPDATE layer_resource SET int_cores = int_cores - $2, int_gpus = int_gpus - $3 WHERE pk_layer = $1`, []any{layer, cores, gpus}},
			{`UPDATE job_resource SET int_cores = int_cores - $2, int_gpus = int_gpus - $3 WHERE pk_job = $1`, []any{job, cores, gpus}},
			{`UPDATE folder_resource SET int_cores = int_cores - $2, int_gpus = int_gpus - $3
			   WHERE pk_folder = (SELECT pk_folder FROM job WHERE pk_job = $1)`, []any{job, cores, gpus}},
			{`UPDATE point SET int_cores = int_cores - $3, int_gpus = int_gpus - $4
			   WHERE pk_show = $2 AND pk_dept = (SELECT pk_dept FROM job WHERE pk_job = $1)`, []any{job, show, cores, gpus}},
		} {
			if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
				return fmt.Errorf("release accounting of proc %s: %w", p.id, err)
			}
		}
		return nil
	})
	if err == nil && deleted {
		e.released.Add(1)
	}
	return err
}

// Booking is one frame started on one host.
type Booking struct {
	FrameID string
	HostID  string
	// Cores in centicores (> 0), memory and GPU memory in KB, GPUs whole.
	Cores, MemKB, GPUs, GPUMemKB int64
	// Local books a desktop (host_local) proc.
	Local bool
	// ProcID is the new proc's id; a random UUID when empty.
	ProcID string
}

// ErrFrameNotWaiting is returned by Book when the frame is not WAITING.
var ErrFrameNotWaiting = errors.New("cuebotemu: frame is not WAITING")

// Book starts one frame on one host in Postgres as a dispatcher does (see
// the package documentation) and returns the proc id. Trigger errors (host
// idle below zero, subscription burst, job max cores) come back unchanged
// (SQLSTATE P0001) and leave nothing behind.
func (e *Emulator) Book(ctx context.Context, b Booking) (string, error) {
	if b.ProcID == "" {
		b.ProcID = uuid.NewString()
	}
	err := e.tx(ctx, func(tx pgx.Tx) error {
		var version, exitStatus int64
		var state, job, layer, show, hostName, alloc string
		var managed bool
		err := tx.QueryRow(ctx, `
			SELECT COALESCE(f.int_version, 0), f.str_state, f.int_exit_status, f.pk_job, f.pk_layer,
			       j.pk_show, s.b_scheduler_managed
			  FROM frame f JOIN job j ON j.pk_job = f.pk_job JOIN show s ON s.pk_show = j.pk_show
			 WHERE f.pk_frame = $1 FOR UPDATE OF f`, b.FrameID).Scan(&version, &state, &exitStatus, &job, &layer, &show, &managed)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: frame %s", ErrNotFound, b.FrameID)
		}
		if err != nil {
			return fmt.Errorf("lock frame %s: %w", b.FrameID, err)
		}
		if state != StateWaiting {
			return fmt.Errorf("%w: frame %s is %s", ErrFrameNotWaiting, b.FrameID, state)
		}
		err = tx.QueryRow(ctx, `SELECT str_name, pk_alloc FROM host WHERE pk_host = $1`, b.HostID).Scan(&hostName, &alloc)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: host %s", ErrNotFound, b.HostID)
		}
		if err != nil {
			return fmt.Errorf("host %s: %w", b.HostID, err)
		}
		tag, err := tx.Exec(ctx, `
			UPDATE frame
			   SET str_state = 'RUNNING', str_host = $2, int_cores = $3, int_mem_reserved = $4,
			       int_gpus = $5, int_gpu_mem_reserved = $6,
			       ts_updated = current_timestamp, ts_started = current_timestamp, ts_stopped = NULL,
			       int_version = int_version + 1,
			       int_retries = int_retries + CASE WHEN int_exit_status IN (-1, 256, 286, 299, 301, 302, 399) THEN 0 ELSE 1 END
			 WHERE pk_frame = $1 AND str_state = 'WAITING' AND int_version = $7`,
			b.FrameID, hostName, b.Cores, b.MemKB, b.GPUs, b.GPUMemKB, version)
		if err != nil {
			return fmt.Errorf("start frame %s: %w", b.FrameID, err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%w: frame %s changed while booking", ErrFrameNotWaiting, b.FrameID)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO proc (pk_proc, pk_host, pk_show, pk_layer, pk_job, pk_frame,
			                  int_cores_reserved, int_mem_reserved, int_mem_pre_reserved, int_mem_used,
			                  int_gpus_reserved, int_gpu_mem_reserved, int_gpu_mem_pre_reserved, int_gpu_mem_used, b_local)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10, $11, $11, 0, $12)`,
			b.ProcID, b.HostID, show, layer, job, b.FrameID, b.Cores, b.MemKB, memReservedMin, b.GPUs, b.GPUMemKB, b.Local); err != nil {
			return fmt.Errorf("insert proc for frame %s: %w", b.FrameID, err)
		}
		if _, err := tx.Exec(ctx, `
			UPDATE host SET int_cores_idle = int_cores_idle - $2, int_mem_idle = int_mem_idle - $3,
			       int_gpus_idle = int_gpus_idle - $4, int_gpu_mem_idle = int_gpu_mem_idle - $5
			 WHERE pk_host = $1`, b.HostID, b.Cores, b.MemKB, b.GPUs, b.GPUMemKB); err != nil {
			return fmt.Errorf("reserve host %s: %w", b.HostID, err)
		}
		var stmts []stmt
		switch {
		case b.Local:
			stmts = []stmt{
				{`UPDATE layer_resource SET int_cores = int_cores + $2, int_gpus = int_gpus + $3 WHERE pk_layer = $1`, []any{layer, b.Cores, b.GPUs}},
				{`UPDATE job_resource SET int_local_cores = int_local_cores + $2, int_local_gpus = int_local_gpus + $3 WHERE pk_job = $1`, []any{job, b.Cores, b.GPUs}},
				{`UPDATE host_local SET int_cores_idle = int_cores_idle - $3, int_mem_idle = int_mem_idle - $4,
				         int_gpus_idle = int_gpus_idle - $5, int_gpu_mem_idle = int_gpu_mem_idle - $6
				   WHERE pk_job = $1 AND pk_host = $2`, []any{job, b.HostID, b.Cores, b.MemKB, b.GPUs, b.GPUMemKB}},
			}
		case !managed:
			stmts = []stmt{
				{`UPDATE subscription SET int_cores = int_cores + $3, int_gpus = int_gpus + $4 WHERE pk_show = $1 AND pk_alloc = $2`, []any{show, alloc, b.Cores, b.GPUs}},
				{`UPDATE layer_resource SET int_cores = int_cores + $2, int_gpus = int_gpus + $3 WHERE pk_layer = $1`, []any{layer, b.Cores, b.GPUs}},
				{`UPDATE job_resource SET int_cores = int_cores + $2, int_gpus = int_gpus + $3 WHERE pk_job = $1`, []any{job, b.Cores, b.GPUs}},
				{`UPDATE folder_resource SET int_cores = int_cores + $2, int_gpus = int_gpus + $3
				   WHERE pk_folder = (SELECT pk_folder FROM job WHERE pk_job = $1)`, []any{job, b.Cores, b.GPUs}},
				{`UPDATE point SET int_cores = int_cores + $3, int_gpus = int_gpus + $4
				   WHERE pk_show = $2 AND pk_dept = (SELECT pk_dept FROM job WHERE pk_job = $1)`, []any{job, show, b.Cores, b.GPUs}},
			}
		}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
				return fmt.Errorf("book accounting of frame %s: %w", b.FrameID, err)
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	e.booked.Add(1)
	return b.ProcID, nil
}

// MarkMemoryKill is what Cuebot's memory guard writes before it asks RQD to
// kill a frame for memory (DispatchSupport.updateFrameMemoryError): the
// frame's exit status becomes 33 (memory failure) and its version moves
// on. RQD then reports an ordinary kill (status 1, signal 9), and the
// completion path, seeing the stored 33, retries the frame whatever its
// retries and keeps 33 as its exit status. It reports whether the frame
// existed.
func (e *Emulator) MarkMemoryKill(ctx context.Context, frameID string) (bool, error) {
	var tag pgconn.CommandTag
	err := e.retry(ctx, func() error {
		var err error
		tag, err = e.pool.Exec(ctx, `UPDATE frame SET int_exit_status = $2, int_version = int_version + 1 WHERE pk_frame = $1`,
			frameID, ExitMemoryFailure)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("mark memory kill of frame %s: %w", frameID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// KillFrame is Cuebot clearing a running frame without a report from RQD
// (the lost-proc path with exit status 299, FRAME_CLEARED): the frame's proc
// is released, then the frame goes back to WAITING.
func (e *Emulator) KillFrame(ctx context.Context, frameID string) error {
	var procID string
	err := e.pool.QueryRow(ctx, `SELECT pk_proc FROM proc WHERE pk_frame = $1`, frameID).Scan(&procID)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: no proc runs frame %s", ErrNotFound, frameID)
	}
	if err != nil {
		return fmt.Errorf("find proc of frame %s: %w", frameID, err)
	}
	p, err := loadProc(ctx, e.pool, procID)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("%w: proc %s of frame %s vanished", ErrNotFound, procID, frameID)
	}
	if err := e.lostProc(ctx, p, ExitFrameCleared); err != nil {
		return err
	}
	e.killed.Add(1)
	return nil
}

// ClearProc is KillFrame for the frame of one proc, named by the proc id
// (RQD's resource id): the proc is released and its frame, if it still runs
// one, goes back to WAITING with exit status 299 (FRAME_CLEARED). A proc
// that no longer exists gives ErrNotFound and changes nothing, so a frame
// that completed meanwhile is left alone.
func (e *Emulator) ClearProc(ctx context.Context, procID string) error {
	p, err := loadProc(ctx, e.pool, procID)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("%w: proc %s", ErrNotFound, procID)
	}
	if err := e.lostProc(ctx, p, ExitFrameCleared); err != nil {
		return err
	}
	e.killed.Add(1)
	return nil
}

// HostDown is Cuebot losing a render host: host_stat goes DOWN and every
// proc of the host is released, its frame returned to WAITING with exit
// status 399 (DOWN_HOST). host is a host id or name. It returns how many
// procs were released.
func (e *Emulator) HostDown(ctx context.Context, host string) (int, error) {
	var hostID string
	err := e.pool.QueryRow(ctx, `SELECT pk_host FROM host WHERE pk_host = $1 OR str_name = $1`, host).Scan(&hostID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: host %s", ErrNotFound, host)
	}
	if err != nil {
		return 0, fmt.Errorf("find host %s: %w", host, err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE host_stat SET str_state = 'DOWN' WHERE pk_host = $1`, hostID); err != nil {
		return 0, fmt.Errorf("mark host %s down: %w", host, err)
	}
	rows, err := e.pool.Query(ctx, `SELECT pk_proc FROM proc WHERE pk_host = $1 ORDER BY pk_proc`, hostID)
	if err != nil {
		return 0, fmt.Errorf("procs of host %s: %w", host, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("procs of host %s: %w", host, err)
	}
	n := 0
	for _, id := range ids {
		// host_stat is DOWN but still present, so the proc loads.
		p, err := loadProc(ctx, e.pool, id)
		if err != nil {
			return n, err
		}
		if p == nil {
			continue
		}
		if err := e.lostProc(ctx, p, ExitDownHost); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// lostProc releases a proc Cuebot gave up on and stops its frame (without
// max RSS) back to WAITING with the given exit status.
func (e *Emulator) lostProc(ctx context.Context, p *procRow, exitStatus int) error {
	if err := e.release(ctx, p); err != nil {
		return err
	}
	if p.frame == nil {
		return nil
	}
	frameID := *p.frame
	if _, err := e.pool.Exec(ctx, `UPDATE frame SET str_checkpoint_state = 'DISABLED' WHERE pk_frame = $1`, frameID); err != nil {
		return fmt.Errorf("disable checkpoint of frame %s: %w", frameID, err)
	}
	f, err := loadFrame(ctx, e.pool, frameID)
	if err != nil || f == nil {
		return err
	}
	var stopped bool
	err = e.retry(ctx, func() error {
		tag, err := e.pool.Exec(ctx, `
			UPDATE frame
			   SET str_state = 'WAITING', int_exit_status = $2,
			       ts_stopped = current_timestamp, ts_updated = current_timestamp,
			       int_version = int_version + 1,
			       int_total_past_core_time = int_total_past_core_time + COALESCE(round(
			           interval_to_seconds(current_timestamp - ts_started) * int_cores / 100), 0),
			       int_total_past_gpu_time = int_total_past_gpu_time + COALESCE(round(
			           interval_to_seconds(current_timestamp - ts_started) * int_gpus), 0)
			 WHERE pk_frame = $1 AND str_state = 'RUNNING' AND int_version = $3`, frameID, exitStatus, f.version)
		if err != nil {
			return fmt.Errorf("stop lost frame %s: %w", frameID, err)
		}
		stopped = tag.RowsAffected() == 1
		return nil
	})
	if err != nil {
		return err
	}
	if stopped {
		var show string
		if err := e.pool.QueryRow(ctx, `SELECT pk_show FROM job WHERE pk_job = $1`, f.job).Scan(&show); err != nil {
			return fmt.Errorf("lost frame usage: %w", err)
		}
		return e.updateUsage(ctx, frameID, f.job, f.layer, show, exitStatus)
	}
	if f.state == StateDead && exitStatus == ExitDownHost {
		_, err := e.pool.Exec(ctx, `
			UPDATE frame SET str_state = 'WAITING', int_exit_status = $2,
			       ts_stopped = current_timestamp, ts_updated = current_timestamp, int_version = int_version + 1
			 WHERE pk_frame = $1 AND pk_frame NOT IN (SELECT pk_frame FROM proc WHERE pk_frame = $1)`, frameID, exitStatus)
		if err != nil {
			return fmt.Errorf("return dead frame %s of a down host: %w", frameID, err)
		}
	}
	return nil
}

// tx runs fn in a transaction, retrying deadlocks and serialization failures.
func (e *Emulator) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	return e.retry(ctx, func() error { return pgx.BeginFunc(ctx, e.pool, fn) })
}

func (e *Emulator) retry(ctx context.Context, fn func() error) error {
	var err error
	for attempt := 1; attempt <= e.opts.MaxAttempts; attempt++ {
		if err = fn(); err == nil || !retryable(err) {
			return err
		}
		e.log.Debug("retrying after transient error", "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 5 * time.Millisecond):
		}
	}
	return err
}

func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40P01" || pgErr.Code == "40001"
	}
	return false
}
