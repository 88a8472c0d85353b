package faults

import (
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// productionPacing is the queue section's production pacing (the harness
// default paces everything fast, which hides how long a sleep lasts).
var productionPacing = map[string]string{
	"cluster_empty_sleep": "30s", "cluster_saturated_sleep": "5s", "active_scan_interval": "2s",
	"layer_backoff_min": "1s", "layer_backoff_max": "30s",
}

// firstLaunchAfter waits for the first frame started on the fake RQD after
// t0 and returns its time.
func (e *env) firstLaunchAfter(t0 time.Time, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var first time.Time
		for _, l := range e.fake.Launches() {
			if l.Started && l.At.After(t0) && (first.IsZero() || l.At.Before(first)) {
				first = l.At
			}
		}
		if !first.IsZero() {
			return first, true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Time{}, false
}

// TestFaultPostgresOutageBookingGap: every process loses Postgres for 3 s
// (a restart or a failover seen from the daemons) while work waits, with
// the production queue pacing (cluster_empty_sleep 30 s). A failed pass
// is retried after the error backoff (200 ms doubling to 2 s), not after
// the empty sleep: booking resumes within a few seconds of the database
// coming back. The gap (cut to first launch) is measured and printed; the
// verdict is that it stays under the empty sleep, the sign of the bug
// (round 2 measured 30.3 s), whatever the machine's speed.
func TestFaultPostgresOutageBookingGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{Frames: pick(600, 1200), Queue: productionPacing})
	e.run()
	e.waitProgress(0.1, 60*time.Second)
	outage := 3 * time.Second
	cutAt := time.Now()
	e.mu.Lock()
	ds := append(append([]*daemon(nil), e.schedulers...), e.sidecars...)
	e.mu.Unlock()
	for _, d := range ds {
		e.cut(d, true, false)
	}
	time.Sleep(outage)
	for _, d := range ds {
		d.restore()
	}
	restoredAt := time.Now()
	e.note("restored every process's Postgres after %s", restoredAt.Sub(cutAt).Round(time.Millisecond))
	first, ok := e.firstLaunchAfter(restoredAt, testenv.Patience(40*time.Second))
	if !ok {
		t.Fatalf("no frame launched after the database came back")
	}
	gap, resume := first.Sub(cutAt), first.Sub(restoredAt)
	e.note("booking gap %s (first launch %s after the database came back)", gap.Round(time.Millisecond), resume.Round(time.Millisecond))
	t.Logf("booking gap after a %s Postgres outage: %s (first launch %s after it came back)", outage, gap.Round(time.Millisecond), resume.Round(time.Millisecond))
	if resume >= 30*time.Second {
		t.Errorf("booking resumed %s after the database came back: a failed pass slept cluster_empty_sleep", resume)
	}
	e.finish(pick(90*time.Second, 3*time.Minute))
}
