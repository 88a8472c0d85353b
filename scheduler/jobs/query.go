package jobs

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DB is what the queries need from a pgx pool.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PendingQuery selects the jobs of one cluster pass.
type PendingQuery struct {
	ShowID     string
	FacilityID string
	// Tags are the cluster's tag names.
	Tags []string
	// Limit is max_jobs_per_cluster_pass (default 20).
	Limit int
	// CoreUnit is one core in centicores (queue.core_multiplier, 100).
	CoreUnit int
	// AgeRelief: one priority point per this much job age; 0 disables.
	AgeRelief time.Duration
	// Lottery draws the jobs weighted by effective priority (floored at
	// 1) instead of taking them in priority order; Draw names the draw
	// (the same Draw over the same jobs gives the same order).
	Lottery bool
	Draw    string
	// Exclude lists jobs left out (the jobs another pass of the same
	// cluster is working: passes in flight together work disjoint jobs).
	Exclude []string
	// Schema adapts the query to the database (nil: CurrentSchema).
	Schema *Schema
	// Live, if set, supplies the live use of the show's jobs, folders and
	// subscriptions (the accounting store's counters), so the query does
	// not sum the show's procs: its cost follows the show's pending jobs,
	// not its running frames. When it cannot vouch for the show (not
	// seeded) or cannot be read, the query sums the procs as without it.
	Live LiveSource
}

// Use is what a job, folder or subscription holds: centicores and GPUs.
type Use struct{ Cores, GPUs int64 }

// LiveUse is a show's live use, keyed by job, folder and allocation (its
// subscription on that allocation; GPUs unused there).
type LiveUse struct {
	Jobs, Folders, Allocs map[string]Use
}

// LiveSource reads a show's live use for the pending-jobs query.
type LiveSource interface {
	// LiveUse returns the use of the given jobs and folders and of the
	// show's subscriptions on the given allocations. ok is false when the
	// source cannot vouch for the show (its accounting is not seeded).
	LiveUse(ctx context.Context, showID string, jobs, folders, allocs []string) (use LiveUse, ok bool, err error)
}

// pendingSQL: live (proc-based) headroom of the show's subscriptions, the
// job's folder and the job itself; some layer with waiting frames, an
// overlapping tag, no future start-after and room for its minimum.
//
// Order: a job below its minimum cores (live cores < job_resource
// int_min_cores, a minimum of 0 or less being none) before any other, then
// the lottery or the effective priority (see the package doc).
//
// Caps read as Cuebot's DispatchQuery reads them. A job's int_max_cores has
// no "unlimited" value: the job needs one core unit of room (vs_waiting's
// "int_max_cores - int_cores >= 100") and a layer needs int_cores +
// int_cores_min <= int_max_cores, so a max of 0 or below books nothing. A
// folder's int_max_cores is unlimited at exactly -1 and otherwise needs
// folder cores + int_cores_min < max (strictly, as Cuebot writes it), so 0
// and other negative values book nothing. GPU caps (the job's, no sentinel;
// the folder's, -1 unlimited) bind only layers that need GPUs, so a max of 0
// stops GPU layers and leaves CPU layers alone.
const pendingSQL = pendingProcsCTE + pendingSelect

// pendingLiveSQL is pendingSQL with the live use given (LiveSource): $10-$12
// jobs, cores, GPUs; $13-$15 folders, cores, GPUs; $16-$17 allocations and
// the show's subscription cores there.
const pendingLiveSQL = `
WITH job_live AS MATERIALIZED (
    SELECT * FROM unnest($10::text[], $11::bigint[], $12::bigint[]) AS t(pk_job, cores, gpus)
), folder_live AS MATERIALIZED (
    SELECT * FROM unnest($13::text[], $14::bigint[], $15::bigint[]) AS t(pk_folder, cores, gpus)
), sub_live AS MATERIALIZED (
    SELECT * FROM unnest($16::text[], $17::bigint[]) AS t(pk_alloc, cores)
)
` + pendingSelect

