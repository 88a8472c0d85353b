package publisher_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// A release publishes its show once on acct:released; a Redis ACL user
// without the channel (Redis 7 users start with resetchannels) still
// releases, gets no notice, and has its subscription refused with an error.
func TestReleaseNotices(t *testing.T) {
	f := newPrivateFixture(t, publisher.Options{})
	f.seedShow()
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	shows := make(chan string, 16)
	go func() { _ = f.pub.WatchReleases(ctx, func(s string) { shows <- s }) }()
	// The subscription is live once a PUBLISH reaches a subscriber.
	for deadline := time.Now().Add(testenv.Patience(5 * time.Second)); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := f.rdb.PubSubNumSub(f.ctx, publisher.ReleasedChannel).Result(); n[publisher.ReleasedChannel] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("WatchReleases never subscribed")
		}
	}
	for _, p := range []string{"p1", "p2"} {
		if _, err := f.pub.Book(f.ctx, booking(p, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := f.pub.Release(f.ctx, "p1", "p2"); err != nil || r.Released != 2 {
		t.Fatalf("Release = %+v, %v", r, err)
	}
	wantNotice(t, shows, "S")
	if r, err := f.pub.Release(f.ctx, "p1"); err != nil || r.Released != 0 {
		t.Fatalf("second Release = %+v, %v", r, err)
	}

	if err := f.rdb.Do(f.ctx, "ACL", "SETUSER", "nochan", "on", ">pw", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	u := newFixtureAt(t, strings.Replace(f.url, "redis://", "redis://nochan:pw@", 1), publisher.Options{})
	other := booking("p3", 100)
	other.ShowID = "T"
	if _, err := u.pub.ForceBook(u.ctx, other); err != nil {
		t.Fatal(err)
	}
	if r, err := u.pub.Release(u.ctx, "p3"); err != nil || r.Released != 1 {
		t.Fatalf("Release by a user without the channel = %+v, %v (its release must apply)", r, err)
	}
	if err := u.pub.WatchReleases(u.ctx, func(string) {}); err == nil || !strings.Contains(err.Error(), publisher.ReleasedChannel) {
		t.Fatalf("WatchReleases by a user without the channel = %v, want an error naming it", err)
	}
	// Notices arrive in publication order: show T's release was not
	// published, so the next notice is S's.
	if _, err := f.pub.Book(f.ctx, booking("p4", 100)); err != nil {
		t.Fatal(err)
	}
	if r, err := f.pub.Release(f.ctx, "p4"); err != nil || r.Released != 1 {
		t.Fatalf("Release = %+v, %v", r, err)
	}
	wantNotice(t, shows, "S") // not T's
	f.expectCores(0)
}

// wantNotice waits for the next notice and checks its show.
func wantNotice(t *testing.T, shows <-chan string, want string) {
	t.Helper()
	select {
	case s := <-shows:
		if s != want {
			t.Fatalf("notice for show %q, want %s", s, want)
		}
	case <-time.After(testenv.Patience(5 * time.Second)):
		t.Fatal("no release notice")
	}
}
