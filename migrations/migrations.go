// Package migrations holds cuesched's SQL and applies it.
//
// Two sets of SQL live here, embedded in the binary:
//
//   - baseline/*.sql: a Cuebot-compatible schema (tables, keys, indexes,
//     triggers, views and the seed rows of a stock Cuebot) for tests and
//     demos. It behaves like a real Cuebot database after Cuebot's V47
//     migration for everything the scheduler, the sidecar and a Cuebot
//     emulator touch. It is written from the facts of Cuebot's schema,
//     never copied from OpenCue. A
//     production Cuebot database already has this schema (Cuebot's Flyway
//     creates it); ApplyBaseline refuses to run anywhere but in an empty
//     database.
//
//   - rollout/NNNN_name.sql: what cuesched adds to a live Cuebot database:
//     show.b_scheduler_managed (if Cuebot's V45 is not there yet), our
//     version table, the logical-replication publications, REPLICA IDENTITY
//     FULL on proc, the indexes the scheduler's queries need, and the folder
//     and job caps on the host cache's publication. Every step
//     is idempotent (IF NOT EXISTS / catalog checks in DO blocks), so it is
//     safe on a database that already has some or all of it, and it never
//     touches Cuebot's own objects beyond what it says (in particular never
//     flyway_schema_history).
//
// Design decisions:
//
//   - Each rollout step runs in its own transaction together with the
//     insert of its row in cuesched_schema_migrations, so a step is either
//     applied and recorded or neither. A step whose first line is
//     "-- cuesched:no-transaction" (CREATE INDEX CONCURRENTLY) runs statement
//     by statement instead and is recorded afterwards; being idempotent, a
//     crash between the two only means it runs again.
//   - Up holds a session-level advisory lock for its whole run, so two
//     concurrent "cuesched migrate up" serialize: the second waits, then
//     finds nothing pending.
//   - Steps that need a strong lock on a hot Cuebot table set a lock_timeout
//     so they fail with a clear error instead of queueing behind a long
//     transaction and stalling Cuebot.
//   - The SQL is plain files so an operator can read "cuesched migrate plan"
//     output or run it with psql; the Go code only sequences and records.
//   - Preflight and Status only read. Preflight collects every problem
//     (not a Cuebot database, standby, wal_level, slots, senders, role)
//     into one *PreflightError whose text says what to change.
//
// API: Plan, Up, Status (returns a Report), Preflight / PreflightWith,
// ApplyBaseline; Steps, Baseline and Publications expose the embedded SQL
// and its intent. Tests use cuebotdb.Database.
package migrations

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

//go:embed baseline/*.sql rollout/*.sql
var sqlFiles embed.FS

// VersionTable is the table recording applied rollout steps.
const VersionTable = "cuesched_schema_migrations"

// Publication names created by the rollout.
const (
	// PublicationHostCache feeds the scheduler's host cache and, through
	// it, the cluster feed.
	PublicationHostCache = "cuesched_hostcache"
	// PublicationAccounting feeds the sidecar with cap and ownership changes.
	PublicationAccounting = "cuesched_accounting"
	// PublicationProc feeds the sidecar with proc inserts and deletes
	// (bookings and releases), never proc updates.
	PublicationProc = "cuesched_proc"
)

// Replication slot naming. Every slot cuesched creates by default starts
// with SlotPrefix; the sidecar's start with SidecarSlotPrefix. A sidecar
// slot may be named anything (sidecar.slot_name), so a slot is also the
// sidecar's while a walsender whose application_name starts with
// appname.Sidecar streams it (Status warns when managed shows exist but no
// sidecar slot is active).
const (
	SlotPrefix        = "cuesched"
	SidecarSlotPrefix = "cuesched_sidecar"
)

// PublicationSpec describes one publication the rollout maintains.
type PublicationSpec struct {
	Name   string
	Tables []string // sorted
	// Operations published: any of insert, update, delete, truncate.
	Insert, Update, Delete, Truncate bool
}

// Publications returns the publications the rollout creates, as Status
// checks them.
func Publications() []PublicationSpec {
	return []PublicationSpec{
		{Name: PublicationAccounting, Tables: sorted("show", "job", "host", "subscription", "folder_resource", "job_resource", "point"), Insert: true, Update: true, Delete: true, Truncate: true},
		// 0003 creates it with the host cache's seven tables; 0006 adds the
		// folder and job caps the cluster feed follows.
		{Name: PublicationHostCache, Tables: sorted("host", "host_stat", "host_tag", "alloc", "subscription", "show", "facility", "folder_resource", "job_resource"), Insert: true, Update: true, Delete: true, Truncate: true},
		{Name: PublicationProc, Tables: []string{"proc"}, Insert: true, Delete: true, Truncate: true},
	}
}

func sorted(s ...string) []string { sort.Strings(s); return s }

// CuebotTables returns the tables whose presence identifies a Cuebot
// database (Preflight refuses a target missing any of them).
func CuebotTables() []string {
	return []string{
		"alloc", "facility", "dept", "folder", "folder_resource", "frame", "host", "host_stat", "host_tag",
		"job", "job_resource", "job_stat", "layer", "layer_resource", "layer_stat", "point", "proc",
		"show", "subscription",
	}
}

// Step is one rollout migration.
type Step struct {
	Version int    // NNNN from the file name
	Name    string // the file name's name part
	File    string // e.g. rollout/0003_publications.sql
	SQL     string
	// Checksum is the hex sha256 of SQL, recorded when applied.
	Checksum string
	// NoTransaction steps run statement by statement outside a
	// transaction (for CREATE INDEX CONCURRENTLY).
	NoTransaction bool
}

// String is "0003_publications".
func (s Step) String() string { return fmt.Sprintf("%04d_%s", s.Version, s.Name) }

const noTxDirective = "-- cuesched:no-transaction"

// Steps returns every rollout step in version order.
func Steps() ([]Step, error) {
	names, err := fs.Glob(sqlFiles, "rollout/*.sql")
	if err != nil {
		return nil, err
	}
	var steps []Step
	seen := map[int]string{}
	for _, file := range names {
		base := strings.TrimSuffix(path.Base(file), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || len(num) != 4 || name == "" {
			return nil, fmt.Errorf("migrations: %s: rollout files must be named NNNN_name.sql", file)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations: %s and %s share version %d", prev, file, v)
		}
		seen[v] = file
		b, err := sqlFiles.ReadFile(file)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		steps = append(steps, Step{
			Version:       v,
			Name:          name,
			File:          file,
			SQL:           string(b),
			Checksum:      hex.EncodeToString(sum[:]),
			NoTransaction: strings.HasPrefix(string(b), noTxDirective),
		})
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].Version < steps[j].Version })
	return steps, nil
}

// BaselineFile is one file of the baseline schema.
type BaselineFile struct {
	Name string // e.g. baseline/0002_tables.sql
	SQL  string
}

// Baseline returns the baseline schema files in the order they run.
func Baseline() ([]BaselineFile, error) {
	names, err := fs.Glob(sqlFiles, "baseline/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]BaselineFile, 0, len(names))
	for _, n := range names {
		b, err := sqlFiles.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, BaselineFile{Name: n, SQL: string(b)})
	}
	return out, nil
}
