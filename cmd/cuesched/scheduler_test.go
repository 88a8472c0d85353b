package main

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/clitest"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/hashicorp/go-hclog"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func runSchedulerT(ctx context.Context, env map[string]string, args ...string) (int, *clitest.SyncBuffer) {
	out, errb := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
	c := &cli.Env{Stdout: out, Stderr: errb, Getenv: func(k string) string { return env[k] }, Logger: hclog.NewNullLogger()}
	return runScheduler(ctx, c, args), errb
}

func TestSchedulerCLIUsageAndErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("queue:\n  layer_backof_min: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"--config", empty, "extra"}, 2, `unexpected argument "extra"`},
		{nil, 2, "--config FILE is required"},
		{[]string{"--config", "/nonexistent/cuesched.yaml"}, 1, "/nonexistent/cuesched.yaml"},
		{[]string{"--config", bad}, 1, "queue.layer_backof_min"},
	}
	for _, tc := range cases {
		code, errb := runSchedulerT(ctx, nil, tc.args...)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("scheduler %v: code %d, stderr %q; want %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}

// An unknown --facility is a clear startup failure naming it.
func TestSchedulerCLIUnknownFacility(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "cfg.yaml")
	if err := os.WriteFile(path, []byte("metrics:\n  listen: \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": cuebotdb.Database(t), "CUESCHED_ACCOUNTING_REDIS_URL": testenv.NewRedisDB(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, errb := runSchedulerT(ctx, env, "--config", path, "--facility", "atlantis")
	if code != 1 || !strings.Contains(errb.String(), `unknown facility "atlantis"`) {
		t.Fatalf("code %d, stderr %q", code, errb.String())
	}
}

// A dry run against a real database books the frames of a managed show in
// Postgres and Redis (through the real host cache and accounting
// bootstrap), and SIGTERM-style cancellation drains cleanly.
func TestSchedulerCLIDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, pool := farmseed.OneHostFarm(t, "spi", "cli", "clihost", "clijob", 3)
	path := filepath.Join(t.TempDir(), "cfg.yaml")
	cfg := "metrics:\n  listen: \"127.0.0.1:0\"\nqueue:\n  active_scan_interval: 50ms\naccounting:\n  leader_poll_interval: 50ms\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": db, "CUESCHED_ACCOUNTING_REDIS_URL": testenv.NewRedisDB(t)}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	var errb *clitest.SyncBuffer
	go func() {
		var code int
		code, errb = runSchedulerT(rctx, env, "--config", path, "--facility", "spi", "--dry-run")
		done <- code
	}()
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM proc`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("%d of 3 frames booked by the dry run; stderr:\n%s", n, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, errb.String())
	}
}

// withWrongPassword rewrites a test Redis URL to a user and password the
// server refuses (no server setting changes: the user does not exist).
func withWrongPassword(t *testing.T, redisURL string) string {
	t.Helper()
	u, err := url.Parse(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("cuesched_nobody", "s3cret-wrong")
	return u.String()
}

// A wrong Redis password stops the daemons at start-up with a clear error
// (it used to be retried forever, two WARN lines a second), without the
// password in the output; the daemon's logger reached cli.Env.UseLogger
// (go-redis's lines follow it).
func TestDaemonsRefuseWrongRedisPassword(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "cfg.yaml")
	if err := os.WriteFile(path, []byte("metrics:\n  listen: \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": cuebotdb.Database(t),
		"CUESCHED_ACCOUNTING_REDIS_URL": withWrongPassword(t, testenv.NewRedisDB(t))}
	for _, cmd := range []struct {
		name string
		run  func(context.Context, *cli.Env, []string) int
	}{{"scheduler", runScheduler}, {"sidecar", runSidecar}} {
		t.Run(cmd.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience(30*time.Second))
			defer cancel()
			out, errb := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
			var used hclog.Logger
			c := &cli.Env{Stdout: out, Stderr: errb, Getenv: func(k string) string { return env[k] }, Logger: hclog.NewNullLogger(),
				UseLogger: func(l hclog.Logger) { used = l }}
			code := cmd.run(ctx, c, []string{"--config", path})
			if code != 1 || !strings.Contains(errb.String(), "redis refused the credentials") || !strings.Contains(errb.String(), "accounting.redis_url") {
				t.Fatalf("code %d, stderr %q", code, errb.String())
			}
			if strings.Contains(errb.String()+out.String(), "s3cret-wrong") {
				t.Errorf("the password is in the output: %q", errb.String())
			}
			if used == nil {
				t.Errorf("%s never handed its logger to UseLogger", cmd.name)
			}
		})
	}
}
