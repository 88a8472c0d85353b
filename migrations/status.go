package migrations

import (
	"context"
	"errors"
	"fmt"
	"github.com/cuesched/cuesched/shared/appname"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Report is what "cuesched migrate status" reports: the rollout state of a
// database and whether it is ready for logical replication.
type Report struct {
	Database      string
	ServerVersion string
	Role          string

	// CuebotSchema is false when any of CuebotTables is missing
	// (MissingTables names them).
	CuebotSchema  bool
	MissingTables []string

	Applied []AppliedStep
	Pending []Step

	// SchedulerManagedColumn: show.b_scheduler_managed exists.
	SchedulerManagedColumn bool
	// ManagedShows counts shows with b_scheduler_managed = true.
	ManagedShows int

	Publications []PublicationStatus

	// ProcReplicaIdentity is proc's REPLICA IDENTITY: "default", "full",
	// "index" or "nothing" ("" when there is no proc table).
	ProcReplicaIdentity string

	WALLevel string
	// MaxSlotWALKeepSize is max_slot_wal_keep_size as the server shows it
	// ("-1" is unlimited).
	MaxSlotWALKeepSize   string
	MaxReplicationSlots  int
	ReplicationSlotsUsed int
	MaxWALSenders        int
	WALSendersUsed       int

	// CanReplicate: the role has REPLICATION or is a superuser.
	CanReplicate bool
	Superuser    bool

	// Slots are the replication slots whose name starts with SlotPrefix.
	Slots []SlotStatus

	// Unreadable lists tables the role may not SELECT from (the version
	// table or show); what depends on them is then unknown.
	Unreadable []string

	// Warnings are problems an operator should act on; they do not make
	// Status fail.
	Warnings []string
}

// AppliedStep is a row of the version table.
type AppliedStep struct {
	Version   int
	Name      string
	AppliedAt time.Time
	AppliedBy string
	// Changed: the step's embedded SQL no longer matches the checksum
	// recorded when it was applied (this binary's SQL differs).
	Changed bool
	// Unknown: this binary has no step with that version (applied by a
	// newer cuesched).
	Unknown bool
}

// PublicationStatus compares a publication with its PublicationSpec.
type PublicationStatus struct {
	Name    string
	Present bool
	// Tables actually published (sorted).
	Tables []string
	// Operations actually published, e.g. "insert, delete, truncate".
	Operations string
	// OK: present with exactly the expected tables and operations.
	OK bool
}

// SlotStatus describes one cuesched replication slot.
type SlotStatus struct {
	Name     string
	Plugin   string
	Database string
	Active   bool
	// LagBytes is how much WAL the slot holds back: the distance from the
	// current WAL position to the slot's confirmed flush position.
	LagBytes int64
	// Sidecar: named with SidecarSlotPrefix, or streamed right now by a
	// cuesched sidecar (application_name appname.Sidecar...).
	Sidecar bool
}

// Status inspects the database conn is connected to. It only reads, and
// works on a database without any rollout applied (or not Cuebot at all:
// CuebotSchema is then false).
func Status(ctx context.Context, conn *pgx.Conn) (Report, error) {
	var st Report
	err := conn.QueryRow(ctx, `
		SELECT current_database(), current_setting('server_version'), current_user,
		       r.rolsuper, r.rolreplication OR r.rolsuper,
		       current_setting('wal_level'), current_setting('max_slot_wal_keep_size'),
		       current_setting('max_replication_slots')::int,
		       (SELECT count(*) FROM pg_replication_slots)::int,
		       current_setting('max_wal_senders')::int,
		       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')::int
		  FROM pg_roles r WHERE r.rolname = current_user`).Scan(
		&st.Database, &st.ServerVersion, &st.Role, &st.Superuser, &st.CanReplicate,
		&st.WALLevel, &st.MaxSlotWALKeepSize, &st.MaxReplicationSlots, &st.ReplicationSlotsUsed,
		&st.MaxWALSenders, &st.WALSendersUsed)
	if err != nil {
		return st, fmt.Errorf("migrations: read server settings: %w", err)
	}

	if st.MissingTables, err = missingTables(ctx, conn); err != nil {
		return st, err
	}
	st.CuebotSchema = len(st.MissingTables) == 0

	// Rollout steps.
	steps, err := Steps()
	if err != nil {
		return st, err
	}
	known := map[int]Step{}
	for _, s := range steps {
		known[s.Version] = s
	}
	var hasTable bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&hasTable); err != nil {
		return st, err
	}
	applied := map[int]bool{}
	if hasTable {
		var readable bool
		if err := conn.QueryRow(ctx, `SELECT has_table_privilege($1, 'SELECT')`, VersionTable).Scan(&readable); err != nil {
			return st, err
		}
		if !readable {
			st.Unreadable = append(st.Unreadable, VersionTable)
		}
	}
	if hasTable && len(st.Unreadable) == 0 {
		rows, err := conn.Query(ctx, `SELECT version, name, checksum, applied_at, applied_by FROM `+VersionTable+` ORDER BY version`)
		if err != nil {
			return st, fmt.Errorf("migrations: read %s: %w", VersionTable, err)
		}
		for rows.Next() {
			var a AppliedStep
			var sum string
			if err := rows.Scan(&a.Version, &a.Name, &sum, &a.AppliedAt, &a.AppliedBy); err != nil {
				rows.Close()
				return st, err
			}
			s, ok := known[a.Version]
			a.Unknown = !ok
			a.Changed = ok && s.Checksum != sum
			applied[a.Version] = true
			st.Applied = append(st.Applied, a)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return st, err
		}
	}
	for _, s := range steps {
		if !applied[s.Version] && len(st.Unreadable) == 0 {
			st.Pending = append(st.Pending, s)
		}
	}

	// show.b_scheduler_managed and the managed-show count.
	if err := conn.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_attribute
		                WHERE attrelid = to_regclass('show') AND attname = 'b_scheduler_managed'
		                  AND NOT attisdropped)`).Scan(&st.SchedulerManagedColumn); err != nil {
		return st, err
	}
	var showReadable bool
	if st.SchedulerManagedColumn {
		if err := conn.QueryRow(ctx, `SELECT has_table_privilege('show', 'SELECT')`).Scan(&showReadable); err != nil {
			return st, err
		}
		if !showReadable {
			st.Unreadable = append(st.Unreadable, "show")
		}
	}
	if st.SchedulerManagedColumn && showReadable {
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM show WHERE b_scheduler_managed`).Scan(&st.ManagedShows); err != nil {
			return st, fmt.Errorf("migrations: count managed shows: %w", err)
		}
	}

	// proc replica identity.
	var ident *string
	if err := conn.QueryRow(ctx, `SELECT relreplident::text FROM pg_class WHERE oid = to_regclass('proc')`).Scan(&ident); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return st, err
	}
	if ident != nil {
		st.ProcReplicaIdentity = map[string]string{"d": "default", "f": "full", "i": "index", "n": "nothing"}[*ident]
	}

	// Publications.
	for _, spec := range Publications() {
		ps, err := publicationStatus(ctx, conn, spec)
		if err != nil {
			return st, err
		}
		st.Publications = append(st.Publications, ps)
	}

	// Our replication slots.
	rows, err := conn.Query(ctx, `
		SELECT s.slot_name, coalesce(s.plugin, ''), coalesce(s.database, ''), s.active,
		       coalesce(pg_wal_lsn_diff(
		           CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END,
		           coalesce(s.confirmed_flush_lsn, s.restart_lsn)), 0)::bigint,
		       left(s.slot_name, length($2)) = $2
		         OR (s.active AND left(coalesce(a.application_name, ''), length($3)) = $3)
		  FROM pg_replication_slots s
		  LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		 WHERE left(s.slot_name, length($1)) = $1
		    OR (s.active AND left(coalesce(a.application_name, ''), length($3)) = $3)
		 ORDER BY s.slot_name`, SlotPrefix, SidecarSlotPrefix, appname.Sidecar)
	if err != nil {
		return st, fmt.Errorf("migrations: read replication slots: %w", err)
	}
	for rows.Next() {
		var s SlotStatus
		if err := rows.Scan(&s.Name, &s.Plugin, &s.Database, &s.Active, &s.LagBytes, &s.Sidecar); err != nil {
			rows.Close()
			return st, err
		}
		st.Slots = append(st.Slots, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, err
	}

	st.Warnings = st.warnings()
	return st, nil
}

