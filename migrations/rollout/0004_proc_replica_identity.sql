-- cuesched rollout 0004: REPLICA IDENTITY FULL on proc.
--
-- Why: a proc DELETE is a release. With the default identity (the primary
-- key) the WAL record of a DELETE carries only pk_proc, but the sidecar
-- must know whose resources came back: pk_show, pk_job, pk_layer, pk_host,
-- int_cores_reserved and int_gpus_reserved of the deleted row. FULL makes
-- PostgreSQL log the complete old row with every DELETE (and UPDATE).
--
-- Cost (WAL volume): FULL also applies to UPDATEs, and Cuebot updates each
-- running proc on every RQD report, about once a minute (memory columns,
-- bytea_children, ts_ping). Each such UPDATE then also logs the whole old
-- row. Measured on PostgreSQL 15 (BenchmarkProcUpdateWAL):
--   * no child-process data: ~930 -> ~1,260 bytes of WAL per UPDATE
--     (+330 bytes, +36%; the old row image of a typical ~350-byte proc row);
--   * 4 KB of bytea_children (rewritten by every Cuebot update, stored out
--     of line): ~5.7 KB -> ~10.1 KB per UPDATE (+4.4 KB, +78%), because a
--     TOASTed old value is written out in full in the old-row image.
-- At 10,000 running procs that is ~3.3 MB of extra WAL per minute (~5 GB a
-- day) without child data, and up to ~44 MB per minute (~63 GB a day) with
-- 4 KB of it: written, archived and shipped to physical standbys, although
-- these UPDATEs are never sent to the sidecar (the cuesched_proc
-- publication excludes UPDATE). See migrations/README.md.
--
-- The alternative (a unique index with all those columns as identity) is
-- not possible: REPLICA IDENTITY USING INDEX needs NOT NULL columns and
-- pk_job/pk_show/pk_layer are nullable.
--
-- Changing the identity takes a brief ACCESS EXCLUSIVE lock on proc; the
-- lock_timeout makes the step fail (and be retried) instead of stalling
-- Cuebot's dispatch behind a long-running transaction.
DO $$
BEGIN
    IF (SELECT relreplident FROM pg_class WHERE oid = to_regclass('proc')) IS DISTINCT FROM 'f' THEN
        SET LOCAL lock_timeout = '10s';
        ALTER TABLE proc REPLICA IDENTITY FULL;
    END IF;
END
$$;
