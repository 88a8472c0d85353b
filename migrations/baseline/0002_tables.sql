-- cuesched baseline, part 2: tables, primary/unique keys and foreign keys.
--
-- Conventions of the Cuebot schema reproduced here:
--   * every key is varchar(36) text (Cuebot writes lowercase random UUIDs;
--     seed rows use fixed uppercase ids), compared case-sensitively;
--   * cores are centicores (100 = one core), memory and GPU memory are KB,
--     GPUs are whole devices;
--   * states are upper-case text (see shared/cuebot);
--   * child rows (job_stat, layer_resource, folder_resource, ...) reuse the
--     parent's key as their own and are created by the insert triggers in
--     0004_triggers.sql, never by callers;
--   * timestamps are timestamptz(6) except where Cuebot uses plain
--     timestamp (host.ts_created, task_lock.ts_lastrun, depend, comments).
--
-- Constraint names follow Cuebot's (c_<table>_pk, c_<table>_uk, ...) because
-- Cuebot's Java code recognises some of them in error messages.
-- Column order follows Cuebot's physical order so SELECT * and positional
-- INSERTs line up.

------------------------------------------------------------------------------
-- Organisation: shows, facilities, departments, allocations.
------------------------------------------------------------------------------

CREATE TABLE show (
    pk_show               varchar(36)   NOT NULL,
    str_name              varchar(512)  NOT NULL,          -- not unique
    b_paused              boolean       NOT NULL DEFAULT false,
    int_default_min_cores integer       NOT NULL DEFAULT 100,    -- centicores
    int_default_max_cores integer       NOT NULL DEFAULT 10000,  -- centicores
    b_booking_enabled     boolean       NOT NULL DEFAULT true,
    b_dispatch_enabled    boolean       NOT NULL DEFAULT true,
    b_active              boolean       NOT NULL DEFAULT true,
    str_comment_email     varchar(1024),
    int_default_min_gpus  integer       NOT NULL DEFAULT 100,
    int_default_max_gpus  integer       NOT NULL DEFAULT 100000,
    -- Cuebot V45: true hands the show's accounting to the external
    -- scheduler (Cuebot neither books it nor decrements its accounting rows).
    b_scheduler_managed   boolean       NOT NULL DEFAULT false,
    CONSTRAINT c_show_pk PRIMARY KEY (pk_show)
);

-- Per-show counters; Cuebot inserts the row together with the show. There is
-- deliberately no foreign key to show.
CREATE TABLE show_stats (
    pk_show                 varchar(36) NOT NULL,
    int_frame_insert_count  bigint      NOT NULL DEFAULT 0,
    int_job_insert_count    bigint      NOT NULL DEFAULT 0,
    int_frame_success_count bigint      NOT NULL DEFAULT 0,
    int_frame_fail_count    bigint      NOT NULL DEFAULT 0,
    CONSTRAINT c_show_stats_pk PRIMARY KEY (pk_show)
);

CREATE TABLE show_alias (
    pk_show_alias varchar(36) NOT NULL,
    pk_show       varchar(36) NOT NULL,
    str_name      varchar(16) NOT NULL,
    CONSTRAINT c_show_alias_pk PRIMARY KEY (pk_show_alias),
    CONSTRAINT c_show_alias_pk_show FOREIGN KEY (pk_show) REFERENCES show (pk_show)
);

CREATE TABLE facility (
    pk_facility varchar(36) NOT NULL,
    str_name    varchar(36) NOT NULL,
    b_default   boolean     NOT NULL DEFAULT false,
    CONSTRAINT c_facility_pk PRIMARY KEY (pk_facility)
);

CREATE TABLE dept (
    pk_dept   varchar(36) NOT NULL,
    str_name  varchar(36) NOT NULL,
    b_default boolean     NOT NULL DEFAULT false,
    CONSTRAINT c_dept_pk PRIMARY KEY (pk_dept)
);

-- An allocation is a named slice of a facility's hosts ("<facility>.<name>");
-- str_tag is the tag its hosts carry as an ALLOC host_tag.
CREATE TABLE alloc (
    pk_alloc     varchar(36) NOT NULL,
    str_name     varchar(36) NOT NULL,
    b_allow_edit boolean     NOT NULL DEFAULT true,
    b_default    boolean     NOT NULL DEFAULT false,
    str_tag      varchar(24),
    b_billable   boolean     NOT NULL DEFAULT true,
    pk_facility  varchar(36) NOT NULL,
    b_enabled    boolean              DEFAULT true,
    CONSTRAINT c_alloc_pk PRIMARY KEY (pk_alloc),
    CONSTRAINT c_alloc_name_uniq UNIQUE (str_name),
    CONSTRAINT c_alloc_pk_facility FOREIGN KEY (pk_facility) REFERENCES facility (pk_facility)
);

-- A show's right to use an allocation: int_size is its guaranteed share,
-- int_burst the hard cap, int_cores what it has booked (all centicores).
CREATE TABLE subscription (
    pk_subscription varchar(36)    NOT NULL,
    pk_alloc        varchar(36)    NOT NULL,
    pk_show         varchar(36)    NOT NULL,
    int_size        bigint         NOT NULL DEFAULT 0,
    int_burst       bigint         NOT NULL DEFAULT 0,
    int_cores       integer        NOT NULL DEFAULT 0,
    float_tier      numeric(16,2)  NOT NULL DEFAULT 0,
    int_gpus        integer        NOT NULL DEFAULT 0,
    CONSTRAINT c_subscription_pk PRIMARY KEY (pk_subscription),
    CONSTRAINT c_subscription_uk UNIQUE (pk_show, pk_alloc),
    CONSTRAINT c_subscription_pk_alloc FOREIGN KEY (pk_alloc) REFERENCES alloc (pk_alloc),
    CONSTRAINT c_subscription_pk_show FOREIGN KEY (pk_show) REFERENCES show (pk_show)
);

------------------------------------------------------------------------------
-- Folders ("groups" in the Cuebot UI) and points (show x department).
------------------------------------------------------------------------------