func missingTables(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	var missing []string
	err := conn.QueryRow(ctx, `
		SELECT coalesce(array_agg(t ORDER BY t), '{}') FROM unnest($1::text[]) AS t
		 WHERE to_regclass(t) IS NULL`, CuebotTables()).Scan(&missing)
	if err != nil {
		return nil, fmt.Errorf("migrations: look for Cuebot tables: %w", err)
	}
	return missing, nil
}

func publicationStatus(ctx context.Context, conn *pgx.Conn, spec PublicationSpec) (PublicationStatus, error) {
	ps := PublicationStatus{Name: spec.Name}
	var ins, upd, del, trunc bool
	err := conn.QueryRow(ctx, `SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1`,
		spec.Name).Scan(&ins, &upd, &del, &trunc)
	if errors.Is(err, pgx.ErrNoRows) {
		return ps, nil
	}
	if err != nil {
		return ps, fmt.Errorf("migrations: read publication %s: %w", spec.Name, err)
	}
	ps.Present = true
	ps.Operations = operations(ins, upd, del, trunc)
	if err := conn.QueryRow(ctx, `
		SELECT coalesce(array_agg(tablename::text ORDER BY tablename), '{}')
		  FROM pg_publication_tables WHERE pubname = $1`, spec.Name).Scan(&ps.Tables); err != nil {
		return ps, err
	}
	ps.OK = strings.Join(ps.Tables, ",") == strings.Join(spec.Tables, ",") &&
		ps.Operations == operations(spec.Insert, spec.Update, spec.Delete, spec.Truncate)
	return ps, nil
}

