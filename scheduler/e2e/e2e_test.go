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

	"github.com/cuesched/cuesched/scheduler/testdouble/fakerqd"
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
	if n := counters(t, reg, "scheduler_frames_dispatched_total", "show_name"); n["aurora"]+n["borealis"] != float64(e.farm.managedFrames) || n["cuebotshow"] != 0 {
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
	deadline := time.Now().Add(30 * time.Second)
	for failedOnDown() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no launch was attempted on an unreachable host within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Let the failures pile up a little, then bring the hosts back.
	time.Sleep(300 * time.Millisecond)
	failed := failedOnDown()
	for h := range down {
		e.fake.ClearHost(h)
	}
	e.waitDrained(60 * time.Second)
	smp.finish(t)
	e.checkEnd(true)
	// A compensated frame was started (version 1), cleared (2), started
	// again (3) and completed (4).
	if n := e.count(`SELECT count(*) FROM frame WHERE str_state = 'SUCCEEDED' AND int_version >= 4`); n == 0 {
		t.Fatal("no frame went through compensation and a second dispatch")
	}
	t.Logf("%d launches failed on unreachable hosts and were compensated", failed)
}
