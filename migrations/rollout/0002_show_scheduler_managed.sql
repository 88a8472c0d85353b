-- cuesched rollout 0002: the per-show ownership flag.
--
-- show.b_scheduler_managed = true hands a show's booking and accounting to
-- cuesched; false (the default) leaves it to Cuebot. Cuebot's own V45
-- migration adds the same column with the same definition; on a database
-- that already has it this step changes nothing (it does not even take a
-- lock on show). Adding a NOT NULL column with a constant default is a
-- catalog-only change (no table rewrite).
DO $$
DECLARE
    show_rel regclass := to_regclass('show');
    col      record;
BEGIN
    IF show_rel IS NULL THEN
        RAISE EXCEPTION 'table show not found in search_path %: not a Cuebot database?',
            current_setting('search_path');
    END IF;

    SELECT format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null
      INTO col
      FROM pg_attribute a
     WHERE a.attrelid = show_rel AND a.attname = 'b_scheduler_managed' AND NOT a.attisdropped;

    IF NOT FOUND THEN
        -- Fail fast rather than queue behind a long transaction on show
        -- (and block every reader queued behind us).
        SET LOCAL lock_timeout = '10s';
        ALTER TABLE show ADD COLUMN b_scheduler_managed boolean NOT NULL DEFAULT false;
        COMMENT ON COLUMN show.b_scheduler_managed IS
            'true: booking and accounting of this show belong to the external scheduler (cuesched)';
    ELSIF col.type <> 'boolean' OR NOT col.not_null THEN
        RAISE EXCEPTION 'show.b_scheduler_managed exists as % (not null: %), expected boolean NOT NULL DEFAULT false',
            col.type, col.not_null;
    END IF;
END
$$;
