package migrations_test

// Optional comparison with the real Cuebot schema. OpenCue's SQL is not in
// this repository; point CUESCHED_CUEBOT_MIGRATIONS_DIR at a checkout's
// cuebot/src/main/resources/conf/ddl/postgres directory (the one holding
// migrations/ and seed_data.sql) to:
//
//   - run TestBaselineMatchesCuebotMigrations, which builds a database from
//     Cuebot's own V*.sql files and compares its catalog with the baseline;
//   - run every booking/release test in this package against that real
//     schema (plus our rollout) instead of the baseline (see schemaDB).
//
// Without the variable these tests use the baseline / are skipped.

import (
	"context"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
	"github.com/jackc/pgx/v5"
)

const cuebotDirEnv = cuebotdb.RealCuebotDirEnv

// schemaDB returns a migrated database: the baseline normally, Cuebot's
// real schema when CUESCHED_CUEBOT_MIGRATIONS_DIR is set. Rollout applied
// in both cases.
func schemaDB(t testing.TB) string {
	t.Helper()
	if os.Getenv(cuebotDirEnv) == "" {
		return cuebotdb.Database(t)
	}
	return cuebotdb.RealDatabase(t)
}

// applyRealCuebot is cuebotdb.ApplyRealCuebot.
func applyRealCuebot(ctx context.Context, conn *pgx.Conn, dir string) error {
	return cuebotdb.ApplyRealCuebot(ctx, conn, dir)
}

func TestBaselineMatchesCuebotMigrations(t *testing.T) {
	dir := os.Getenv(cuebotDirEnv)
	if dir == "" {
		t.Skipf("set %s to an OpenCue cuebot/src/main/resources/conf/ddl/postgres directory to compare with the real schema", cuebotDirEnv)
	}
	t.Parallel()
	ctx := context.Background()
	real := connect(t, testenv.NewDatabase(t))
	if err := applyRealCuebot(ctx, real, dir); err != nil {
		t.Fatal(err)
	}
	_, ours := baselineDB(t)

	// Only objects on tables the baseline has; functions by name only
	// (their bodies are ours), and our own helpers left out.
	tables := map[string]bool{}
	rows, err := ours.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'v')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		tables[n] = true
	}
	rows.Close()
	norm := func(fp map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range fp {
			kind, name, _ := strings.Cut(k, " ")
			switch kind {
			case "col", "con", "trg":
				if !tables[strings.SplitN(name, ".", 2)[0]] {
					continue
				}
			case "idx":
				m := regexp.MustCompile(` ON public\.(\w+) `).FindStringSubmatch(v)
				if m == nil || !tables[m[1]] {
					continue
				}
			case "view":
				if !tables[name] {
					continue
				}
				v = "" // definitions are written differently; columns are compared
			case "fn":
				if strings.HasPrefix(name, "cuesched_") {
					continue
				}
				v = ""
			case "replident":
				if !tables[name] {
					continue
				}
			}
			out[k] = v
		}
		return out
	}
	diff := diffFingerprints(norm(fingerprint(t, real, nil)), norm(fingerprint(t, ours, nil)))
	// Known, intended differences:
	//   - Cuebot functions the baseline does not provide (Oracle leftovers,
	//     one-off repair helpers, reporting): nothing we or Cuebot's dispatch
	//     path calls;
	//   - verify_host_local's WHEN clause prints with different (equivalent)
	//     parentheses.
	var unexpected []string
	for _, d := range diff {
		switch {
		case strings.HasPrefix(d, "removed fn "):
		case strings.Contains(d, "verify_host_local"):
		default:
			unexpected = append(unexpected, d)
		}
	}
	sort.Strings(unexpected)
	if len(unexpected) > 0 {
		t.Fatalf("baseline differs from Cuebot's schema (%d differences; '-' Cuebot, '+' baseline):\n%s",
			len(unexpected), strings.Join(unexpected, "\n"))
	}
	t.Logf("baseline matches Cuebot's schema on %d tables/views (%d catalog entries compared)", len(tables), len(norm(fingerprint(t, ours, nil))))
}
