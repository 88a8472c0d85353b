package migrations_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func exec(t testing.TB, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", firstLine(sql), err)
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i > 0 {
		return s[:i] + " ..."
	}
	return s
}

// baselineDB is an empty database with only the baseline applied.
func baselineDB(t testing.TB) (string, *pgx.Conn) {
	t.Helper()
	url := testenv.NewDatabase(t, testenv.WithTemplate("cuebot-baseline-only", func(ctx context.Context, url string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		return migrations.ApplyBaseline(ctx, conn)
	}))
	return url, connect(t, url)
}

// pgError returns the PostgreSQL error inside err, failing the test when
// there is none.
func pgError(t testing.TB, err error) *pgconn.PgError {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("want a PostgreSQL error, got %v", err)
	}
	return pe
}

// fingerprint describes the schema objects of a database as sorted lines:
// columns (type, nullability, default, position), constraints, indexes,
// triggers, functions (with a hash of their bodies), views, sequences,
// replica identities and publications. Objects for which skip returns true
// (given the object's name) are left out.
func fingerprint(t testing.TB, conn *pgx.Conn, skip func(name string) bool) map[string]string {
	t.Helper()
	const q = `
	SELECT 'col ' || c.relname || '.' || a.attname,
	       (row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum)) || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
	       || ' default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '-')
	  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
	  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
	 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'v', 'p') AND a.attnum > 0 AND NOT a.attisdropped
	UNION ALL
	SELECT 'con ' || conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
	  FROM pg_constraint WHERE connamespace = 'public'::regnamespace
	UNION ALL
	SELECT 'idx ' || indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
	UNION ALL
	SELECT 'trg ' || tgrelid::regclass::text || '.' || tgname, pg_get_triggerdef(oid) || ' enabled=' || tgenabled::text
	  FROM pg_trigger WHERE NOT tgisinternal
	UNION ALL
	SELECT 'fn ' || p.oid::regprocedure::text, md5(p.prosrc) || ' ' || pg_get_function_result(p.oid)
	  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.probin IS NULL
	UNION ALL
	SELECT 'view ' || viewname, md5(definition) FROM pg_views WHERE schemaname = 'public'
	UNION ALL
	SELECT 'seq ' || sequencename, data_type::text FROM pg_sequences WHERE schemaname = 'public'
	UNION ALL
	SELECT 'replident ' || relname, relreplident::text FROM pg_class
	 WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'
	UNION ALL
	SELECT 'pub ' || pubname, pubinsert || ',' || pubupdate || ',' || pubdelete || ',' || pubtruncate FROM pg_publication
	UNION ALL
	SELECT 'pubrel ' || pubname || '.' || tablename, '' FROM pg_publication_tables`
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("fingerprint: %v", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var k, v string
		err := r.Scan(&k, &v)
		return [2]string{k, v}, err
	})
	if err != nil {
		t.Fatalf("fingerprint: %v", err)
	}
	m := map[string]string{}
	for _, kv := range out {
		name := kv[0][strings.IndexByte(kv[0], ' ')+1:]
		if skip != nil && skip(name) {
			continue
		}
		m[kv[0]] = kv[1]
	}
	return m
}

// diffFingerprints lists the keys that differ between a and b.
func diffFingerprints(a, b map[string]string) []string {
	var d []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			d = append(d, "removed "+k)
		} else if w != v {
			d = append(d, "changed "+k+": "+v+" -> "+w)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d = append(d, "added "+k+": "+b[k])
		}
	}
	return d
}

// tableHash hashes a table's full contents (ordered by all columns).
func tableHash(t testing.TB, conn *pgx.Conn, table string) string {
	t.Helper()
	var s string
	err := conn.QueryRow(context.Background(),
		`SELECT coalesce(string_agg(x::text, E'\n' ORDER BY x::text), '') FROM `+pgx.Identifier{table}.Sanitize()+` x`).Scan(&s)
	if err != nil {
		t.Fatalf("hash %s: %v", table, err)
	}
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
