package releases

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// A watch moves at a release of its show after it was taken, not of
// another show's, and not before the minimum has passed since it was
// taken; Changed is closed again once it has, so a feed poked then sees
// it move.
func TestWatchMovesOnItsShowAfterTheMinimum(t *testing.T) {
	now := time.Unix(1000, 0)
	b := New(time.Hour, prometheus.NewRegistry())
	b.now = func() time.Time { return now }
	a, other := b.Watch("a"), b.Watch("b")
	ch := b.Changed()
	b.Bump("a")
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed at a notice")
	}
	if a.Moved() {
		t.Error("watch moved before the minimum passed")
	}
	now = now.Add(time.Hour)
	if !a.Moved() {
		t.Error("watch of the released show did not move once the minimum passed")
	}
	if other.Moved() {
		t.Error("watch of another show moved")
	}
	if late := b.Watch("a"); late.Moved() {
		t.Error("a watch taken after the release moved")
	}
}

// The second signal comes the minimum after the last notice: a watch the
// first signal found too young moves by then.
func TestChangedAgainAfterTheMinimum(t *testing.T) {
	b := New(20*time.Millisecond, nil)
	w := b.Watch("a")
	b.Bump("a")
	ch := b.Changed()
	if w.Moved() {
		return // the delayed signal came before ch was taken: it is past
	}
	select {
	case <-ch:
	case <-time.After(testenv.Patience(5 * time.Second)):
		t.Fatal("Changed not closed again after the minimum")
	}
	if !w.Moved() {
		t.Error("watch not moved at the delayed signal")
	}
}