// pendingProcsCTE sums the show's procs into the live use.
const pendingProcsCTE = `
WITH ph AS MATERIALIZED (
    -- One scan of the show's procs (i_proc_pkshow), summed per job, host
    -- and locality: no join per proc, hash aggregates whatever the
    -- statistics say; the three headroom sums below read these groups.
    SELECT p.pk_job, p.pk_host, p.b_local,
           SUM(p.int_cores_reserved) AS cores, SUM(p.int_gpus_reserved) AS gpus
    FROM proc p WHERE p.pk_show = $1
    GROUP BY p.pk_job, p.pk_host, p.b_local
), job_live AS MATERIALIZED (
    SELECT pk_job, SUM(cores) AS cores, SUM(gpus) AS gpus FROM ph GROUP BY pk_job
), folder_live AS MATERIALIZED (
    -- Folder sums over the folder's unfinished jobs, from the job sums.
    SELECT j2.pk_folder, SUM(jl.cores) AS cores, SUM(jl.gpus) AS gpus
    FROM job_live jl JOIN job j2 ON j2.pk_job = jl.pk_job
    WHERE j2.str_state <> 'FINISHED' GROUP BY j2.pk_folder
), sub_live AS MATERIALIZED (
    -- Subscription use: non-local procs of an existing job, per host, so
    -- the allocation is looked up once per host, not once per proc.
    SELECT h.pk_alloc, SUM(hs.cores) AS cores
    FROM (SELECT pk_host, SUM(cores) AS cores FROM ph
          WHERE NOT b_local AND EXISTS (SELECT 1 FROM job j3 WHERE j3.pk_job = ph.pk_job)
          GROUP BY pk_host) hs
    JOIN host h ON h.pk_host = hs.pk_host
    GROUP BY h.pk_alloc
)
`

// pendingSelect is the job selection over job_live, folder_live and
// sub_live.
const pendingSelect = `
SELECT j.pk_job, j.str_name, sh.str_name, j.pk_facility, j.pk_folder, j.pk_dept,
       jr.int_priority, j.ts_started, e.effective, u.under_min,
       COALESCE(jl.cores, 0)::bigint, COALESCE(jl.gpus, 0)::bigint
FROM job j
JOIN show sh            ON sh.pk_show = j.pk_show
JOIN job_resource jr    ON jr.pk_job = j.pk_job
CROSS JOIN LATERAL (SELECT jr.int_priority + CASE WHEN $6::float8 > 0
           THEN floor(extract(epoch FROM (now() - j.ts_started)) / $6::float8) ELSE 0 END AS effective) e
JOIN folder_resource fr ON fr.pk_folder = j.pk_folder
LEFT JOIN job_live jl    ON jl.pk_job = j.pk_job
CROSS JOIN LATERAL (SELECT jr.int_min_cores > 0 AND COALESCE(jl.cores, 0) < jr.int_min_cores AS under_min) u
LEFT JOIN folder_live fl ON fl.pk_folder = j.pk_folder
WHERE j.pk_show = $1 AND j.pk_facility = $2
  AND j.str_state = 'PENDING' AND NOT j.b_paused
  AND j.pk_job <> ALL($9::text[])
  AND sh.b_active AND sh.b_scheduler_managed
  AND EXISTS (
      SELECT 1 FROM subscription s LEFT JOIN sub_live sl ON sl.pk_alloc = s.pk_alloc
      WHERE s.pk_show = $1 AND s.int_burst > 0
        AND s.int_burst - COALESCE(sl.cores, 0) >= $5)
  AND (fr.int_max_cores = -1 OR COALESCE(fl.cores, 0) < fr.int_max_cores)
  AND COALESCE(jl.cores, 0) + $5 <= jr.int_max_cores
  AND EXISTS (
      SELECT 1 FROM layer l JOIN layer_stat ls ON ls.pk_layer = l.pk_layer
      WHERE l.pk_job = j.pk_job AND ls.int_waiting_count > 0
        AND string_to_array(replace(l.str_tags::text, ' ', ''), '|') && $3::text[]
        AND (l.ts_start_after IS NULL OR l.ts_start_after <= now())
        ` + NotHeldSQL + `
        AND (fr.int_max_cores = -1 OR COALESCE(fl.cores, 0) + GREATEST(l.int_cores_min, 0) < fr.int_max_cores)
        AND COALESCE(jl.cores, 0) + GREATEST(l.int_cores_min, 0) <= jr.int_max_cores
        AND (l.int_gpus_min <= 0 OR fr.int_max_gpus = -1 OR COALESCE(fl.gpus, 0) + l.int_gpus_min <= fr.int_max_gpus)
        AND (l.int_gpus_min <= 0 OR COALESCE(jl.gpus, 0) + l.int_gpus_min <= jr.int_max_gpus))
ORDER BY
    -- Jobs below their minimum cores first, in either order.
    u.under_min DESC,
    -- The lottery (Efraimidis-Spirakis, as exponential keys): each job
    -- draws u in (0,1) from a hash of its id and the pass's draw, and the
    -- smallest -ln(u)/weight win. A job is drawn first with probability
    -- weight / total weight, and LIMIT samples without replacement.
    CASE WHEN $7::bool THEN -ln((hashtext(j.pk_job || $8::text)::float8 + 2147483649.0) / 4294967297.0)
                            / GREATEST(e.effective, 1)::float8 END,
    e.effective DESC, j.ts_started, j.pk_job
LIMIT $4`

