package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// Two databases, one Redis db bound to the first: the scheduler, the
// sidecar and every tool that opens the accounting Redis refuse the second
// database, naming both identities.
func TestEveryCommandRefusesRedisOfAnotherDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	prodURL, stagingURL, redisURL := cuebotdb.Database(t), cuebotdb.Database(t), testenv.NewRedisDB(t)
	identity := func(u string) publisher.Identity {
		pool, err := pgxpool.New(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		id, err := publisher.DatabaseIdentity(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	prodID, stagingID := identity(prodURL), identity(stagingURL)
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: redisURL})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	pub, err := publisher.New(rdb, publisher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// What production's bootstrap (or sidecar) did.
	if err := pub.BindIdentity(ctx, prodID); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": stagingURL, "CUESCHED_ACCOUNTING_REDIS_URL": redisURL}
	cfg := filepath.Join(t.TempDir(), "cfg.yaml")
	if err := os.WriteFile(cfg, []byte("metrics:\n  listen: \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(what string, code int, stderr string) {
		t.Helper()
		if code != 1 || !strings.Contains(stderr, "belongs to another database") ||
			!strings.Contains(stderr, prodID.String()) || !strings.Contains(stderr, stagingID.String()) {
			t.Errorf("%s: exit %d, stderr %q; want 1 and a refusal naming %s and %s", what, code, stderr, prodID, stagingID)
		}
	}
	runs := 0
	paths, leaf := bin().Paths()
	for _, p := range paths {
		if !leaf[p.String()] {
			continue
		}
		_, usage, _ := runCLI(nil, append(append([]string{}, p...), "-h")...)
		daemon := p.String() == "scheduler" || p.String() == "sidecar"
		if !daemon && !strings.Contains(usage, "\n  -redis-url ") {
			continue // does not open the accounting Redis
		}
		args := append(append([]string{}, p...), bin().Positionals(p.String())...)
		if daemon {
			args = append(args, "--config", cfg)
		}
		rctx, cancel := context.WithTimeout(ctx, testenv.Patience(60*time.Second))
		code, _, errOut := bin().RunContext(rctx, env, args...)
		cancel()
		check("cuesched "+strings.Join(args, " "), code, errOut)
		runs++
	}
	if runs < 5 {
		t.Errorf("only %d commands checked", runs)
	}
	if got, _ := pub.BoundIdentity(ctx); got != prodID.String() {
		t.Errorf("Redis is now bound to %q, want %q", got, prodID)
	}
}
