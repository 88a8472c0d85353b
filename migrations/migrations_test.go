package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
	"github.com/jackc/pgx/v5"
)

func TestStepsAreWellFormed(t *testing.T) {
	steps, err := migrations.Steps()
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) < 5 {
		t.Fatalf("only %d rollout steps", len(steps))
	}
	for i, s := range steps {
		if s.Version != i+1 {
			t.Errorf("step %s: versions must be 1..n without gaps", s)
		}
		if len(s.Checksum) != 64 || s.SQL == "" {
			t.Errorf("step %s: empty SQL or bad checksum", s)
		}
		if strings.Contains(strings.ToLower(s.SQL), "flyway_schema_history") && !strings.Contains(s.SQL, "never") {
			t.Errorf("step %s touches flyway_schema_history", s)
		}
	}
	for _, s := range steps {
		if s.NoTransaction != (s.Name == "scheduler_indexes") {
			t.Errorf("step %s: NoTransaction = %v; only the index step runs outside a transaction (CREATE INDEX CONCURRENTLY)", s, s.NoTransaction)
		}
	}
	if steps[0].NoTransaction {
		t.Error("the version-table step must be transactional")
	}
	files, err := migrations.Baseline()
	if err != nil || len(files) == 0 {
		t.Fatalf("baseline files: %v %v", files, err)
	}
}

func TestSplitStatements(t *testing.T) {
	sql := `-- header; with a semicolon
CREATE INDEX a ON t (x); -- trailing; comment
DO $$ BEGIN PERFORM 1; PERFORM 2; END $$;
SELECT 'it''s; fine', "we;ird";
/* block; comment */ SELECT $tag$ a;b $tag$;
-- only a comment;
`
	got := migrations.SplitStatements(sql)
	want := []string{
		"-- header; with a semicolon\nCREATE INDEX a ON t (x)",
		"-- trailing; comment\nDO $$ BEGIN PERFORM 1; PERFORM 2; END $$",
		`SELECT 'it''s; fine', "we;ird"`,
		"/* block; comment */ SELECT $tag$ a;b $tag$",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("SplitStatements:\n got %q\nwant %q", got, want)
	}
}

// Baseline + rollout applied, then everything applied again: Up finds
// nothing to do, re-running every rollout file by hand (as if the ledger
// were lost) succeeds and changes nothing, and a second baseline is refused.
func TestBaselineAndRolloutAreIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, testenv.NewDatabase(t))

	if err := migrations.ApplyBaseline(ctx, conn); err != nil {
		t.Fatalf("ApplyBaseline: %v", err)
	}
	steps, _ := migrations.Steps()
	pending, err := migrations.Plan(ctx, conn)
	if err != nil || len(pending) != len(steps) {
		t.Fatalf("Plan on a fresh baseline: %d of %d steps pending, err %v", len(pending), len(steps), err)
	}
	applied, err := migrations.Up(ctx, conn)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	if len(applied) != len(steps) {
		t.Fatalf("Up applied %d of %d steps", len(applied), len(steps))
	}
	before := fingerprint(t, conn, nil)

	again, err := migrations.Up(ctx, conn)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Up: applied %v, err %v", again, err)
	}
	for _, s := range steps {
		if s.NoTransaction {
			for _, stmt := range migrations.SplitStatements(s.SQL) {
				exec(t, conn, stmt)
			}
			continue
		}
		if _, err := conn.Exec(ctx, s.SQL, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("re-running %s: %v", s, err)
		}
	}
	if d := diffFingerprints(before, fingerprint(t, conn, nil)); len(d) > 0 {
		t.Fatalf("re-running the rollout changed the schema:\n%s", strings.Join(d, "\n"))
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM cuesched_schema_migrations`).Scan(&n); err != nil || n != len(steps) {
		t.Fatalf("version table has %d rows, want %d (err %v)", n, len(steps), err)
	}

	err = migrations.ApplyBaseline(ctx, conn)
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("second ApplyBaseline: %v, want a refusal naming a non-empty database", err)
	}
	if d := diffFingerprints(before, fingerprint(t, conn, nil)); len(d) > 0 {
		t.Fatalf("refused baseline changed the schema: %v", d)
	}
}

// The rollout objects exist exactly as specified.
func TestRolloutObjects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, cuebotdb.Database(t))

	var typ string
	var notNull bool
	var def string
	err := conn.QueryRow(ctx, `
		SELECT format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
		  FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		 WHERE a.attrelid = 'show'::regclass AND a.attname = 'b_scheduler_managed'`).Scan(&typ, &notNull, &def)
	if err != nil || typ != "boolean" || !notNull || def != "false" {
		t.Fatalf("show.b_scheduler_managed: %s not null=%v default %s (%v)", typ, notNull, def, err)
	}

	var ident string
	if err := conn.QueryRow(ctx, `SELECT relreplident::text FROM pg_class WHERE oid = 'proc'::regclass`).Scan(&ident); err != nil || ident != "f" {
		t.Fatalf("proc replica identity %q, want f (full); %v", ident, err)
	}

	want := map[string]string{
		"cuesched_hostcache":  "alloc,facility,folder_resource,host,host_stat,host_tag,job_resource,show,subscription|true,true,true,true",
		"cuesched_accounting": "folder_resource,host,job,job_resource,point,show,subscription|true,true,true,true",
		"cuesched_proc":       "proc|true,false,true,true",
	}
	for name, w := range want {
		var got string
		err := conn.QueryRow(ctx, `
			SELECT (SELECT string_agg(tablename::text, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = p.pubname)
			       || '|' || pubinsert || ',' || pubupdate || ',' || pubdelete || ',' || pubtruncate
			  FROM pg_publication p WHERE pubname = $1`, name).Scan(&got)
		if err != nil || got != w {
			t.Errorf("publication %s = %q, want %q (%v)", name, got, w, err)
		}
	}

	for _, idx := range []string{"idx_job_pending_lookup", "idx_layer_tags_array", "idx_layer_stat_waiting",
		"cuesched_i_host_tag_str_tag", "cuesched_i_frame_waiting"} {
		var valid bool
		if err := conn.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)`, idx).Scan(&valid); err != nil || !valid {
			t.Errorf("index %s missing or invalid (%v)", idx, err)
		}
	}

	st, err := migrations.Status(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Ready() || len(st.Pending) != 0 || st.ProcReplicaIdentity != "full" || !st.SchedulerManagedColumn || !st.CuebotSchema {
		t.Fatalf("status not ready: %+v", st)
	}
	if err := migrations.Preflight(ctx, conn); err != nil {
		t.Fatalf("preflight on the test cluster: %v", err)
	}
}