// Pending returns the cluster's bookable jobs, best first: the jobs running
// below their minimum cores, then the others, each in effective priority
// order, or, with Lottery, in the order of a priority-weighted draw.
func Pending(ctx context.Context, db DB, q PendingQuery) ([]Job, error) {
	if q.Limit <= 0 {
		q.Limit = 20
	}
	if q.CoreUnit <= 0 {
		q.CoreUnit = 100
	}
	exclude := q.Exclude
	if exclude == nil {
		exclude = []string{}
	}
	args := []any{q.ShowID, q.FacilityID, normTags(q.Tags), q.Limit, q.CoreUnit, q.AgeRelief.Seconds(), q.Lottery, q.Draw, exclude}
	sql := pendingSQL
	if q.Live != nil {
		live, ok, err := liveArgs(ctx, db, q, exclude)
		if err != nil {
			return nil, err
		}
		if ok {
			sql, args = pendingLiveSQL, append(args, live...)
		}
	}
	rows, err := db.Query(ctx, q.Schema.adapt(sql), args...)
	if err != nil {
		return nil, fmt.Errorf("pending jobs of show %s: %w", q.ShowID, err)
	}
	defer rows.Close()
	var out []Job
	for rows.Next() {
		var j Job
		var live Use
		if err := rows.Scan(&j.ID, &j.Name, &j.ShowName, &j.FacilityID, &j.FolderID, &j.DeptID,
			&j.Priority, &j.Started, &j.Effective, &j.BelowMinCores, &live.Cores, &live.GPUs); err != nil {
			return nil, fmt.Errorf("pending jobs of show %s: %w", q.ShowID, err)
		}
		j.ShowID = q.ShowID
		j.Live = &live
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pending jobs of show %s: %w", q.ShowID, err)
	}
	return out, nil
}

// candidatesSQL: the show's PENDING, unpaused jobs of the facility (not
// excluded) with their folders, then the allocations the show subscribes
// to: the keys whose live use pendingLiveSQL needs.
const candidatesSQL = `
SELECT 'j', j.pk_job, j.pk_folder FROM job j
 WHERE j.pk_show = $1 AND j.pk_facility = $2 AND j.str_state = 'PENDING' AND NOT j.b_paused
   AND j.pk_job <> ALL($3::text[])
UNION ALL
SELECT 's', s.pk_alloc, '' FROM subscription s WHERE s.pk_show = $1`

