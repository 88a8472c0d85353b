package sidecar_test

import (
	"context"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/heldcommit"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestReleaseWaitsUntilTheDeleteIsVisible: a committed DELETE can reach the
// sidecar before PostgreSQL shows it to other sessions. The walsender ships
// a commit once its WAL is flushed; the committing backend leaves the
// snapshot's in-progress list a moment later (normally microseconds, longer
// on a loaded machine, and for as long as a synchronous standby takes to
// confirm). Applied at once, the release frees a cap in Redis while every
// new snapshot still shows the proc, so a booking into that room commits
// next to it and a reader sees the job over its cap. The test holds the
// window open: its cluster names a synchronous standby that never comes,
// and the DELETE's session waits for it after its commit is flushed. The
// record must stay in Redis for as long as the proc is visible, and the
// release must apply once the wait ends.
func TestReleaseWaitsUntilTheDeleteIsVisible(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := heldcommit.Database(t, ctx)
	// Every other session commits without waiting for the standby.
	h := newHarness(t, harnessOpts{dbURL: url, syncCommit: "local"})
	ps := h.book(h.a, 2)
	ip := h.start(true)
	ip.waitActive(t, 10*time.Second)
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	h.assertExact()

	held := heldcommit.Commit(t, ctx, url, `DELETE FROM proc WHERE pk_proc = $1`, ps[0].id)
	visible := func() bool {
		var n int
		if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM proc WHERE pk_proc = $1`, ps[0].id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if !visible() {
		t.Fatal("the DELETE is visible while its session still waits for the standby")
	}
	// The sidecar has the transaction once it holds its release back
	// (sidecar_visibility_waits_total); a release that reaches Redis first
	// is the defect.
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for ip.metric(t, "sidecar_visibility_waits_total", nil) < 1 {
		n, err := h.rdb.Exists(ctx, publisher.ProcKey(ps[0].id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if visible() {
				t.Fatal("the release reached Redis while the DELETE was not visible to other sessions: a booking into the freed room would show next to the proc")
			}
			t.Fatal("the DELETE became visible before its session's wait ended")
		}
		if time.Now().After(deadline) {
			t.Fatal("the sidecar never received the DELETE's transaction")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Held for as long as the proc is visible.
	time.Sleep(200 * time.Millisecond)
	if n, err := h.rdb.Exists(ctx, publisher.ProcKey(ps[0].id)).Result(); err != nil || n != 1 || !visible() {
		t.Fatalf("while the DELETE is not visible: record in Redis %d (err %v), want 1", n, err)
	}
	// End the wait: the commit becomes visible, and the release applies.
	if err := held.Release(t, ctx); err != nil {
		t.Fatalf("DELETE: %v", err)
	}
	if visible() {
		t.Fatal("the DELETE is still not visible after its session's wait ended")
	}
	h.forget(ps[0])
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	h.assertExact()
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "applied"}, 1)
}
