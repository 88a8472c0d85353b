package sidecar_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// A sidecar of a second database pointed at the Redis db the first
// database's sidecar streams into refuses to stream (Run returns, naming
// both identities) and writes nothing there; the first keeps streaming.
func TestSidecarRefusesRedisOfAnotherDatabase(t *testing.T) {
	t.Parallel()
	prod := newHarness(t, harnessOpts{})
	p := prod.start(true)
	p.waitActive(t, 60*time.Second)
	prodID, err := publisher.DatabaseIdentity(prod.ctx, prod.pool)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := prod.pub.BoundIdentity(prod.ctx); got != prodID.String() {
		t.Fatalf("the active sidecar bound Redis to %q, want %q", got, prodID)
	}
	lsnBefore, _, err := prod.pub.Checkpoint(prod.ctx)
	if err != nil {
		t.Fatal(err)
	}

	staging := newHarness(t, harnessOpts{redisURL: prod.redisURL})
	stagingID, err := publisher.DatabaseIdentity(staging.ctx, staging.pool)
	if err != nil {
		t.Fatal(err)
	}
	s := staging.start(true)
	select {
	case err := <-s.done:
		close(s.done)
		if !errors.Is(err, publisher.ErrIdentityMismatch) || !strings.Contains(err.Error(), prodID.String()) || !strings.Contains(err.Error(), stagingID.String()) {
			t.Fatalf("staging sidecar Run = %v; want the identity mismatch naming %s and %s", err, prodID, stagingID)
		}
	case <-time.After(testenv.Patience(60 * time.Second)):
		t.Fatalf("the staging sidecar did not refuse: %+v\n%s", s.sc.Status(), tail(s.logs.String(), 4000))
	}
	if got, _ := prod.pub.BoundIdentity(prod.ctx); got != prodID.String() {
		t.Errorf("Redis is now bound to %q, want %q", got, prodID)
	}
	if lsn, _, _ := prod.pub.Checkpoint(prod.ctx); lsn < lsnBefore {
		t.Errorf("the Redis checkpoint went back from %d to %d", lsnBefore, lsn)
	}
	// Production still releases.
	procs := prod.book(prod.a, 3)
	prod.del(procs...)
	prod.waitCheckpoint(prod.walNow(), 60*time.Second)
	prod.assertExact()
	if !p.sc.Status().Active {
		t.Errorf("production sidecar not active: %+v", p.sc.Status())
	}
}