// liveArgs reads the candidate keys and their live use (q.Live) and returns
// pendingLiveSQL's arguments $10-$17; ok is false when the source cannot
// vouch for the show or cannot be read.
func liveArgs(ctx context.Context, db DB, q PendingQuery, exclude []string) ([]any, bool, error) {
	rows, err := db.Query(ctx, candidatesSQL, q.ShowID, q.FacilityID, exclude)
	if err != nil {
		return nil, false, fmt.Errorf("pending jobs of show %s: candidates: %w", q.ShowID, err)
	}
	var jobIDs, folders, allocs []string
	seenFolder := map[string]bool{}
	for rows.Next() {
		var kind, id, folder string
		if err := rows.Scan(&kind, &id, &folder); err != nil {
			rows.Close()
			return nil, false, fmt.Errorf("pending jobs of show %s: candidates: %w", q.ShowID, err)
		}
		if kind == "s" {
			allocs = append(allocs, id)
			continue
		}
		jobIDs = append(jobIDs, id)
		if !seenFolder[folder] {
			seenFolder[folder] = true
			folders = append(folders, folder)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("pending jobs of show %s: candidates: %w", q.ShowID, err)
	}
	use, ok, err := q.Live.LiveUse(ctx, q.ShowID, jobIDs, folders, allocs)
	if err != nil || !ok {
		// The store is unreachable or not seeded: the query sums the
		// procs, as without a source (a Redis outage is the accounting
		// gate's to report; the pass still reads its jobs).
		return nil, false, nil
	}
	arrays := func(ids []string, m map[string]Use) ([]string, []int64, []int64) {
		cores, gpus := make([]int64, len(ids)), make([]int64, len(ids))
		for i, id := range ids {
			cores[i], gpus[i] = m[id].Cores, m[id].GPUs
		}
		return ids, cores, gpus
	}
	jid, jc, jg := arrays(jobIDs, use.Jobs)
	fid, fc, fg := arrays(folders, use.Folders)
	aid, ac, _ := arrays(allocs, use.Allocs)
	return []any{jid, jc, jg, fid, fc, fg, aid, ac}, true, nil
}

// cappedSQL: the cluster has work that Pending left out only for lack of
// headroom (a subscription at its burst, a folder or job at its cap): a
// PENDING, unpaused job of the active managed show with a layer of waiting
// frames on the cluster's tags that is not deferred.
const cappedSQL = `
SELECT EXISTS (
    SELECT 1 FROM job j JOIN show sh ON sh.pk_show = j.pk_show
    WHERE j.pk_show = $1 AND j.pk_facility = $2
      AND j.str_state = 'PENDING' AND NOT j.b_paused
      AND sh.b_active AND sh.b_scheduler_managed
      AND EXISTS (
          SELECT 1 FROM layer l JOIN layer_stat ls ON ls.pk_layer = l.pk_layer
          WHERE l.pk_job = j.pk_job AND ls.int_waiting_count > 0
            AND string_to_array(replace(l.str_tags::text, ' ', ''), '|') && $3::text[]
            AND (l.ts_start_after IS NULL OR l.ts_start_after <= now())))`

// Capped reports whether a cluster for which Pending found no job has
// waiting work all the same, held back only by a burst or a cap: its
// headroom returns as the show's frames end, so it is worth looking again
// soon (the pipeline's saturated sleep rather than its empty sleep).
func Capped(ctx context.Context, db DB, q PendingQuery) (bool, error) {
	rows, err := db.Query(ctx, q.Schema.adapt(cappedSQL), q.ShowID, q.FacilityID, normTags(q.Tags))
	if err != nil {
		return false, fmt.Errorf("capped work of show %s: %w", q.ShowID, err)
	}
	defer rows.Close()
	var capped bool
	for rows.Next() {
		if err := rows.Scan(&capped); err != nil {
			return false, fmt.Errorf("capped work of show %s: %w", q.ShowID, err)
		}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("capped work of show %s: %w", q.ShowID, err)
	}
	return capped, nil
}

// normTags strips spaces the way the tag-array expression does.
func normTags(tags []string) []string {
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		t = strings.ReplaceAll(t, " ", "")
		if t != "" {
			out = append(out, t)
		}
	}
	return out
}

// LayerQuery selects the layers and frames of one job for one cluster.
type LayerQuery struct {
	JobID string
	// Tags are the cluster's tag names.
	Tags []string
	// FramesPerLayer is dispatch_frames_per_layer_limit (default 20).
	FramesPerLayer int
	// Exclude lists layers to skip (backed off).
	Exclude []string
	// Schema adapts the query to the database (nil: CurrentSchema).
	Schema *Schema
}

// PassLayerQuery selects the layers and frames of several jobs (one
// cluster pass's) for one cluster, in one statement.
type PassLayerQuery struct {
	JobIDs []string
	// Tags, FramesPerLayer, Exclude and Schema as in LayerQuery.
	Tags           []string
	FramesPerLayer int
	Exclude        []string
	Schema         *Schema
	// Live, by job, is the live use the pass's Pending read (Job.Live):
	// the statement does not sum the procs of a job given here (at
	// SCALE's full farm that sum was about 30% of the statement's time),
	// and the job's layers carry the given use. Jobs not given are summed.
	Live map[string]Use
}

