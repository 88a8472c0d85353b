-- cuesched rollout 0008: the fail-fast backoff of layers.
--
-- A table of cuesched's, one row per pending layer of a scheduler-managed
-- show that the loop leader has judged: the layer's failure and success
-- counters (Cuebot's layer_usage) when it was last judged, its backoff
-- level, and until when it is held out of the lottery and of every
-- dispatch pass (ts_until; NULL or past = not held). A layer whose frames
-- keep failing fast (queue.fail_fast_*) is held, doubling while it goes
-- on; a success ends it. Every scheduler instance reads the hold from
-- here, and so does "cuesched explain". Rows of layers with nothing left
-- to run are deleted by the leader. Cuebot's tables are not changed.
CREATE TABLE IF NOT EXISTS cuesched_layer_backoff (
    pk_layer            text        NOT NULL PRIMARY KEY,  -- layer.pk_layer
    int_level           integer     NOT NULL DEFAULT 0,    -- holds in a row (0: healthy)
    ts_until            timestamptz,                       -- held until (NULL: not held)
    int_fail_base       bigint      NOT NULL DEFAULT 0,    -- layer_usage.int_frame_fail_count when last judged
    int_success_base    bigint      NOT NULL DEFAULT 0,    -- layer_usage.int_frame_success_count
    int_clock_fail_base bigint      NOT NULL DEFAULT 0,    -- layer_usage.int_clock_time_fail (seconds)
    int_fails           bigint      NOT NULL DEFAULT 0,    -- failed runs behind the last hold
    int_avg_run_ms      bigint      NOT NULL DEFAULT 0,    -- their average run time
    ts_updated          timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE cuesched_layer_backoff IS
    'cuesched fail-fast backoff of layers whose frames keep failing fast (see queue.fail_fast_* in the scheduler configuration).';