func operations(ins, upd, del, trunc bool) string {
	var ops []string
	for _, o := range []struct {
		on   bool
		name string
	}{{ins, "insert"}, {upd, "update"}, {del, "delete"}, {trunc, "truncate"}} {
		if o.on {
			ops = append(ops, o.name)
		}
	}
	return strings.Join(ops, ", ")
}

// Ready reports whether the database is fully rolled out: Cuebot schema,
// nothing pending, the column, every publication as specified and proc
// with REPLICA IDENTITY FULL.
func (st Report) Ready() bool {
	if !st.CuebotSchema || len(st.Unreadable) > 0 || len(st.Pending) > 0 || !st.SchedulerManagedColumn || st.ProcReplicaIdentity != "full" {
		return false
	}
	for _, p := range st.Publications {
		if !p.OK {
			return false
		}
	}
	return true
}

// SlotWALWarning is the warning about an unlimited max_slot_wal_keep_size
// ("" when it is bounded): the sidecar's permanent slot then keeps every
// WAL segment while no sidecar streams it, until the disk is full.
func (st Report) SlotWALWarning() string {
	if st.MaxSlotWALKeepSize != "-1" {
		return ""
	}
	return "max_slot_wal_keep_size is -1 (unlimited): while every sidecar is down, the permanent replication slot " +
		"keeps all WAL until the Cuebot database's disk is full. Bound it to what the disk can spare above normal use, " +
		"e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '20GB'; SELECT pg_reload_conf(); past it the slot is invalidated " +
		"instead, and a sidecar with --create-slot re-creates it and Redis is re-bootstrapped from Postgres (see the operator guide)"
}