CREATE TABLE folder (
    pk_folder         varchar(36) NOT NULL,
    pk_parent_folder  varchar(36),                 -- NULL for a show's root folder
    pk_show           varchar(36) NOT NULL,
    str_name          varchar(36) NOT NULL,
    int_priority      bigint      NOT NULL DEFAULT 1,
    b_default         boolean     NOT NULL DEFAULT false,
    pk_dept           varchar(36) NOT NULL,
    int_job_min_cores integer     NOT NULL DEFAULT -1,   -- -1 = not set
    int_job_max_cores integer     NOT NULL DEFAULT -1,
    int_job_priority  integer     NOT NULL DEFAULT -1,
    int_min_cores     integer     NOT NULL DEFAULT 0,
    int_max_cores     integer     NOT NULL DEFAULT -1,   -- -1 = unlimited
    b_exclude_managed boolean     NOT NULL DEFAULT false,
    f_order           integer     NOT NULL DEFAULT 0,
    int_job_min_gpus  integer     NOT NULL DEFAULT -1,
    int_job_max_gpus  integer     NOT NULL DEFAULT -1,
    int_min_gpus      integer     NOT NULL DEFAULT 0,
    int_max_gpus      integer     NOT NULL DEFAULT -1,
    CONSTRAINT c_folder_pk PRIMARY KEY (pk_folder),
    -- Root folders have a NULL parent, so their names are not unique.
    CONSTRAINT c_folder_uk UNIQUE (pk_parent_folder, str_name),
    CONSTRAINT c_folder_pk_show FOREIGN KEY (pk_show) REFERENCES show (pk_show),
    CONSTRAINT c_folder_pk_dept FOREIGN KEY (pk_dept) REFERENCES dept (pk_dept)
);

CREATE TABLE folder_level (
    pk_folder_level varchar(36) NOT NULL,
    pk_folder       varchar(36) NOT NULL,
    int_level       bigint      NOT NULL DEFAULT 0,
    CONSTRAINT c_folder_level_pk PRIMARY KEY (pk_folder_level),
    CONSTRAINT c_folder_level_uk UNIQUE (pk_folder),
    CONSTRAINT c_folder_level_pk_folder FOREIGN KEY (pk_folder) REFERENCES folder (pk_folder)
);

-- Booked and capped resources of a folder. Cuebot has no unique key on
-- pk_folder here: a second row for the same folder is possible (and wrong).
CREATE TABLE folder_resource (
    pk_folder_resource varchar(36)   NOT NULL,
    pk_folder          varchar(36)   NOT NULL,
    int_cores          integer       NOT NULL DEFAULT 0,
    int_max_cores      integer       NOT NULL DEFAULT -1,   -- -1 = unlimited
    int_min_cores      integer       NOT NULL DEFAULT 0,
    float_tier         numeric(16,2) NOT NULL DEFAULT 0,
    int_gpus           integer       NOT NULL DEFAULT 0,
    int_max_gpus       integer       NOT NULL DEFAULT -1,
    int_min_gpus       integer       NOT NULL DEFAULT 0,
    CONSTRAINT c_folder_resource_pk PRIMARY KEY (pk_folder_resource),
    CONSTRAINT c_folder_resource_pk_folder FOREIGN KEY (pk_folder) REFERENCES folder (pk_folder)
);

CREATE TABLE point (
    pk_point      varchar(36)   NOT NULL,
    pk_dept       varchar(36)   NOT NULL,
    pk_show       varchar(36)   NOT NULL,
    str_ti_task   varchar(36),
    int_cores     integer       NOT NULL DEFAULT 0,
    b_managed     boolean       NOT NULL DEFAULT false,
    int_min_cores integer       NOT NULL DEFAULT 0,
    float_tier    numeric(16,2) NOT NULL DEFAULT 0,
    ts_updated    timestamptz(6) NOT NULL DEFAULT current_timestamp,
    int_gpus      integer       NOT NULL DEFAULT 0,
    int_min_gpus  integer       NOT NULL DEFAULT 0,
    CONSTRAINT c_point_pk PRIMARY KEY (pk_point),
    CONSTRAINT c_point_pk_show_dept UNIQUE (pk_show, pk_dept),
    CONSTRAINT c_point_pk_dept FOREIGN KEY (pk_dept) REFERENCES dept (pk_dept),
    CONSTRAINT c_point_pk_show FOREIGN KEY (pk_show) REFERENCES show (pk_show)
);

------------------------------------------------------------------------------
-- Jobs and their per-job child rows.
------------------------------------------------------------------------------

CREATE TABLE job (
    pk_job           varchar(36)   NOT NULL,
    pk_folder        varchar(36)   NOT NULL,
    pk_show          varchar(36)   NOT NULL,
    str_name         varchar(255)  NOT NULL,
    str_visible_name varchar(255),                 -- NULL once FINISHED
    str_shot         varchar(64)   NOT NULL,
    str_user         varchar(32)   NOT NULL,
    str_state        varchar(16)   NOT NULL,       -- STARTUP, PENDING, FINISHED, ...
    str_log_dir      varchar(4000) NOT NULL DEFAULT '',
    int_uid          bigint,
    b_paused         boolean       NOT NULL DEFAULT false,
    b_autoeat        boolean       NOT NULL DEFAULT false,
    int_frame_count  integer       NOT NULL DEFAULT 0,
    int_layer_count  integer       NOT NULL DEFAULT 0,
    int_max_retries  smallint      NOT NULL DEFAULT 3,
    b_auto_book      boolean       NOT NULL DEFAULT true,
    b_auto_unbook    boolean       NOT NULL DEFAULT true,
    b_comment        boolean       NOT NULL DEFAULT false,
    str_email        varchar(256),
    pk_facility      varchar(36)   NOT NULL,
    pk_dept          varchar(36)   NOT NULL,
    ts_started       timestamptz(6) NOT NULL DEFAULT current_timestamp,
    ts_stopped       timestamptz(6),
    int_min_cores    integer       NOT NULL DEFAULT 100,
    int_max_cores    integer       NOT NULL DEFAULT 20000,
    str_show         varchar(512)  NOT NULL DEFAULT 'none',
    ts_updated       timestamptz(6) NOT NULL DEFAULT current_timestamp,
    str_os           varchar(12),                  -- NULL = any OS
    int_min_gpus     integer       NOT NULL DEFAULT 0,
    int_max_gpus     integer       NOT NULL DEFAULT 100000,
    str_loki_url     varchar(256),
    ts_eligible      timestamptz(6) NOT NULL DEFAULT current_timestamp,
    CONSTRAINT c_job_pk PRIMARY KEY (pk_job),
    CONSTRAINT c_job_uk UNIQUE (str_visible_name),
    CONSTRAINT c_job_pk_show FOREIGN KEY (pk_show) REFERENCES show (pk_show),
    CONSTRAINT c_job_pk_folder FOREIGN KEY (pk_folder) REFERENCES folder (pk_folder),
    CONSTRAINT c_job_pk_facility FOREIGN KEY (pk_facility) REFERENCES facility (pk_facility),
    CONSTRAINT c_job_pk_dept FOREIGN KEY (pk_dept) REFERENCES dept (pk_dept)
);