// layersSQL reads the dispatchable layers of the jobs $1 with up to $3
// WAITING frames each; every job's rows are what the query of that job
// alone returns (the job's live cores are its own sums, grouped per job).
// What belongs to a layer (limits, env, runtime) or to a job (env, folder
// caps) is read once per layer or job, not once per frame row.
//
// Only the jobs $5 have their procs summed: the others' live use is the
// caller's (PassLayerQuery.Live), and the statement returns 0 for it.
//
// PostgreSQL plans it once per connection (the generic plan of the
// prepared statement), not on every pass: at SCALE's full farm planning it
// for its parameters took 3.1 ms a call beside 5.8 ms of execution. Two
// shapes keep the generic plan both chosen and safe. The procs are summed
// per job behind a one-time test of $5, so a plan that cannot see $5 does
// not price a scan of the proc table (with a CTE over $5 it did, and
// PostgreSQL planned every call). The tag test is wrapped in IS TRUE, which
// no index serves, so no plan finds the layers through the tags' GIN index
// (that reads every layer of the tag, finished jobs' included) instead of
// by job.
const layersSQL = `
WITH lay AS MATERIALIZED (
    SELECT l.pk_job, l.pk_layer, l.str_name, l.str_cmd, l.str_range, l.int_chunk_size, l.int_dispatch_order,
           l.int_cores_min, l.int_cores_max, l.int_mem_min, l.int_gpus_min, l.int_gpu_mem_min,
           l.b_threadable, l.str_services, l.str_tags, ls.int_running_count, ls.int_succeeded_count
    FROM layer l JOIN layer_stat ls ON ls.pk_layer = l.pk_layer
    WHERE l.pk_job = ANY($1::text[]) AND ls.int_waiting_count > 0
      AND (string_to_array(replace(l.str_tags::text, ' ', ''), '|') && $2::text[]) IS TRUE
      AND (l.ts_start_after IS NULL OR l.ts_start_after <= now())
      AND l.pk_layer <> ALL($4::text[])
      ` + NotHeldSQL + `
), ly AS MATERIALIZED (
    SELECT lay.*,
           (SELECT array_agg(ll.pk_limit_record ORDER BY ll.pk_limit_record) FROM layer_limit ll WHERE ll.pk_layer = lay.pk_layer) AS limit_ids,
           ` + SeatIDsSQL + ` AS seat_ids,
           ` + SeatMaxSQL + ` AS seat_max,
           (SELECT json_object_agg(e.str_key, e.str_value) FROM layer_env e WHERE e.pk_layer = lay.pk_layer AND e.str_key IS NOT NULL) AS layer_env,
           COALESCE((SELECT lu.int_clock_time_high FROM layer_usage lu WHERE lu.pk_layer = lay.pk_layer LIMIT 1), 0) AS high
    FROM lay
), jb AS MATERIALIZED (
    SELECT j.pk_job, j.str_name, j.pk_show, sh.str_name AS show_name, j.pk_facility, j.pk_folder, j.pk_dept, j.str_shot, j.str_user,
           j.str_log_dir, COALESCE(j.str_loki_url, '') AS loki, j.int_uid, COALESCE(j.str_os, '') AS os,
           jr.int_priority, jr.int_max_cores, jr.int_max_gpus,
           COALESCE(jl.cores, 0) AS cores, COALESCE(jl.gpus, 0) AS gpus,
           COALESCE((SELECT fr.int_max_cores FROM folder_resource fr WHERE fr.pk_folder = j.pk_folder LIMIT 1), -1) AS folder_max_cores,
           COALESCE((SELECT fr.int_max_gpus FROM folder_resource fr WHERE fr.pk_folder = j.pk_folder LIMIT 1), -1) AS folder_max_gpus,
           (SELECT json_object_agg(e.str_key, e.str_value) FROM job_env e WHERE e.pk_job = j.pk_job AND e.str_key IS NOT NULL) AS job_env
    FROM job j
    JOIN show sh         ON sh.pk_show = j.pk_show
    JOIN job_resource jr ON jr.pk_job = j.pk_job
    LEFT JOIN LATERAL (
        SELECT SUM(p.int_cores_reserved) AS cores, SUM(p.int_gpus_reserved) AS gpus
        FROM proc p WHERE p.pk_job = j.pk_job AND j.pk_job = ANY($5::text[])
    ) jl ON true
    WHERE j.pk_job IN (SELECT DISTINCT pk_job FROM lay)
)
SELECT ly.pk_job, ly.pk_layer, ly.str_name, ly.str_cmd, ly.str_range, ly.int_chunk_size, ly.int_dispatch_order,
       ly.int_cores_min, ly.int_cores_max, ly.int_mem_min, ly.int_gpus_min, ly.int_gpu_mem_min,
       ly.b_threadable, ly.str_services, ly.str_tags,
       jb.str_name, jb.pk_show, jb.show_name, jb.pk_facility, jb.pk_folder, jb.pk_dept, jb.str_shot, jb.str_user,
       jb.str_log_dir, jb.loki, jb.int_uid, jb.os,
       jb.int_priority, jb.int_max_cores, jb.int_max_gpus, jb.cores, jb.gpus,
       jb.folder_max_cores, jb.folder_max_gpus,
       ly.limit_ids, ly.seat_ids, ly.seat_max, jb.job_env, ly.layer_env, ly.high,
       ly.int_running_count, ly.int_succeeded_count,
       f.pk_frame, f.str_name, f.int_number, f.ver, f.eligible, f.int_exit_status, f.int_mem_max_used, f.int_mem_reserved, f.ts_stopped
FROM ly
JOIN jb ON jb.pk_job = ly.pk_job
CROSS JOIN LATERAL (
    SELECT fr.pk_frame, fr.str_name, fr.int_number, COALESCE(fr.int_version, 0) AS ver,
           COALESCE(fr.ts_eligible, fr.ts_updated, now()) AS eligible,
           fr.int_dispatch_order, fr.int_layer_order,
           fr.int_exit_status, fr.int_mem_max_used, fr.int_mem_reserved, fr.ts_stopped
    FROM frame fr
    WHERE fr.pk_job = ly.pk_job AND fr.pk_layer = ly.pk_layer AND fr.str_state = 'WAITING'
    ORDER BY fr.int_dispatch_order, fr.int_layer_order
    LIMIT $3
) f
ORDER BY ly.pk_job, ly.int_dispatch_order, ly.pk_layer, f.int_dispatch_order, f.int_layer_order`