// A Cuebot database that already has V45 (and V44): migrate up succeeds
// and leaves every Cuebot object as it was, except proc's replica
// identity, which is the point of step 0004. Flyway's history is not
// touched and neither is any data.
func TestUpOnCuebotWithV45LeavesCuebotObjectsUntouched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, conn := baselineDB(t)
	// A stand-in for Flyway's ledger, with content.
	exec(t, conn, `CREATE TABLE flyway_schema_history (installed_rank int PRIMARY KEY, version varchar(50), description varchar(200), checksum int, success boolean)`)
	exec(t, conn, `INSERT INTO flyway_schema_history VALUES (45, '45', 'show scheduler managed', 12345, true), (47, '47', 'Add layer start after', -1, true)`)
	exec(t, conn, `UPDATE show SET b_scheduler_managed = true`)

	notOurs := func(name string) bool { return strings.Contains(name, "cuesched") }
	before := fingerprint(t, conn, notOurs)
	data := map[string]string{}
	for _, tbl := range []string{"flyway_schema_history", "show", "subscription", "alloc", "folder_resource", "task_lock", "config"} {
		data[tbl] = tableHash(t, conn, tbl)
	}

	if err := migrations.Preflight(ctx, conn); err != nil {
		t.Fatalf("preflight: %v", err)
	}
	if _, err := migrations.Up(ctx, conn); err != nil {
		t.Fatalf("Up: %v", err)
	}

	after := fingerprint(t, conn, notOurs)
	diff := diffFingerprints(before, after)
	wantDiff := []string{"changed replident proc: d -> f"}
	if !reflect.DeepEqual(diff, wantDiff) {
		t.Fatalf("migrate up changed Cuebot objects:\n got %q\nwant %q", diff, wantDiff)
	}
	for tbl, h := range data {
		if got := tableHash(t, conn, tbl); got != h {
			t.Errorf("migrate up changed the rows of %s", tbl)
		}
	}
	// Our own objects did appear.
	ours := fingerprint(t, conn, func(n string) bool { return !notOurs(n) })
	for _, k := range []string{"pub cuesched_proc", "idx cuesched_i_frame_waiting", "col cuesched_schema_migrations.version"} {
		if _, ok := ours[k]; !ok {
			t.Errorf("missing %s after up", k)
		}
	}
}

