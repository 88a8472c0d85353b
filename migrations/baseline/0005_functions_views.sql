-- cuesched baseline, part 5: maintenance functions and views that Cuebot
-- and an external scheduler read.

-- recalculate_subs(): rebuilds subscription.int_cores / int_gpus from the
-- live proc table for Cuebot-managed shows only (b_scheduler_managed =
-- false; managed shows are the external scheduler's business). Only
-- non-local procs count, and the allocation is the proc's host's. Cuebot's
-- maintenance task calls it every two hours.
--
-- verify_subscription would refuse an increase above the burst, so each
-- row is written with int_burst set to the new total in the same UPDATE
-- (which disables the check) and the burst is put back afterwards.
CREATE OR REPLACE FUNCTION recalculate_subs() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    saved_burst bigint;
BEGIN
    UPDATE subscription SET int_cores = 0, int_gpus = 0
     WHERE pk_show IN (SELECT pk_show FROM show WHERE NOT b_scheduler_managed);

    FOR r IN
        SELECT s.str_name AS show_name, p.pk_show, a.pk_alloc, a.str_name AS alloc_name,
               sum(p.int_cores_reserved) AS cores, sum(p.int_gpus_reserved) AS gpus
          FROM proc p
          JOIN show s  ON s.pk_show = p.pk_show
          JOIN host h  ON h.pk_host = p.pk_host
          JOIN alloc a ON a.pk_alloc = h.pk_alloc
         WHERE NOT p.b_local AND NOT s.b_scheduler_managed
         GROUP BY s.str_name, p.pk_show, a.pk_alloc, a.str_name
    LOOP
        BEGIN
            SELECT int_burst INTO saved_burst FROM subscription
             WHERE pk_alloc = r.pk_alloc AND pk_show = r.pk_show;
            UPDATE subscription SET int_cores = r.cores, int_burst = r.cores, int_gpus = r.gpus
             WHERE pk_alloc = r.pk_alloc AND pk_show = r.pk_show;
            UPDATE subscription SET int_burst = saved_burst
             WHERE pk_alloc = r.pk_alloc AND pk_show = r.pk_show;
        EXCEPTION WHEN data_exception THEN
            RAISE data_exception USING MESSAGE =
                r.show_name || ' ' || r.alloc_name || ' could not be fixed (over burst)';
        END;
    END LOOP;
END;
$$;

-- recalculate_tags(host): host.str_tags = the host's tags, ordered by tag
-- type then name, separated by single spaces.
CREATE OR REPLACE FUNCTION recalculate_tags(p_host varchar) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE host
       SET str_tags = coalesce((SELECT string_agg(str_tag, ' ' ORDER BY str_tag_type, str_tag)
                                  FROM host_tag WHERE pk_host = p_host), '')
     WHERE pk_host = p_host;
END;
$$;

-- Shows that have at least one pending, unpaused job with waiting frames
-- and at least one core (100 centicores) of headroom under its max.
-- Both Cuebot's show selection and the Rust pending-job query start here,
-- so job_stat.int_waiting_count and job_resource must be kept realistic.
CREATE VIEW vs_waiting AS
SELECT j.pk_show
  FROM job j
  JOIN job_resource jr ON jr.pk_job = j.pk_job
  JOIN job_stat js     ON js.pk_job = j.pk_job
 WHERE j.str_state = 'PENDING'
   AND j.b_paused = false
   AND jr.int_max_cores - jr.int_cores >= 100
   AND js.int_waiting_count <> 0
 GROUP BY j.pk_show;

-- Live per-job totals computed from proc (not the lagging job_resource).
CREATE VIEW vs_job_resource AS
SELECT j.pk_job,
       count(p.pk_proc)                              AS int_procs,
       coalesce(sum(p.int_cores_reserved), 0)::numeric AS int_cores,
       coalesce(sum(p.int_gpus_reserved), 0)::bigint   AS int_gpus,
       coalesce(sum(p.int_mem_reserved), 0)::numeric   AS int_mem_reserved
  FROM job j
  LEFT JOIN proc p ON p.pk_job = j.pk_job
 GROUP BY j.pk_job;

-- Booked cores/GPUs of a show's pending jobs, from job_resource.
CREATE VIEW vs_show_resource AS
SELECT j.pk_show,
       sum(jr.int_cores) AS int_cores,
       sum(jr.int_gpus)  AS int_gpus
  FROM job j
  JOIN job_resource jr ON jr.pk_job = j.pk_job
 WHERE j.str_state = 'PENDING'
 GROUP BY j.pk_show;

-- Frame counts of a show's pending jobs.
CREATE VIEW vs_show_stat AS
SELECT j.pk_show,
       sum(js.int_waiting_count + js.int_depend_count) AS int_pending_count,
       sum(js.int_running_count)                       AS int_running_count,
       sum(js.int_dead_count)                          AS int_dead_count,
       count(1)                                        AS int_job_count
  FROM job j
  JOIN job_stat js ON js.pk_job = j.pk_job
 WHERE j.str_state = 'PENDING'
 GROUP BY j.pk_show;

-- Per-folder totals over its pending jobs.
CREATE VIEW vs_folder_counts AS
SELECT f.pk_folder,
       coalesce(sum(js.int_depend_count), 0)::numeric  AS int_depend_count,
       coalesce(sum(js.int_waiting_count), 0)::numeric AS int_waiting_count,
       coalesce(sum(js.int_running_count), 0)::numeric AS int_running_count,
       coalesce(sum(js.int_dead_count), 0)::numeric    AS int_dead_count,
       coalesce(sum(jr.int_cores), 0)::numeric         AS int_cores,
       coalesce(sum(jr.int_gpus), 0)::bigint           AS int_gpus,
       count(j.pk_job)                                 AS int_job_count
  FROM folder f
  LEFT JOIN job j           ON j.pk_folder = f.pk_folder AND j.str_state = 'PENDING'
  LEFT JOIN job_stat js     ON js.pk_job = j.pk_job
  LEFT JOIN job_resource jr ON jr.pk_job = j.pk_job
 GROUP BY f.pk_folder;

-- Per-allocation host capacity: totals, idle, running, locked, available
-- (OPEN and UP) cores and GPUs, and host counts.
CREATE VIEW vs_alloc_usage AS
SELECT a.pk_alloc,
       coalesce(sum(h.int_cores), 0)::numeric                      AS int_cores,
       coalesce(sum(h.int_cores_idle), 0)::numeric                 AS int_idle_cores,
       coalesce(sum(h.int_cores - h.int_cores_idle), 0)::numeric   AS int_running_cores,
       coalesce((SELECT sum(x.int_cores) FROM host x
                  WHERE x.pk_alloc = a.pk_alloc
                    AND x.str_lock_state IN ('LOCKED', 'NIMBY_LOCKED')), 0)::numeric AS int_locked_cores,
       coalesce((SELECT sum(x.int_cores_idle) FROM host x JOIN host_stat xs ON xs.pk_host = x.pk_host
                  WHERE x.pk_alloc = a.pk_alloc AND x.str_lock_state = 'OPEN'
                    AND xs.str_state = 'UP'), 0)::numeric           AS int_available_cores,
       coalesce(sum(h.int_gpus), 0)::numeric                       AS int_gpus,
       coalesce(sum(h.int_gpus_idle), 0)::numeric                  AS int_idle_gpus,
       coalesce(sum(h.int_gpus - h.int_gpus_idle), 0)::numeric     AS int_running_gpus,
       coalesce((SELECT sum(x.int_gpus) FROM host x
                  WHERE x.pk_alloc = a.pk_alloc
                    AND x.str_lock_state IN ('LOCKED', 'NIMBY_LOCKED')), 0)::numeric AS int_locked_gpus,
       coalesce((SELECT sum(x.int_gpus_idle) FROM host x JOIN host_stat xs ON xs.pk_host = x.pk_host
                  WHERE x.pk_alloc = a.pk_alloc AND x.str_lock_state = 'OPEN'
                    AND xs.str_state = 'UP'), 0)::numeric           AS int_available_gpus,
       count(h.pk_host)                                            AS int_hosts,
       (SELECT count(*) FROM host x
         WHERE x.pk_alloc = a.pk_alloc AND x.str_lock_state = 'LOCKED') AS int_locked_hosts,
       (SELECT count(*) FROM host x JOIN host_stat xs ON xs.pk_host = x.pk_host
         WHERE x.pk_alloc = a.pk_alloc AND xs.str_state = 'DOWN')  AS int_down_hosts
  FROM alloc a
  LEFT JOIN host h ON h.pk_alloc = a.pk_alloc
 GROUP BY a.pk_alloc;
