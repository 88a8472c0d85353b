// Package heldcommit holds a committed transaction in the moment between
// its WAL flush and its visibility, for as long as a test needs.
//
// The walsender streams a transaction once its commit record is flushed;
// the committing backend leaves the in-progress list that snapshots are
// built from a moment later (microseconds as a rule), or, with a
// synchronous standby, once the standby confirms. A consumer of the stream
// that acts at once acts on a change no other session can see yet. Tests
// of that window start a private cluster whose synchronous standby never
// comes (Database): every session of it commits without waiting
// (synchronous_commit is off by default in testenv's clusters), but a
// transaction committed with synchronous_commit on stays invisible after
// its flush until its wait is cancelled (Commit, Held.Release).
package heldcommit

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// Database starts a private cluster whose synchronous standby never comes,
// creates a Cuebot database in it (cuebotdb.Setup) and returns its URL.
// The cluster is stopped at the test's end.
func Database(t testing.TB, ctx context.Context) string {
	t.Helper()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{ExtraSettings: map[string]string{
		"synchronous_standby_names": "ghost",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	if err := pg.CreateDatabase(ctx, "cue", ""); err != nil {
		t.Fatal(err)
	}
	url := pg.URL("cue")
	if err := cuebotdb.Setup(ctx, url); err != nil {
		t.Fatal(err)
	}
	return url
}

// Held is a transaction committed and flushed but not visible yet.
type Held struct {
	// XID is the transaction's id as the stream carries it (32 bits).
	XID uint32
	// PID is the backend that waits for the standby.
	PID  uint32
	obs  *pgx.Conn
	done chan error
}

// Commit runs sql in one transaction, committed with synchronous_commit on,
// on a new session of the Database at url, and returns once that session
// waits for the standby: the commit is flushed (and streamed) and not
// visible to other sessions.
func Commit(t testing.TB, ctx context.Context, url, sql string, args ...any) *Held {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.WithoutCancel(ctx)) })
	obs, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { obs.Close(context.WithoutCancel(ctx)) })
	if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xid int64
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	h := &Held{XID: uint32(xid), PID: conn.PgConn().PID(), obs: obs, done: make(chan error, 1)}
	go func() { h.done <- tx.Commit(ctx) }()
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for {
		var ev string
		if err := obs.QueryRow(ctx, `SELECT COALESCE(wait_event, '') FROM pg_stat_activity WHERE pid = $1`, h.PID).Scan(&ev); err != nil {
			t.Fatal(err)
		}
		if ev == "SyncRep" {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("the committing session never waited for the synchronous standby (wait_event %q): the window is not held open", ev)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Release cancels the session's wait for the standby: the commit becomes
// visible (PostgreSQL warns that it was not confirmed). It returns the
// commit's error, nil as a rule.
func (h *Held) Release(t testing.TB, ctx context.Context) error {
	t.Helper()
	if _, err := h.obs.Exec(ctx, `SELECT pg_cancel_backend($1)`, int32(h.PID)); err != nil {
		t.Fatal(err)
	}
	return <-h.done
}