// A Cuebot database from before V44/V45: up adds the column (existing
// shows become Cuebot-managed) and Cuebot's V44 indexes under Cuebot's
// names, so a later V44 finds them.
func TestUpOnPreV44Cuebot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, conn := baselineDB(t)
	exec(t, conn, `ALTER TABLE show DROP COLUMN b_scheduler_managed`)
	exec(t, conn, `DROP INDEX idx_job_pending_lookup, idx_layer_tags_array, idx_layer_stat_waiting`)
	exec(t, conn, `INSERT INTO show (pk_show, str_name) VALUES ('s2', 'second')`)

	st, err := migrations.Status(ctx, conn)
	if err != nil || st.SchedulerManagedColumn || st.ManagedShows != 0 {
		t.Fatalf("status before: column=%v managed=%d err=%v", st.SchedulerManagedColumn, st.ManagedShows, err)
	}
	if _, err := migrations.Up(ctx, conn); err != nil {
		t.Fatalf("Up: %v", err)
	}
	var n, managed int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE b_scheduler_managed) FROM show`).Scan(&n, &managed); err != nil || n != 2 || managed != 0 {
		t.Fatalf("after up: %d shows, %d managed, err %v", n, managed, err)
	}
	var def string
	if err := conn.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_job_pending_lookup'`).Scan(&def); err != nil ||
		!strings.Contains(def, "WHERE (((str_state)::text = 'PENDING'::text) AND (b_paused = false))") {
		t.Fatalf("idx_job_pending_lookup: %q %v", def, err)
	}
}

// A publication whose table list or operations drifted is put back by
// re-running its step; one created FOR ALL TABLES is refused by name.
func TestUpRepairsPublications(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, cuebotdb.Database(t))
	want := fingerprint(t, conn, nil)
	exec(t, conn, `ALTER PUBLICATION cuesched_accounting DROP TABLE point`)
	exec(t, conn, `ALTER PUBLICATION cuesched_accounting ADD TABLE frame`)
	exec(t, conn, `ALTER PUBLICATION cuesched_proc SET (publish = 'insert, update, delete')`)
	exec(t, conn, `DROP PUBLICATION cuesched_hostcache`)
	st, err := migrations.Status(ctx, conn)
	if err != nil || st.Ready() || !hasWarning(st, "publication cuesched_accounting differs") || !hasWarning(st, "publication cuesched_proc differs") {
		t.Fatalf("status did not notice the drift: ready=%v warnings=%q (%v)", st.Ready(), st.Warnings, err)
	}
	// 0003 re-creates cuesched_hostcache with its seven tables, 0006 adds
	// the caps again.
	exec(t, conn, `DELETE FROM cuesched_schema_migrations WHERE version IN (3, 6)`)
	if _, err := migrations.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if d := diffFingerprints(want, fingerprint(t, conn, nil)); len(d) > 0 {
		t.Fatalf("publications not restored: %v", d)
	}

	exec(t, conn, `DROP PUBLICATION cuesched_proc`)
	exec(t, conn, `CREATE PUBLICATION cuesched_proc FOR ALL TABLES`)
	exec(t, conn, `DELETE FROM cuesched_schema_migrations WHERE version = 3`)
	_, err = migrations.Up(ctx, conn)
	if err == nil || !strings.Contains(err.Error(), "cuesched_proc exists as FOR ALL TABLES") || !strings.Contains(err.Error(), "0003_publications") {
		t.Fatalf("Up with a FOR ALL TABLES publication: %v", err)
	}
}

// An index left INVALID by an interrupted concurrent build is rebuilt.
func TestUpRebuildsInvalidIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, cuebotdb.Database(t))
	exec(t, conn, `DELETE FROM cuesched_schema_migrations WHERE version = 5`)
	exec(t, conn, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'cuesched_i_frame_waiting'::regclass`)
	applied, err := migrations.Up(ctx, conn)
	if err != nil || len(applied) != 1 || applied[0].Version != 5 {
		t.Fatalf("Up: %v %v", applied, err)
	}
	var valid bool
	if err := conn.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'cuesched_i_frame_waiting'::regclass`).Scan(&valid); err != nil || !valid {
		t.Fatalf("index still invalid (%v)", err)
	}
}

// Two concurrent Up calls serialize on the advisory lock: every step is
// applied exactly once and neither fails.
func TestConcurrentUpSerializes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := baselineDB(t)
	a, b := connect(t, url), connect(t, url)
	steps, _ := migrations.Steps()

	var wg sync.WaitGroup
	results := make([][]migrations.Step, 2)
	errs := make([]error, 2)
	for i, c := range []*pgx.Conn{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = migrations.Up(ctx, c)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Up: %v", err)
		}
	}
	if got := len(results[0]) + len(results[1]); got != len(steps) {
		t.Fatalf("the two Ups applied %d + %d steps, want %d in total", len(results[0]), len(results[1]), len(steps))
	}
}

