package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

func runLimitT(env map[string]string, args ...string) (int, string, string) {
	c, out, errb := testCLI(env)
	code := limitGroup().Run(context.Background(), c, args)
	return code, out.String(), errb.String()
}

// set-denials writes cuesched's own row for the limit; list shows it; bad
// statuses and unknown limits are refused with what is wrong.
func TestLimitSetDenials(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := cuebotdb.Database(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := (&farmseed.Seeder{DB: pool}).Limit(ctx, "nuke", 6); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": url}
	if code, out, errs := runLimitT(env, "set-denials", "nuke", "43,42,42"); code != 0 || !strings.Contains(out, "denial exit statuses 42,43") {
		t.Fatalf("set-denials: exit %d %q %q", code, out, errs)
	}
	var codes []int32
	if err := pool.QueryRow(ctx, `SELECT cl.int_denial_exit_statuses FROM cuesched_limit cl JOIN limit_record lr
		ON lr.pk_limit_record = cl.pk_limit_record WHERE lr.str_name = 'nuke'`).Scan(&codes); err != nil || len(codes) != 2 {
		t.Fatalf("stored %v, %v", codes, err)
	}
	if code, out, _ := runLimitT(env, "list"); code != 0 || !strings.Contains(out, "nuke") || !strings.Contains(out, "42,43") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	if code, out, _ := runLimitT(env, "set-denials", "nuke", "none"); code != 0 || !strings.Contains(out, "statuses -") {
		t.Fatalf("set-denials none: exit %d %q", code, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"set-denials", "nuke", "x"}, 2, `exit status "x" is not an integer`},
		{[]string{"set-denials", "nuke", "0"}, 2, "exit status 0 is success"},
		{[]string{"set-denials", "nuke"}, 2, "want a limit and its exit statuses"},
		{[]string{"set-denials", "nolimit", "42"}, 1, `no limit named "nolimit"`},
	} {
		if code, _, errs := runLimitT(env, tc.args...); code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("%v: exit %d %q, want %d %q", tc.args, code, errs, tc.code, tc.msg)
		}
	}
}

// set-per-host marks the limit node-locked in cuesched's own row and back;
// list shows what it counts; the denials set before are kept; a wrong
// database gets the Cuebot-database check's line.
func TestLimitSetPerHost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := cuebotdb.Database(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	seed := &farmseed.Seeder{DB: pool}
	lim, err := seed.Limit(ctx, "houdini", 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := seed.LimitDenials(ctx, lim, 42); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": url}
	if code, out, errs := runLimitT(env, "set-per-host", "houdini", "on"); code != 0 || !strings.Contains(out, "node-locked") {
		t.Fatalf("set-per-host on: exit %d %q %q", code, out, errs)
	}
	perHost := func() (on bool, codes []int32) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT b_per_host, int_denial_exit_statuses FROM cuesched_limit WHERE pk_limit_record = $1`, lim).
			Scan(&on, &codes); err != nil {
			t.Fatal(err)
		}
		return on, codes
	}
	if on, codes := perHost(); !on || len(codes) != 1 {
		t.Fatalf("after on: per host %v, denials %v", on, codes)
	}
	if code, out, _ := runLimitT(env, "list"); code != 0 || !strings.Contains(out, "hosts") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	if code, out, errs := runLimitT(env, "set-per-host", lim, "off"); code != 0 || !strings.Contains(out, "per frame") {
		t.Fatalf("set-per-host off by id: exit %d %q %q", code, out, errs)
	}
	if on, _ := perHost(); on {
		t.Fatal("still per host after off")
	}
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"set-per-host", "houdini", "yes"}, 2, `want on or off, got "yes"`},
		{[]string{"set-per-host", "houdini"}, 2, "want a limit and on or off"},
		{[]string{"set-per-host", "nolimit", "on"}, 1, `no limit named "nolimit"`},
	} {
		if code, _, errs := runLimitT(env, tc.args...); code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("%v: exit %d %q, want %d %q", tc.args, code, errs, tc.code, tc.msg)
		}
	}
	// Not a Cuebot database: the shared check's one line, not a SQL error.
	if _, err := pool.Exec(ctx, `CREATE DATABASE notcuebot_limit`); err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(url, "/"+pool.Config().ConnConfig.Database, "/notcuebot_limit", 1)
	if code, _, errs := runLimitT(map[string]string{"CUESCHED_DATABASE_URL": other}, "set-per-host", "houdini", "on"); code != 1 ||
		!strings.Contains(errs, "is not a Cuebot database") {
		t.Fatalf("wrong database: exit %d %q", code, errs)
	}
}

// set-per-host on a database built by Cuebot's own migrations (skipped
// unless CUESCHED_CUEBOT_MIGRATIONS_DIR names an OpenCue checkout's
// ddl/postgres directory): rollout 0010 applies there and the setting
// sticks.
func TestLimitSetPerHostOnRealCuebot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := cuebotdb.RealDatabase(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := (&farmseed.Seeder{DB: pool}).Limit(ctx, "houdini", 4); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": url}
	if code, out, errs := runLimitT(env, "set-per-host", "houdini", "on"); code != 0 || !strings.Contains(out, "node-locked") {
		t.Fatalf("set-per-host on: exit %d %q %q", code, out, errs)
	}
	if code, out, errs := runLimitT(env, "list"); code != 0 || !strings.Contains(out, "hosts") || strings.Contains(out, "not applied") {
		t.Fatalf("list: exit %d %q %q", code, out, errs)
	}
	var on bool
	if err := pool.QueryRow(ctx, `SELECT cl.b_per_host FROM cuesched_limit cl JOIN limit_record lr
		ON lr.pk_limit_record = cl.pk_limit_record WHERE lr.str_name = 'houdini'`).Scan(&on); err != nil || !on {
		t.Fatalf("stored %v, %v", on, err)
	}
}
