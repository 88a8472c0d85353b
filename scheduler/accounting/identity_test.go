package accounting

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

// A staging scheduler on a second database pointed at the Redis db the
// first database's scheduler bootstrapped is refused: the gate stays shut
// (no "booking resumed"), no loop writes Redis, and the refusal names both
// identities. The production accounting is untouched.
func TestRedisOfAnotherDatabaseIsRefused(t *testing.T) {
	t.Parallel()
	prod := newFarm(t)
	a := prod.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: 50, hosts: 1})
	a.mustInsertProc("a1", 0, 200, 0)
	sp, _ := prod.service(Config{})
	runService(t, sp)
	eventually(t, 30*time.Second, "production bootstrap", sp.Ready)
	prodID, err := publisher.DatabaseIdentity(prod.ctx, prod.pool)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := prod.pub.BoundIdentity(prod.ctx); got != prodID.String() {
		t.Fatalf("after the bootstrap Redis is bound to %q, want %q", got, prodID)
	}
	wantSub := a.subCores()

	// The staging copy: another database, the same Redis db.
	staging := newFarm(t, withRedisURL(prod.redisURL))
	b := staging.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: 50, hosts: 1})
	b.mustInsertProc("b1", 0, 500, 0)
	stagingID, err := publisher.DatabaseIdentity(staging.ctx, staging.pool)
	if err != nil {
		t.Fatal(err)
	}
	if stagingID == prodID {
		t.Fatalf("two databases, one identity %s", prodID)
	}
	logs := &logBuf{t: t}
	reg := prometheus.NewRegistry()
	ss, err := New(staging.pool, staging.pub, Config{EpochPollInterval: 50 * time.Millisecond, ManagedPollInterval: 50 * time.Millisecond},
		hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: logs}), reg)
	if err != nil {
		t.Fatal(err)
	}
	names := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), prodID.String()) && strings.Contains(err.Error(), stagingID.String())
	}
	// The startup check (the scheduler exits on it).
	err = ss.CheckIdentity(staging.ctx)
	var mm *publisher.IdentityMismatchError
	if !errors.As(err, &mm) || !errors.Is(err, publisher.ErrIdentityMismatch) || !names(err) {
		t.Fatalf("CheckIdentity = %v; want a mismatch naming %s and %s", err, prodID, stagingID)
	}
	// Running anyway: the gate never opens, every writer refuses.
	runService(t, ss)
	eventually(t, 30*time.Second, "identity mismatch gauge", func() bool {
		return promread.Value(t, reg, "scheduler_accounting_identity_mismatch") == 1
	})
	if ss.Ready() || !names(ss.ReadyErr()) {
		t.Errorf("staging gate: ready %v, reason %v; want shut naming both identities", ss.Ready(), ss.ReadyErr())
	}
	for what, fn := range map[string]func() error{
		"bootstrap":     func() error { return ss.Bootstrap(staging.ctx) },
		"recompute":     func() error { return ss.Recompute(staging.ctx) },
		"limit reseed":  func() error { return ss.ReseedLimits(staging.ctx) },
		"managed check": func() error { return ss.SyncManaged(staging.ctx) },
		"caps changed":  func() error { return ss.ReseedShowLimits(staging.ctx, []string{b.id}) },
	} {
		if err := fn(); !errors.Is(err, publisher.ErrIdentityMismatch) {
			t.Errorf("staging %s: %v, want the identity mismatch", what, err)
		}
	}
	if l := logs.lines("INFO", "booking resumed"); len(l) > 0 {
		t.Errorf("staging logged %q", l)
	}
	if l := logs.lines("ERROR", "REFUSING THE ACCOUNTING REDIS"); len(l) != 1 {
		t.Errorf("staging refusal logged %d times, want once: %q", len(l), logs.lines("ERROR", ""))
	}
	// Production's accounting is untouched and still bound to it.
	if got := a.subCores(); got != wantSub {
		t.Errorf("production subscription = %d cores, want %d", got, wantSub)
	}
	if n := prod.rdb.Exists(prod.ctx, publisher.SubKey(b.id, b.alloc), publisher.ShowKey(b.id)).Val(); n != 0 {
		t.Errorf("staging's show was written to the production Redis (%d keys)", n)
	}
	if got, _ := prod.pub.BoundIdentity(prod.ctx); got != prodID.String() {
		t.Errorf("Redis is now bound to %q, want %q", got, prodID)
	}
	if !sp.Ready() {
		t.Errorf("production gate shut: %v", sp.ReadyErr())
	}
}
