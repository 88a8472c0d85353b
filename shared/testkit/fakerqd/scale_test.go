package fakerqd_test

import (
	"testing"
	"time"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
)

// Frames end in the order of their run times, whatever the launch order
// (one timer heap), and a killed frame never ends a second time.
func TestEndsInRunTimeOrder(t *testing.T) {
	runTimes := map[string]time.Duration{}
	h := start(t, fakerqd.Config{Default: fakerqd.Behavior{RunTimeFunc: func(rf *rqdpb.RunFrame) time.Duration {
		return runTimes[rf.GetFrameName()]
	}}})
	names := []string{"c", "a", "killed", "b"}
	for i, d := range []time.Duration{600, 200, 300, 400} {
		runTimes[names[i]] = d * time.Millisecond
	}
	ids := map[string]string{}
	for _, n := range names {
		rf := newFrame(100)
		rf.FrameName = n
		ids[n] = rf.GetFrameId()
		h.mustLaunch(t, "h1", rf)
	}
	if _, err := h.client.KillRunningFrame(ctxFor(t, "h1"), &rqdpb.RqdStaticKillRunningFrameRequest{FrameId: ids["killed"], Message: "test"}); err != nil {
		t.Fatal(err)
	}
	if c := h.wait(t); c.FrameName != "killed" || !c.Killed {
		t.Fatalf("first completion %s killed=%v, want the kill", c.FrameName, c.Killed)
	}
	for _, want := range []string{"a", "b", "c"} {
		if c := h.wait(t); c.FrameName != want || c.Killed {
			t.Fatalf("completion %s (killed %v), want %s", c.FrameName, c.Killed, want)
		}
	}
	h.expectNoCompletion(t, 400*time.Millisecond)
	tot := h.fake.Totals()
	if tot.Frames != 0 || tot.Centicores != 0 || tot.Launched != 4 || tot.Ended != 4 {
		t.Fatalf("totals %+v, want 4 launched and ended, nothing running", tot)
	}
}

// Totals follow the running frames; HistoryLimit keeps the latest launches
// only; Capacity counts a launch past its host's cores or GPUs.
func TestTotalsHistoryAndOverbooking(t *testing.T) {
	h := start(t, fakerqd.Config{
		Default:      fakerqd.Behavior{RunTime: time.Hour},
		HistoryLimit: 3,
		Capacity: func(host string) (int32, int32, bool) {
			return 400, 1, host != "unknown"
		},
	})
	for i := 0; i < 4; i++ {
		h.mustLaunch(t, "h1", newFrame(100))
	}
	gpu := newFrame(100)
	gpu.NumGpus = 2
	h.mustLaunch(t, "h2", gpu)
	h.mustLaunch(t, "unknown", newFrame(800))
	if n, _ := h.fake.Overbooked(); n != 1 {
		t.Fatalf("overbooked after h1 full and h2 over its GPUs: %d, want 1", n)
	}
	over := newFrame(100)
	h.mustLaunch(t, "h1", over)
	n, ex := h.fake.Overbooked()
	if n != 2 || ex[1].Host != "h1" || ex[1].FrameID != over.GetFrameId() || ex[1].Centicores != 500 || ex[1].CapCenticores != 400 {
		t.Fatalf("overbooked %d %+v", n, ex)
	}
	tot := h.fake.Totals()
	if tot.Frames != 7 || tot.Centicores != 1400 || tot.GPUs != 2 || tot.Launched != 7 || tot.Ended != 0 {
		t.Fatalf("totals %+v", tot)
	}
	if ls := h.fake.Launches(); len(ls) < 3 || len(ls) > 6 || ls[len(ls)-1].RunFrame.GetFrameId() != over.GetFrameId() {
		t.Fatalf("history of %d launches with limit 3 (want 3..6, the latest last)", len(ls))
	}
}
