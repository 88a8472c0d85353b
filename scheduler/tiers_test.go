package scheduler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestShowTiersNextSlot: two shows of equal subscription on one
// allocation, one already using 3 of the host's 4 cores: the one free core
// goes to the show running nothing (tier 0), read from the accounting
// store, and the other show's pass does not run beside it.
func TestShowTiersNextSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, 1)
	busy := w.show
	idle, err := w.seed.Show(ctx, "idle", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Subscribe(ctx, idle, w.alloc, 100, 100); err != nil {
		t.Fatal(err)
	}
	layer := []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 5, NotThreadable: true}}
	bj, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "busy-job", Show: busy, Facility: w.facility, Layers: layer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "idle-job", Show: idle, Facility: w.facility, Layers: layer}); err != nil {
		t.Fatal(err)
	}
	var host string
	if err := w.pool.QueryRow(ctx, `SELECT pk_host FROM host WHERE str_name = 'ha'`).Scan(&host); err != nil {
		t.Fatal(err)
	}
	for _, f := range bj.Layers[0].Frames[:3] {
		if _, err := w.seed.Proc(ctx, farmseed.ProcSpec{Host: host, Frame: f, Cores: 1, MemKB: farmseed.GB}); err != nil {
			t.Fatal(err)
		}
	}
	if err := farmseed.SeedAccounting(ctx, w.pool, w.pub, busy.ID, idle.ID); err != nil {
		t.Fatal(err)
	}
	// The busy show's three cores, as the booking script charged them.
	if err := w.pub.Client().HSet(ctx, publisher.SubKey(busy.ID, w.alloc), "int_cores", 3).Err(); err != nil {
		t.Fatal(err)
	}

	s := w.scheduler(t, testConfig(w), scheduler.Deps{NoAccounting: true})
	c, err := s.Feed.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.ShowID != idle.ID {
		t.Fatalf("first cluster handed out is show %s, want the idle show %s (tier 0 < 3/100)", c.ShowID, idle.ID)
	}
	// While it is in flight the busy show's pass of the same allocation
	// waits (nothing else is ready, so Next blocks until the deadline).
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if c2, err := s.Feed.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Next while the idle show's pass is in flight = %v, %v; want to wait", c2, err)
	}
	cancel()
	s.Feed.Done(c, 0)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	deadline := time.Now().Add(testenv.Patience(15 * time.Second))
	for {
		var running, idleRunning int
		if err := w.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE j.pk_show = $1)
			FROM frame f JOIN job j USING (pk_job) WHERE f.str_state = 'RUNNING'`, idle.ID).Scan(&running, &idleRunning); err != nil {
			t.Fatal(err)
		}
		if running == 4 {
			if idleRunning != 1 {
				t.Fatalf("the free core went to the busy show (idle show runs %d)", idleRunning)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d frames running, want 4 (the free core booked)", running)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
