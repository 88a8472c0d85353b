// Package explain answers "why is my frame waiting?" for the frames of
// scheduler-managed shows: every waiting frame gets exactly one reason, the
// first gate that holds it, in the order the scheduler meets them.
//
// It reads Postgres only (the caps and live proc sums the pending-job query
// reads, the hosts the host cache mirrors), in one query per call, off the
// dispatch path: the scheduler runs it on a slow timer for the
// scheduler_waiting_frames gauge, and `cuesched explain` runs it for one job.
// Its cost follows the farm's distinct layer needs, not its layers: the
// hosts are counted once per need and allocation, the booked cores once per
// show, folder and job (113 ms at 10,000 hosts and 600 layers, where counting
// host by host for every layer took 19 s).
package explain

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reason is why a waiting frame is not running.
type Reason string

// The reasons, in the order they are checked.
const (
	// Held: the job is paused.
	Held Reason = "held"
	// Depend: the frame waits on a dependency (state DEPEND).
	Depend Reason = "depend"
	// FailingFast: the layer's frames keep failing fast, and the fail-fast
	// backoff (package failfast) holds it out of the lottery and the passes
	// until a time it is tried again.
	FailingFast Reason = "failing fast"
	// NoHost: no up, open host of the job's facility is on an allocation
	// the show subscribes to and carries one of the layer's tags.
	NoHost Reason = "no host"
	// NoFit: such hosts exist, but none is big enough for one frame even
	// when idle (cores, memory, GPUs, GPU memory, OS).
	NoFit Reason = "no fit"
	// Burst: every subscription of the show in the facility is at its
	// burst.
	Burst Reason = "burst"
	// FolderCap and JobCap: the job's folder or the job is at its max
	// cores.
	FolderCap Reason = "folder cap"
	JobCap    Reason = "job cap"
	// Limit: one of the layer's limits is at its max running frames.
	Limit Reason = "limit"
	// Strand: GPU protection keeps CPU work off the cores an idle GPU
	// needs while GPU work waits (queue.gpu_protection).
	Strand Reason = "strand"
	// Capacity: a host fits the frame, but none has the room free now.
	Capacity Reason = "capacity"
	// Flowing: nothing holds it: a host has room now and the next pass
	// books it.
	Flowing Reason = "flowing"
)

// Label is the reason as a metric label value (scheduler_waiting_frames):
// spaces become underscores ("no host" -> "no_host"), as Prometheus label
// values are matched and typed by operators.
func (r Reason) Label() string { return strings.ReplaceAll(string(r), " ", "_") }

// Reasons lists every reason, in check order.
func Reasons() []Reason {
	return []Reason{Held, Depend, FailingFast, NoHost, NoFit, Burst, FolderCap, JobCap, Limit, Strand, Capacity, Flowing}
}

// Facts are what the classification reads about one layer.
type Facts struct {
	Show, Job, Layer string
	LayerID          string
	// OS is the job's OS ("" = any).
	OS     string
	Paused bool
	// Waiting, Depend and Running count the layer's frames by state.
	Waiting, Depend, Running int
	// CoresMin (centicores), MemMinKB, GPUsMin: one frame's needs.
	CoresMin, MemMinKB, GPUsMin int64
	// Hosts that serve the layer; of those, FitTotal fit one frame when
	// idle and FitIdle fit one now. BestIdle / BestTotal name the roomiest.
	Hosts, FitTotal, FitIdle int
	// FitIdleUnguarded: hosts that would fit one now if GPU protection did
	// not hold their room for idle GPUs.
	FitIdleUnguarded    int
	BestIdle, BestTotal string
	BurstFull           bool
	FolderFull, JobFull bool
	LimitFull           string // the name of a limit at its max, or ""
	// LimitSeats: LimitFull is node-locked (every seat held by a host).
	LimitSeats bool
	// LimitZero names a limit of the layer whose max is 0 ("" none): nothing
	// of the layer runs until it is raised, whatever the farm does.
	LimitZero string
	// LimitRoom is how many more frames the layer's frame-counting limits
	// let run (the tightest; -1: none). Waiting counts at most that many
	// of a flowing layer's frames as flowing, the rest as limit.
	LimitRoom int
	// HeldUntil is when the fail-fast backoff tries the layer again (zero:
	// not held); HeldLevel is its holds in a row, HeldFails and HeldAvgRun
	// the failed runs behind the last hold and their average run time.
	HeldUntil  time.Time
	HeldLevel  int
	HeldFails  int64
	HeldAvgRun time.Duration
}

