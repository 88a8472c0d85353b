-- cuesched baseline, part 1: extension and scalar helper functions.
--
-- The baseline recreates, for tests and demos, the database a stock Cuebot
-- has after its V47 migration. It is written from the facts of that schema,
-- not copied from OpenCue. Object names
-- (tables, constraints, indexes, triggers, trigger functions) match Cuebot's
-- so that a later Cuebot migration, a Cuebot DAO or an operator's psql
-- session finds what it expects.
--
-- Files in this directory run in lexical order inside one transaction.

-- frame_history.pk_frame_history defaults to a version-1 UUID, as in Cuebot.
CREATE EXTENSION IF NOT EXISTS "uuid-ossp";

-- epoch(ts): whole seconds since 1970 for a timestamptz. The history tables
-- keep start/stop times as integer epoch seconds. The fractional part is
-- rounded to the nearest second, as Cuebot's version does when it stores
-- the extracted value into an integer.
CREATE OR REPLACE FUNCTION epoch(ts timestamptz) RETURNS numeric
LANGUAGE plpgsql AS $$
BEGIN
    RETURN round(extract(epoch FROM ts));
END;
$$;

-- interval_to_seconds(iv): a day-to-second interval as numeric seconds
-- (months and years are ignored, as in Cuebot).
CREATE OR REPLACE FUNCTION interval_to_seconds(iv interval) RETURNS numeric
LANGUAGE plpgsql AS $$
BEGIN
    RETURN extract(day FROM iv) * 86400
         + extract(hour FROM iv) * 3600
         + extract(minute FROM iv) * 60
         + extract(second FROM iv);
END;
$$;

-- find_duration(start, stop): whole seconds between two instants; an open
-- interval (stop NULL) runs to now, a missing start gives 0.
CREATE OR REPLACE FUNCTION find_duration(t_start timestamptz, t_stop timestamptz) RETURNS numeric
LANGUAGE plpgsql AS $$
BEGIN
    IF t_start IS NULL THEN
        RETURN 0;
    END IF;
    RETURN round(interval_to_seconds(date_trunc('second', coalesce(t_stop, current_timestamp)) - t_start));
END;
$$;

-- genkey(): a fresh 36-character id. Cuebot's Java code uses random
-- (version 4) UUIDs for every key it writes; this helper exists for SQL
-- that needs an id server-side.
CREATE OR REPLACE FUNCTION genkey() RETURNS varchar
LANGUAGE plpgsql AS $$
BEGIN
    RETURN uuid_generate_v1()::text;
END;
$$;

-- tier(cores, min): the "how far above its minimum" ratio Cuebot keeps in
-- float_tier of subscription and job_resource. With no minimum it is the
-- number of whole cores plus one; an idle consumer with a minimum gets a
-- negative tier (the minimum, negated) so that it sorts first.
CREATE OR REPLACE FUNCTION tier(cores numeric, min_cores numeric) RETURNS numeric
LANGUAGE plpgsql AS $$
BEGIN
    IF min_cores = 0 THEN
        RETURN cores / 100 + 1;
    END IF;
    IF cores = 0 THEN
        RETURN -min_cores;
    END IF;
    RETURN cores / min_cores;
END;
$$;

-- soft_tier(cores, min): like tier but saturating at 1 once the minimum is
-- met; used for folder_resource and point.
CREATE OR REPLACE FUNCTION soft_tier(cores numeric, min_cores numeric) RETURNS numeric
LANGUAGE plpgsql AS $$
BEGIN
    IF cores IS NULL THEN
        RETURN 0;
    END IF;
    IF min_cores = 0 OR cores >= min_cores THEN
        RETURN 1;
    END IF;
    IF cores = 0 THEN
        RETURN -min_cores;
    END IF;
    RETURN cores / min_cores;
END;
$$;
