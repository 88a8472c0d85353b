-- cuesched rollout 0007: cuesched's own settings for Cuebot's limits.
--
-- A table of cuesched's, keyed by limit_record.pk_limit_record, that says
-- which exit statuses a limit's licence failures produce
-- (int_denial_exit_statuses): a frame of a scheduler-managed show whose
-- last run ended with one of them was denied a seat, not broken, and the
-- scheduler's booking statement relaunches it without counting a retry.
-- Cuebot's tables are not changed: no column on limit_record and no
-- foreign key (a foreign key would add a trigger to Cuebot's table); a row
-- whose limit was deleted is ignored. Set with "cuesched limit".
CREATE TABLE IF NOT EXISTS cuesched_limit (
    pk_limit_record          text        NOT NULL PRIMARY KEY,  -- limit_record.pk_limit_record
    int_denial_exit_statuses integer[]   NOT NULL DEFAULT '{}',
    ts_updated               timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE cuesched_limit IS
    'cuesched settings of Cuebot limits (licence-denial exit statuses); see "cuesched limit".';
