package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/sizing"
)

// lockLimitsSQL serialises dispatchers on a layer's limit_records.
const lockLimitsSQL = `
SELECT pk_limit_record FROM limit_record
WHERE pk_limit_record = ANY($1::text[])
ORDER BY pk_limit_record
FOR UPDATE`

// ClaimSQL claims frames and inserts their procs (see the package doc). It
// returns the limit headroom (-1 = no limit) and whether the job is still
// dispatchable (PENDING and not paused, in the statement's snapshot), and
// one row per frame started.
//
// The layer's limits are read again here, from layer_limit in the
// statement's snapshot, not only taken from the caller: a limit attached to
// the layer after the pending query read it (Cuebot's addLimit on a live
// layer) is one the transaction did not lock, so its headroom is 0 and
// nothing starts (the next pass reads the new list and locks it).
//
// $1 frame ids, $2 proc ids, $3 versions, $4 centicores, $5 memory KB,
// $6 GPUs, $7 GPU memory KB (one element per frame, in dispatch order);
// A frame whose last run ended with an exit status one of the layer's limits
// names as a licence denial (cuesched_limit.int_denial_exit_statuses) is
// relaunched without counting a retry, like Cuebot's own non-counting
// statuses (-1, 256, 286, 299, 301, 302, 399).
//
// A node-locked limit (cuesched_limit.b_per_host) is left out of the frame
// count: it counts hosts holding a seat, which the booking script checked.
//
// $8 host name, $9 show, $10 limit_record ids (the ones locked), $11 host,
// $12 layer, $13 job, $14 proc.int_mem_used (KB).
const ClaimSQL = `
WITH ` + jobs.DenialsCTE + `, lids AS (
    SELECT unnest($10::text[]) AS pk_limit_record, true AS locked
    UNION
    SELECT ll.pk_limit_record, false FROM layer_limit ll
     WHERE ll.pk_layer = $12 AND ll.pk_limit_record <> ALL($10::text[])
), lim AS (
    SELECT lr.int_max_value, lids.locked,
           (SELECT COALESCE(SUM(ls.int_running_count), 0)
              FROM layer_limit ll JOIN layer_stat ls ON ls.pk_layer = ll.pk_layer
             WHERE ll.pk_limit_record = lr.pk_limit_record) AS running
    FROM lids JOIN limit_record lr ON lr.pk_limit_record = lids.pk_limit_record
    WHERE true ` + jobs.NotPerHostSQL + `
), room AS (
    SELECT CASE WHEN count(*) = 0 THEN -1
                ELSE GREATEST(MIN(CASE WHEN int_max_value IS NULL OR NOT locked THEN 0
                                       ELSE int_max_value - running END), 0) END AS n
    FROM lim
), jb AS (
    -- The job as the frame UPDATE below sees it (one snapshot), read once
    -- by its key: the state is a result, not a predicate, so no plan walks
    -- an index of the PENDING jobs for it.
    SELECT COALESCE((SELECT j.str_state = 'PENDING' AND NOT j.b_paused FROM job j WHERE j.pk_job = $13), false) AS ok
), req AS (
    SELECT r.*
    FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[])
         WITH ORDINALITY AS r(pk_frame, pk_proc, ver, cores, mem, gpus, gpu_mem, ord)
    CROSS JOIN room
    WHERE room.n < 0 OR r.ord <= room.n
), claim AS (
    SELECT f.pk_frame FROM frame f
    WHERE f.pk_frame = ANY($1::text[])
    ORDER BY f.pk_frame
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE frame f
       SET str_state = 'RUNNING', str_host = $8, int_cores = req.cores, int_mem_reserved = req.mem,
           int_gpus = req.gpus, int_gpu_mem_reserved = req.gpu_mem,
           ts_updated = now(), ts_started = now(), ts_stopped = NULL,
           int_version = COALESCE(f.int_version, 0) + 1,
           int_retries = CASE WHEN f.int_exit_status IN (-1, 256, 286, 299, 301, 302, 399)
                                   OR f.int_exit_status IN (SELECT unnest(codes) FROM denials)
                              THEN f.int_retries ELSE f.int_retries + 1 END
      FROM req
     WHERE f.pk_frame = req.pk_frame
       AND f.pk_frame IN (SELECT pk_frame FROM claim)
       AND f.str_state = 'WAITING'
       AND COALESCE(f.int_version, 0) = req.ver
       AND f.pk_layer = $12
       AND NOT EXISTS (SELECT 1 FROM layer l WHERE l.pk_layer = f.pk_layer AND l.ts_start_after > now())
       AND EXISTS (SELECT 1 FROM show s WHERE s.pk_show = $9 AND s.b_scheduler_managed AND s.b_active)
       AND f.pk_job = $13 AND (SELECT ok FROM jb)
    RETURNING f.pk_frame, f.int_version, req.pk_proc, req.cores, req.mem, req.gpus, req.gpu_mem
), ins AS (
    INSERT INTO proc (pk_proc, pk_host, pk_show, pk_layer, pk_job, pk_frame,
                      int_cores_reserved, int_mem_reserved, int_mem_pre_reserved, int_mem_used,
                      int_gpus_reserved, int_gpu_mem_reserved, int_gpu_mem_pre_reserved, int_gpu_mem_used, b_local)
    SELECT upd.pk_proc, $11, $9, $12, $13, upd.pk_frame,
           upd.cores, upd.mem, upd.mem, $14, upd.gpus, upd.gpu_mem, upd.gpu_mem, 0, false
    FROM upd
    RETURNING pk_frame
)
SELECT room.n, jb.ok, upd.pk_frame, upd.int_version FROM room CROSS JOIN jb LEFT JOIN upd ON true`