func (st Report) warnings() []string {
	var w []string
	if !st.CuebotSchema {
		w = append(w, fmt.Sprintf("not a Cuebot database: missing tables %s", strings.Join(st.MissingTables, ", ")))
	}
	if len(st.Unreadable) > 0 {
		w = append(w, fmt.Sprintf("role %q may not read %s: applied steps and managed shows are unknown; run migrate as the owner of Cuebot's tables", st.Role, strings.Join(st.Unreadable, ", ")))
	}
	if st.WALLevel != "logical" {
		w = append(w, fmt.Sprintf("wal_level is %q: logical replication needs wal_level = logical (postgresql.conf, then restart PostgreSQL)", st.WALLevel))
	}
	if !st.CanReplicate {
		w = append(w, fmt.Sprintf("role %q cannot replicate: ALTER ROLE %s REPLICATION", st.Role, quoteIdent(st.Role)))
	}
	if m := st.SlotWALWarning(); m != "" {
		w = append(w, m)
	}
	for _, a := range st.Applied {
		if a.Changed {
			w = append(w, fmt.Sprintf("step %04d_%s was applied with different SQL than this binary has", a.Version, a.Name))
		}
		if a.Unknown {
			w = append(w, fmt.Sprintf("step %04d_%s was applied by a newer cuesched than this one", a.Version, a.Name))
		}
	}
	for _, p := range st.Publications {
		if p.Present && !p.OK {
			w = append(w, fmt.Sprintf("publication %s differs from what cuesched expects (tables %s; operations %s): run migrate up", p.Name, strings.Join(p.Tables, ", "), p.Operations))
		}
	}
	if st.ManagedShows > 0 {
		active := false
		for _, s := range st.Slots {
			if s.Active && s.Sidecar {
				active = true
			}
		}
		if !active {
			w = append(w, fmt.Sprintf("%d show(s) are scheduler-managed but no sidecar replication slot (%s*) is active: releases of those shows are not reaching the accounting store", st.ManagedShows, SidecarSlotPrefix))
		}
	}
	for _, s := range st.Slots {
		if !s.Active && s.LagBytes > 1<<30 {
			w = append(w, fmt.Sprintf("inactive slot %s holds back %s of WAL; drop it if it is abandoned (SELECT pg_drop_replication_slot('%s'))", s.Name, humanBytes(s.LagBytes), s.Name))
		}
	}
	return w
}

// Write writes st as a readable multi-line report.
func (st Report) Write(w io.Writer) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	yes := func(v bool) string {
		if v {
			return "yes"
		}
		return "no"
	}
	p("database:            %s (PostgreSQL %s, role %s)", st.Database, st.ServerVersion, st.Role)
	if st.CuebotSchema {
		p("cuebot schema:       yes")
	} else {
		p("cuebot schema:       NO (missing %s)", strings.Join(st.MissingTables, ", "))
	}
	p("rollout steps:       %d applied, %d pending", len(st.Applied), len(st.Pending))
	for _, a := range st.Applied {
		note := ""
		if a.Changed {
			note = "  (SQL changed since)"
		}
		if a.Unknown {
			note = "  (unknown to this binary)"
		}
		p("  applied  %04d_%s  %s by %s%s", a.Version, a.Name, a.AppliedAt.UTC().Format(time.RFC3339), a.AppliedBy, note)
	}
	for _, s := range st.Pending {
		p("  pending  %s", s)
	}
	p("b_scheduler_managed: %s (%d managed show(s))", yes(st.SchedulerManagedColumn), st.ManagedShows)
	p("proc replica identity: %s", orNone(st.ProcReplicaIdentity))
	p("publications:")
	for _, ps := range st.Publications {
		switch {
		case !ps.Present:
			p("  %-20s missing", ps.Name)
		default:
			state := "ok"
			if !ps.OK {
				state = "DIFFERS"
			}
			p("  %-20s %s: %s [%s]", ps.Name, state, strings.Join(ps.Tables, ", "), ps.Operations)
		}
	}
	p("replication readiness:")
	p("  wal_level            %s", st.WALLevel)
	p("  max_slot_wal_keep_size %s", st.MaxSlotWALKeepSize)
	p("  replication slots    %d of %d in use", st.ReplicationSlotsUsed, st.MaxReplicationSlots)
	p("  wal senders          %d of %d in use", st.WALSendersUsed, st.MaxWALSenders)
	p("  role can replicate   %s", yes(st.CanReplicate))
	if len(st.Slots) == 0 {
		p("  cuesched slots       none")
	}
	sort.Slice(st.Slots, func(i, j int) bool { return st.Slots[i].Name < st.Slots[j].Name })
	for _, s := range st.Slots {
		act := "inactive"
		if s.Active {
			act = "active"
		}
		p("  slot %-20s %s, %s, lag %s", s.Name, s.Plugin, act, humanBytes(s.LagBytes))
	}
	if len(st.Warnings) > 0 {
		p("warnings:")
		for _, x := range st.Warnings {
			p("  - %s", x)
		}
	}
	if st.Ready() {
		p("status: ready")
	} else {
		p("status: NOT ready")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orNone(s string) string {
	if s == "" {
		return "(no proc table)"
	}
	return s
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// quoteIdent quotes an identifier for SQL advice only when needed.
func quoteIdent(s string) string {
	if plainIdent.MatchString(s) {
		return s
	}
	return pgx.Identifier{s}.Sanitize()
}