// Classify returns the reason of the layer's WAITING frames and a line of
// detail (DEPEND frames are always Depend).
func Classify(f Facts) (Reason, string) {
	switch {
	case f.Paused:
		return Held, "the job is paused"
	case !f.HeldUntil.IsZero():
		return FailingFast, fmt.Sprintf("its frames keep failing fast (%d failed runs averaging %s, hold %d in a row): held out of the lottery and the passes; tried again at %s",
			f.HeldFails, f.HeldAvgRun.Round(100*time.Millisecond), f.HeldLevel, f.HeldUntil.UTC().Format(time.RFC3339))
	case f.LimitZero != "":
		return Limit, fmt.Sprintf("limit %q has a max of 0: nothing of the layer runs until it is raised (cuesched limit list)", f.LimitZero)
	case f.Hosts == 0:
		return NoHost, "no up, open host of the facility is on a subscribed allocation with one of the layer's tags"
	case f.FitTotal == 0:
		os := ""
		if f.OS != "" {
			os = ", OS " + f.OS
		}
		return NoFit, fmt.Sprintf("none of the %s serving the layer fits one frame (%s cores, %s memory, %d GPUs%s) even when idle",
			hosts(f.Hosts), cores(f.CoresMin), mem(f.MemMinKB), f.GPUsMin, os)
	case f.BurstFull:
		return Burst, "every subscription of the show in the facility is at its burst"
	case f.FolderFull:
		return FolderCap, "the job's folder is at its max cores"
	case f.JobFull:
		return JobCap, "the job is at its max cores"
	case f.LimitFull != "" && f.LimitSeats:
		return Limit, fmt.Sprintf("node-locked limit %q: every seat is held by a host with no room for a frame (a seat host takes the frames first, a new host once a seat is free)", f.LimitFull)
	case f.LimitFull != "":
		return Limit, fmt.Sprintf("limit %q is at its max running frames", f.LimitFull)
	case f.FitIdle == 0 && f.FitIdleUnguarded > 0:
		return Strand, fmt.Sprintf("GPU protection holds the room of %s for their idle GPUs while GPU work waits", hosts(f.FitIdleUnguarded))
	case f.FitIdle == 0:
		return Capacity, fmt.Sprintf("%s fit a frame, none has the room free now (roomiest when idle: %s)", hosts(f.FitTotal), f.BestTotal)
	}
	if f.LimitRoom >= 0 && f.LimitRoom < f.Waiting {
		return Flowing, fmt.Sprintf("%d of its %d waiting frames (the room left under its limits; the rest wait for the limit): %s with room now (best: %s)",
			f.LimitRoom, f.Waiting, hosts(f.FitIdle), f.BestIdle)
	}
	return Flowing, fmt.Sprintf("%s with room now (best: %s)", hosts(f.FitIdle), f.BestIdle)
}

func hosts(n int) string {
	if n == 1 {
		return "1 host"
	}
	return strconv.Itoa(n) + " hosts"
}

func cores(centi int64) string {
	return strconv.FormatFloat(float64(max(centi, 0))/100, 'f', -1, 64)
}

func mem(kb int64) string {
	const gib = 1024 * 1024
	return fmt.Sprintf("%.1fGiB", float64(kb)/gib)
}