-- Booked resources and caps of a job (centicores). int_max_gpus defaults to
-- 100 here although job.int_max_gpus defaults to 100000.
CREATE TABLE job_resource (
    pk_job_resource varchar(36)   NOT NULL,
    pk_job          varchar(36)   NOT NULL,
    int_cores       bigint        NOT NULL DEFAULT 0,
    int_max_rss     bigint        NOT NULL DEFAULT 0,
    int_max_vss     bigint        NOT NULL DEFAULT 0,
    int_min_cores   integer       NOT NULL DEFAULT 100,
    int_max_cores   integer       NOT NULL DEFAULT 10000,
    float_tier      numeric(16,2) NOT NULL DEFAULT 0,
    int_priority    integer       NOT NULL DEFAULT 1,
    int_local_cores integer       NOT NULL DEFAULT 0,
    int_gpus        integer       NOT NULL DEFAULT 0,
    int_min_gpus    integer       NOT NULL DEFAULT 0,
    int_max_gpus    integer       NOT NULL DEFAULT 100,
    int_local_gpus  integer       NOT NULL DEFAULT 0,
    int_gpu_mem_max bigint        NOT NULL DEFAULT 0,
    int_max_pss     bigint                 DEFAULT 0,
    CONSTRAINT c_job_resource_pk PRIMARY KEY (pk_job_resource),
    CONSTRAINT c_job_resource_uk UNIQUE (pk_job),
    CONSTRAINT c_job_resource_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);

-- Frame counts by state, maintained by update_frame_status_counts.
CREATE TABLE job_stat (
    pk_job_stat          varchar(36) NOT NULL,
    pk_job               varchar(36) NOT NULL,
    int_waiting_count    bigint      NOT NULL DEFAULT 0,
    int_running_count    bigint      NOT NULL DEFAULT 0,
    int_dead_count       bigint      NOT NULL DEFAULT 0,
    int_depend_count     bigint      NOT NULL DEFAULT 0,
    int_eaten_count      bigint      NOT NULL DEFAULT 0,
    int_succeeded_count  bigint      NOT NULL DEFAULT 0,
    int_checkpoint_count bigint      NOT NULL DEFAULT 0,
    CONSTRAINT c_job_stat_pk PRIMARY KEY (pk_job_stat),
    CONSTRAINT c_job_stat_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);
-- A unique index (not a constraint), usable by ON CONFLICT (pk_job).
CREATE UNIQUE INDEX i_job_stat_pk_job ON job_stat (pk_job);

CREATE TABLE job_usage (
    pk_job_usage            varchar(36) NOT NULL,
    pk_job                  varchar(36) NOT NULL,
    int_core_time_success   bigint      NOT NULL DEFAULT 0,
    int_core_time_fail      bigint      NOT NULL DEFAULT 0,
    int_frame_success_count integer     NOT NULL DEFAULT 0,
    int_frame_fail_count    integer     NOT NULL DEFAULT 0,
    int_clock_time_fail     integer     NOT NULL DEFAULT 0,
    int_clock_time_high     integer     NOT NULL DEFAULT 0,
    int_clock_time_success  integer     NOT NULL DEFAULT 0,
    int_gpu_time_success    bigint      NOT NULL DEFAULT 0,
    int_gpu_time_fail       bigint      NOT NULL DEFAULT 0,
    CONSTRAINT c_job_usage_pk PRIMARY KEY (pk_job_usage),
    CONSTRAINT c_job_usage_pk_job_uniq UNIQUE (pk_job),
    CONSTRAINT c_job_usage_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);

CREATE TABLE job_mem (
    pk_job_mem      varchar(36) NOT NULL,
    pk_job          varchar(36) NOT NULL,
    int_max_rss     bigint      NOT NULL DEFAULT 0,
    int_max_vss     bigint      NOT NULL DEFAULT 0,
    int_gpu_mem_max bigint      NOT NULL DEFAULT 0,
    int_max_pss     bigint               DEFAULT 0,
    CONSTRAINT c_job_mem_pk PRIMARY KEY (pk_job_mem),
    CONSTRAINT c_job_mem_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);
CREATE UNIQUE INDEX i_job_mem_pk_job ON job_mem (pk_job);

CREATE TABLE job_env (
    pk_job_env varchar(36)   NOT NULL,
    pk_job     varchar(36),
    str_key    varchar(2048),
    str_value  varchar(2048),
    CONSTRAINT c_job_env_pk PRIMARY KEY (pk_job_env),
    CONSTRAINT c_job_env_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);

CREATE TABLE job_post (
    pk_job_post varchar(36) NOT NULL,
    pk_job      varchar(36) NOT NULL,
    pk_post_job varchar(36) NOT NULL,
    CONSTRAINT c_job_post_pk PRIMARY KEY (pk_job_post),
    CONSTRAINT c_job_post_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job),
    CONSTRAINT c_job_post_pk_post_job FOREIGN KEY (pk_post_job) REFERENCES job (pk_job)
);

------------------------------------------------------------------------------
-- Layers and their per-layer child rows.
------------------------------------------------------------------------------

CREATE TABLE layer (
    pk_layer               varchar(36)   NOT NULL,
    pk_job                 varchar(36)   NOT NULL,
    str_name               varchar(256)  NOT NULL,
    str_cmd                varchar(4000) NOT NULL,
    str_range              varchar(4000) NOT NULL,
    int_chunk_size         bigint        NOT NULL DEFAULT 1,
    int_dispatch_order     bigint        NOT NULL DEFAULT 1,
    int_cores_min          bigint        NOT NULL DEFAULT 100,     -- 0 = whole host, <0 = all but N
    int_mem_min            bigint        NOT NULL DEFAULT 4194304, -- KB (4 GB)
    str_tags               varchar(4000) NOT NULL DEFAULT '',      -- "a | b"
    str_type               varchar(16)   NOT NULL,                 -- PRE, POST, RENDER, UTIL
    b_threadable           boolean       NOT NULL DEFAULT true,
    str_services           varchar(128)  NOT NULL DEFAULT 'default',
    b_optimize             boolean       NOT NULL DEFAULT true,
    int_cores_max          integer       NOT NULL DEFAULT 0,       -- 0 = no cap
    int_gpu_mem_min        bigint        NOT NULL DEFAULT 0,
    int_timeout            integer       NOT NULL DEFAULT 0,
    int_timeout_llu        integer       NOT NULL DEFAULT 0,
    int_gpus_min           bigint        NOT NULL DEFAULT 0,
    int_gpus_max           bigint        NOT NULL DEFAULT 0,
    ts_eligible            timestamptz(6) NOT NULL DEFAULT current_timestamp,
    ts_start_after         timestamptz(6)          DEFAULT NULL,  -- V47: no frame starts before
    str_start_after_reason varchar(255)            DEFAULT NULL,
    CONSTRAINT c_layer_pk PRIMARY KEY (pk_layer),
    CONSTRAINT c_layer_str_name_unq UNIQUE (str_name, pk_job),
    CONSTRAINT c_layer_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);

