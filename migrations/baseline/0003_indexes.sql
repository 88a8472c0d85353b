-- cuesched baseline, part 3: secondary indexes.
--
-- Names match Cuebot's so that its later migrations (which use
-- CREATE INDEX IF NOT EXISTS) and the rollout migrations recognise them.
-- Unique indexes that are part of a table's contract live with the table in
-- 0002_tables.sql.

-- organisation
CREATE INDEX i_alloc_pk_facility ON alloc (pk_facility);
CREATE INDEX i_sub_tier ON subscription (float_tier);
CREATE INDEX i_subscription_pkalloc ON subscription (pk_alloc);
CREATE INDEX i_show_alias_pk_show ON show_alias (pk_show);

-- folders and points
CREATE INDEX i_folder_pkparentfolder ON folder (pk_parent_folder);
CREATE INDEX i_folder_pkshow ON folder (pk_show);
CREATE INDEX i_folder_strname ON folder (str_name);
CREATE INDEX i_folder_res_int_max_cores ON folder_resource (int_max_cores);
CREATE INDEX i_folder_res_int_max_gpus ON folder_resource (int_max_gpus);
CREATE INDEX i_folder_resource_fl_tier ON folder_resource (float_tier);
CREATE INDEX i_folder_resource_int_cores ON folder_resource (int_cores);
CREATE INDEX i_folderresource_pkfolder ON folder_resource (pk_folder);
CREATE INDEX i_point_pk_dept ON point (pk_dept);
CREATE INDEX i_point_pk_show ON point (pk_show);
CREATE INDEX i_point_tier ON point (float_tier);

-- jobs
CREATE INDEX i_booking_3 ON job (str_state, b_paused, pk_show, pk_facility);
CREATE INDEX i_job_int_min_cores ON job (int_min_cores);
CREATE INDEX i_job_pk_dept ON job (pk_dept);
CREATE INDEX i_job_pk_facility ON job (pk_facility);
CREATE INDEX i_job_pkgroup ON job (pk_folder);
CREATE INDEX i_job_pkshow ON job (pk_show);
CREATE INDEX i_job_str_name ON job (str_name);
CREATE INDEX i_job_str_os ON job (str_os);
CREATE INDEX i_job_str_shot ON job (str_shot);
CREATE INDEX i_job_str_state ON job (str_state);
CREATE INDEX i_job_ts_updated ON job (ts_updated);
-- V39: unfinished jobs only.
CREATE INDEX i_job_active_pkjob ON job (pk_job) WHERE str_state <> 'FINISHED';
-- V44: the pending-job lookup of an external scheduler.
CREATE INDEX idx_job_pending_lookup ON job (pk_show, pk_facility, str_state, b_paused)
    WHERE str_state = 'PENDING' AND b_paused = false;

CREATE INDEX i_job_env_pk_job ON job_env (pk_job);
CREATE INDEX i_job_post_pk_job ON job_post (pk_job);
CREATE INDEX i_job_post_pk_post_job ON job_post (pk_post_job);
CREATE INDEX i_job_mem_int_max_rss ON job_mem (int_max_rss);
CREATE INDEX i_max_pss_job ON job_mem (int_max_pss);
CREATE INDEX i_job_resource_cores ON job_resource (int_cores);
CREATE INDEX i_job_resource_gpus ON job_resource (int_gpus);
CREATE INDEX i_job_resource_gpus_min_max ON job_resource (int_min_gpus, int_max_gpus);
CREATE INDEX i_job_resource_int_priority ON job_resource (int_priority);
CREATE INDEX i_job_resource_max_c ON job_resource (int_max_cores);
CREATE INDEX i_job_resource_max_gpus ON job_resource (int_max_gpus);
CREATE INDEX i_job_resource_min_max ON job_resource (int_min_cores, int_max_cores);
CREATE INDEX i_job_tier ON job_resource (float_tier);
CREATE INDEX i_job_stat_int_waiting_count ON job_stat (int_waiting_count);

