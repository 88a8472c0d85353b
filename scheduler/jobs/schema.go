package jobs

import (
	"context"
	"fmt"
	"strings"
)

// Schema says which optional Cuebot columns the database has, so the
// queries work on a Cuebot database older than V47 as well.
type Schema struct {
	// StartAfter: layer.ts_start_after (Cuebot V47, deferred layers).
	StartAfter bool
	// FrameEligible: frame.ts_eligible (Cuebot V41), the start of a frame's
	// time to book; without it ts_updated is used.
	FrameEligible bool
	// LimitSettings: cuesched_limit (rollout 0007), the limits' licence
	// denial exit statuses; without it no exit status is a denial.
	LimitSettings bool
	// LayerBackoff: cuesched_layer_backoff (rollout 0008), the fail-fast
	// holds of layers (package failfast); without it nothing is held.
	LayerBackoff bool
	// MemorySizing: cuesched_frame_oom and cuesched_layer_oom (rollout
	// 0009), memory sizing's kill ledger; without them sizing is off.
	MemorySizing bool
	// PerHostLimits: cuesched_limit.b_per_host (rollout 0010), node-locked
	// limits; without it every limit counts frames.
	PerHostLimits bool
}

// CurrentSchema is a database at Cuebot V47 or later with every rollout
// step applied.
var CurrentSchema = Schema{StartAfter: true, FrameEligible: true, LimitSettings: true, LayerBackoff: true, MemorySizing: true, PerHostLimits: true}

// DetectSchema reads the optional columns from the catalog (the current
// search_path).
func DetectSchema(ctx context.Context, db DB) (Schema, error) {
	rows, err := db.Query(ctx, `SELECT c.relname, a.attname FROM pg_attribute a
		JOIN pg_class c ON c.oid = a.attrelid
		WHERE c.oid IN (to_regclass('layer'), to_regclass('frame'), to_regclass('cuesched_limit'), to_regclass('cuesched_layer_backoff'), to_regclass('cuesched_layer_oom'))
		  AND a.attnum > 0 AND NOT a.attisdropped
		  AND a.attname IN ('ts_start_after', 'ts_eligible', 'int_denial_exit_statuses', 'ts_until', 'int_bump_kb', 'b_per_host')`)
	if err != nil {
		return Schema{}, fmt.Errorf("detect schema: %w", err)
	}
	defer rows.Close()
	var s Schema
	for rows.Next() {
		var rel, col string
		if err := rows.Scan(&rel, &col); err != nil {
			return Schema{}, fmt.Errorf("detect schema: %w", err)
		}
		switch rel + "." + col {
		case "layer.ts_start_after":
			s.StartAfter = true
		case "frame.ts_eligible":
			s.FrameEligible = true
		case "cuesched_limit.int_denial_exit_statuses":
			s.LimitSettings = true
		case "cuesched_layer_backoff.ts_until":
			s.LayerBackoff = true
		case "cuesched_layer_oom.int_bump_kb":
			s.MemorySizing = true
		case "cuesched_limit.b_per_host":
			s.PerHostLimits = true
		}
	}
	return s, rows.Err()
}

// Adapt rewrites a query written for the current schema for s: the
// start-after conditions (marked by the alias l or f they use) are dropped
// when layer.ts_start_after is missing, and ts_eligible falls back to
// ts_updated.
func (s Schema) Adapt(sql string) string {
	if !s.StartAfter {
		sql = strings.NewReplacer(
			"AND (l.ts_start_after IS NULL OR l.ts_start_after <= now())", "",
			"AND NOT EXISTS (SELECT 1 FROM layer l WHERE l.pk_layer = f.pk_layer AND l.ts_start_after > now())", "",
		).Replace(sql)
	}
	if !s.FrameEligible {
		sql = strings.ReplaceAll(sql, "COALESCE(fr.ts_eligible, fr.ts_updated, now())", "COALESCE(fr.ts_updated, now())")
	}
	if !s.LayerBackoff {
		sql = strings.ReplaceAll(sql, NotHeldSQL, "")
	}
	if !s.LimitSettings {
		sql = strings.ReplaceAll(sql, DenialsCTE, "denials AS (SELECT '{}'::integer[] AS codes)")
	}
	if !s.PerHostLimits {
		sql = strings.NewReplacer(SeatIDsSQL, "NULL::text[]", SeatMaxSQL, "NULL::bigint[]", NotPerHostSQL, "").Replace(sql)
	}
	return sql
}

// SeatIDsSQL and SeatMaxSQL read the node-locked limits of layer lay
// (cuesched_limit.b_per_host, rollout 0010) and their max seats, in the
// same order; Adapt makes them NULL on a database without the column.
const (
	SeatIDsSQL = `(SELECT array_agg(ll.pk_limit_record ORDER BY ll.pk_limit_record) FROM layer_limit ll
         JOIN cuesched_limit cl ON cl.pk_limit_record = ll.pk_limit_record AND cl.b_per_host WHERE ll.pk_layer = lay.pk_layer)`
	SeatMaxSQL = `(SELECT array_agg(COALESCE(lr.int_max_value, 0)::bigint ORDER BY ll.pk_limit_record) FROM layer_limit ll
         JOIN cuesched_limit cl ON cl.pk_limit_record = ll.pk_limit_record AND cl.b_per_host
         JOIN limit_record lr ON lr.pk_limit_record = ll.pk_limit_record WHERE ll.pk_layer = lay.pk_layer)`
)

// NotPerHostSQL is the condition of the booking statement that leaves a
// node-locked limit (alias lr) out of the frame count: the booking script
// holds its seats. Adapt drops it on a database without the column.
const NotPerHostSQL = `AND NOT EXISTS (SELECT 1 FROM cuesched_limit cl WHERE cl.pk_limit_record = lr.pk_limit_record AND cl.b_per_host)`

// NotHeldSQL is the condition of the job and layer queries that skips a
// layer (alias l) held by the fail-fast backoff (package failfast,
// cuesched_layer_backoff, rollout 0008). Adapt drops it on a database
// without the table.
const NotHeldSQL = `AND NOT EXISTS (SELECT 1 FROM cuesched_layer_backoff lb WHERE lb.pk_layer = l.pk_layer AND lb.ts_until > now())`

// DenialsCTE is the common table expression of a booking statement that
// reads the licence-denial exit statuses of layer $12's limits
// (cuesched_limit, rollout 0007) as one array, codes. Adapt replaces it with
// an empty array on a database without the table.
const DenialsCTE = `denials AS (
    SELECT COALESCE(array_agg(DISTINCT c.code), '{}'::integer[]) AS codes
      FROM layer_limit ll JOIN cuesched_limit cl ON cl.pk_limit_record = ll.pk_limit_record
     CROSS JOIN LATERAL unnest(cl.int_denial_exit_statuses) AS c(code)
     WHERE ll.pk_layer = $12)`

// adapt is Adapt for an optional schema (nil means CurrentSchema).
func (s *Schema) adapt(sql string) string {
	if s == nil {
		return sql
	}
	return s.Adapt(sql)
}
