package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/cli"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// Pointed at a database that is not the Cuebot database, every read-only
// tool says so in one line, naming the database, the server and what is
// missing, and exits 1: no raw SQL error (issue #23: `explain` against the
// default database answered `relation "layer" does not exist`).
func TestToolsOnANonCuebotDatabase(t *testing.T) {
	t.Parallel()
	empty := testenv.NewDatabase(t)
	// A Cuebot database from before V44 that never had the rollout: no
	// show.b_scheduler_managed (migration 0002 adds it).
	baseline := baselineOnly(t)
	pool, err := pgxpool.New(context.Background(), baseline)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(context.Background(), `ALTER TABLE show DROP COLUMN b_scheduler_managed`)
	pool.Close()
	if err != nil {
		t.Fatal(err)
	}
	redisURL := testenv.NewRedisDB(t)
	tools := []struct {
		name string
		run  func(context.Context, *cli.Env, []string) int
		args []string
		// rollout: the tool needs the rollout too (status reports an
		// incomplete rollout itself, set-managed refuses it in its preflight).
		rollout bool
	}{
		{"cuesched explain", runExplain, nil, true},
		{"cuesched explain", runExplain, []string{"some_job"}, true},
		{"cuesched status", runStatus, []string{"--no-audit"}, false},
		{"cuesched show list", runShowList, nil, true},
		{"cuesched accounting audit", runAccountingAudit, nil, true},
	}
	for _, tc := range tools {
		for _, db := range []struct {
			url, want string
			held      bool
		}{
			{empty, `is not a Cuebot database (no table "layer" and 18 other Cuebot tables); point --database-url or CUESCHED_DATABASE_URL at the Cuebot database`, true},
			{baseline, `is a Cuebot database without the cuesched rollout (no column show.b_scheduler_managed); run ` + "`cuesched migrate status`", tc.rollout},
		} {
			c, out, errb := testCLI(map[string]string{"CUESCHED_DATABASE_URL": db.url, "CUESCHED_ACCOUNTING_REDIS_URL": redisURL})
			code := tc.run(context.Background(), c, tc.args)
			if !db.held {
				if strings.Contains(errb.String(), "Cuebot database") {
					t.Errorf("%s on %s: refused a Cuebot database: %s", tc.name, db.url, errb.String())
				}
				continue
			}
			dbName := db.url[strings.LastIndex(db.url, "/")+1:]
			dbName, _, _ = strings.Cut(dbName, "?")
			want := tc.name + `: database "` + dbName + `" on 127.0.0.1:`
			lines := strings.Split(strings.TrimSpace(errb.String()), "\n")
			if code != 1 || len(lines) != 1 || !strings.HasPrefix(lines[0], want) || !strings.Contains(lines[0], db.want) {
				t.Errorf("%s %v on %s: exit %d, stderr %q; want exit 1 and one line %q…%q", tc.name, tc.args, dbName, code, errb.String(), want, db.want)
			}
			if strings.Contains(errb.String(), "SQLSTATE") || out.Len() != 0 {
				t.Errorf("%s: raw SQL error or output: stdout %q stderr %q", tc.name, out.String(), errb.String())
			}
		}
	}
	// The Cuebot database itself passes the check.
	c, _, errb := testCLI(map[string]string{"CUESCHED_DATABASE_URL": cuebotdb.Database(t)})
	if code := runExplain(context.Background(), c, nil); code != 0 {
		t.Errorf("explain on a Cuebot database: exit %d: %s", code, errb.String())
	}
}
