package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/clitest"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func runSidecarT(ctx context.Context, env map[string]string, args ...string) (int, *clitest.SyncBuffer) {
	out, errb := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
	c := &cli.Env{Stdout: out, Stderr: errb, Getenv: func(k string) string { return env[k] }, Logger: hclog.NewNullLogger()}
	return runSidecar(ctx, c, args), errb
}

func TestSidecarCLIUsageAndErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--config", "/nonexistent/cuesched.yaml"}, 1, "/nonexistent/cuesched.yaml"},
	}
	for _, tc := range cases {
		code, errb := runSidecarT(ctx, nil, tc.args...)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("sidecar %v: code %d, stderr %q; want %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
	// A bad key in the file is named with its line.
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("sidecar:\n  slot_nam: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, errb := runSidecarT(ctx, nil, "--config", path)
	if code != 1 || !strings.Contains(errb.String(), "sidecar.slot_nam") || !strings.Contains(errb.String(), ":2") {
		t.Errorf("bad key: code %d, stderr %q", code, errb.String())
	}
	// A missing slot without --create-slot is a clear failure.
	db := cuebotdb.Database(t)
	env := map[string]string{
		"CUESCHED_DATABASE_URL": db, "CUESCHED_ACCOUNTING_REDIS_URL": testenv.NewRedisDB(t),
		"CUESCHED_SIDECAR_SLOT_NAME": "cli_missing_" + strings.ReplaceAll(uuid.NewString()[:8], "-", ""),
		"CUESCHED_METRICS_LISTEN":    "127.0.0.1:0",
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	code, errb = runSidecarT(cctx, env)
	if code != 1 || !strings.Contains(errb.String(), "does not exist") || !strings.Contains(errb.String(), "--create-slot") ||
		strings.Contains(errb.String(), "CreateSlot") {
		t.Errorf("missing slot: code %d, stderr %q (want the flag named, not the Go field)", code, errb.String())
	}
}

func TestSidecarCLIRunsAndDrains(t *testing.T) {
	t.Parallel()
	db := cuebotdb.Database(t)
	slot := "cli_run_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	dir := t.TempDir()
	path := filepath.Join(dir, "cuesched.yaml")
	cfg := "database:\n  url: " + db + "\naccounting:\n  redis_url: " + testenv.NewRedisDB(t) +
		"\nsidecar:\n  slot_name: " + slot + "\n  standby_retry: 200ms\nmetrics:\n  listen: 127.0.0.1:0\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		code int
		errb *clitest.SyncBuffer
	}
	done := make(chan result, 1)
	go func() {
		code, errb := runSidecarT(ctx, nil, "--config", path, "--create-slot")
		done <- result{code, errb}
	}()
	deadline := time.Now().Add(testenv.Patience(30 * time.Second))
	for {
		var active bool
		err := pool.QueryRow(context.Background(), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if err == nil && active {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sidecar never streamed the slot it was asked to create")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case r := <-done:
		if r.code != 0 {
			t.Fatalf("exit code %d after a drain, Stderr:\n%s", r.code, r.errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sidecar did not drain")
	}
}
