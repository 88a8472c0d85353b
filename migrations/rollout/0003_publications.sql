-- cuesched rollout 0003: logical-replication publications.
--
--   cuesched_hostcache  host, host_stat, host_tag, alloc, subscription, show,
--                       facility; every operation. Feeds the scheduler's
--                       host cache (idle values, lock/hardware state, tags,
--                       allocation and subscription changes).
--   cuesched_accounting show, job, host, subscription, folder_resource,
--                       job_resource, point; every operation. Lets the
--                       sidecar follow cap changes (burst, folder and job
--                       max) and ownership flips.
--   cuesched_proc       proc only, INSERT / DELETE / TRUNCATE. A proc DELETE
--                       is a release; inserts are bookings. Cuebot updates
--                       every running proc on each host report (memory,
--                       ping), and those UPDATEs carry nothing the sidecar
--                       needs, so they are not published at all.
--
-- Idempotent: a missing publication is created; an existing one has its
-- table list replaced (ALTER PUBLICATION ... SET TABLE) only when it
-- differs, and its operations reset only when they differ, so re-running
-- this step does not disturb subscribers.
DO $$
DECLARE
    p       record;
    pub     record;
    t       text;
    want    oid[];
    have    oid[];
    tlist   text;
BEGIN
    FOR p IN
        SELECT * FROM (VALUES
            ('cuesched_hostcache',
             ARRAY['host', 'host_stat', 'host_tag', 'alloc', 'subscription', 'show', 'facility'],
             true, true, true, true),
            ('cuesched_accounting',
             ARRAY['show', 'job', 'host', 'subscription', 'folder_resource', 'job_resource', 'point'],
             true, true, true, true),
            ('cuesched_proc',
             ARRAY['proc'],
             true, false, true, true)
        ) AS v(name, tables, ins, upd, del, trunc)
    LOOP
        want := ARRAY[]::oid[];
        FOREACH t IN ARRAY p.tables LOOP
            IF to_regclass(t) IS NULL THEN
                RAISE EXCEPTION 'publication %: table % not found in search_path %',
                    p.name, t, current_setting('search_path');
            END IF;
            want := want || to_regclass(t)::oid;
        END LOOP;
        SELECT string_agg(to_regclass(x)::text, ', ') INTO tlist FROM unnest(p.tables) AS x;

        SELECT * INTO pub FROM pg_publication WHERE pubname = p.name;
        IF NOT FOUND THEN
            EXECUTE format('CREATE PUBLICATION %I FOR TABLE %s WITH (publish = %L)',
                p.name, tlist,
                concat_ws(', ',
                    CASE WHEN p.ins   THEN 'insert' END,
                    CASE WHEN p.upd   THEN 'update' END,
                    CASE WHEN p.del   THEN 'delete' END,
                    CASE WHEN p.trunc THEN 'truncate' END));
            CONTINUE;
        END IF;

        IF pub.puballtables THEN
            RAISE EXCEPTION 'publication % exists as FOR ALL TABLES; drop it (DROP PUBLICATION %) and rerun',
                p.name, p.name;
        END IF;

        SELECT coalesce(array_agg(prrelid ORDER BY prrelid), ARRAY[]::oid[]) INTO have
          FROM pg_publication_rel WHERE prpubid = pub.oid;
        IF have IS DISTINCT FROM (SELECT array_agg(x ORDER BY x) FROM unnest(want) AS x) THEN
            EXECUTE format('ALTER PUBLICATION %I SET TABLE %s', p.name, tlist);
        END IF;

        IF (pub.pubinsert, pub.pubupdate, pub.pubdelete, pub.pubtruncate)
           IS DISTINCT FROM (p.ins, p.upd, p.del, p.trunc) THEN
            EXECUTE format('ALTER PUBLICATION %I SET (publish = %L)', p.name,
                concat_ws(', ',
                    CASE WHEN p.ins   THEN 'insert' END,
                    CASE WHEN p.upd   THEN 'update' END,
                    CASE WHEN p.del   THEN 'delete' END,
                    CASE WHEN p.trunc THEN 'truncate' END));
        END IF;
    END LOOP;
END
$$;