-- layers
CREATE INDEX i_layer_b_threadable ON layer (b_threadable);
CREATE INDEX i_layer_cores_gpus_mem ON layer (int_cores_min, int_gpus_min, int_mem_min, int_gpu_mem_min);
CREATE INDEX i_layer_cores_gpus_mem_thread ON layer (int_cores_min, int_gpus_min, int_mem_min, int_gpu_mem_min, b_threadable);
CREATE INDEX i_layer_cores_mem ON layer (int_cores_min, int_mem_min);
CREATE INDEX i_layer_cores_mem_thread ON layer (int_cores_min, int_mem_min, b_threadable);
CREATE INDEX i_layer_int_cores_max ON layer (int_cores_max);
CREATE INDEX i_layer_int_dispatch_order ON layer (int_dispatch_order);
CREATE INDEX i_layer_int_gpu_mem_min ON layer (int_gpu_mem_min);
CREATE INDEX i_layer_int_gpus_mem_min_1 ON layer (int_gpu_mem_min);
CREATE INDEX i_layer_int_gpus_min ON layer (int_gpus_min);
CREATE INDEX i_layer_mem_min ON layer (int_mem_min);
CREATE INDEX i_layer_pkjob ON layer (pk_job);
CREATE INDEX i_layer_str_tags ON layer (str_tags);
CREATE INDEX i_layer_strname ON layer (str_name);
-- V47: deferred layers only.
CREATE INDEX i_layer_start_after ON layer (ts_start_after) WHERE ts_start_after IS NOT NULL;
-- V44: tag-array overlap ("a | b" -> {a,b}) for the external scheduler.
CREATE INDEX idx_layer_tags_array ON layer
    USING gin (string_to_array(replace(str_tags::text, ' ', ''), '|'));

CREATE INDEX i_layer_env_pk_job ON layer_env (pk_job);
CREATE INDEX i_layer_env_pk_layer ON layer_env (pk_layer);
CREATE INDEX i_layer_mem_int_max_rss ON layer_mem (int_max_rss);
CREATE INDEX i_layer_mem_pk_job ON layer_mem (pk_job);
CREATE INDEX i_max_pss_layer ON layer_mem (int_max_pss);
CREATE INDEX i_layer_output_pk_job ON layer_output (pk_job);
CREATE INDEX i_layer_output_pk_layer ON layer_output (pk_layer);
CREATE UNIQUE INDEX i_layer_output_unique ON layer_output (pk_layer, str_filespec);
CREATE INDEX i_layer_resource_pk_job ON layer_resource (pk_job);
CREATE INDEX i_layerstat_pkjob ON layer_stat (pk_job);
-- Only layers with waiting frames have a non-NULL key here.
CREATE INDEX i_layerstat_int_waiting_count ON layer_stat (
    (CASE WHEN int_waiting_count > 0 THEN 1 ELSE NULL END),
    (CASE WHEN int_waiting_count > 0 THEN pk_layer ELSE NULL END));
-- V44: same idea as a partial index.
CREATE INDEX idx_layer_stat_waiting ON layer_stat (pk_layer) WHERE int_waiting_count > 0;
CREATE INDEX i_layer_usage_pk_job ON layer_usage (pk_job);
CREATE INDEX i_limit_record_pk_limit_record ON limit_record (pk_limit_record);
CREATE INDEX i_layer_limit_pk_layer ON layer_limit (pk_layer);
CREATE INDEX i_layer_limit_pk_limit_record ON layer_limit (pk_limit_record);

-- frames
CREATE INDEX i_frame_dispatch_idx ON frame (int_dispatch_order, int_layer_order);
CREATE INDEX i_frame_int_gpu_mem_reserved ON frame (int_gpu_mem_reserved);
CREATE INDEX i_frame_pk_job ON frame (pk_job);
CREATE INDEX i_frame_pkjoblayer ON frame (pk_layer);
CREATE INDEX i_frame_state_job ON frame (str_state, pk_job);
-- V40: frames waiting on dependencies.
CREATE INDEX i_frame_depend_candidates ON frame (pk_job, pk_layer, pk_frame)
    WHERE str_state = 'DEPEND' AND int_depend_count > 0;

-- dependencies
CREATE INDEX i_depend_b_composite ON depend (b_composite);
CREATE INDEX i_depend_er_frame ON depend (pk_frame_depend_er);
CREATE INDEX i_depend_er_layer ON depend (pk_layer_depend_er);
CREATE INDEX i_depend_on_frame ON depend (pk_frame_depend_on);
CREATE INDEX i_depend_on_layer ON depend (pk_layer_depend_on);
CREATE INDEX i_depend_pk_er_job ON depend (pk_job_depend_er);
CREATE INDEX i_depend_pk_on_job ON depend (pk_job_depend_on);
CREATE INDEX i_depend_pkparent ON depend (pk_parent);
CREATE INDEX i_depend_str_target ON depend (str_target);
CREATE INDEX i_depend_str_type ON depend (str_type);
-- V40: active dependencies by dependent job (+ frame / + layer / job only).
CREATE INDEX i_depend_active_er_job_frame ON depend (pk_job_depend_er, pk_frame_depend_er)
    WHERE b_active = true AND pk_frame_depend_er IS NOT NULL;
CREATE INDEX i_depend_active_er_job_layer ON depend (pk_job_depend_er, pk_layer_depend_er)
    WHERE b_active = true AND pk_frame_depend_er IS NULL AND pk_layer_depend_er IS NOT NULL;