// hostTakeGens is how many texts of HostTakeSQL hostTake hands out.
const hostTakeGens = 48

// hostTakeSQLs are HostTakeSQL's texts, one per generation: the same
// statement with a comment naming its generation.
func hostTakeSQLs() []string {
	out := make([]string, hostTakeGens)
	for g := range out {
		out[g] = fmt.Sprintf("%s\n-- cuesched: generation %d", HostTakeSQL, g)
	}
	return out
}

// hostTake is the text of HostTakeSQL for the next batch. Its generation
// grows by one each time the frames this dispatcher committed double
// (from 256), so every connection prepares the statement again and
// PostgreSQL plans it afresh. A connection prepares each statement once
// and, after five executions, may keep a generic plan for good; one made
// while the proc table was nearly empty (a scheduler started on an idle
// farm) scans the table sequentially, and keeps doing so as the farm
// fills: 22 ms a batch at 150,000 procs against 0.2 ms by the primary key
// (measured on PostgreSQL 15; one 10,000-host SCALE fill spent 82 s of
// its product database time there, 14.9 ms a call). A new text gets a plan for
// the table as it is; the doubling keeps the re-preparations to a few
// dozen over any number of frames.
func (d *Dispatcher) hostTake() string {
	g := bits.Len64(uint64(d.committed.Load()) >> 8)
	return d.hostTakeSQL[min(g, len(d.hostTakeSQL)-1)]
}

// HostSQL takes the started frames' resources off the host, guarded so no
// idle value goes below zero. $1 host, $2 centicores, $3 memory KB, $4
// GPUs, $5 GPU memory KB (sums over the frames ClaimSQL started). The
// dispatcher itself uses HostTakeSQL; HostSQL is the same update of one
// host for a client that knows the sums (the benchmark's pgbench script).
const HostSQL = `
UPDATE host
   SET int_cores_idle = int_cores_idle - $2, int_mem_idle = int_mem_idle - $3,
       int_gpus_idle = int_gpus_idle - $4, int_gpu_mem_idle = int_gpu_mem_idle - $5
 WHERE pk_host = $1
   AND int_cores_idle >= $2 AND int_mem_idle >= $3 AND int_gpus_idle >= $4 AND int_gpu_mem_idle >= $5
RETURNING int_cores_idle, int_mem_idle, int_gpus_idle, int_gpu_mem_idle`

