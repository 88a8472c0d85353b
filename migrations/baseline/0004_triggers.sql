-- cuesched baseline, part 4: triggers.
--
-- These reproduce the side effects a Cuebot database has on the writes a
-- scheduler, the sidecar and a Cuebot emulator make. Behaviour that matters
-- to us, in short:
--
--   booking   INSERT proc            -> before_insert_proc only (cores > 0);
--                                       nothing is accounted automatically.
--             UPDATE frame -> RUNNING -> frame_history row opened,
--                                       layer_stat/job_stat waiting-1 running+1.
--             UPDATE host idle -= x   -> verify_host_resources rejects any
--                                       idle value below zero (P0001).
--             subscription/job_resource increments -> burst / max checks.
--   release   DELETE proc            -> no trigger at all; the caller gives
--                                       the host its idle values back.
--             UPDATE frame RUNNING -> X -> history row closed, counts moved.
--
-- PostgreSQL fires same-event triggers in name order, so trigger names are
-- part of the behaviour (Cuebot's names are kept). All errors are raised
-- with the default SQLSTATE P0001 and the same message text as Cuebot, since
-- Cuebot and the Rust scheduler match on it.
--
-- Trigger functions are named trigger__<trigger>, as in Cuebot, so a later
-- Cuebot migration that replaces one of them replaces ours.

------------------------------------------------------------------------------
-- Helpers shared by the history triggers.
------------------------------------------------------------------------------

-- True when the operator switched history off with a config row
-- str_key = 'DISABLE_HISTORY' (its value is not looked at).
CREATE OR REPLACE FUNCTION cuesched_history_disabled() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM config WHERE str_key = 'DISABLE_HISTORY')
$$;

------------------------------------------------------------------------------
-- proc
------------------------------------------------------------------------------