// DB is what the queries need (a pool, a connection or a transaction).
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// layerFactsSQL: one row per layer with waiting or depend frames of a
// PENDING job of a scheduler-managed show ($1: a job name or id, or ” for
// all; $2 a layer; $4/$5 the memory a frame books by layer id, where
// sizing sizes it: layer.int_mem_min otherwise), with the same caps the pending-job query applies and,
// when $3 (GPU protection), the room a CPU frame must leave for idle GPUs
// while GPU work waits (package gpuguard: per idle GPU, the smallest
// per-GPU cores and memory of the waiting GPU layers with the host's tags).
const layerFactsSQL = `
WITH gpuwant AS (
    SELECT t.tag, min(GREATEST(l.int_cores_min, 0)::float8 / l.int_gpus_min) AS cores_per_gpu,
           min(GREATEST(l.int_mem_min, 0)::float8 / l.int_gpus_min) AS mem_per_gpu
    FROM layer l
    JOIN layer_stat ls ON ls.pk_layer = l.pk_layer
    JOIN job j         ON j.pk_job = l.pk_job
    JOIN show sh       ON sh.pk_show = j.pk_show
    CROSS JOIN LATERAL unnest(string_to_array(replace(l.str_tags::text, ' ', ''), '|')) AS t(tag)
    WHERE $3::bool AND l.int_gpus_min > 0 AND ls.int_waiting_count > 0
      AND j.str_state = 'PENDING' AND NOT j.b_paused AND sh.b_active AND sh.b_scheduler_managed
    GROUP BY t.tag
), lay AS (
    SELECT l.pk_layer, l.str_name AS layer, j.pk_job, j.str_name AS job, j.pk_show, sh.str_name AS show,
           j.pk_facility, j.pk_folder, j.b_paused, COALESCE(j.str_os, '') AS os,
           GREATEST(l.int_cores_min, 0) AS cores_min,
           COALESCE((SELECT m.kb FROM unnest($4::text[], $5::bigint[]) AS m(id, kb) WHERE m.id = l.pk_layer LIMIT 1), l.int_mem_min) AS mem_min,
           GREATEST(l.int_gpus_min, 0) AS gpus_min, GREATEST(l.int_gpu_mem_min, 0) AS gpu_mem_min,
           string_to_array(replace(l.str_tags::text, ' ', ''), '|') AS tags,
           ls.int_waiting_count AS waiting, ls.int_depend_count AS depend, ls.int_running_count AS running
    FROM layer l
    JOIN job j        ON j.pk_job = l.pk_job
    JOIN show sh      ON sh.pk_show = j.pk_show
    JOIN layer_stat ls ON ls.pk_layer = l.pk_layer
    WHERE j.str_state = 'PENDING' AND sh.b_scheduler_managed
      AND (ls.int_waiting_count > 0 OR ls.int_depend_count > 0)
      AND ($1::text = '' OR j.str_name = $1 OR j.pk_job = $1)
      AND ($2::text = '' OR l.str_name = $2 OR l.pk_layer = $2)
), need AS (
    -- The host facts depend on a layer's needs and facility, and on the
    -- allocations its show subscribes to: they are counted once per need
    -- and allocation (a farm's layers share a few needs), then summed over
    -- each show's subscribed allocations, not counted host by host for
    -- every layer (19 s at 10,000 hosts and 600 layers, by hand).
    SELECT DISTINCT pk_facility, os, cores_min, mem_min, gpus_min, gpu_mem_min, tags FROM lay
), need_alloc AS MATERIALIZED (
    -- Per need and allocation, the hosts serving it: up, open, of the
    -- facility, with one of the layer's tags. The roomiest host comes with
    -- the keys it was chosen by, so the sum below picks the roomiest over
    -- allocations.
    SELECT n.pk_facility, n.os, n.cores_min, n.mem_min, n.gpus_min, n.gpu_mem_min, n.tags, c.pk_alloc,
           count(*) AS hosts,
           count(*) FILTER (WHERE c.fits) AS fit_total,
           count(*) FILTER (WHERE c.fits_now AND c.keeps_room) AS fit_idle,
           count(*) FILTER (WHERE c.fits_now) AS fit_idle_unguarded,
           (array_agg(c.str_name ORDER BY c.gpu_spill, c.int_cores_idle DESC, c.str_name) FILTER (WHERE c.fits_now AND c.keeps_room))[1] AS best_idle,
           (array_agg(c.gpu_spill ORDER BY c.gpu_spill, c.int_cores_idle DESC, c.str_name) FILTER (WHERE c.fits_now AND c.keeps_room))[1] AS idle_spill,
           (array_agg(c.int_cores_idle ORDER BY c.gpu_spill, c.int_cores_idle DESC, c.str_name) FILTER (WHERE c.fits_now AND c.keeps_room))[1] AS idle_cores,
           (array_agg(c.str_name ORDER BY c.gpu_spill, c.int_cores DESC, c.str_name) FILTER (WHERE c.fits))[1] AS best_total,
           (array_agg(c.gpu_spill ORDER BY c.gpu_spill, c.int_cores DESC, c.str_name) FILTER (WHERE c.fits))[1] AS total_spill,
           (array_agg(c.int_cores ORDER BY c.gpu_spill, c.int_cores DESC, c.str_name) FILTER (WHERE c.fits))[1] AS total_cores
    FROM need n
    CROSS JOIN LATERAL (
        SELECT h.pk_alloc, h.str_name, h.int_cores, h.int_cores_idle,
               -- A CPU frame is best kept off GPU hosts.
               (h.int_gpus > 0 AND n.gpus_min = 0) AS gpu_spill,
               os_ok AND h.int_cores >= GREATEST(n.cores_min, 1) AND h.int_mem >= n.mem_min
                     AND h.int_gpus >= n.gpus_min AND h.int_gpu_mem >= n.gpu_mem_min AS fits,
               os_ok AND h.int_cores_idle >= GREATEST(n.cores_min, 1)
                     AND LEAST(h.int_mem_idle, hs.int_mem_free) >= n.mem_min
                     AND h.int_gpus_idle >= n.gpus_min
                     AND LEAST(h.int_gpu_mem_idle, hs.int_gpu_mem_free) >= n.gpu_mem_min AS fits_now,
               (n.gpus_min > 0 OR h.int_gpus_idle <= 0 OR NOT EXISTS (
                    SELECT 1 FROM gpuwant g JOIN host_tag ht3 ON ht3.str_tag = g.tag
                    WHERE ht3.pk_host = h.pk_host
                    GROUP BY ht3.pk_host
                    HAVING h.int_cores_idle - h.int_gpus_idle * min(g.cores_per_gpu) < GREATEST(n.cores_min, 1)
                        OR LEAST(h.int_mem_idle, hs.int_mem_free) - h.int_gpus_idle * min(g.mem_per_gpu) < n.mem_min)) AS keeps_room
        FROM host h
        JOIN host_stat hs ON hs.pk_host = h.pk_host
        JOIN alloc a      ON a.pk_alloc = h.pk_alloc
        CROSS JOIN LATERAL (SELECT n.os = '' OR n.os = ANY(string_to_array(replace(hs.str_os, ' ', ''), ',')) AS os_ok) o
        WHERE a.pk_facility = n.pk_facility AND h.str_lock_state = 'OPEN' AND hs.str_state = 'UP'
          AND h.pk_host IN (SELECT ht.pk_host FROM host_tag ht WHERE ht.str_tag = ANY(n.tags))
    ) c
    GROUP BY n.pk_facility, n.os, n.cores_min, n.mem_min, n.gpus_min, n.gpu_mem_min, n.tags, c.pk_alloc
), shape_hosts AS MATERIALIZED (
    -- Per show and need: the sums over the allocations the show
    -- subscribes to.
    SELECT sh.pk_show, sh.pk_facility, sh.os, sh.cores_min, sh.mem_min, sh.gpus_min, sh.gpu_mem_min, sh.tags,
           SUM(na.hosts)::bigint AS hosts, SUM(na.fit_total)::bigint AS fit_total,
           SUM(na.fit_idle)::bigint AS fit_idle, SUM(na.fit_idle_unguarded)::bigint AS fit_idle_unguarded,
           (array_agg(na.best_idle ORDER BY na.idle_spill, na.idle_cores DESC, na.best_idle)
                FILTER (WHERE na.best_idle IS NOT NULL))[1] AS best_idle,
           (array_agg(na.best_total ORDER BY na.total_spill, na.total_cores DESC, na.best_total)
                FILTER (WHERE na.best_total IS NOT NULL))[1] AS best_total
    FROM (SELECT DISTINCT pk_show, pk_facility, os, cores_min, mem_min, gpus_min, gpu_mem_min, tags FROM lay) sh
    JOIN need_alloc na ON na.pk_facility = sh.pk_facility AND na.os = sh.os AND na.cores_min = sh.cores_min
                      AND na.mem_min IS NOT DISTINCT FROM sh.mem_min AND na.gpus_min = sh.gpus_min
                      AND na.gpu_mem_min = sh.gpu_mem_min AND na.tags IS NOT DISTINCT FROM sh.tags
    WHERE EXISTS (SELECT 1 FROM subscription s WHERE s.pk_show = sh.pk_show AND s.pk_alloc = na.pk_alloc)
    GROUP BY sh.pk_show, sh.pk_facility, sh.os, sh.cores_min, sh.mem_min, sh.gpus_min, sh.gpu_mem_min, sh.tags
), show_used AS MATERIALIZED (
    -- Cores booked by the shows, by allocation; the folders' and the
    -- jobs' below: each summed once, not once per layer (MATERIALIZED:
    -- inlined, the planner pushed each layer's show into the sum and
    -- summed the show's procs again for every layer).
    SELECT p.pk_show, h.pk_alloc, SUM(p.int_cores_reserved) AS cores
    FROM proc p JOIN host h ON h.pk_host = p.pk_host
    WHERE NOT p.b_local AND p.pk_show IN (SELECT pk_show FROM lay)
    GROUP BY p.pk_show, h.pk_alloc
), folder_used AS MATERIALIZED (
    SELECT j2.pk_folder, SUM(p.int_cores_reserved) AS cores
    FROM proc p JOIN job j2 ON j2.pk_job = p.pk_job
    WHERE j2.str_state <> 'FINISHED' AND j2.pk_folder IN (SELECT pk_folder FROM lay)
    GROUP BY j2.pk_folder
), job_used AS MATERIALIZED (
    SELECT p.pk_job, SUM(p.int_cores_reserved) AS cores
    FROM proc p WHERE p.pk_job IN (SELECT pk_job FROM lay)
    GROUP BY p.pk_job
)
SELECT lay.show, lay.job, lay.layer, lay.os, lay.b_paused, lay.waiting, lay.depend, lay.running,
       lay.cores_min, lay.mem_min, lay.gpus_min,
       COALESCE(hc.hosts, 0), COALESCE(hc.fit_total, 0), COALESCE(hc.fit_idle, 0), COALESCE(hc.fit_idle_unguarded, 0),
       COALESCE(hc.best_idle, ''), COALESCE(hc.best_total, ''),
       NOT EXISTS (
           SELECT 1 FROM subscription s JOIN alloc a ON a.pk_alloc = s.pk_alloc
           LEFT JOIN show_used su ON su.pk_show = s.pk_show AND su.pk_alloc = s.pk_alloc
           WHERE s.pk_show = lay.pk_show AND a.pk_facility = lay.pk_facility AND s.int_burst > 0
             AND s.int_burst - COALESCE(su.cores, 0) >= GREATEST(lay.cores_min, 100)) AS burst_full,
       (fr.int_max_cores <> -1 AND COALESCE(fu.cores, 0) + lay.cores_min >= fr.int_max_cores) AS folder_full,
       (COALESCE(ju.cores, 0) + GREATEST(lay.cores_min, 100) > jr.int_max_cores) AS job_full,
       COALESCE(lm.full_name, ''), COALESCE(lm.full_seats, false), COALESCE(lm.zero_name, ''), COALESCE(lm.room, -1),
       lb.ts_until, COALESCE(lb.int_level, 0), COALESCE(lb.int_fails, 0), COALESCE(lb.int_avg_run_ms, 0), lay.pk_layer
FROM lay
` + heldJoin + `
JOIN job_resource jr    ON jr.pk_job = lay.pk_job
JOIN folder_resource fr ON fr.pk_folder = lay.pk_folder
LEFT JOIN folder_used fu ON fu.pk_folder = lay.pk_folder
LEFT JOIN job_used ju    ON ju.pk_job = lay.pk_job
LEFT JOIN shape_hosts hc ON hc.pk_show = lay.pk_show AND hc.pk_facility = lay.pk_facility AND hc.os = lay.os
                        AND hc.cores_min = lay.cores_min AND hc.mem_min IS NOT DISTINCT FROM lay.mem_min
                        AND hc.gpus_min = lay.gpus_min AND hc.gpu_mem_min = lay.gpu_mem_min
                        AND hc.tags IS NOT DISTINCT FROM lay.tags
CROSS JOIN LATERAL (
    -- The layer's limits: what each uses (a node-locked one: the hosts
    -- holding a seat, i.e. running one of its layers' procs; any other:
    -- its layers' running frames), the first full one, the first of max 0,
    -- and the free frames of the tightest frame-counting one (-1: none).
    SELECT (array_agg(x.str_name ORDER BY x.str_name) FILTER (WHERE x.used >= x.int_max_value))[1] AS full_name,
           (array_agg(x.ph ORDER BY x.str_name) FILTER (WHERE x.used >= x.int_max_value))[1] AS full_seats,
           (array_agg(x.str_name ORDER BY x.str_name) FILTER (WHERE x.int_max_value = 0))[1] AS zero_name,
           CASE WHEN count(*) FILTER (WHERE NOT x.ph) = 0 THEN -1
                ELSE GREATEST(MIN(x.int_max_value - x.used) FILTER (WHERE NOT x.ph), 0) END AS room
    FROM (
        SELECT lr.str_name, lr.int_max_value, ph.on AS ph,
               CASE WHEN ph.on THEN (SELECT count(DISTINCT p.pk_host) FROM layer_limit ll2 JOIN proc p ON p.pk_layer = ll2.pk_layer
                                      WHERE ll2.pk_limit_record = lr.pk_limit_record)
                    ELSE (SELECT COALESCE(SUM(ls2.int_running_count), 0) FROM layer_limit ll2 JOIN layer_stat ls2 ON ls2.pk_layer = ll2.pk_layer
                           WHERE ll2.pk_limit_record = lr.pk_limit_record) END AS used
        FROM layer_limit ll JOIN limit_record lr ON lr.pk_limit_record = ll.pk_limit_record
        CROSS JOIN LATERAL (SELECT ` + perHostExpr + ` AS on) ph
        WHERE ll.pk_layer = lay.pk_layer AND lr.int_max_value IS NOT NULL AND lr.int_max_value >= 0
    ) x
) lm
ORDER BY lay.show, lay.job, lay.layer`

