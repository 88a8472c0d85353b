-- cuesched rollout 0001: our own migration ledger.
--
-- cuesched records which rollout steps it applied here, in a table of its
-- own. Cuebot's flyway_schema_history is never read or written: Flyway
-- validates that table on Cuebot start-up, and a foreign row in it would
-- stop Cuebot.
CREATE TABLE IF NOT EXISTS cuesched_schema_migrations (
    version    integer     NOT NULL PRIMARY KEY,  -- the NNNN of rollout/NNNN_name.sql
    name       text        NOT NULL,
    checksum   text        NOT NULL,              -- sha256 of the step's SQL
    applied_at timestamptz NOT NULL DEFAULT now(),
    applied_by text        NOT NULL DEFAULT current_user
);

COMMENT ON TABLE cuesched_schema_migrations IS
    'Rollout steps applied by "cuesched migrate up" (not Cuebot''s Flyway history).';