CREATE INDEX i_depend_active_er_job_only ON depend (pk_job_depend_er)
    WHERE b_active = true AND pk_frame_depend_er IS NULL AND pk_layer_depend_er IS NULL;

-- hosts and procs
CREATE INDEX i_host_int_gpu ON host (int_gpu_mem);
CREATE INDEX i_host_int_gpu_idle ON host (int_gpu_mem_idle);
CREATE INDEX i_host_int_gpu_mem ON host (int_gpu_mem);
CREATE INDEX i_host_int_gpu_mem_idle ON host (int_gpu_mem_idle);
CREATE INDEX i_host_int_gpus ON host (int_gpus);
CREATE INDEX i_host_int_gpus_idle ON host (int_gpus_idle);
CREATE INDEX i_host_pkalloc ON host (pk_alloc);
CREATE INDEX i_host_str_tags ON host (str_tags);
CREATE INDEX i_host_strlockstate ON host (str_lock_state);
CREATE INDEX i_host_stat_int_gpu_mem_free ON host_stat (int_gpu_mem_free);
CREATE INDEX i_host_stat_int_gpu_mem_total ON host_stat (int_gpu_mem_total);
CREATE INDEX i_host_stat_str_os ON host_stat (str_os);
CREATE INDEX i_host_str_tag_type ON host_tag (str_tag_type);
CREATE INDEX i_host_tag_pk_host ON host_tag (pk_host);
CREATE INDEX i_host_local ON host_local (pk_host);
CREATE INDEX i_host_local_int_gpu_idle ON host_local (int_gpu_mem_idle);
CREATE INDEX i_host_local_int_gpu_max ON host_local (int_gpu_mem_max);
CREATE INDEX i_host_local_int_gpus_idle ON host_local (int_gpus_idle);
CREATE INDEX i_host_local_int_gpus_max ON host_local (int_gpus_max);
CREATE INDEX i_host_local_pk_job ON host_local (pk_job);
CREATE INDEX i_proc_int_gpu_mem_reserved ON proc (int_gpu_mem_reserved);
CREATE INDEX i_proc_pkhost ON proc (pk_host);
CREATE INDEX i_proc_pkjob ON proc (pk_job);
CREATE INDEX i_proc_pklayer ON proc (pk_layer);
CREATE INDEX i_proc_pkshow ON proc (pk_show);
CREATE INDEX i_redirect_create ON redirect (lng_creation_time);
CREATE INDEX i_redirect_group ON redirect (str_group_id);
CREATE INDEX i_deed_pk_owner ON deed (pk_owner);
CREATE INDEX i_owner_pk_show ON owner (pk_show);
CREATE INDEX i_comment_pk_host ON comments (pk_host);
CREATE INDEX i_comment_pk_job ON comments (pk_job);

-- services
CREATE INDEX i_service_int_gpu_mem_min ON service (int_gpu_mem_min);
CREATE INDEX i_service_int_gpus_min ON service (int_gpus_min);
CREATE INDEX i_show_service_int_gpu_mem_min ON show_service (int_gpu_mem_min);
CREATE INDEX i_show_service_int_gpus_min ON show_service (int_gpus_min);

-- history
CREATE INDEX i_job_history_b_archived ON job_history (b_archived);
CREATE INDEX i_job_history_pk_dept ON job_history (pk_dept);
CREATE INDEX i_job_history_pk_facility ON job_history (pk_facility);
CREATE INDEX i_job_history_pk_show ON job_history (pk_show);
CREATE INDEX i_job_history_str_name ON job_history (str_name);
CREATE INDEX i_job_history_str_shot ON job_history (str_shot);
CREATE INDEX i_job_history_str_user ON job_history (str_user);
CREATE INDEX i_job_history_ts_start_stop ON job_history (int_ts_started, int_ts_stopped);
CREATE INDEX i_layer_history_b_archived ON layer_history (b_archived);
CREATE INDEX i_layer_history_pk_job ON layer_history (pk_job);
CREATE INDEX i_layer_history_str_name ON layer_history (str_name);
CREATE INDEX i_layer_history_str_type ON layer_history (str_type);
CREATE INDEX i_frame_history_int_exit_stat ON frame_history (int_exit_status);
CREATE INDEX i_frame_history_int_ts_stopped ON frame_history (int_ts_stopped);
CREATE INDEX i_frame_history_pk_alloc ON frame_history (pk_alloc);
CREATE INDEX i_frame_history_pk_frame ON frame_history (pk_frame);
CREATE INDEX i_frame_history_pk_job ON frame_history (pk_job);
CREATE INDEX i_frame_history_pk_layer ON frame_history (pk_layer);
CREATE INDEX i_frame_history_str_state ON frame_history (str_state);
CREATE INDEX i_frame_history_ts_start_stop ON frame_history (int_ts_started, int_ts_stopped);
