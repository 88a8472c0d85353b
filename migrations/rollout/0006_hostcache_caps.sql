-- cuesched rollout 0006: folder and job caps on the host-cache stream.
--
-- Adds folder_resource and job_resource to the publication
-- cuesched_hostcache. The scheduler's cluster feed follows the stream the
-- host cache already consumes: a show flipped managed, a subscription, an
-- allocation or a host tag added or removed change the cluster set at
-- once, and a raised folder or job cap (int_max_cores, int_max_gpus) wakes
-- the show's clusters instead of leaving them asleep until their sleep
-- ends. Only tables missing from the publication are added (ALTER
-- PUBLICATION ... ADD TABLE), so re-running this step changes nothing and
-- the host cache's other tables are not touched. The scheduler tolerates a
-- publication without them (it then learns of cap changes only when a
-- cluster's sleep ends).
--
-- Cost: Cuebot updates job_resource and folder_resource rows as it books
-- and releases (int_cores) and as frames report memory (int_max_rss);
-- each scheduler instance now receives those rows and ignores all but cap
-- changes.
DO $$
DECLARE
    pub record;
    t   text;
BEGIN
    SELECT * INTO pub FROM pg_publication WHERE pubname = 'cuesched_hostcache';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'publication cuesched_hostcache not found: step 0003_publications creates it (cuesched migrate up)';
    END IF;
    IF pub.puballtables THEN
        RAISE EXCEPTION 'publication cuesched_hostcache exists as FOR ALL TABLES; drop it (DROP PUBLICATION cuesched_hostcache) and rerun';
    END IF;
    FOREACH t IN ARRAY ARRAY['folder_resource', 'job_resource'] LOOP
        IF to_regclass(t) IS NULL THEN
            RAISE EXCEPTION 'publication cuesched_hostcache: table % not found in search_path %',
                t, current_setting('search_path');
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_publication_rel
                        WHERE prpubid = pub.oid AND prrelid = to_regclass(t)::oid) THEN
            EXECUTE format('ALTER PUBLICATION cuesched_hostcache ADD TABLE %s', to_regclass(t));
        END IF;
    END LOOP;
END
$$;