type wonFrames struct {
	frames   []string
	versions []int32
}

// version is the version frame id has after the claim (0 if not won).
func (w wonFrames) version(id string) int32 {
	for i, f := range w.frames {
		if f == id {
			return w.versions[i]
		}
	}
	return 0
}

// staleHost reports whether err is verify_host_resources refusing the host
// update: Postgres has less idle on the host than the cache said.
func staleHost(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "P0001" && strings.HasPrefix(pe.Message, "unable to allocate additional")
}

// errUnresolved marks a booking transaction whose outcome stayed unknown:
// the connection was lost before its end was read and procsFound failed
// too. Its Redis bookings are not rolled back (Run settles it).
var errUnresolved = errors.New("its outcome could not be resolved")

// resolveTimeout bounds the resolution of a booking transaction whose
// outcome is unknown (procsFound; config.CommitResolveBudget covers it).
const resolveTimeout = 10 * time.Second

// procsFound resolves a booking transaction whose outcome is unknown: which
// of the batch's procs exist (the transaction is all or nothing, so either
// every winner's proc exists or none does). The server may still be running
// it (the client gave up, the pipeline was already sent): a share lock on
// the batch's frames first waits for whatever transaction holds them (the
// claim locks them until it commits or rolls back), then a fresh snapshot
// reads the procs.
//
// The lock alone is not enough when the client gave up before the server
// took the locks (the batch still in the backend's socket, or behind a
// lock wait of its own): the read would find nothing, the bookings would
// be rolled back in Redis, and the transaction could commit afterwards
// (Redis then under-counts the procs until the recompute). So, knowing
// the batch's backend (pid, not behind a pooler), it is ended first
// (pg_terminate_backend, waiting up to 5 s for it to exit; the row of
// pg_stat_activity must predate the batch, so a reused pid is never hit):
// its transaction has then committed or rolled back for good.
func (d *Dispatcher) procsFound(ctx context.Context, booked []planned, by time.Time, pid uint32, sent time.Time) (map[string]bool, error) {
	procs, frames := make([]string, len(booked)), make([]string, len(booked))
	for i, p := range booked {
		procs[i], frames[i] = p.proc, p.frame.ID
	}
	qctx, cancel := context.WithDeadline(ctx, by)
	defer cancel()
	if pid != 0 {
		if _, err := d.pool.Exec(qctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
WHERE pid = $1 AND backend_start < $2`, int32(pid), sent); err != nil {
			// PostgreSQL < 14 (no timeout argument) or no right to end
			// it: the frame lock below is all there is.
			d.log.Debug("could not end the backend of a booking with an unknown outcome", "pid", pid, "error", err)
		}
	}
	out := make(map[string]bool, len(booked))
	err := pgx.BeginFunc(qctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(qctx, `SELECT 1 FROM frame WHERE pk_frame = ANY($1::text[]) ORDER BY pk_frame FOR SHARE`, frames); err != nil {
			return err
		}
		rows, err := tx.Query(qctx, `SELECT pk_proc FROM proc WHERE pk_proc = ANY($1::text[])`, procs)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, id := range ids {
			out[id] = true
		}
		return nil
	})
	return out, err
}

// Compensation: the frame goes back to WAITING only while our proc exists;
// the proc is deleted and the host given its resources back in one
// statement, so they happen together and at most once.
const (
	ClearFrameSQL = `
UPDATE frame SET str_state = 'WAITING', int_exit_status = 299, ts_stopped = now(), ts_updated = now(),
       int_version = int_version + 1
 WHERE pk_frame = $1 AND str_state = 'RUNNING' AND int_version = $2
   AND EXISTS (SELECT 1 FROM proc WHERE pk_proc = $3 AND pk_frame = $1)`
	DeleteProcSQL = `
WITH del AS (
    DELETE FROM proc WHERE pk_proc = $1
    RETURNING pk_host, int_cores_reserved, int_mem_reserved, int_gpus_reserved, int_gpu_mem_reserved
)
UPDATE host h
   SET int_cores_idle = h.int_cores_idle + del.int_cores_reserved,
       int_mem_idle = h.int_mem_idle + del.int_mem_reserved,
       int_gpus_idle = h.int_gpus_idle + del.int_gpus_reserved,
       int_gpu_mem_idle = h.int_gpu_mem_idle + del.int_gpu_mem_reserved
  FROM del WHERE h.pk_host = del.pk_host
RETURNING h.int_cores_idle, h.int_mem_idle, h.int_gpus_idle, h.int_gpu_mem_idle`
)

// putBack is the compensation's transaction: the frame back to WAITING
// (while our proc exists, at the version the claim gave it), our proc
// deleted and its resources given back to the host. restored says whether
// the proc was still there, idle is then the host's idle cores, memory,
// GPUs and GPU memory after the restore.
func (d *Dispatcher) putBack(ctx context.Context, p planned, version int32) (idle [4]int64, restored bool, err error) {
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, ClearFrameSQL, p.frame.ID, version, p.proc); err != nil {
			return fmt.Errorf("clear frame: %w", err)
		}
		switch err := tx.QueryRow(ctx, DeleteProcSQL, p.proc).Scan(&idle[0], &idle[1], &idle[2], &idle[3]); {
		case errors.Is(err, pgx.ErrNoRows):
			// Already released by the completion path: nothing to give back.
		case err != nil:
			return fmt.Errorf("delete proc: %w", err)
		default:
			restored = true
		}
		return nil
	})
	return idle, restored && err == nil, err
}

// compensate undoes a committed booking whose launch failed. It returns the
// host's idle values after the restore when it restored them.
func (d *Dispatcher) compensate(ctx context.Context, h sizing.Host, p planned, version int32, cause error) (sizing.Host, bool) {
	d.m.launchFailures.Inc()
	d.log.Warn("launch failed; putting the frame back", "host", h.Name, "frame", p.frame.Name, "proc", p.proc, "error", cause)
	after := h
	idle, restored, err := d.putBack(ctx, p, version)
	if restored {
		after.IdleCores, after.IdleGPUs, after.IdleGPUMemKB = idle[0], idle[2], idle[3]
		after.IdleMemKB = min(idle[1], h.IdleMemKB+p.res.MemKB)
	}
	if err != nil {
		d.m.compensations.WithLabelValues("error").Inc()
		d.log.Error("compensation failed; the frame stays RUNNING without a launch until Cuebot's orphan check",
			"frame", p.frame.ID, "proc", p.proc, "error", err)
		return h, false
	}
	if restored {
		d.m.compensations.WithLabelValues("restored").Inc()
	} else {
		d.m.compensations.WithLabelValues("already_released").Inc()
	}
	if _, err := d.acct.Release(ctx, p.proc); err != nil {
		d.m.accountingErrors.WithLabelValues("release").Inc()
		d.log.Warn("accounting release failed; the sidecar or the recompute will heal it", "proc", p.proc, "error", err)
	}
	if d.rqd != nil {
		kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := d.rqd.KillRunningFrame(kctx, h.Name, p.frame.ID, "cuesched: launch failed, frame returned to the queue"); err != nil {
			// The launch's outcome is unknown (a deadline, a lost
			// connection): the frame may be running on the host although
			// it is WAITING again. Until RQD's next report makes Cuebot
			// kill it, it may run twice.
			d.m.killFailures.Inc()
			d.log.Warn("best-effort kill after a failed launch failed; the frame may still run on the host until its RQD reports it",
				"host", h.Name, "frame", p.frame.Name, "frame_id", p.frame.ID, "launch_error", cause, "error", err)
		}
	}
	return after, restored
}

// claimGroupSQL is the dispatcher's claim: ClaimSQL (adapted to the schema)
// with the host name ($8) and host id ($11) as arrays with one element per
// frame, like the other per-frame arguments, so one statement claims a
// batch on one host or several.
func claimGroupSQL(claim string) string {
	for _, r := range [][2]string{
		{`$7::bigint[])
         WITH ORDINALITY AS r(pk_frame, pk_proc, ver, cores, mem, gpus, gpu_mem, ord)`,
			`$7::bigint[], $8::text[], $11::text[])
         WITH ORDINALITY AS r(pk_frame, pk_proc, ver, cores, mem, gpus, gpu_mem, host_name, host_id, ord)`},
		{`str_host = $8,`, `str_host = req.host_name,`},
		{`RETURNING f.pk_frame, f.int_version, req.pk_proc,`, `RETURNING f.pk_frame, f.int_version, req.pk_proc, req.host_id,`},
		{`SELECT upd.pk_proc, $11, $9,`, `SELECT upd.pk_proc, upd.host_id, $9,`},
	} {
		if strings.Count(claim, r[0]) != 1 {
			panic("dispatch: ClaimSQL no longer has " + r[0])
		}
		claim = strings.Replace(claim, r[0], r[1], 1)
	}
	return claim
}

// lockHostsSQL locks a batch's hosts (when there are several) in key order
// before their update, so two batches sharing hosts cannot deadlock. It runs
// after the claim: frames, then the frame triggers' layer_stat/job_stat,
// then hosts, the order of a one-host batch and of Cuebot's completion.
const lockHostsSQL = `
SELECT pk_host FROM host WHERE pk_host = ANY($1::text[]) ORDER BY pk_host FOR UPDATE`

// HostTakeSQL takes the resources of the procs the claim inserted ($1, the
// batch's proc ids; only the winners exist) off each of their hosts ($2,
// the batch's hosts), in the same transaction and without the client
// knowing the winners yet, so the claim and the host update go in one
// round trip. It has no idle >= need guard: Cuebot's own
// verify_host_resources trigger (BEFORE UPDATE of the idle columns) raises
// "unable to allocate additional ..." when a value would go below zero,
// which aborts the whole transaction, exactly as it refuses Cuebot's own
// over-booking; the dispatcher reads that error as a stale host cache
// (HostStale). It returns one row per host that started something: the
// host, the number of procs and its idle values after the update.
const HostTakeSQL = `
WITH took AS (
    SELECT pk_host, count(*) AS n, SUM(int_cores_reserved)::bigint AS cores, SUM(int_mem_reserved)::bigint AS mem,
           SUM(int_gpus_reserved)::bigint AS gpus, SUM(int_gpu_mem_reserved)::bigint AS gpu_mem
    FROM proc WHERE pk_proc = ANY($1::text[]) AND pk_host = ANY($2::text[])
    GROUP BY pk_host
)
UPDATE host h
   SET int_cores_idle = h.int_cores_idle - took.cores, int_mem_idle = h.int_mem_idle - took.mem,
       int_gpus_idle = h.int_gpus_idle - took.gpus, int_gpu_mem_idle = h.int_gpu_mem_idle - took.gpu_mem
  FROM took
 WHERE h.pk_host = took.pk_host
RETURNING h.pk_host, took.n, h.int_cores_idle::bigint, h.int_mem_idle::bigint,
          h.int_gpus_idle::bigint, h.int_gpu_mem_idle::bigint`

// commit runs the booking transaction of a batch on one host or several
// (parts, each with its booked frames; the frames' order in the statement
// is the parts' order, then each part's) in one round trip: the limit
// locks, the claim, the host locks (several hosts) and the host update,
// pipelined as one implicit transaction (one Sync: it commits when the
// last statement succeeds, and any error rolls all of it back; no BEGIN or
// COMMIT statement). It sets each part's outcome: its won frames and idle
// values after the batch, the limit headroom the claim saw (room, -1 = no
// limit) and the index of its first frame in the claim (base), stale when
// a host update was refused (the whole batch rolled back), jobStopped
// when the job was no longer dispatchable (paused, or no longer PENDING)
// inside the transaction, err when it failed. An error the server did not
// report (the connection lost, the deadline passed) leaves the outcome
// unknown: it is resolved by looking for the batch's procs on a fresh
// connection, and resolvedBy is that resolution's deadline (zero when
// none ran): procs it found may be launched until it plus the launch
// timeout. It reports whether the batch was stale.
//
// conn is the connection the bookings named (Booking.BackendPID); the
// caller releases it.
func (d *Dispatcher) commit(ctx context.Context, conn *pgxpool.Conn, l *jobs.Layer, parts []*part) (resolvedBy time.Time, stale bool) {
	room, stale, jobStopped, resolvedBy, err := d.commitBatch(ctx, conn, l, parts)
	base := 0
	for _, x := range parts {
		x.base, x.room, x.stale, x.jobStopped, x.err = base, room, stale, jobStopped, err
		base += len(x.booked)
	}
	return resolvedBy, stale
}

func (d *Dispatcher) commitBatch(ctx context.Context, conn *pgxpool.Conn, l *jobs.Layer, parts []*part) (room int, stale, jobStopped bool, resolvedBy time.Time, err error) {
	var frameIDs, procs, hostNames, hostIDs, hosts []string
	var versions []int32
	var cores, mem, gpus, gpuMem []int64
	var all []planned
	for _, x := range parts {
		hosts = append(hosts, x.Host.ID)
		for _, p := range x.booked {
			all = append(all, p)
			frameIDs, procs, versions = append(frameIDs, p.frame.ID), append(procs, p.proc), append(versions, p.frame.Version)
			cores, mem = append(cores, p.res.Cores), append(mem, p.res.MemKB)
			gpus, gpuMem = append(gpus, p.res.GPUs), append(gpuMem, p.res.GPUMemKB)
			hostNames, hostIDs = append(hostNames, x.Host.Name), append(hostIDs, x.Host.ID)
		}
	}
	limits := l.LimitIDs
	if limits == nil {
		limits = []string{}
	}
	// The backend running the batch, for resolving an unknown outcome
	// (procsFound): it was alive before the batch went out.
	var pid uint32
	if d.pids.Load() == pidReal {
		pid = conn.Conn().PgConn().PID()
	}
	sent := time.Now()
	b := &pgx.Batch{}
	if len(limits) > 0 {
		b.Queue(lockLimitsSQL, limits)
	}
	b.Queue(d.claim, frameIDs, procs, versions, cores, mem, gpus, gpuMem,
		hostNames, l.ShowID, limits, hostIDs, l.ID, l.JobID, d.cfg.Policy.MinMemKB)
	if len(hosts) > 1 {
		b.Queue(lockHostsSQL, hosts)
	}
	b.Queue(d.hostTake(), procs, hosts)
	br := conn.SendBatch(ctx, b)
	room = -1
	jobOK := true
	winners := map[string]int32{}
	type hostRow struct {
		n                          int64
		cores, mem, gpus, gpuMemKB int64
	}
	rowsByHost := map[string]hostRow{}
	err = func() error {
		if len(limits) > 0 {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("lock limits %v: %w", limits, err)
			}
		}
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("claim frames: %w", err)
		}
		for rows.Next() {
			var r int64
			var frame *string
			var ver *int32
			if err := rows.Scan(&r, &jobOK, &frame, &ver); err != nil {
				rows.Close()
				return fmt.Errorf("claim frames: %w", err)
			}
			room = int(r)
			if frame != nil && ver != nil {
				winners[*frame] = *ver
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("claim frames: %w", err)
		}
		if len(hosts) > 1 {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("lock hosts: %w", err)
			}
		}
		rows, err = br.Query()
		if err != nil {
			return fmt.Errorf("take host resources: %w", err)
		}
		for rows.Next() {
			var id string
			var h hostRow
			if err := rows.Scan(&id, &h.n, &h.cores, &h.mem, &h.gpus, &h.gpuMemKB); err != nil {
				rows.Close()
				return fmt.Errorf("take host resources: %w", err)
			}
			rowsByHost[id] = h
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("take host resources: %w", err)
		}
		return nil
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("dispatch batch: %w", cerr)
	}
	switch {
	case err != nil && staleHost(err):
		d.log.Debug("a host has less idle than the cache said; batch rolled back", "hosts", hosts, "layer", l.Name, "error", err)
		return room, true, false, time.Time{}, nil
	case err != nil:
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			return room, false, false, time.Time{}, fmt.Errorf("dispatch layer %s on %d hosts: %w", l.Name, len(parts), err)
		}
		resolvedBy = time.Now().Add(resolveTimeout)
		// Detached: the batch's own deadline may be what cut it short.
		rctx := context.WithoutCancel(ctx)
		found, rerr := d.procsFound(rctx, all, resolvedBy, pid, sent)
		// Postgres unreachable from here too (a partition, a restart):
		// try again until the resolution's deadline, so a short outage
		// still ends in a known outcome.
		for wait := 100 * time.Millisecond; rerr != nil && time.Until(resolvedBy) > wait; wait = min(2*wait, time.Second) {
			time.Sleep(wait)
			found, rerr = d.procsFound(rctx, all, resolvedBy, pid, sent)
		}
		if rerr != nil {
			// Still unknown at the deadline: the transaction may have
			// committed, so nothing is launched and the Redis bookings
			// stay (settle keeps them): a rollback now could under-count
			// committed procs and let the gate pass more than a cap. Run
			// settles the batch once Postgres answers.
			d.log.Warn("booking transaction's outcome unknown and its resolution failed; its Redis bookings are kept until Postgres answers",
				"hosts", hosts, "layer", l.Name, "frames", len(all), "error", err, "resolve_error", rerr)
			d.later(unresolvedBatch{layer: l.Name, booked: all, pid: pid, sent: sent})
			return room, false, false, time.Time{}, fmt.Errorf("dispatch layer %s on %d hosts: %w (%w: %w)", l.Name, len(parts), err, errUnresolved, rerr)
		}
		if len(found) == 0 {
			return room, false, false, time.Time{}, fmt.Errorf("dispatch layer %s on %d hosts: %w", l.Name, len(parts), err)
		}
		d.log.Warn("the booking transaction reported an error but its procs exist; continuing", "hosts", hosts, "error", err)
		for _, x := range parts {
			x.won, x.after = wonFrames{}, x.Host
			for _, p := range x.booked {
				if found[p.proc] {
					x.won.frames = append(x.won.frames, p.frame.ID)
					x.won.versions = append(x.won.versions, p.frame.Version+1)
					x.after.Take(p.res)
				}
			}
		}
		return room, false, false, resolvedBy, nil
	}
	if len(winners) == 0 {
		return room, false, !jobOK, time.Time{}, nil
	}
	d.committed.Add(int64(len(winners)))
	for _, x := range parts {
		x.won, x.after = wonFrames{}, x.Host
		for _, p := range x.booked {
			if v, ok := winners[p.frame.ID]; ok {
				x.won.frames = append(x.won.frames, p.frame.ID)
				x.won.versions = append(x.won.versions, v)
				x.after.Take(p.res)
			}
		}
		// The host's idle values as the update left them (memory: the
		// lower of the row's and the cache's less what was taken).
		if h, ok := rowsByHost[x.Host.ID]; ok && len(x.won.frames) > 0 {
			x.after.IdleCores, x.after.IdleGPUs, x.after.IdleGPUMemKB = h.cores, h.gpus, h.gpuMemKB
			x.after.IdleMemKB = min(h.mem, x.after.IdleMemKB)
		}
	}
	return room, false, false, time.Time{}, nil
}
