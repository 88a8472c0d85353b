// Package e2e runs the whole scheduler against the Cuebot baseline schema:
// the dispatch pipeline (feed, job queries, matcher, dispatcher, RQD
// client), the sidecar applying releases from the WAL, a fake RQD running
// the frames and the Cuebot emulator completing them, until the queue
// drains. The farm is small on purpose (tens of hosts, about two hundred
// frames) so each test takes seconds.
package e2e

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cuesched/cuesched/shared/testkit/fakerqd"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// One scheduler drains the farm; caps, bursts, limits and host resources
// hold at every sample; the unmanaged show is never touched; Redis ends
// equal to SUM(proc).
func TestEndToEndDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedFarm(2)
	e.startSidecar()
	smp := e.startSampler()
	start := time.Now()
	reg := e.startScheduler("sched")
	e.waitDrained(60 * time.Second)
	t.Logf("%d managed frames drained in %s", e.farm.managedFrames, time.Since(start).Round(time.Millisecond))
	smp.finish(t)
	e.checkEnd(false)
	t.Logf("Redis cap refusals by table: %v; batches by stop: %v",
		counters(t, reg, "scheduler_accounting_limit_exceeded_total", "table"),
		counters(t, reg, "scheduler_dispatch_batches_total", "stop"))
	if n := counters(t, reg, "scheduler_frames_dispatched_total", "show"); n["aurora"]+n["borealis"] != float64(e.farm.managedFrames) || n["cuebotshow"] != 0 {
		t.Fatalf("scheduler_frames_dispatched_total = %v, want %d over the managed shows", n, e.farm.managedFrames)
	}
}

// Two instances on one facility: the same guarantees, and no frame is ever
// launched twice.
func TestEndToEndTwoInstances(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedFarm(2)
	e.startSidecar()
	smp := e.startSampler()
	e.startScheduler("a")
	e.startScheduler("b")
	e.waitDrained(60 * time.Second)
	smp.finish(t)
	e.checkEnd(false)
}

// RQD is unreachable on some hosts: their frames go back to WAITING with
// the bookings released, run elsewhere, and nothing leaks. Every host
// carrying the "fast" tag is unreachable at first, so the layer that runs
// only there is certainly launched on one of them and compensated; the
// hosts come back once that has happened, and the queue drains.
func TestEndToEndUnreachableHosts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedFarm(2)
	down := map[string]bool{}
	for _, h := range e.farm.fastHosts {
		down[h] = true
		e.fake.SetHost(h, fakerqd.Behavior{Mode: fakerqd.Unreachable})
	}
	e.startSidecar()
	smp := e.startSampler()
	e.startScheduler("sched")
	failedOnDown := func() int {
		n := 0
		for _, l := range e.fake.Launches() {
			if down[l.Host] {
				if l.Started {
					t.Errorf("frame started on unreachable host %s", l.Host)
				}
				n++
			}
		}
		return n
	}
	// Keep the hosts down until the case under test has happened: a
	// launch failed there and the booking was compensated (the frame is
	// WAITING again with the launch-failure exit status 299). Waiting for
	// the event, not for a time, so a slow machine cannot skip it.
	compensatedSQL := `SELECT pk_frame FROM frame WHERE str_state = 'WAITING' AND int_exit_status = 299 AND int_version >= 2`
	var compensated []string
	deadline := time.Now().Add(testenv.Patience(2 * time.Minute))
	for {
		rows, err := e.pool.Query(e.ctx, compensatedSQL)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 0 && failedOnDown() > 0 {
			compensated = ids
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no booking on an unreachable host was compensated within 2 min (%d failed launches seen)", failedOnDown())
		}
		time.Sleep(20 * time.Millisecond)
	}
	failed := failedOnDown()
	for h := range down {
		e.fake.ClearHost(h)
	}
	e.waitDrained(2 * time.Minute)
	smp.finish(t)
	e.checkEnd(true)
	// Each compensated frame was started (version 1), cleared (2), then
	// dispatched again and completed: SUCCEEDED at version 4 or more.
	for _, id := range compensated {
		var state string
		var version int
		if err := e.pool.QueryRow(e.ctx, `SELECT str_state, int_version FROM frame WHERE pk_frame = $1`, id).Scan(&state, &version); err != nil {
			t.Fatal(err)
		}
		if state != "SUCCEEDED" || version < 4 {
			t.Errorf("compensated frame %s ended %s at version %d, want SUCCEEDED after a second dispatch (version >= 4)", id, state, version)
		}
	}
	t.Logf("%d launches failed on unreachable hosts; %d frames seen compensated, all dispatched again", failed, len(compensated))
}
