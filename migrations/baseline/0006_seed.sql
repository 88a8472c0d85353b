-- cuesched baseline, part 6: the rows of a stock Cuebot sandbox database
-- (Cuebot's seed data plus the task_lock rows its migrations insert).
-- Fixed ids are Cuebot's, so fixtures and demos can refer to them; see
-- shared/cuebot for Go constants naming the most useful ones.

-- Facilities and departments ("cloud" and "Unknown" are the defaults).
INSERT INTO facility (pk_facility, str_name, b_default) VALUES
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA0', 'cloud', true),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1', 'local', false);

INSERT INTO dept (pk_dept, str_name, b_default) VALUES
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA0', 'Lighting',  false),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1', 'Animation', false),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA2', 'Hair',      false),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA3', 'Cloth',     false),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA4', 'Layout',    false),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA5', 'FX',        false),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA6', 'Pipeline',  false),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA7', 'Unknown',   true);

-- The show "testing" (max 2000 cores, min 1 core), its stats row and alias.
INSERT INTO show (pk_show, str_name, int_default_max_cores, int_default_min_cores,
                  b_booking_enabled, b_dispatch_enabled, b_active)
VALUES ('00000000-0000-0000-0000-000000000000', 'testing', 200000, 100, true, true, true);

INSERT INTO show_stats (pk_show) VALUES ('00000000-0000-0000-0000-000000000000');

INSERT INTO show_alias (pk_show_alias, pk_show, str_name)
VALUES ('00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-000000000000', 'test');

-- Root folder of "testing" (department Pipeline); the insert triggers add
-- its folder_level and folder_resource rows.
INSERT INTO folder (pk_folder, pk_parent_folder, pk_show, str_name, b_default, pk_dept,
                    int_job_min_cores, int_job_max_cores, int_job_priority, f_order, b_exclude_managed)
VALUES ('A0000000-0000-0000-0000-000000000000', NULL, '00000000-0000-0000-0000-000000000000',
        'testing', true, 'AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA6', -1, -1, -1, 1, false);

-- Point for (testing, Pipeline).
INSERT INTO point (pk_point, pk_dept, pk_show)
VALUES ('FFEEDDCC-AAAA-AAAA-AAAA-AAAAAAAAAAA0', 'AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA6',
        '00000000-0000-0000-0000-000000000000');

-- Allocations: three in "local", two in "cloud". Only local.general is the
-- default; none is billable.
INSERT INTO alloc (pk_alloc, str_name, b_allow_edit, b_default, str_tag, pk_facility, b_billable, b_enabled) VALUES
    ('00000000-0000-0000-0000-000000000000', 'local.general',    false, true,  'general',    'AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1', false, true),
    ('00000000-0000-0000-0000-000000000001', 'local.desktop',    false, false, 'desktop',    'AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1', false, true),
    ('00000000-0000-0000-0000-000000000002', 'local.unassigned', false, false, 'unassigned', 'AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1', false, true),
    ('00000000-0000-0000-0000-000000000003', 'cloud.general',    true,  false, 'general',    'AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA0', false, true),
    ('00000000-0000-0000-0000-000000000004', 'cloud.unassigned', true,  false, 'unassigned', 'AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA0', false, true);

-- "testing" subscribes to local.general, local.desktop and cloud.general
-- with size = burst = 1000 cores.
INSERT INTO subscription (pk_subscription, pk_alloc, pk_show, int_size, int_burst) VALUES
    ('00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-000000000000', '00000000-0000-0000-0000-000000000000', 100000, 100000),
    ('00000000-0000-0000-0000-000000000002', '00000000-0000-0000-0000-000000000001', '00000000-0000-0000-0000-000000000000', 100000, 100000),
    ('00000000-0000-0000-0000-000000000003', '00000000-0000-0000-0000-000000000003', '00000000-0000-0000-0000-000000000000', 100000, 100000);

-- Facility-wide services (cores in centicores, memory in KB).
INSERT INTO service (pk_service, str_name, b_threadable, int_cores_min, int_mem_min, str_tags) VALUES
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA0', 'default',     false, 100, 3355443, 'general | desktop'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1', 'prman',       false, 100, 3355443, 'general | desktop'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA2', 'arnold',      true,  100, 3355443, 'general | desktop'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA3', 'shell',       false, 100, 3355443, 'general | util'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA4', 'maya',        false, 100, 2097152, 'general | desktop'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA5', 'houdini',     false, 100, 3355443, 'general | desktop'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA7', 'katana',      true,  100, 2097152, 'general | desktop | util'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA9', 'nuke',        false, 100, 2097152, 'general | desktop'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAA11', 'preprocess',  false, 10,  393216,  'util'),
    ('AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAA12', 'postprocess', false, 10,  524288,  'util');

INSERT INTO config (pk_config, str_key, int_value, long_value, str_value, b_value)
VALUES ('00000000-0000-0000-0000-000000000005', 'MAX_FRAME_RETRIES', 16, 0, NULL, false);

-- Maintenance task locks. int_timeout is compared with a millisecond delta
-- (only the V46 row's 300000 was chosen with that in mind).
INSERT INTO task_lock (pk_task_lock, str_name, int_lock, int_timeout) VALUES
    ('00000000-0000-0000-0000-000000000001', 'LOCK_HISTORICAL_TRANSFER',        0,             3600),
    ('00000000-0000-0000-0000-000000000002', 'LOCK_HARDWARE_STATE_CHECK',       0,             30),
    ('00000000-0000-0000-0000-000000000003', 'LOCK_ORPHANED_PROC_CHECK',        0,             30),
    ('00000000-0000-0000-0000-000000000005', 'LOCK_TASK_UPDATE',                1240618998852, 3600),
    ('00000000-0000-0000-0000-000000000006', 'LOCK_SUBSCRIPTION_RECALCULATION', 0,             7200),
    ('00000000-0000-0000-0000-000000000007', 'LOCK_STUCK_DEPENDENCY_RECOVERY',  0,             600),
    ('00000000-0000-0000-0000-000000000008', 'LOCK_ORPHANED_FRAME_CHECK',       0,             300000);