CREATE TABLE layer_resource (
    pk_layer_resource varchar(36) NOT NULL,
    pk_layer          varchar(36) NOT NULL,
    pk_job            varchar(36) NOT NULL,
    int_cores         bigint      NOT NULL DEFAULT 0,
    int_max_rss       bigint      NOT NULL DEFAULT 0,
    int_max_vss       bigint      NOT NULL DEFAULT 0,
    int_gpus          integer     NOT NULL DEFAULT 0,
    int_gpu_mem_max   bigint      NOT NULL DEFAULT 0,
    int_max_pss       bigint               DEFAULT 0,
    CONSTRAINT c_layerresource_pk PRIMARY KEY (pk_layer_resource),
    CONSTRAINT c_layerresource_uk UNIQUE (pk_layer),
    CONSTRAINT c_layer_resource_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job),
    CONSTRAINT c_layer_resource_pk_layer FOREIGN KEY (pk_layer) REFERENCES layer (pk_layer)
);

CREATE TABLE layer_stat (
    pk_layer_stat        varchar(36) NOT NULL,
    pk_layer             varchar(36) NOT NULL,
    pk_job               varchar(36) NOT NULL,
    int_total_count      bigint      NOT NULL DEFAULT 0,
    int_waiting_count    bigint      NOT NULL DEFAULT 0,
    int_running_count    bigint      NOT NULL DEFAULT 0,
    int_dead_count       bigint      NOT NULL DEFAULT 0,
    int_depend_count     bigint      NOT NULL DEFAULT 0,
    int_eaten_count      bigint      NOT NULL DEFAULT 0,
    int_succeeded_count  bigint      NOT NULL DEFAULT 0,
    int_checkpoint_count bigint      NOT NULL DEFAULT 0,
    ts_started           timestamptz(6),   -- V43: first frame start
    ts_stopped           timestamptz(6),   -- V43: last frame stop
    CONSTRAINT c_layerstat_pk PRIMARY KEY (pk_layer_stat),
    CONSTRAINT c_layer_stat_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job),
    CONSTRAINT c_layer_stat_pk_layer FOREIGN KEY (pk_layer) REFERENCES layer (pk_layer)
);
CREATE UNIQUE INDEX i_layer_stat_pk_layer ON layer_stat (pk_layer);

CREATE TABLE layer_usage (
    pk_layer_usage          varchar(36) NOT NULL,
    pk_layer                varchar(36) NOT NULL,
    pk_job                  varchar(36) NOT NULL,
    int_core_time_success   bigint      NOT NULL DEFAULT 0,
    int_core_time_fail      bigint      NOT NULL DEFAULT 0,
    int_frame_success_count integer     NOT NULL DEFAULT 0,
    int_frame_fail_count    integer     NOT NULL DEFAULT 0,
    int_clock_time_fail     integer     NOT NULL DEFAULT 0,
    int_clock_time_high     integer     NOT NULL DEFAULT 0,
    int_clock_time_low      integer     NOT NULL DEFAULT 0,
    int_clock_time_success  integer     NOT NULL DEFAULT 0,
    int_gpu_time_success    bigint      NOT NULL DEFAULT 0,
    int_gpu_time_fail       bigint      NOT NULL DEFAULT 0,
    CONSTRAINT c_layer_usage_pk PRIMARY KEY (pk_layer_usage),
    CONSTRAINT c_layer_usage_pk_layer_uk UNIQUE (pk_layer),
    CONSTRAINT c_layer_usage_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job),
    CONSTRAINT c_layer_usage_pk_layer FOREIGN KEY (pk_layer) REFERENCES layer (pk_layer)
);

CREATE TABLE layer_mem (
    pk_layer_mem    varchar(36) NOT NULL,
    pk_job          varchar(36) NOT NULL,
    pk_layer        varchar(36) NOT NULL,
    int_max_rss     bigint      NOT NULL DEFAULT 0,
    int_max_vss     bigint      NOT NULL DEFAULT 0,
    int_gpu_mem_max bigint      NOT NULL DEFAULT 0,
    int_max_pss     bigint               DEFAULT 0,
    CONSTRAINT c_layer_mem_pk PRIMARY KEY (pk_layer_mem),
    CONSTRAINT c_layer_mem_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job),
    CONSTRAINT c_layer_mem_pk_layer FOREIGN KEY (pk_layer) REFERENCES layer (pk_layer)
);
CREATE UNIQUE INDEX i_layer_mem_pk_layer ON layer_mem (pk_layer);

CREATE TABLE layer_env (
    pk_layer_env varchar(36)   NOT NULL,
    pk_layer     varchar(36),
    pk_job       varchar(36),
    str_key      varchar(2048),
    str_value    varchar(2048),
    CONSTRAINT c_layer_env_pk PRIMARY KEY (pk_layer_env),
    CONSTRAINT c_layer_env_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job),
    CONSTRAINT c_layer_env_pk_layer FOREIGN KEY (pk_layer) REFERENCES layer (pk_layer)
);

CREATE SEQUENCE layer_output_ser_order_seq AS integer;

CREATE TABLE layer_output (
    pk_layer_output varchar(36)   NOT NULL,
    pk_layer        varchar(36)   NOT NULL,
    pk_job          varchar(36)   NOT NULL,
    str_filespec    varchar(2048) NOT NULL,
    ser_order       integer       NOT NULL DEFAULT nextval('layer_output_ser_order_seq'),
    CONSTRAINT c_pk_layer_output PRIMARY KEY (pk_layer_output),
    CONSTRAINT c_layer_output_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job),
    CONSTRAINT c_layer_output_pk_layer FOREIGN KEY (pk_layer) REFERENCES layer (pk_layer)
);
ALTER SEQUENCE layer_output_ser_order_seq OWNED BY layer_output.ser_order;

-- Limits: a named counter of concurrently RUNNING frames shared by every
-- layer attached to it. Neither table has a primary key or foreign keys in
-- Cuebot.
CREATE TABLE limit_record (
    pk_limit_record varchar(36)  NOT NULL,
    str_name        varchar(255) NOT NULL,
    int_max_value   integer,
    b_host_limit    boolean      NOT NULL DEFAULT false
);