// heldJoin reads the layer's fail-fast hold (cuesched_layer_backoff,
// rollout 0008); noHeldJoin stands in for it on a database without it.
const (
	heldJoin = `LEFT JOIN LATERAL (SELECT b.ts_until, b.int_level, b.int_fails, b.int_avg_run_ms FROM cuesched_layer_backoff b
                   WHERE b.pk_layer = lay.pk_layer AND b.ts_until > now()) lb ON true`
	noHeldJoin = `LEFT JOIN LATERAL (SELECT NULL::timestamptz AS ts_until, 0 AS int_level, 0::bigint AS int_fails, 0::bigint AS int_avg_run_ms
                   WHERE false) lb ON true`
)

// perHostExpr reads whether limit lr is node-locked (cuesched_limit.b_per_host,
// rollout 0010); noPerHostExpr stands in for it on a database without it.
const (
	perHostExpr   = `COALESCE((SELECT cl.b_per_host FROM cuesched_limit cl WHERE cl.pk_limit_record = lr.pk_limit_record), false)`
	noPerHostExpr = `false`
)

// LayerReport is one layer's answer.
type LayerReport struct {
	Facts
	Reason Reason
	Detail string
}

// Layers explains the layers of a job (job: name or id; layer: name or id,
// "" for all), or of every managed show's pending jobs when job is "".
// gpuProtection says whether GPU protection (queue.gpu_protection) holds
// idle GPUs' room from CPU work, as the scheduler does.
func Layers(ctx context.Context, db DB, job, layer string, gpuProtection bool) ([]LayerReport, error) {
	return SizedLayers(ctx, db, job, layer, gpuProtection, nil)
}

