package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/accounting"
	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func runAccountingT(env map[string]string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	c := &cli.Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }, Logger: hclog.NewNullLogger()}
	code := runAccounting(context.Background(), c, args)
	return code, out.String(), errb.String()
}

func TestAccountingAuditCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, redisURL := cuebotdb.Database(t), testenv.NewRedisDB(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// The seed show "testing" becomes managed, with one Cuebot proc.
	for _, q := range []string{
		`UPDATE show SET b_scheduler_managed = true WHERE pk_show = '` + cuebot.SeedShowTesting + `'`,
		`INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state) VALUES ('h1', '` + cuebot.SeedAllocLocalGeneral + `', 'h1', 'OPEN')`,
		`INSERT INTO job (pk_job, pk_folder, pk_show, str_name, str_shot, str_user, str_state, pk_facility, pk_dept)
		 VALUES ('j1', '` + cuebot.SeedFolderTesting + `', '` + cuebot.SeedShowTesting + `', 'j1', 's', 'u', 'PENDING', '` +
			cuebot.SeedFacilityLocal + `', '` + cuebot.SeedDeptPipeline + `')`,
		`INSERT INTO layer (pk_layer, pk_job, str_name, str_cmd, str_range, str_type) VALUES ('l1', 'j1', 'l', 'true', '1', 'RENDER')`,
		`INSERT INTO proc (pk_proc, pk_host, pk_job, pk_show, pk_layer, int_cores_reserved, int_mem_reserved)
		 VALUES ('p1', 'h1', 'j1', '` + cuebot.SeedShowTesting + `', 'l1', 250, 1024)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": dbURL, "CUESCHED_ACCOUNTING_REDIS_URL": redisURL}

	// Empty Redis: drift (no bootstrap, no counters).
	code, out, _ := runAccountingT(env, "audit")
	if code != 1 || !strings.Contains(out, "acct:epoch") || !strings.Contains(out, "KIND") {
		t.Fatalf("audit of an empty Redis: code %d\n%s", code, out)
	}

	// The same settings from --config FILE (the daemons' file); the
	// environment wins over the file and a flag over the environment.
	dir := t.TempDir()
	writeConfig := func(name, db, redis string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, fmt.Appendf(nil, "database:\n  url: %q\naccounting:\n  redis_url: %q\n", db, redis), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const nowhere = "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"
	good, stale := writeConfig("good.yaml", dbURL, redisURL), writeConfig("stale.yaml", nowhere, "redis://127.0.0.1:1/0")
	for _, tc := range []struct {
		env  map[string]string
		args []string
	}{
		{nil, []string{"audit", "--config", good}},
		{env, []string{"audit", "--config", stale}},
		{map[string]string{"CUESCHED_DATABASE_URL": nowhere, "CUESCHED_ACCOUNTING_REDIS_URL": redisURL}, []string{"audit", "--database-url", dbURL}},
	} {
		code, out, errOut := runAccountingT(tc.env, tc.args...)
		if code != 1 || !strings.Contains(out, "acct:epoch") {
			t.Errorf("%v (env %v): code %d, stderr %q\n%s", tc.args, tc.env, code, errOut, out)
		}
	}
	// An unreachable database is named by where its URL came from.
	code, _, errOut := runAccountingT(nil, "audit", "--config", stale)
	if code != 1 || !strings.Contains(errOut, "database.url in "+stale) {
		t.Errorf("unreachable database from the file: code %d, stderr %q", code, errOut)
	}

	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: redisURL})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	pub, err := publisher.New(rdb, publisher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := accounting.New(pool, pub, accounting.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	// Flags win over the environment.
	code, out, errOut = runAccountingT(map[string]string{}, "audit", "--database-url", dbURL, "--redis-url", redisURL)
	if code != 0 || !strings.Contains(out, "1 managed shows, 1 procs") || !strings.Contains(out, ": 0 differences") {
		t.Fatalf("audit after bootstrap: code %d\n%s%s", code, out, errOut)
	}
	// A drifted counter is named with both numbers.
	rdb.HSet(ctx, publisher.JobKey("j1"), "int_cores", 7)
	code, out, _ = runAccountingT(env, "audit")
	if code != 1 || !strings.Contains(out, "acct:job:j1") || !strings.Contains(out, " 7 ") || !strings.Contains(out, " 3") {
		t.Fatalf("audit with drift: code %d\n%s", code, out)
	}
}

func TestAccountingCLIUsage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		{nil, nil, 2, "usage: cuesched accounting"},
		{[]string{"bogus"}, nil, 2, `unknown subcommand "bogus"`},
		{[]string{"audit"}, nil, 2, "no database"},
		{[]string{"audit", "--database-url", "postgres://x/y"}, nil, 2, "no Redis: pass --redis-url URL (or --sentinel-master and --sentinel-addrs), set CUESCHED_ACCOUNTING_REDIS_URL"},
		{[]string{"audit", "--config", "/nonexistent/cuesched.yaml"}, nil, 1, "/nonexistent/cuesched.yaml"},
		{[]string{"audit", "--nope"}, nil, 2, "flag provided but not defined"},
		{[]string{"audit", "extra"}, map[string]string{"CUESCHED_DATABASE_URL": "postgres://x/y", "CUESCHED_ACCOUNTING_REDIS_URL": "redis://x:1/0"}, 2, `unexpected argument "extra"`},
		{[]string{"audit", "--redis-url", "http://x"}, map[string]string{"CUESCHED_DATABASE_URL": "postgres://x/y"}, 2, "redis url"},
	} {
		code, _, errOut := runAccountingT(c.env, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: code %d, stderr %q; want %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
}