CREATE TABLE layer_limit (
    pk_layer_limit  varchar(36) NOT NULL,
    pk_layer        varchar(36) NOT NULL,
    pk_limit_record varchar(36) NOT NULL
);

------------------------------------------------------------------------------
-- Frames.
------------------------------------------------------------------------------

CREATE TABLE frame (
    pk_frame                 varchar(36)  NOT NULL,
    pk_layer                 varchar(36)  NOT NULL,
    pk_job                   varchar(36)  NOT NULL,
    str_name                 varchar(256) NOT NULL,       -- "0001-layer"
    str_state                varchar(24)  NOT NULL,       -- WAITING, RUNNING, ...
    int_number               bigint       NOT NULL,
    int_depend_count         bigint       NOT NULL DEFAULT 0,
    int_exit_status          bigint       NOT NULL DEFAULT -1, -- -1 = never ran
    int_retries              bigint       NOT NULL DEFAULT 0,
    int_mem_reserved         bigint       NOT NULL DEFAULT 0,
    int_mem_max_used         bigint       NOT NULL DEFAULT 0,
    int_mem_used             bigint       NOT NULL DEFAULT 0,
    int_dispatch_order       bigint       NOT NULL DEFAULT 0,
    str_host                 varchar(256),
    int_cores                integer      NOT NULL DEFAULT 0,
    int_layer_order          integer      NOT NULL,
    ts_started               timestamptz(6),
    ts_stopped               timestamptz(6),
    ts_last_run              timestamptz(6),
    ts_updated               timestamptz(6),
    int_version              integer               DEFAULT 0, -- optimistic lock
    str_checkpoint_state     varchar(12)  NOT NULL DEFAULT 'DISABLED',
    int_checkpoint_count     smallint     NOT NULL DEFAULT 0,
    int_gpu_mem_reserved     bigint       NOT NULL DEFAULT 0,
    int_total_past_core_time integer      NOT NULL DEFAULT 0,
    ts_llu                   timestamptz(6),
    int_gpu_mem_used         bigint       NOT NULL DEFAULT 0,
    int_gpu_mem_max_used     bigint       NOT NULL DEFAULT 0,
    int_gpus                 integer      NOT NULL DEFAULT 0,
    int_total_past_gpu_time  integer      NOT NULL DEFAULT 0,
    int_pss_max_used         bigint                DEFAULT 0,
    int_pss_used             bigint                DEFAULT 0,
    ts_eligible              timestamptz(6)        DEFAULT NULL,
    CONSTRAINT c_frame_pk PRIMARY KEY (pk_frame),
    CONSTRAINT c_frame_str_name_unq UNIQUE (str_name, pk_job),
    CONSTRAINT c_frame_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job),
    CONSTRAINT c_frame_pk_layer FOREIGN KEY (pk_layer) REFERENCES layer (pk_layer)
);

CREATE TABLE frame_state_display_overrides (
    pk_frame_override varchar(36) NOT NULL,
    pk_frame          varchar(36) NOT NULL,
    str_frame_state   varchar(24) NOT NULL,
    str_override_text varchar(24) NOT NULL,
    str_rgb           varchar(24) NOT NULL,
    CONSTRAINT c_frame_state_override UNIQUE (pk_frame, str_frame_state),
    CONSTRAINT c_frame_state_overrides_pk_frame FOREIGN KEY (pk_frame) REFERENCES frame (pk_frame)
);

-- Dependencies. No foreign keys in Cuebot.
CREATE TABLE depend (
    pk_depend          varchar(36) NOT NULL,
    pk_parent          varchar(36),
    pk_job_depend_on   varchar(36) NOT NULL,
    pk_job_depend_er   varchar(36) NOT NULL,
    pk_frame_depend_on varchar(36),
    pk_frame_depend_er varchar(36),
    pk_layer_depend_on varchar(36),
    pk_layer_depend_er varchar(36),
    str_type           varchar(36) NOT NULL,
    b_active           boolean     NOT NULL DEFAULT true,
    b_any              boolean     NOT NULL DEFAULT false,
    ts_created         timestamp(6) NOT NULL DEFAULT current_timestamp,
    ts_satisfied       timestamp(6),
    str_target         varchar(20) NOT NULL DEFAULT 'Internal',
    str_signature      varchar(36) NOT NULL,
    b_composite        boolean     NOT NULL DEFAULT false,
    CONSTRAINT c_depend_pk PRIMARY KEY (pk_depend)
);
CREATE UNIQUE INDEX i_depend_signature ON depend (str_signature);

------------------------------------------------------------------------------
-- Hosts and running processes.
------------------------------------------------------------------------------

-- A render node. Totals and idle values are in centicores / KB / devices;
-- the verify_host_resources trigger keeps every idle value >= 0.
CREATE TABLE host (
    pk_host          varchar(36)  NOT NULL,
    pk_alloc         varchar(36)  NOT NULL,
    str_name         varchar(45)  NOT NULL,
    str_lock_state   varchar(36)  NOT NULL,      -- OPEN, LOCKED, NIMBY_LOCKED (no default)
    b_nimby          boolean      NOT NULL DEFAULT false,
    ts_created       timestamp(6) NOT NULL DEFAULT current_timestamp,
    int_cores        bigint       NOT NULL DEFAULT 0,
    int_procs        bigint       NOT NULL DEFAULT 0,
    int_cores_idle   bigint       NOT NULL DEFAULT 0,
    int_mem          bigint       NOT NULL DEFAULT 0,
    int_mem_idle     bigint       NOT NULL DEFAULT 0,
    b_unlock_boot    boolean      NOT NULL DEFAULT false,
    b_unlock_idle    boolean      NOT NULL DEFAULT false,
    b_reboot_idle    boolean      NOT NULL DEFAULT false,
    str_tags         varchar(128),                -- host_tag names, space separated
    str_fqdn         varchar(128),
    b_comment        boolean      NOT NULL DEFAULT false,
    int_thread_mode  integer      NOT NULL DEFAULT 0,  -- 0 AUTO, 1 ALL, 2 VARIABLE
    str_lock_source  varchar(128),
    int_gpu_mem      bigint       NOT NULL DEFAULT 0,
    int_gpu_mem_idle bigint       NOT NULL DEFAULT 0,
    int_gpus         bigint       NOT NULL DEFAULT 0,
    int_gpus_idle    bigint       NOT NULL DEFAULT 0,
    CONSTRAINT c_host_pk PRIMARY KEY (pk_host),
    CONSTRAINT c_host_uk UNIQUE (str_name),
    CONSTRAINT c_str_host_fqdn_uk UNIQUE (str_fqdn),
    CONSTRAINT c_host_pk_alloc FOREIGN KEY (pk_alloc) REFERENCES alloc (pk_alloc)
);

