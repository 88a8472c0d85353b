-- cuesched rollout 0010: node-locked (per-host) limits.
--
-- A column of cuesched's own table (cuesched_limit, rollout 0007) that says
-- whether a limit is node-locked: b_per_host true makes the limit count the
-- hosts holding a seat (a host runs any number of its frames on one seat),
-- not the frames. The scheduler enforces it atomically in Redis (the
-- booking script) and packs the limit's frames onto hosts that already hold
-- a seat; the default (false, or no row) keeps Cuebot's per-frame meaning.
-- Cuebot's tables are not changed. Set with "cuesched limit set-per-host".
ALTER TABLE cuesched_limit ADD COLUMN IF NOT EXISTS b_per_host boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN cuesched_limit.b_per_host IS
    'node-locked licence: the limit counts hosts holding a seat, not frames (cuesched limit set-per-host).';
