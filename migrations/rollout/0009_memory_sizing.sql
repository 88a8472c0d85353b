-- cuesched rollout 0009: memory sizing's kill ledger and layer bumps.
--
-- Two tables of cuesched's (section sizing of the scheduler configuration):
--
-- cuesched_frame_oom: one row per memory kill of a frame of a
-- scheduler-managed show, as Cuebot recorded it on the frame when the run
-- ended (frame.int_exit_status 33 or 137, or a failed run whose
-- int_mem_max_used exceeded its int_mem_reserved), keyed by the frame and
-- the run's ts_stopped so a kill seen by two scheduler instances, or again
-- after a failover, is one row. int_retry_kb is the size the frame's next
-- run books (its max RSS, at least its booking, times
-- sizing.oom_retry_factor).
--
-- cuesched_layer_oom: one row per layer whose kills within
-- sizing.oom_bump_window reached sizing.oom_bump_kills: int_bump_kb is the
-- floor every later frame of the layer books (the largest retry size of
-- those kills). It is written in the same statement as the kill that
-- reached the count, so every instance sees the bump at once and a
-- failover loses neither. Cuebot's tables are not changed.
CREATE TABLE IF NOT EXISTS cuesched_frame_oom (
    pk_frame         text        NOT NULL,               -- frame.pk_frame
    ts_stopped       timestamptz NOT NULL,               -- frame.ts_stopped of the killed run
    pk_layer         text        NOT NULL,               -- layer.pk_layer
    int_exit_status  bigint      NOT NULL,               -- frame.int_exit_status of the run
    int_max_rss_kb   bigint      NOT NULL,               -- frame.int_mem_max_used (KB)
    int_reserved_kb  bigint      NOT NULL,               -- frame.int_mem_reserved (KB)
    int_retry_kb     bigint      NOT NULL,               -- what the retry books (KB)
    ts_recorded      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pk_frame, ts_stopped)
);
CREATE INDEX IF NOT EXISTS i_cuesched_frame_oom_layer ON cuesched_frame_oom (pk_layer, ts_stopped);

CREATE TABLE IF NOT EXISTS cuesched_layer_oom (
    pk_layer    text        NOT NULL PRIMARY KEY,  -- layer.pk_layer
    int_bump_kb bigint      NOT NULL,              -- every frame of the layer books at least this (KB)
    int_bumps   integer     NOT NULL DEFAULT 1,    -- times the layer was raised
    ts_bumped   timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE cuesched_frame_oom IS
    'cuesched memory sizing: memory kills of frames (see sizing.* in the scheduler configuration).';
COMMENT ON TABLE cuesched_layer_oom IS
    'cuesched memory sizing: layers raised after sizing.oom_bump_kills kills within sizing.oom_bump_window.';