-- What the host last reported (memory free, hardware state, OS).
CREATE TABLE host_stat (
    pk_host_stat      varchar(36)    NOT NULL,
    pk_host           varchar(36)    NOT NULL,
    int_mem_total     bigint         NOT NULL DEFAULT 0,
    int_mem_free      bigint         NOT NULL DEFAULT 0,
    int_swap_total    bigint         NOT NULL DEFAULT 0,
    int_swap_free     bigint         NOT NULL DEFAULT 0,
    int_mcp_total     bigint         NOT NULL DEFAULT 0,
    int_mcp_free      bigint         NOT NULL DEFAULT 0,
    int_load          bigint         NOT NULL DEFAULT 0,
    ts_ping           timestamptz(6) NOT NULL DEFAULT current_timestamp,
    ts_booted         timestamptz(6) NOT NULL DEFAULT current_timestamp,
    str_state         varchar(32)    NOT NULL DEFAULT 'UP',
    str_os            varchar(32)    NOT NULL DEFAULT 'rhel40',
    int_gpu_mem_total bigint         NOT NULL DEFAULT 0,
    int_gpu_mem_free  bigint         NOT NULL DEFAULT 0,
    CONSTRAINT c_hoststat_pk PRIMARY KEY (pk_host_stat),
    CONSTRAINT c_host_stat_pk_host_uk UNIQUE (pk_host),
    CONSTRAINT c_host_stat_pk_host FOREIGN KEY (pk_host) REFERENCES host (pk_host)
);

-- Tags of a host. No foreign key to host in Cuebot. The column default is
-- the mixed-case 'Hardware'; Cuebot always writes the upper-case type name.
CREATE TABLE host_tag (
    pk_host_tag  varchar(36) NOT NULL,
    pk_host      varchar(36) NOT NULL,
    str_tag      varchar(45) NOT NULL,
    str_tag_type varchar(24) NOT NULL DEFAULT 'Hardware',
    b_constant   boolean     NOT NULL DEFAULT false,
    CONSTRAINT c_host_tag_pk PRIMARY KEY (pk_host_tag)
);

-- A booked slice of a host running (or about to run) one frame. pk_frame is
-- unique, so a frame has at most one proc; pk_job, pk_layer and pk_show
-- carry no foreign keys.
CREATE TABLE proc (
    pk_proc                  varchar(36)    NOT NULL,
    pk_host                  varchar(36)    NOT NULL,
    pk_job                   varchar(36),
    pk_show                  varchar(36),
    pk_layer                 varchar(36),
    pk_frame                 varchar(36),           -- NULL between frame stop and unbook
    int_cores_reserved       bigint         NOT NULL,   -- centicores, > 0
    int_mem_reserved         bigint         NOT NULL,   -- KB
    int_mem_used             bigint         NOT NULL DEFAULT 0,
    int_mem_max_used         bigint         NOT NULL DEFAULT 0,
    b_unbooked               boolean        NOT NULL DEFAULT false,
    int_mem_pre_reserved     bigint         NOT NULL DEFAULT 0,
    int_virt_used            bigint         NOT NULL DEFAULT 0,
    int_virt_max_used        bigint         NOT NULL DEFAULT 0,
    str_redirect             varchar(265),
    b_local                  boolean        NOT NULL DEFAULT false,
    ts_ping                  timestamptz(6) NOT NULL DEFAULT current_timestamp,
    ts_booked                timestamptz(6) NOT NULL DEFAULT current_timestamp,
    ts_dispatched            timestamptz(6) NOT NULL DEFAULT current_timestamp,
    int_gpu_mem_reserved     bigint         NOT NULL DEFAULT 0,
    int_gpus_reserved        integer        NOT NULL DEFAULT 0,
    int_gpu_mem_used         bigint         NOT NULL DEFAULT 0,
    int_gpu_mem_max_used     bigint         NOT NULL DEFAULT 0,
    int_gpu_mem_pre_reserved bigint         NOT NULL DEFAULT 0,
    bytea_children           bytea,
    int_swap_used            bigint         NOT NULL DEFAULT 0,
    int_pss_max_used         bigint                  DEFAULT 0,
    int_pss_used             bigint                  DEFAULT 0,
    CONSTRAINT c_proc_pk PRIMARY KEY (pk_proc),
    CONSTRAINT c_proc_uk UNIQUE (pk_frame),
    CONSTRAINT c_proc_pk_frame FOREIGN KEY (pk_frame) REFERENCES frame (pk_frame),
    CONSTRAINT c_proc_pk_host FOREIGN KEY (pk_host) REFERENCES host (pk_host)
);

CREATE TABLE redirect (
    pk_proc            varchar(36)  NOT NULL,
    str_group_id       varchar(36)  NOT NULL,
    int_type           bigint       NOT NULL,
    str_destination_id varchar(512) NOT NULL,
    str_name           varchar(512) NOT NULL,
    lng_creation_time  bigint       NOT NULL,
    CONSTRAINT c_redirect_pk PRIMARY KEY (pk_proc)
);

-- Desktop ("local") booking: a user lends a host to one job.
CREATE TABLE host_local (
    pk_host_local    varchar(36)    NOT NULL,
    pk_job           varchar(36)    NOT NULL,
    pk_layer         varchar(36),
    pk_frame         varchar(36),
    pk_host          varchar(36)    NOT NULL,
    ts_created       timestamptz(6) NOT NULL DEFAULT current_timestamp,
    ts_updated       timestamptz(6),
    int_mem_max      bigint         NOT NULL DEFAULT 0,
    int_mem_idle     bigint         NOT NULL DEFAULT 0,
    int_cores_max    integer        NOT NULL DEFAULT 100,
    int_cores_idle   integer        NOT NULL DEFAULT 100,
    int_threads      integer        NOT NULL DEFAULT 1,
    float_tier       numeric(16,2)  NOT NULL DEFAULT 0,
    b_active         boolean        NOT NULL DEFAULT true,
    str_type         varchar(36)    NOT NULL,
    int_gpu_mem_idle bigint         NOT NULL DEFAULT 0,
    int_gpu_mem_max  bigint         NOT NULL DEFAULT 0,
    int_gpus_idle    integer        NOT NULL DEFAULT 0,
    int_gpus_max     integer        NOT NULL DEFAULT 0,
    CONSTRAINT c_pk_host_local PRIMARY KEY (pk_host_local),
    CONSTRAINT c_host_local_pk_host FOREIGN KEY (pk_host) REFERENCES host (pk_host),
    CONSTRAINT c_host_local_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);
