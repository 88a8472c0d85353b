package clusters_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/heldcommit"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestFlushWaitsUntilTheCapChangeIsVisible: the WAL can report a committed
// cap change before PostgreSQL shows it to other sessions (the walsender
// ships a commit once flushed; the backend leaves the in-progress list a
// moment later, or once a synchronous standby confirms). Copied at once,
// the old cap would be read and written to Redis stamped with a WAL
// position newer than the change, so the sidecar's copy of the new cap
// would be refused as older and the old cap would stay until the next full
// reseed. The test holds the window open: its cluster names a synchronous
// standby that never comes, and the UPDATE's session waits for it after
// its commit is flushed. The feed must copy the caps only once the change
// is visible, and, when it stays invisible past VisibleWait, not at all.
func TestFlushWaitsUntilTheCapChangeIsVisible(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := heldcommit.Database(t, ctx)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	seed := &farmseed.Seeder{DB: pool}
	fac, err := seed.Facility(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	show, err := seed.Show(ctx, "vis", true)
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := seed.Alloc(ctx, fac, "f.general", "general")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seed.Subscribe(ctx, show, alloc, 10, 10); err != nil {
		t.Fatal(err)
	}
	var read []int64 // the bursts CapsChanged read
	reg := prometheus.NewRegistry()
	f, err := clusters.NewFeed(ctx, pool, clusters.FeedOptions{Registerer: reg, VisibleWait: time.Minute,
		CapsChanged: func(ctx context.Context, shows []string) error {
			var burst int64
			err := pool.QueryRow(ctx, `SELECT int_burst FROM subscription WHERE pk_show = $1`, show.ID).Scan(&burst)
			read = append(read, burst)
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}

	// change commits burst and returns once it is flushed and invisible.
	change := func(burst int) *heldcommit.Held {
		held := heldcommit.Commit(t, ctx, url, `UPDATE subscription SET int_burst = $1 WHERE pk_show = $2`, burst, show.ID)
		var visible int64
		if err := pool.QueryRow(ctx, `SELECT int_burst FROM subscription WHERE pk_show = $1`, show.ID).Scan(&visible); err != nil {
			t.Fatal(err)
		}
		if visible == int64(burst) {
			t.Fatal("the change is visible while its session waits for the standby: the test exercises nothing")
		}
		return held
	}

	// Visible after a wait: the caps are copied once, with the new burst.
	held := change(2000)
	f.Notify(clusters.Change{CapShows: []string{show.ID}, XIDs: []uint32{held.XID}})
	flushed := make(chan error, 1)
	go func() { flushed <- f.Flush(ctx) }()
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for testCounter(t, reg, "scheduler_clusters_visibility_waits_total") < 1 {
		select {
		case err := <-flushed:
			t.Fatalf("the flush ended (%v) without waiting for the invisible change; caps read %v", err, read)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the flush never waited for the invisible change")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := held.Release(t, ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if len(read) != 1 || read[0] != 2000 {
		t.Fatalf("CapsChanged read bursts %v, want [2000] (read once the change was visible)", read)
	}

	// Still invisible after VisibleWait: no copy at all.
	read = nil
	f2, err := clusters.NewFeed(ctx, pool, clusters.FeedOptions{VisibleWait: 200 * time.Millisecond,
		CapsChanged: func(ctx context.Context, shows []string) error {
			read = append(read, 0)
			return errors.New("must not run")
		}})
	if err != nil {
		t.Fatal(err)
	}
	held = change(3000)
	f2.Notify(clusters.Change{CapShows: []string{show.ID}, XIDs: []uint32{held.XID}})
	if err := f2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(t, ctx); err != nil {
		t.Fatal(err)
	}
	if len(read) != 0 {
		t.Fatal("CapsChanged ran while the change was still invisible")
	}
}