// Against a cluster with wal_level=replica (and too few slots and
// senders) preflight fails and names every setting to change.
func TestPreflightRefusesReplicaWALLevel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{
		WALLevel:      "replica",
		ExtraSettings: map[string]string{"max_replication_slots": "1", "max_wal_senders": "1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	if err := pg.CreateDatabase(ctx, "cuebot", ""); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, pg.URL("cuebot"))
	if err := migrations.ApplyBaseline(ctx, conn); err != nil {
		t.Fatal(err)
	}
	err = migrations.Preflight(ctx, conn)
	var pf *migrations.PreflightError
	if !errors.As(err, &pf) {
		t.Fatalf("Preflight = %v, want a *PreflightError", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`wal_level is "replica"`, "wal_level = logical", "postgresql.conf", "restart",
		"max_replication_slots = 1", "max_wal_senders = 1",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("preflight message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "not a Cuebot database") || strings.Contains(msg, "cannot replicate") {
		t.Errorf("preflight reports problems that are not there:\n%s", msg)
	}
}

// A database without Cuebot's tables is refused, naming what is missing.
func TestPreflightRefusesNonCuebotDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, testenv.NewDatabase(t))
	exec(t, conn, `CREATE TABLE show (pk_show text PRIMARY KEY)`) // one look-alike table is not enough
	err := migrations.Preflight(ctx, conn)
	if err == nil {
		t.Fatal("preflight accepted a non-Cuebot database")
	}
	for _, want := range []string{"not a Cuebot database", "proc", "frame", "host"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "show,") {
		t.Errorf("show exists and must not be reported missing: %v", err)
	}
}

// A role without REPLICATION is told how to fix it.
func TestPreflightRoleCannotReplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := cuebotdb.Database(t)
	admin := connect(t, dbURL)
	role := fmt.Sprintf("cuesched_norepl_%d", os.Getpid())
	exec(t, admin, `DROP ROLE IF EXISTS `+role)
	exec(t, admin, `CREATE ROLE `+role+` LOGIN NOREPLICATION`)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+role)
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	conn := connect(t, u.String())
	err = migrations.Preflight(ctx, conn)
	if err == nil || !strings.Contains(err.Error(), "ALTER ROLE "+role+" REPLICATION") {
		t.Fatalf("Preflight = %v, want advice to grant REPLICATION", err)
	}
}

// The guardrail: managed shows without an active sidecar slot warn; with
// a streaming sidecar slot the warning goes away and the slot is listed.
func TestStatusGuardrailManagedShowsNeedSidecarSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := cuebotdb.Database(t)
	conn := connect(t, dbURL)
	exec(t, conn, `UPDATE show SET b_scheduler_managed = true`)

	st, err := migrations.Status(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if st.ManagedShows != 1 || !hasWarning(st, "no sidecar replication slot") {
		t.Fatalf("want the guardrail warning, got managed=%d warnings=%q", st.ManagedShows, st.Warnings)
	}

	slot := fmt.Sprintf("%s_test_%s", migrations.SidecarSlotPrefix, strings.ToLower(strings.ReplaceAll(dbURL[strings.LastIndexByte(dbURL, '/')+1:], "?", "_")))
	if len(slot) > 63 {
		slot = slot[:63]
	}
	stop := streamSlot(t, dbURL, slot)
	st, err = migrations.Status(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if hasWarning(st, "no sidecar replication slot") {
		t.Fatalf("warning with an active sidecar slot: %q", st.Warnings)
	}
	var found bool
	for _, s := range st.Slots {
		if s.Name == slot {
			found = s.Active && s.Plugin == "pgoutput" && s.LagBytes >= 0
		}
	}
	if !found {
		t.Fatalf("slot %s not reported active: %+v", slot, st.Slots)
	}
	stop()
}

func hasWarning(st migrations.Report, sub string) bool {
	for _, w := range st.Warnings {
		if strings.Contains(w, sub) {
			return true
		}
	}
	return false
}

// An unlimited max_slot_wal_keep_size is a warning that gives a value; a
// bounded one is not.
func TestSlotWALWarning(t *testing.T) {
	t.Parallel()
	if w := (migrations.Report{MaxSlotWALKeepSize: "-1"}).SlotWALWarning(); !strings.Contains(w, "unlimited") || !strings.Contains(w, "max_slot_wal_keep_size = '20GB'") {
		t.Errorf("-1: %q", w)
	}
	if w := (migrations.Report{MaxSlotWALKeepSize: "20GB"}).SlotWALWarning(); w != "" {
		t.Errorf("20GB: %q", w)
	}
}