// Layers returns the job's dispatchable layers in dispatch order, each with
// up to FramesPerLayer WAITING frames in frame order. Frames beyond what the
// job's core/GPU cap leaves (job-wide running sum of the layers' minimums
// over live proc sums) are dropped; layers left without frames are omitted.
func Layers(ctx context.Context, db DB, q LayerQuery) ([]*Layer, error) {
	by, err := PassLayers(ctx, db, PassLayerQuery{JobIDs: []string{q.JobID}, Tags: q.Tags,
		FramesPerLayer: q.FramesPerLayer, Exclude: q.Exclude, Schema: q.Schema})
	if err != nil {
		return nil, fmt.Errorf("layers of job %s: %w", q.JobID, err)
	}
	return Dispatchable(by[q.JobID], nil), nil
}

// PassLayers reads the layers of several jobs in one statement, by job id
// (a job without a layer that has waiting frames on the tags has no
// entry), before the job's cap: Dispatchable(layers, exclude) of a job's
// entry is what Layers returns for it with Exclude exclude (the layers of
// q.Exclude are left out by the statement itself).
func PassLayers(ctx context.Context, db DB, q PassLayerQuery) (map[string][]*Layer, error) {
	if q.FramesPerLayer <= 0 {
		q.FramesPerLayer = 20
	}
	exclude := q.Exclude
	if exclude == nil {
		exclude = []string{}
	}
	out := make(map[string][]*Layer, len(q.JobIDs))
	if len(q.JobIDs) == 0 {
		return out, nil
	}
	summed := make([]string, 0, len(q.JobIDs))
	for _, id := range q.JobIDs {
		if _, ok := q.Live[id]; !ok {
			summed = append(summed, id)
		}
	}
	rows, err := db.Query(ctx, q.Schema.adapt(layersSQL), q.JobIDs, normTags(q.Tags), q.FramesPerLayer, exclude, summed)
	if err != nil {
		return nil, fmt.Errorf("layers of %d job(s): %w", len(q.JobIDs), err)
	}
	defer rows.Close()
	var cur *Layer
	for rows.Next() {
		var (
			l        Layer
			services string
			tags     string
			uid      *int64
			limits   []string
			seatIDs  []string
			seatMax  []int64
			jobEnv   map[string]string
			layerEnv map[string]string
			f        Frame
			chunk    int64
			high     int64
			stopped  *time.Time
		)
		if err := rows.Scan(&l.JobID, &l.ID, &l.Name, &l.Command, &l.Range, &chunk, &l.DispatchOrder,
			&l.CoresMin, &l.CoresMax, &l.MemMinKB, &l.GPUsMin, &l.GPUMemMinKB,
			&l.Threadable, &services, &tags,
			&l.JobName, &l.ShowID, &l.ShowName, &l.FacilityID, &l.FolderID, &l.DeptID, &l.Shot, &l.User,
			&l.LogDir, &l.LokiURL, &uid, &l.OS,
			&l.Priority, &l.JobMaxCores, &l.JobMaxGPUs, &l.JobCoresLive, &l.JobGPUsLive,
			&l.FolderMaxCores, &l.FolderMaxGPUs,
			&limits, &seatIDs, &seatMax, &jobEnv, &layerEnv, &high, &l.Running, &l.Succeeded,
			&f.ID, &f.Name, &f.Number, &f.Version, &f.Eligible, &f.ExitStatus, &f.MaxRSSKB, &f.ReservedKB, &stopped); err != nil {
			return nil, fmt.Errorf("layers of %d job(s): %w", len(q.JobIDs), err)
		}
		if stopped != nil {
			f.Stopped = *stopped
		}
		if cur == nil || cur.ID != l.ID {
			if u, ok := q.Live[l.JobID]; ok {
				l.JobCoresLive, l.JobGPUsLive = u.Cores, u.GPUs
			}
			l.ChunkSize = int(max(chunk, 1))
			l.Services = splitList(services, ",")
			l.Tags = splitList(tags, "|")
			l.LimitIDs = limits
			for i, id := range seatIDs {
				if i < len(seatMax) {
					l.SeatLimits = append(l.SeatLimits, SeatLimit{ID: id, Max: seatMax[i]})
				}
			}
			l.RuntimeHigh = time.Duration(max(high, 0)) * time.Second
			if uid != nil {
				u := int32(*uid)
				l.UID = &u
			}
			l.Env = make(map[string]string, len(jobEnv)+len(layerEnv))
			for k, v := range jobEnv {
				l.Env[k] = v
			}
			for k, v := range layerEnv {
				l.Env[k] = v
			}
			cur = &l
			out[l.JobID] = append(out[l.JobID], cur)
		}
		cur.Frames = append(cur.Frames, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("layers of %d job(s): %w", len(q.JobIDs), err)
	}
	return out, nil
}

// Dispatchable is what a job may dispatch of its layers as PassLayers read
// them: the layers of exclude left out, then the job's cap applied
// (capToJob; layers left without frames are omitted). It trims the
// layers in place.
func Dispatchable(layers []*Layer, exclude []string) []*Layer {
	if len(exclude) > 0 {
		kept := make([]*Layer, 0, len(layers))
		for _, l := range layers {
			if !slices.Contains(exclude, l.ID) {
				kept = append(kept, l)
			}
		}
		layers = kept
	}
	return capToJob(layers)
}

// capToJob applies the job-wide running sum of layer minimums against the
// job's remaining core and GPU budget.
func capToJob(layers []*Layer) []*Layer {
	if len(layers) == 0 {
		return layers
	}
	sort.SliceStable(layers, func(i, j int) bool { return layers[i].DispatchOrder < layers[j].DispatchOrder })
	first := layers[0]
	// Job caps have no "unlimited" value in Cuebot: a max of 0 or below
	// leaves no budget.
	coreBudget := max(first.JobMaxCores-first.JobCoresLive, 0)
	gpuBudget := max(first.JobMaxGPUs-first.JobGPUsLive, 0)
	var cumCores, cumGPUs int64
	out := layers[:0]
	for _, l := range layers {
		keep := l.Frames[:0]
		c := max(l.CoresMin, 0)
		for _, f := range l.Frames {
			// The running sum includes frames already dropped, so once the
			// budget is exceeded every later frame is dropped too.
			cumCores += c
			if l.GPUsMin > 0 {
				cumGPUs += l.GPUsMin
			}
			if cumCores > coreBudget {
				continue
			}
			if l.GPUsMin > 0 && cumGPUs > gpuBudget {
				continue
			}
			keep = append(keep, f)
		}
		l.Frames = keep
		if len(keep) > 0 {
			out = append(out, l)
		}
	}
	return out
}

func splitList(s, sep string) []string {
	var out []string
	for _, p := range strings.Split(s, sep) {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