CREATE UNIQUE INDEX i_host_local_unique ON host_local (pk_host, pk_job);

CREATE TABLE job_local (
    pk_job_local varchar(36)    NOT NULL,
    pk_job       varchar(36)    NOT NULL,
    pk_host      varchar(36)    NOT NULL,
    str_source   varchar(255)   NOT NULL,
    ts_created   timestamptz(6) NOT NULL DEFAULT current_timestamp,
    int_cores    integer        NOT NULL DEFAULT 0,
    int_max_cores integer       NOT NULL,
    int_gpus     integer        NOT NULL DEFAULT 0,
    int_max_gpus integer        NOT NULL DEFAULT 0,
    CONSTRAINT c_pk_job_local PRIMARY KEY (pk_job_local),
    CONSTRAINT c_job_local_pk_host FOREIGN KEY (pk_host) REFERENCES host (pk_host),
    CONSTRAINT c_job_local_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);
CREATE UNIQUE INDEX i_job_local_pk_host ON job_local (pk_host);
CREATE UNIQUE INDEX i_job_local_pk_job ON job_local (pk_job);

-- Host ownership (desktop "deeds"); before_delete_host removes them.
CREATE TABLE owner (
    pk_owner     varchar(36)    NOT NULL,
    pk_show      varchar(36)    NOT NULL,
    str_username varchar(64)    NOT NULL,
    ts_created   timestamptz(6) NOT NULL DEFAULT current_timestamp,
    ts_updated   timestamptz(6) NOT NULL DEFAULT current_timestamp,
    CONSTRAINT c_pk_owner PRIMARY KEY (pk_owner),
    CONSTRAINT c_owner_pk_show FOREIGN KEY (pk_show) REFERENCES show (pk_show)
);
CREATE UNIQUE INDEX i_owner_str_username ON owner (str_username);

CREATE TABLE deed (
    pk_deed            varchar(36) NOT NULL,
    pk_owner           varchar(36) NOT NULL,
    pk_host            varchar(36) NOT NULL,
    b_blackout         boolean     NOT NULL DEFAULT false,
    int_blackout_start integer,
    int_blackout_stop  integer,
    CONSTRAINT c_pk_deed PRIMARY KEY (pk_deed),
    CONSTRAINT c_deed_pk_host FOREIGN KEY (pk_host) REFERENCES host (pk_host)
);
CREATE UNIQUE INDEX i_deed_pk_host ON deed (pk_host);

CREATE TABLE comments (
    pk_comment  varchar(36)   NOT NULL,
    pk_job      varchar(36),
    pk_host     varchar(36),
    ts_created  timestamp(6)  NOT NULL DEFAULT current_timestamp,
    str_user    varchar(36)   NOT NULL,
    str_subject varchar(128)  NOT NULL,
    str_message varchar(4000) NOT NULL,
    CONSTRAINT c_comment_pk PRIMARY KEY (pk_comment),
    CONSTRAINT c_comment_pk_host FOREIGN KEY (pk_host) REFERENCES host (pk_host),
    CONSTRAINT c_comment_pk_job FOREIGN KEY (pk_job) REFERENCES job (pk_job)
);

------------------------------------------------------------------------------
-- Services (per-facility defaults and per-show overrides).
------------------------------------------------------------------------------

CREATE TABLE service (
    pk_service              varchar(36)  NOT NULL,
    str_name                varchar(36)  NOT NULL,
    b_threadable            boolean      NOT NULL,
    int_cores_min           integer      NOT NULL,   -- centicores
    int_mem_min             integer      NOT NULL,   -- KB
    str_tags                varchar(128) NOT NULL,   -- "a | b"
    int_cores_max           integer      NOT NULL DEFAULT 0,
    int_gpu_mem_min         bigint       NOT NULL DEFAULT 0,
    int_timeout             integer      NOT NULL DEFAULT 0,
    int_timeout_llu         integer      NOT NULL DEFAULT 0,
    int_gpus_min            integer      NOT NULL DEFAULT 0,
    int_gpus_max            integer      NOT NULL DEFAULT 0,
    int_min_memory_increase integer      NOT NULL DEFAULT 2097152,  -- KB (2 GB)
    CONSTRAINT c_pk_service PRIMARY KEY (pk_service)
);
CREATE UNIQUE INDEX i_service_str_name ON service (str_name);

CREATE TABLE show_service (
    pk_show_service         varchar(36)  NOT NULL,
    pk_show                 varchar(36)  NOT NULL,
    str_name                varchar(36)  NOT NULL,
    b_threadable            boolean      NOT NULL,
    int_cores_min           integer      NOT NULL,
    int_mem_min             integer      NOT NULL,
    str_tags                varchar(128) NOT NULL,
    int_cores_max           integer      NOT NULL DEFAULT 0,
    int_gpu_mem_min         bigint       NOT NULL DEFAULT 0,
    int_timeout             integer      NOT NULL DEFAULT 0,
    int_timeout_llu         integer      NOT NULL DEFAULT 0,
    int_gpus_min            integer      NOT NULL DEFAULT 0,
    int_gpus_max            integer      NOT NULL DEFAULT 0,
    int_min_memory_increase integer      NOT NULL DEFAULT 2097152,
    CONSTRAINT c_pk_show_service PRIMARY KEY (pk_show_service),
    CONSTRAINT c_show_service_pk_show FOREIGN KEY (pk_show) REFERENCES show (pk_show)
);
CREATE UNIQUE INDEX i_show_service_str_name ON show_service (str_name, pk_show);

------------------------------------------------------------------------------
-- Maintenance locks and configuration.
------------------------------------------------------------------------------

-- Cluster-wide task locks: int_lock holds the holder's epoch milliseconds
-- (0 = free) and int_timeout is compared against a millisecond delta.
CREATE TABLE task_lock (
    pk_task_lock varchar(36)  NOT NULL,
    str_name     varchar(36)  NOT NULL,
    int_lock     bigint       NOT NULL DEFAULT 0,
    int_timeout  bigint       NOT NULL DEFAULT 30,
    ts_lastrun   timestamp(6) NOT NULL DEFAULT current_timestamp,
    CONSTRAINT c_task_lock_pk PRIMARY KEY (pk_task_lock)
);

