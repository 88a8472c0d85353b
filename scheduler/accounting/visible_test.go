package accounting

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/heldcommit"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestLimitReseedWaitsForCommittedCapChanges holds a job cap change
// committed and flushed but not visible (a synchronous standby that never
// confirms) while the limit reseed runs. The reseed stamps the caps it
// copies with a WAL position read after that commit; from a snapshot that
// does not show the change, it would put the old cap in Redis stamped
// past the change, and the sidecar's copy of the new cap would then be
// refused as older until the next reseed. So a reseed must wait until the
// change shows before it takes its snapshot, and, past its patience, copy
// nothing.
func TestLimitReseedWaitsForCommittedCapChanges(t *testing.T) {
	ctx := context.Background()
	f := newFarm(t, withDatabase(heldcommit.Database(t, ctx)))
	sh := f.addShow(showSpec{managed: true, burstCores: 10, jobs: 1, jobMaxCores: 6})
	s, reg := f.service(Config{})
	if err := s.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	waits := func() float64 { return promread.Value(t, reg, "scheduler_accounting_visibility_waits_total") }
	key := keyOf("job", sh, 0)
	if v := f.counter(key, "int_max_cores"); v != 6 {
		t.Fatalf("bootstrap wrote job cap %d, want 6", v)
	}
	lower := func() (*heldcommit.Held, uint64) {
		h := heldcommit.Commit(t, ctx, f.dbURL, `UPDATE job_resource SET int_max_cores = int_max_cores - 200 WHERE pk_job = $1`, sh.jobs[0].id)
		var text string
		if err := f.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&text); err != nil {
			t.Fatal(err)
		}
		lsn, err := pglogrepl.ParseLSN(text)
		if err != nil {
			t.Fatal(err)
		}
		return h, uint64(lsn) // at or past the commit: it is flushed
	}
	stamp := func() uint64 {
		v, err := f.rdb.HGet(ctx, key, "cap_lsn").Result()
		if err != nil {
			t.Fatal(err)
		}
		lsn, err := publisher.ParseLSN(v)
		if err != nil {
			t.Fatal(err)
		}
		return lsn
	}

	// Past its patience: nothing copied, an error naming the transaction.
	s.st.visibleWait = 300 * time.Millisecond
	h, committed := lower()
	err := s.ReseedLimits(ctx)
	if got := stamp(); got >= committed {
		t.Fatalf("the reseed wrote the job's caps stamped %X, at or past the invisible change (its commit ends at or before %X): the sidecar's copy of it would be refused", got, committed)
	}
	if err == nil || !strings.Contains(err.Error(), "not visible") {
		t.Fatalf("limit reseed while a committed cap change is invisible: %v, want its snapshot refused", err)
	}
	if v := f.counter(key, "int_max_cores"); v != 6 {
		t.Fatalf("job cap %d in Redis, want the bootstrap's 6 untouched", v)
	}
	if n := waits(); n < 1 {
		t.Fatalf("scheduler_accounting_visibility_waits_total = %v, want at least 1", n)
	}
	if err := h.Release(t, ctx); err != nil {
		t.Logf("commit after the cancelled wait: %v", err)
	}
	if err := s.ReseedLimits(ctx); err != nil {
		t.Fatal(err)
	}
	if v := f.counter(key, "int_max_cores"); v != 4 {
		t.Fatalf("job cap %d after the change became visible, want 4", v)
	}

	// Within its patience: the reseed waits, then copies the new cap.
	s.st.visibleWait = testenv.Patience(20 * time.Second)
	before := waits()
	h, _ = lower()
	done := make(chan error, 1)
	go func() { done <- s.ReseedLimits(ctx) }()
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for waits() == before {
		select {
		case err := <-done:
			t.Fatalf("the reseed ended (%v) without waiting for the invisible change", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the reseed never waited for the invisible change")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := h.Release(t, ctx); err != nil {
		t.Logf("commit after the cancelled wait: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := f.counter(key, "int_max_cores"); v != 2 {
		t.Fatalf("job cap %d after the reseed waited out the change, want 2", v)
	}
}

// TestSnapshotSaysWhenItCannotSeeOtherRoles: without pg_read_all_stats a
// role sees neither the wait_event nor the type of other roles' sessions,
// so it cannot tell a transaction waiting for a synchronous standby; the
// snapshot says so once.
func TestSnapshotSaysWhenItCannotSeeOtherRoles(t *testing.T) {
	ctx := context.Background()
	f := newFarm(t)
	role := "lowpriv_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	f.exec(`CREATE ROLE ` + role + ` LOGIN`)
	cfg, err := pgxpool.ParseConfig(f.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var logs strings.Builder
	st := newStore(pool, hclog.New(&hclog.LoggerOptions{Output: &logs}), nil)
	for range 2 {
		tx, err := st.beginVisible(ctx) // f.pool's sessions are another role's
		if err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
	}
	if n := strings.Count(logs.String(), "grant pg_read_all_stats"); n != 1 {
		t.Fatalf("the warning was logged %d times, want once:\n%s", n, logs.String())
	}
	f.exec(`GRANT pg_read_all_stats TO ` + role)
	logs.Reset()
	st = newStore(pool, hclog.New(&hclog.LoggerOptions{Output: &logs}), nil)
	tx, err := st.beginVisible(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if logs.Len() != 0 {
		t.Fatalf("warned with pg_read_all_stats granted:\n%s", logs.String())
	}
}