-- A proc must reserve some CPU. (The message says "0 cores" whatever the
-- value was; that is Cuebot's text.)
CREATE OR REPLACE FUNCTION trigger__before_insert_proc() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.int_cores_reserved <= 0 THEN
        RAISE EXCEPTION 'failed to allocate proc, tried to allocate 0 cores';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER before_insert_proc BEFORE INSERT ON proc
    FOR EACH ROW EXECUTE FUNCTION trigger__before_insert_proc();

-- Moving a proc to a frame of another layer (Cuebot reuses procs within a
-- job) moves its cores and GPUs between the two layer_resource rows. The
-- rows are visited in descending pk_layer order so concurrent moves lock in
-- the same order. Only layers that still have a layer_stat row are touched.
CREATE OR REPLACE FUNCTION trigger__update_proc_update_layer() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    l varchar(36);
BEGIN
    FOR l IN SELECT pk_layer FROM layer_stat
              WHERE pk_layer IN (OLD.pk_layer, NEW.pk_layer)
              ORDER BY pk_layer DESC
    LOOP
        IF l = OLD.pk_layer THEN
            UPDATE layer_resource
               SET int_cores = int_cores - OLD.int_cores_reserved,
                   int_gpus  = int_gpus  - OLD.int_gpus_reserved
             WHERE pk_layer = OLD.pk_layer;
        ELSE
            UPDATE layer_resource
               SET int_cores = int_cores + NEW.int_cores_reserved,
                   int_gpus  = int_gpus  + NEW.int_gpus_reserved
             WHERE pk_layer = NEW.pk_layer;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;
-- A NULL on either side makes the WHEN clause NULL: the trigger does not fire.
CREATE TRIGGER update_proc_update_layer AFTER UPDATE ON proc
    FOR EACH ROW WHEN (NEW.pk_layer::text <> OLD.pk_layer::text)
    EXECUTE FUNCTION trigger__update_proc_update_layer();

-- Growing (or shrinking) a proc's memory reservation charges the difference
-- to the host's idle memory; verify_host_resources then refuses a negative
-- result ("unable to allocate additional memory").
CREATE OR REPLACE FUNCTION trigger__upgrade_proc_memory_usage() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE host
       SET int_mem_idle = int_mem_idle - (NEW.int_mem_reserved - OLD.int_mem_reserved)
     WHERE pk_host = NEW.pk_host;
    RETURN NULL;
END;
$$;
CREATE TRIGGER upgrade_proc_memory_usage AFTER UPDATE ON proc
    FOR EACH ROW WHEN (NEW.int_mem_reserved <> OLD.int_mem_reserved)
    EXECUTE FUNCTION trigger__upgrade_proc_memory_usage();

------------------------------------------------------------------------------
-- host
------------------------------------------------------------------------------

-- Idle resources may never go below zero. This is the database-level guard
-- against over-booking a host: a booking subtracts its reservation from the
-- idle columns, and a second booking that does not fit fails here. There is
-- no upper bound (idle may exceed the total). Checked in this order.
CREATE OR REPLACE FUNCTION trigger__verify_host_resources() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.int_cores_idle < 0 THEN
        RAISE EXCEPTION 'unable to allocate additional core units';
    END IF;
    IF NEW.int_mem_idle < 0 THEN
        RAISE EXCEPTION 'unable to allocate additional memory';
    END IF;
    IF NEW.int_gpus_idle < 0 THEN
        RAISE EXCEPTION 'unable to allocate additional GPU units';
    END IF;
    IF NEW.int_gpu_mem_idle < 0 THEN
        RAISE EXCEPTION 'unable to allocate additional GPU memory';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER verify_host_resources BEFORE UPDATE ON host
    FOR EACH ROW WHEN (NEW.int_cores_idle <> OLD.int_cores_idle
                    OR NEW.int_mem_idle <> OLD.int_mem_idle
                    OR NEW.int_gpus_idle <> OLD.int_gpus_idle
                    OR NEW.int_gpu_mem_idle <> OLD.int_gpu_mem_idle)
    EXECUTE FUNCTION trigger__verify_host_resources();

-- Deleting a host removes its stat, tags and deed. Procs are not touched:
-- their foreign key blocks the delete while any exist.
CREATE OR REPLACE FUNCTION trigger__before_delete_host() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM host_stat WHERE pk_host = OLD.pk_host;
    DELETE FROM host_tag  WHERE pk_host = OLD.pk_host;
    DELETE FROM deed      WHERE pk_host = OLD.pk_host;
    RETURN OLD;
END;
$$;
CREATE TRIGGER before_delete_host BEFORE DELETE ON host
    FOR EACH ROW EXECUTE FUNCTION trigger__before_delete_host();

------------------------------------------------------------------------------
-- subscription, job_resource, folder_resource, point: caps and tiers.
------------------------------------------------------------------------------

-- Booking more cores than the burst allows is refused. Only an increase of
-- int_cores with an unchanged int_burst is checked, so lowering the burst
-- below current usage, or rewriting cores and burst together (the
-- recalculation trick), is allowed.
CREATE OR REPLACE FUNCTION trigger__verify_subscription() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.int_cores > NEW.int_burst THEN
        RAISE EXCEPTION 'subscription has exceeded burst size';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER verify_subscription BEFORE UPDATE ON subscription
    FOR EACH ROW WHEN (NEW.int_burst = OLD.int_burst AND NEW.int_cores > OLD.int_cores)
    EXECUTE FUNCTION trigger__verify_subscription();

CREATE OR REPLACE FUNCTION trigger__tier_subscription() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.float_tier := tier(NEW.int_cores, NEW.int_size);
    RETURN NEW;
END;
$$;
CREATE TRIGGER tier_subscription BEFORE UPDATE ON subscription
    FOR EACH ROW EXECUTE FUNCTION trigger__tier_subscription();

-- A job may not book past its max cores / max GPUs. Fires when cores grow
-- with an unchanged max, or GPUs grow with an unchanged GPU max; both caps
-- are then checked.
CREATE OR REPLACE FUNCTION trigger__verify_job_resources() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.int_cores > NEW.int_max_cores THEN
        RAISE EXCEPTION 'job has exceeded max cores';
    END IF;
    IF NEW.int_gpus > NEW.int_max_gpus THEN
        RAISE EXCEPTION 'job has exceeded max GPU units';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER verify_job_resources BEFORE UPDATE ON job_resource
    FOR EACH ROW WHEN ((NEW.int_max_cores = OLD.int_max_cores AND NEW.int_cores > OLD.int_cores)
                    OR (NEW.int_max_gpus = OLD.int_max_gpus AND NEW.int_gpus > OLD.int_gpus))
    EXECUTE FUNCTION trigger__verify_job_resources();

CREATE OR REPLACE FUNCTION trigger__tier_job() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.float_tier := tier(NEW.int_cores, NEW.int_min_cores);
    RETURN NEW;
END;
$$;
CREATE TRIGGER tier_job BEFORE UPDATE ON job_resource
    FOR EACH ROW EXECUTE FUNCTION trigger__tier_job();

-- Folders have no cap check in the database; their max is enforced by the
-- dispatch queries only.
CREATE OR REPLACE FUNCTION trigger__tier_folder() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.float_tier := soft_tier(NEW.int_cores, NEW.int_min_cores);
    RETURN NEW;
END;
$$;
CREATE TRIGGER tier_folder BEFORE UPDATE ON folder_resource
    FOR EACH ROW EXECUTE FUNCTION trigger__tier_folder();

CREATE OR REPLACE FUNCTION trigger__point_tier() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.float_tier := soft_tier(NEW.int_cores, NEW.int_min_cores);
    RETURN NEW;
END;
$$;
CREATE TRIGGER point_tier BEFORE UPDATE ON point
    FOR EACH ROW EXECUTE FUNCTION trigger__point_tier();

------------------------------------------------------------------------------
-- folder
------------------------------------------------------------------------------

-- A folder without a parent is its show's root and is always the default.
CREATE OR REPLACE FUNCTION trigger__before_insert_folder() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.pk_parent_folder IS NULL THEN
        NEW.b_default := true;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER before_insert_folder BEFORE INSERT ON folder
    FOR EACH ROW EXECUTE FUNCTION trigger__before_insert_folder();

-- Every folder gets a folder_level (depth below the root) and a
-- folder_resource row with default caps, both keyed by pk_folder.
CREATE OR REPLACE FUNCTION trigger__after_insert_folder() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    depth integer := 0;
BEGIN
    IF NEW.pk_parent_folder IS NOT NULL THEN
        SELECT fl.int_level + 1 INTO depth
          FROM folder_level fl WHERE fl.pk_folder = NEW.pk_parent_folder;
    END IF;
    INSERT INTO folder_level (pk_folder_level, pk_folder, int_level)
         VALUES (NEW.pk_folder, NEW.pk_folder, depth);
    INSERT INTO folder_resource (pk_folder_resource, pk_folder)
         VALUES (NEW.pk_folder, NEW.pk_folder);
    RETURN NULL;
END;
$$;
CREATE TRIGGER after_insert_folder AFTER INSERT ON folder
    FOR EACH ROW EXECUTE FUNCTION trigger__after_insert_folder();

CREATE OR REPLACE FUNCTION trigger__before_delete_folder() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM folder_level    WHERE pk_folder = OLD.pk_folder;
    DELETE FROM folder_resource WHERE pk_folder = OLD.pk_folder;
    RETURN OLD;
END;
$$;
CREATE TRIGGER before_delete_folder BEFORE DELETE ON folder
    FOR EACH ROW EXECUTE FUNCTION trigger__before_delete_folder();

------------------------------------------------------------------------------
-- job
------------------------------------------------------------------------------

-- A new job gets its stat, resource, usage and memory rows (keyed by pk_job,
-- all defaults) and, unless history is disabled, an open job_history row.
CREATE OR REPLACE FUNCTION trigger__after_insert_job() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_stat     (pk_job_stat, pk_job)     VALUES (NEW.pk_job, NEW.pk_job);
    INSERT INTO job_resource (pk_job_resource, pk_job) VALUES (NEW.pk_job, NEW.pk_job);
    INSERT INTO job_usage    (pk_job_usage, pk_job)    VALUES (NEW.pk_job, NEW.pk_job);
    INSERT INTO job_mem      (pk_job_mem, pk_job)      VALUES (NEW.pk_job, NEW.pk_job);
    IF NOT cuesched_history_disabled() THEN
        INSERT INTO job_history (pk_job, pk_show, pk_facility, pk_dept,
                                 str_name, str_shot, str_user, int_ts_started)
             VALUES (NEW.pk_job, NEW.pk_show, NEW.pk_facility, NEW.pk_dept,
                     NEW.str_name, NEW.str_shot, NEW.str_user, epoch(current_timestamp));
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER after_insert_job AFTER INSERT ON job
    FOR EACH ROW EXECUTE FUNCTION trigger__after_insert_job();

-- Moving a job to another folder moves its booked cores/GPUs (as recorded
-- in job_resource) between the two folder_resource rows.
CREATE OR REPLACE FUNCTION trigger__after_job_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    c bigint;
    g integer;
BEGIN
    SELECT int_cores, int_gpus INTO c, g FROM job_resource WHERE pk_job = NEW.pk_job;
    IF c > 0 THEN
        UPDATE folder_resource SET int_cores = int_cores + c WHERE pk_folder = NEW.pk_folder;
        UPDATE folder_resource SET int_cores = int_cores - c WHERE pk_folder = OLD.pk_folder;
    END IF;
    IF g > 0 THEN
        UPDATE folder_resource SET int_gpus = int_gpus + g WHERE pk_folder = NEW.pk_folder;
        UPDATE folder_resource SET int_gpus = int_gpus - g WHERE pk_folder = OLD.pk_folder;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER after_job_moved AFTER UPDATE ON job
    FOR EACH ROW WHEN (NEW.pk_folder::text <> OLD.pk_folder::text)
    EXECUTE FUNCTION trigger__after_job_moved();

-- Same for a pending job changing department: the point rows (dept, show).
CREATE OR REPLACE FUNCTION trigger__after_job_dept_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    c bigint;
    g integer;
BEGIN
    SELECT int_cores, int_gpus INTO c, g FROM job_resource WHERE pk_job = NEW.pk_job;
    IF c > 0 THEN
        UPDATE point SET int_cores = int_cores + c WHERE pk_dept = NEW.pk_dept AND pk_show = NEW.pk_show;
        UPDATE point SET int_cores = int_cores - c WHERE pk_dept = OLD.pk_dept AND pk_show = OLD.pk_show;
    END IF;
    IF g > 0 THEN
        UPDATE point SET int_gpus = int_gpus + g WHERE pk_dept = NEW.pk_dept AND pk_show = NEW.pk_show;
        UPDATE point SET int_gpus = int_gpus - g WHERE pk_dept = OLD.pk_dept AND pk_show = OLD.pk_show;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER after_job_dept_update AFTER UPDATE ON job
    FOR EACH ROW WHEN (NEW.pk_dept::text <> OLD.pk_dept::text AND NEW.str_state = 'PENDING')
    EXECUTE FUNCTION trigger__after_job_dept_update();

-- Copies a layer's final totals into its layer_history row.
CREATE OR REPLACE FUNCTION cuesched_archive_layer(p_layer varchar, p_archived boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE layer_history h
       SET int_cores_min         = l.int_cores_min,
           int_mem_min           = l.int_mem_min,
           int_core_time_success = u.int_core_time_success,
           int_core_time_fail    = u.int_core_time_fail,
           int_gpu_time_success  = u.int_gpu_time_success,
           int_gpu_time_fail     = u.int_gpu_time_fail,
           int_frame_count       = s.int_total_count,
           int_waiting_count     = s.int_waiting_count,
           int_dead_count        = s.int_dead_count,
           int_depend_count      = s.int_depend_count,
           int_eaten_count       = s.int_eaten_count,
           int_succeeded_count   = s.int_succeeded_count,
           int_running_count     = s.int_running_count,
           int_max_rss           = m.int_max_rss,
           int_gpu_mem_max       = m.int_gpu_mem_max,
           b_archived            = h.b_archived OR p_archived
      FROM layer l
      JOIN layer_usage u ON u.pk_layer = l.pk_layer
      JOIN layer_stat  s ON s.pk_layer = l.pk_layer
      JOIN layer_mem   m ON m.pk_layer = l.pk_layer
     WHERE l.pk_layer = p_layer
       AND h.pk_layer = p_layer;
END;
$$;

-- Copies a job's final totals into its job_history row.
CREATE OR REPLACE FUNCTION cuesched_archive_job(p_job varchar, p_dept varchar,
        p_frames integer, p_layers integer, p_stopped integer, p_archived boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE job_history h
       SET pk_dept               = p_dept,
           int_core_time_success = u.int_core_time_success,
           int_core_time_fail    = u.int_core_time_fail,
           int_gpu_time_success  = u.int_gpu_time_success,
           int_gpu_time_fail     = u.int_gpu_time_fail,
           int_frame_count       = p_frames,
           int_layer_count       = p_layers,
           int_waiting_count     = s.int_waiting_count,
           int_dead_count        = s.int_dead_count,
           int_depend_count      = s.int_depend_count,
           int_eaten_count       = s.int_eaten_count,
           int_succeeded_count   = s.int_succeeded_count,
           int_running_count     = s.int_running_count,
           int_max_rss           = m.int_max_rss,
           int_gpu_mem_max       = m.int_gpu_mem_max,
           int_ts_stopped        = p_stopped,
           b_archived            = h.b_archived OR p_archived
      FROM job_usage u
      JOIN job_stat s ON s.pk_job = u.pk_job
      JOIN job_mem  m ON m.pk_job = u.pk_job
     WHERE u.pk_job = p_job
       AND h.pk_job = p_job;
END;
$$;

-- PENDING -> FINISHED: record final totals in the history tables (no
-- DISABLE_HISTORY check; with history off there are simply no rows to
-- update) and drop the job's local-booking assignments.
CREATE OR REPLACE FUNCTION trigger__after_job_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    l varchar(36);
BEGIN
    PERFORM cuesched_archive_job(NEW.pk_job, NEW.pk_dept, NEW.int_frame_count,
                                 NEW.int_layer_count, epoch(current_timestamp)::integer, false);
    FOR l IN SELECT pk_layer FROM layer WHERE pk_job = NEW.pk_job LOOP
        PERFORM cuesched_archive_layer(l, false);
    END LOOP;
    DELETE FROM job_local WHERE pk_job = NEW.pk_job;
    RETURN NEW;
END;
$$;
CREATE TRIGGER after_job_finished AFTER UPDATE ON job
    FOR EACH ROW WHEN (OLD.str_state = 'PENDING' AND NEW.str_state = 'FINISHED')
    EXECUTE FUNCTION trigger__after_job_finished();

-- Deleting a job archives it (unless history is disabled) and removes
-- everything hanging off it, frames and layers included. Procs, host_local
-- and job_local rows are NOT removed: their foreign keys block the delete.
CREATE OR REPLACE FUNCTION trigger__before_delete_job() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT cuesched_history_disabled() THEN
        PERFORM cuesched_archive_job(OLD.pk_job, OLD.pk_dept, OLD.int_frame_count, OLD.int_layer_count,
                                     coalesce(epoch(OLD.ts_stopped), epoch(current_timestamp))::integer, true);
    END IF;
    DELETE FROM depend WHERE pk_job_depend_on = OLD.pk_job OR pk_job_depend_er = OLD.pk_job;
    DELETE FROM frame_state_display_overrides
     WHERE pk_frame IN (SELECT pk_frame FROM frame WHERE pk_job = OLD.pk_job);
    DELETE FROM frame        WHERE pk_job = OLD.pk_job;
    DELETE FROM layer        WHERE pk_job = OLD.pk_job;
    DELETE FROM job_env      WHERE pk_job = OLD.pk_job;
    DELETE FROM job_stat     WHERE pk_job = OLD.pk_job;
    DELETE FROM job_resource WHERE pk_job = OLD.pk_job;
    DELETE FROM job_usage    WHERE pk_job = OLD.pk_job;
    DELETE FROM job_mem      WHERE pk_job = OLD.pk_job;
    DELETE FROM job_post     WHERE pk_job = OLD.pk_job;
    DELETE FROM comments     WHERE pk_job = OLD.pk_job;
    RETURN OLD;
END;
$$;
CREATE TRIGGER before_delete_job BEFORE DELETE ON job
    FOR EACH ROW EXECUTE FUNCTION trigger__before_delete_job();

------------------------------------------------------------------------------
-- layer
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION trigger__after_insert_layer() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO layer_stat     (pk_layer_stat, pk_layer, pk_job)     VALUES (NEW.pk_layer, NEW.pk_layer, NEW.pk_job);
    INSERT INTO layer_resource (pk_layer_resource, pk_layer, pk_job) VALUES (NEW.pk_layer, NEW.pk_layer, NEW.pk_job);
    INSERT INTO layer_usage    (pk_layer_usage, pk_layer, pk_job)    VALUES (NEW.pk_layer, NEW.pk_layer, NEW.pk_job);
    INSERT INTO layer_mem      (pk_layer_mem, pk_layer, pk_job)      VALUES (NEW.pk_layer, NEW.pk_layer, NEW.pk_job);
    IF NOT cuesched_history_disabled() THEN
        INSERT INTO layer_history (pk_layer, pk_job, str_name, str_type, int_cores_min, int_mem_min,
                                   int_gpus_min, int_gpu_mem_min, b_archived, str_services)
             VALUES (NEW.pk_layer, NEW.pk_job, NEW.str_name, NEW.str_type, NEW.int_cores_min, NEW.int_mem_min,
                     NEW.int_gpus_min, NEW.int_gpu_mem_min, false, NEW.str_services);
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER after_insert_layer AFTER INSERT ON layer
    FOR EACH ROW EXECUTE FUNCTION trigger__after_insert_layer();

-- Deleting a layer archives its totals (there is no DISABLE_HISTORY check)
-- and removes its child rows.
CREATE OR REPLACE FUNCTION trigger__before_delete_layer() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cuesched_archive_layer(OLD.pk_layer, true);
    DELETE FROM layer_resource WHERE pk_layer = OLD.pk_layer;
    DELETE FROM layer_stat     WHERE pk_layer = OLD.pk_layer;
    DELETE FROM layer_usage    WHERE pk_layer = OLD.pk_layer;
    DELETE FROM layer_env      WHERE pk_layer = OLD.pk_layer;
    DELETE FROM layer_mem      WHERE pk_layer = OLD.pk_layer;
    DELETE FROM layer_output   WHERE pk_layer = OLD.pk_layer;
    RETURN OLD;
END;
$$;
CREATE TRIGGER before_delete_layer BEFORE DELETE ON layer
    FOR EACH ROW EXECUTE FUNCTION trigger__before_delete_layer();

CREATE OR REPLACE FUNCTION trigger__before_delete_layer_drop_limit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM layer_limit WHERE pk_layer = OLD.pk_layer;
    RETURN OLD;
END;
$$;
CREATE TRIGGER before_delete_layer_drop_limit BEFORE DELETE ON layer
    FOR EACH ROW EXECUTE FUNCTION trigger__before_delete_layer_drop_limit();

------------------------------------------------------------------------------
-- frame: BEFORE triggers (they fire in this name order and may rewrite NEW).
------------------------------------------------------------------------------

-- Frames inserted straight into WAITING become eligible now.
CREATE OR REPLACE FUNCTION trigger__set_frame_ts_eligible_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.str_state = 'WAITING' AND NEW.ts_eligible IS NULL THEN
        NEW.ts_eligible := current_timestamp;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER set_frame_ts_eligible_on_insert BEFORE INSERT ON frame
    FOR EACH ROW EXECUTE FUNCTION trigger__set_frame_ts_eligible_on_insert();

-- 1. Job activation (SETUP -> WAITING) stamps eligibility; the version is
--    not bumped.
CREATE OR REPLACE FUNCTION trigger__set_frame_ts_eligible_setup_to_wait() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.ts_eligible := current_timestamp;
    RETURN NEW;
END;
$$;
CREATE TRIGGER set_frame_ts_eligible_setup_to_wait BEFORE UPDATE ON frame
    FOR EACH ROW WHEN (OLD.str_state = 'SETUP' AND NEW.str_state = 'WAITING')
    EXECUTE FUNCTION trigger__set_frame_ts_eligible_setup_to_wait();

-- 2. A checkpointing frame sent back to WAITING becomes CHECKPOINT.
CREATE OR REPLACE FUNCTION trigger__update_frame_checkpoint_state() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.str_state := 'CHECKPOINT';
    RETURN NEW;
END;
$$;
CREATE TRIGGER update_frame_checkpoint_state BEFORE UPDATE ON frame
    FOR EACH ROW WHEN (NEW.str_state = 'WAITING' AND OLD.str_state = 'RUNNING'
                       AND NEW.str_checkpoint_state IN ('ENABLED', 'COPYING'))
    EXECUTE FUNCTION trigger__update_frame_checkpoint_state();

-- 3. The last dependency of a DEPEND frame cleared: it becomes WAITING and
--    eligible now, with a version bump.
CREATE OR REPLACE FUNCTION trigger__update_frame_dep_to_wait() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.str_state   := 'WAITING';
    NEW.ts_updated  := current_timestamp;
    NEW.ts_eligible := current_timestamp;
    NEW.int_version := NEW.int_version + 1;
    RETURN NEW;
END;
$$;
CREATE TRIGGER update_frame_dep_to_wait BEFORE UPDATE ON frame
    FOR EACH ROW WHEN (OLD.int_depend_count > 0 AND NEW.int_depend_count < 1 AND OLD.str_state = 'DEPEND')
    EXECUTE FUNCTION trigger__update_frame_dep_to_wait();

-- 4. A SUCCEEDED frame cannot be eaten.
CREATE OR REPLACE FUNCTION trigger__update_frame_eaten() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.str_state := 'SUCCEEDED';
    RETURN NEW;
END;
$$;
CREATE TRIGGER update_frame_eaten BEFORE UPDATE ON frame
    FOR EACH ROW WHEN (NEW.str_state = 'EATEN' AND OLD.str_state = 'SUCCEEDED')
    EXECUTE FUNCTION trigger__update_frame_eaten();

-- 5. A frame with unsatisfied dependencies that would be DEAD, SUCCEEDED,
--    WAITING or CHECKPOINT is DEPEND instead (version bumped). This fires on
--    any update of such a row, not only state changes.
CREATE OR REPLACE FUNCTION trigger__update_frame_wait_to_dep() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.str_state   := 'DEPEND';
    NEW.ts_updated  := current_timestamp;
    NEW.int_version := NEW.int_version + 1;
    RETURN NEW;
END;
$$;
CREATE TRIGGER update_frame_wait_to_dep BEFORE UPDATE ON frame
    FOR EACH ROW WHEN (NEW.int_depend_count > 0
                       AND NEW.str_state IN ('DEAD', 'SUCCEEDED', 'WAITING', 'CHECKPOINT'))
    EXECUTE FUNCTION trigger__update_frame_wait_to_dep();

------------------------------------------------------------------------------
-- frame: AFTER triggers.
------------------------------------------------------------------------------

-- frame_history: one row per run. Leaving RUNNING closes the open row (or
-- deletes it when the frame was cleared with exit status 299); entering
-- RUNNING opens a new one, with the allocation of the host named in
-- str_host. Skipped entirely when history is disabled. The row's str_state
-- stays 'RUNNING' when it is closed.
CREATE OR REPLACE FUNCTION trigger__frame_history_open() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    alloc_id varchar(36);
BEGIN
    IF cuesched_history_disabled() THEN
        RETURN NULL;
    END IF;
    IF OLD.str_state = 'RUNNING' THEN
        IF NEW.int_exit_status = 299 THEN
            DELETE FROM frame_history WHERE pk_frame = NEW.pk_frame AND int_ts_stopped = 0;
        ELSE
            UPDATE frame_history
               SET int_mem_max_used     = NEW.int_mem_max_used,
                   int_gpu_mem_max_used = NEW.int_gpu_mem_max_used,
                   int_ts_stopped       = epoch(current_timestamp),
                   int_exit_status      = NEW.int_exit_status,
                   int_checkpoint_count = CASE WHEN NEW.str_state = 'CHECKPOINT' THEN 1 ELSE 0 END
             WHERE pk_frame = NEW.pk_frame AND int_ts_stopped = 0;
        END IF;
    END IF;
    IF NEW.str_state = 'RUNNING' THEN
        SELECT pk_alloc INTO alloc_id FROM host WHERE str_name = NEW.str_host;
        INSERT INTO frame_history (pk_frame, pk_layer, pk_job, str_name, str_state, int_cores,
                                   int_mem_reserved, int_gpus, int_gpu_mem_reserved, str_host,
                                   int_ts_started, pk_alloc)
             VALUES (NEW.pk_frame, NEW.pk_layer, NEW.pk_job, NEW.str_name, 'RUNNING', NEW.int_cores,
                     NEW.int_mem_reserved, NEW.int_gpus, NEW.int_gpu_mem_reserved, NEW.str_host,
                     epoch(current_timestamp), alloc_id);
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER frame_history_open AFTER UPDATE ON frame
    FOR EACH ROW WHEN (NEW.str_state::text <> OLD.str_state::text)
    EXECUTE FUNCTION trigger__frame_history_open();

-- State counts: moves one frame from int_<old>_count to int_<new>_count in
-- the layer's layer_stat and then the job's job_stat (the column names are
-- built from the state, so a transition into SETUP fails: there is no
-- int_setup_count). Transitions out of SETUP are not counted; job
-- activation sets the counts itself. Entering RUNNING stamps the layer's
-- first start, leaving RUNNING its latest stop.
CREATE OR REPLACE FUNCTION trigger__update_frame_status_counts() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    old_col text := 'int_' || lower(OLD.str_state) || '_count';
    new_col text := 'int_' || lower(NEW.str_state) || '_count';
BEGIN
    EXECUTE format('UPDATE layer_stat SET %1$I = %1$I - 1, %2$I = %2$I + 1 WHERE pk_layer = $1',
                   old_col, new_col) USING NEW.pk_layer;
    EXECUTE format('UPDATE job_stat SET %1$I = %1$I - 1, %2$I = %2$I + 1 WHERE pk_job = $1',
                   old_col, new_col) USING NEW.pk_job;
    IF NEW.str_state = 'RUNNING' THEN
        UPDATE layer_stat
           SET ts_started = coalesce(ts_started, NEW.ts_started, current_timestamp)
         WHERE pk_layer = NEW.pk_layer;
    END IF;
    IF OLD.str_state = 'RUNNING' THEN
        UPDATE layer_stat
           SET ts_stopped = coalesce(NEW.ts_stopped, current_timestamp)
         WHERE pk_layer = NEW.pk_layer;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER update_frame_status_counts AFTER UPDATE ON frame
    FOR EACH ROW WHEN (OLD.str_state::text <> 'SETUP' AND OLD.str_state::text <> NEW.str_state::text)
    EXECUTE FUNCTION trigger__update_frame_status_counts();

------------------------------------------------------------------------------
-- history tables: last-modified date.
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION trigger__tbiu_job_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.dt_last_modified := current_date;
    RETURN NEW;
END;
$$;
CREATE TRIGGER tbiu_job_history BEFORE INSERT OR UPDATE ON job_history
    FOR EACH ROW EXECUTE FUNCTION trigger__tbiu_job_history();

CREATE OR REPLACE FUNCTION trigger__tbiu_layer_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.dt_last_modified := current_date;
    RETURN NEW;
END;
$$;
CREATE TRIGGER tbiu_layer_history BEFORE INSERT OR UPDATE ON layer_history
    FOR EACH ROW EXECUTE FUNCTION trigger__tbiu_layer_history();

CREATE OR REPLACE FUNCTION trigger__tbiu_frame_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.dt_last_modified := current_date;
    RETURN NEW;
END;
$$;
CREATE TRIGGER tbiu_frame_history BEFORE INSERT OR UPDATE ON frame_history
    FOR EACH ROW EXECUTE FUNCTION trigger__tbiu_frame_history();

------------------------------------------------------------------------------
-- Local (desktop) booking.
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION trigger__tier_host_local() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.float_tier := tier(NEW.int_cores_max - NEW.int_cores_idle, NEW.int_cores_max);
    RETURN NEW;
END;
$$;
CREATE TRIGGER tier_host_local BEFORE UPDATE ON host_local
    FOR EACH ROW EXECUTE FUNCTION trigger__tier_host_local();

-- Meant to reject negative idle values. As in Cuebot, the WHEN clause needs
-- a CPU/memory idle change AND a GPU idle change in the same update (with
-- all maxima unchanged), so in practice it rarely fires.
CREATE OR REPLACE FUNCTION trigger__verify_host_local() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.int_cores_idle < 0 THEN
        RAISE EXCEPTION 'host local doesnt have enough idle cores.';
    END IF;
    IF NEW.int_mem_idle < 0 THEN
        RAISE EXCEPTION 'host local doesnt have enough idle memory';
    END IF;
    IF NEW.int_gpus_idle < 0 THEN
        RAISE EXCEPTION 'host local doesnt have enough GPU idle cores.';
    END IF;
    IF NEW.int_gpu_mem_idle < 0 THEN
        RAISE EXCEPTION 'host local doesnt have enough GPU idle memory.';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER verify_host_local BEFORE UPDATE ON host_local
    FOR EACH ROW WHEN (NEW.int_cores_max = OLD.int_cores_max AND NEW.int_mem_max = OLD.int_mem_max
                       AND (NEW.int_cores_idle <> OLD.int_cores_idle OR NEW.int_mem_idle <> OLD.int_mem_idle)
                       AND NEW.int_gpus_max = OLD.int_gpus_max AND NEW.int_gpu_mem_max = OLD.int_gpu_mem_max
                       AND (NEW.int_gpus_idle <> OLD.int_gpus_idle OR NEW.int_gpu_mem_idle <> OLD.int_gpu_mem_idle))
    EXECUTE FUNCTION trigger__verify_host_local();

CREATE OR REPLACE FUNCTION trigger__verify_job_local() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.int_cores > NEW.int_max_cores THEN
        RAISE EXCEPTION 'job local has exceeded max cores';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER verify_job_local BEFORE UPDATE ON job_local
    FOR EACH ROW WHEN (NEW.int_max_cores = OLD.int_max_cores AND NEW.int_cores > OLD.int_cores)
    EXECUTE FUNCTION trigger__verify_job_local();