// SizedLayers is Layers with the memory a frame books by layer id, as
// memory sizing sizes it (sizing.memory: history): a layer in memKB is
// judged (fit, no fit, room now) by that size, not by layer.int_mem_min,
// so a layer sized below its request is not reported as fitting no host,
// nor one sized above it as fitting. MemMinKB reports the size used.
func SizedLayers(ctx context.Context, db DB, job, layer string, gpuProtection bool, memKB map[string]int64) ([]LayerReport, error) {
	ids, kbs := make([]string, 0, len(memKB)), make([]int64, 0, len(memKB))
	for id, kb := range memKB {
		ids, kbs = append(ids, id), append(kbs, kb)
	}
	// One transaction with JIT off: the planner's estimate of
	// the host counts is far above what they cost (about 20 ms at 1,000
	// hosts), and with PostgreSQL's default jit = on it compiled and
	// optimised the statement on every call: 2.7 to 5.3 s, all of the
	// count's time (SCALE, 1,000 hosts and 600 layers).
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET LOCAL jit = off"); err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	q := layerFactsSQL
	var hasHolds, hasPerHost bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('cuesched_layer_backoff') IS NOT NULL,
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('cuesched_limit') AND attname = 'b_per_host' AND NOT attisdropped)`).Scan(&hasHolds, &hasPerHost); err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	if !hasHolds {
		q = strings.Replace(q, heldJoin, noHeldJoin, 1)
	}
	if !hasPerHost {
		q = strings.Replace(q, perHostExpr, noPerHostExpr, 1)
	}
	rows, err := tx.Query(ctx, q, job, layer, gpuProtection, ids, kbs)
	if err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	defer rows.Close()
	var out []LayerReport
	for rows.Next() {
		var f Facts
		var until *time.Time
		var avgMs int64
		if err := rows.Scan(&f.Show, &f.Job, &f.Layer, &f.OS, &f.Paused, &f.Waiting, &f.Depend, &f.Running,
			&f.CoresMin, &f.MemMinKB, &f.GPUsMin, &f.Hosts, &f.FitTotal, &f.FitIdle, &f.FitIdleUnguarded, &f.BestIdle, &f.BestTotal,
			&f.BurstFull, &f.FolderFull, &f.JobFull, &f.LimitFull, &f.LimitSeats, &f.LimitZero, &f.LimitRoom, &until, &f.HeldLevel, &f.HeldFails, &avgMs, &f.LayerID); err != nil {
			return nil, fmt.Errorf("explain: %w", err)
		}
		if until != nil {
			f.HeldUntil = *until
		}
		f.HeldAvgRun = time.Duration(avgMs) * time.Millisecond
		r, d := Classify(f)
		out = append(out, LayerReport{Facts: f, Reason: r, Detail: d})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	return out, nil
}

// Count is the number of waiting frames of one show held for one reason.
type Count struct {
	Show   string
	Reason Reason
	Frames int
}

// Waiting counts the waiting frames of every scheduler-managed show by
// reason (the scheduler_waiting_frames gauge), sorted by show and reason.
func Waiting(ctx context.Context, db DB, gpuProtection bool) ([]Count, error) {
	ls, err := Layers(ctx, db, "", "", gpuProtection)
	if err != nil {
		return nil, err
	}
	type key struct {
		show   string
		reason Reason
	}
	sum := map[key]int{}
	for _, l := range ls {
		if l.Waiting > 0 {
			if l.Reason == Flowing && l.LimitRoom >= 0 && l.LimitRoom < l.Waiting {
				// Only as many frames flow as the limits have room for.
				sum[key{l.Show, Flowing}] += l.LimitRoom
				sum[key{l.Show, Limit}] += l.Waiting - l.LimitRoom
			} else {
				sum[key{l.Show, l.Reason}] += l.Waiting
			}
		}
		if l.Depend > 0 {
			sum[key{l.Show, Depend}] += l.Depend
		}
	}
	out := make([]Count, 0, len(sum))
	for k, n := range sum {
		out = append(out, Count{Show: k.show, Reason: k.reason, Frames: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Show != out[j].Show {
			return out[i].Show < out[j].Show
		}
		return out[i].Reason < out[j].Reason
	})
	return out, nil
}