-- Key/value settings. A row with str_key = 'DISABLE_HISTORY' switches off
-- the history triggers.
CREATE TABLE config (
    pk_config  varchar(36)  NOT NULL,
    str_key    varchar(36)  NOT NULL,
    int_value  bigint                DEFAULT 0,
    long_value bigint                DEFAULT 0,
    str_value  varchar(255)          DEFAULT '',
    b_value    boolean               DEFAULT false,
    CONSTRAINT c_pk_pkconfig PRIMARY KEY (pk_config),
    CONSTRAINT c_show_uk UNIQUE (str_key)
);

------------------------------------------------------------------------------
-- History, written by triggers on every job/layer insert and frame state
-- change. Times are integer epoch seconds; dt_last_modified is stamped by
-- the tbiu_* triggers.
------------------------------------------------------------------------------

CREATE TABLE job_history (
    pk_job                varchar(36)  NOT NULL,
    pk_show               varchar(36)  NOT NULL,
    str_name              varchar(512) NOT NULL,
    str_shot              varchar(64)  NOT NULL,
    str_user              varchar(36)  NOT NULL,
    int_core_time_success bigint       NOT NULL DEFAULT 0,
    int_core_time_fail    bigint       NOT NULL DEFAULT 0,
    int_frame_count       bigint       NOT NULL DEFAULT 0,
    int_layer_count       bigint       NOT NULL DEFAULT 0,
    int_waiting_count     bigint       NOT NULL DEFAULT 0,
    int_dead_count        bigint       NOT NULL DEFAULT 0,
    int_depend_count      bigint       NOT NULL DEFAULT 0,
    int_eaten_count       bigint       NOT NULL DEFAULT 0,
    int_succeeded_count   bigint       NOT NULL DEFAULT 0,
    int_running_count     bigint       NOT NULL DEFAULT 0,
    int_max_rss           bigint       NOT NULL DEFAULT 0,
    b_archived            boolean      NOT NULL DEFAULT false,
    pk_facility           varchar(36)  NOT NULL,
    pk_dept               varchar(36)  NOT NULL,
    int_ts_started        integer      NOT NULL,
    int_ts_stopped        integer      NOT NULL DEFAULT 0,
    dt_last_modified      date         NOT NULL,
    int_gpu_time_success  bigint       NOT NULL DEFAULT 0,
    int_gpu_time_fail     bigint       NOT NULL DEFAULT 0,
    int_gpu_mem_max       bigint       NOT NULL DEFAULT 0,
    CONSTRAINT c_job_history_pk PRIMARY KEY (pk_job),
    CONSTRAINT c_job_history_pk_show FOREIGN KEY (pk_show) REFERENCES show (pk_show),
    CONSTRAINT c_job_history_pk_facility FOREIGN KEY (pk_facility) REFERENCES facility (pk_facility),
    CONSTRAINT c_job_history_pk_dept FOREIGN KEY (pk_dept) REFERENCES dept (pk_dept)
);

CREATE TABLE layer_history (
    pk_layer              varchar(36)  NOT NULL,
    pk_job                varchar(36)  NOT NULL,
    str_name              varchar(512) NOT NULL,
    str_type              varchar(16)  NOT NULL,
    int_cores_min         bigint       NOT NULL DEFAULT 100,
    int_mem_min           bigint       NOT NULL DEFAULT 4194304,
    int_core_time_success bigint       NOT NULL DEFAULT 0,
    int_core_time_fail    bigint       NOT NULL DEFAULT 0,
    int_frame_count       bigint       NOT NULL DEFAULT 0,
    int_layer_count       bigint       NOT NULL DEFAULT 0,
    int_waiting_count     bigint       NOT NULL DEFAULT 0,
    int_dead_count        bigint       NOT NULL DEFAULT 0,
    int_depend_count      bigint       NOT NULL DEFAULT 0,
    int_eaten_count       bigint       NOT NULL DEFAULT 0,
    int_succeeded_count   bigint       NOT NULL DEFAULT 0,
    int_running_count     bigint       NOT NULL DEFAULT 0,
    int_max_rss           bigint       NOT NULL DEFAULT 0,
    b_archived            boolean      NOT NULL DEFAULT false,
    dt_last_modified      date         NOT NULL,
    str_services          varchar(128),
    int_gpus_min          integer      NOT NULL DEFAULT 0,
    int_gpu_time_success  bigint       NOT NULL DEFAULT 0,
    int_gpu_time_fail     bigint       NOT NULL DEFAULT 0,
    int_gpu_mem_min       bigint       NOT NULL DEFAULT 0,
    int_gpu_mem_max       bigint       NOT NULL DEFAULT 0,
    CONSTRAINT c_layer_history_pk PRIMARY KEY (pk_layer),
    CONSTRAINT c_layer_history_pk_job FOREIGN KEY (pk_job) REFERENCES job_history (pk_job) ON DELETE CASCADE
);

CREATE TABLE frame_history (
    pk_frame_history     varchar(36)  NOT NULL DEFAULT uuid_generate_v1(),
    pk_frame             varchar(36)  NOT NULL,
    pk_layer             varchar(36)  NOT NULL,
    pk_job               varchar(36)  NOT NULL,
    str_name             varchar(256) NOT NULL,
    str_state            varchar(24)  NOT NULL,
    int_mem_reserved     bigint       NOT NULL DEFAULT 0,
    int_mem_max_used     bigint       NOT NULL DEFAULT 0,
    int_cores            integer      NOT NULL DEFAULT 100,
    str_host             varchar(64)           DEFAULT NULL,  -- narrower than frame.str_host
    int_exit_status      smallint     NOT NULL DEFAULT -1,    -- narrower than frame's bigint
    pk_alloc             varchar(36),
    int_ts_started       integer      NOT NULL,
    int_ts_stopped       integer      NOT NULL DEFAULT 0,     -- 0 = still running
    int_checkpoint_count integer      NOT NULL DEFAULT 0,
    dt_last_modified     date         NOT NULL,
    int_gpus             integer      NOT NULL DEFAULT 0,
    int_gpu_mem_reserved bigint       NOT NULL DEFAULT 0,
    int_gpu_mem_max_used bigint       NOT NULL DEFAULT 0,
    CONSTRAINT c_frame_history_pk PRIMARY KEY (pk_frame_history),
    CONSTRAINT c_frame_history_pk_alloc FOREIGN KEY (pk_alloc) REFERENCES alloc (pk_alloc),
    CONSTRAINT c_frame_history_pk_job FOREIGN KEY (pk_job) REFERENCES job_history (pk_job) ON DELETE CASCADE,
    CONSTRAINT c_frame_history_pk_layer FOREIGN KEY (pk_layer) REFERENCES layer_history (pk_layer) ON DELETE CASCADE
);
