-- cuesched:no-transaction
--
-- cuesched rollout 0005: indexes the scheduler's queries need.
--
-- Built CONCURRENTLY so a live Cuebot keeps writing frames, layers and
-- hosts while they build; that is why this step runs outside a transaction
-- (cuesched re-runs it safely: an index left INVALID by an interrupted
-- build is dropped before it is built again).
--
-- The first three are exactly Cuebot's V44 indexes, under Cuebot's names:
-- on a database that already has V44 they exist and nothing happens, on an
-- older one they are created as V44 would (and V44 later skips them).

-- Pending, unpaused jobs of a show in a facility.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_job_pending_lookup
    ON job (pk_show, pk_facility, str_state, b_paused)
    WHERE str_state = 'PENDING' AND b_paused = false;

-- Layer tags as an array, for the "&&" overlap with a cluster's tags.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_layer_tags_array
    ON layer USING gin (string_to_array(replace(str_tags::text, ' ', ''), '|'));

-- Layers that have waiting frames.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_layer_stat_waiting
    ON layer_stat (pk_layer) WHERE int_waiting_count > 0;

-- The scheduler's host-cache fill reads the hosts carrying one tag of a
-- cluster; Cuebot only indexes host_tag by host and by type.
CREATE INDEX CONCURRENTLY IF NOT EXISTS cuesched_i_host_tag_str_tag
    ON host_tag (str_tag, str_tag_type);

-- The layer query walks a job's WAITING frames in dispatch order; Cuebot's
-- frame indexes are by state+job or by layer alone.
CREATE INDEX CONCURRENTLY IF NOT EXISTS cuesched_i_frame_waiting
    ON frame (pk_job, pk_layer, int_dispatch_order, int_layer_order)
    WHERE str_state = 'WAITING';
