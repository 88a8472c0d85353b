package accounting

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestRecomputeNeverStarves books and releases as fast as the machine
// allows while the recompute runs back to back, and forces the case that
// starved the reference design on every cycle: between the recompute's
// snapshot and its write, the hook waits until the booking workers have
// made more script calls (so acct:seq has moved and a compare-and-swap
// reseed would fail). Every one of a fixed number of cycles must still
// complete, with no retry and no skip. The verdict counts cycles against
// booking calls, never against the clock.
func TestRecomputeNeverStarves(t *testing.T) {
	t.Parallel()
	const (
		wantCycles    = 8
		callsPerCycle = 64 // booking+release script calls forced into each snapshot window
	)
	rd, err := testenv.StartRedis(context.Background(), testenv.RedisOptions{Databases: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rd.Stop)
	f := newFarm(t, withRedisURL(rd.URL(0)))
	sh := f.addShow(showSpec{managed: true, burstCores: 1 << 20, folderMaxCores: -1, jobs: 4, jobMaxCores: -1, hosts: 1})
	for i := 0; i < 400; i++ {
		sh.mustInsertProc(fmt.Sprintf("static-%d", i), i%4, 100, 0)
	}
	s, reg := f.service(Config{InFlightGrace: time.Hour, BatchSize: 100})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}

	// The workers run until the recompute loop below is done.
	load, stopLoad := context.WithCancel(f.ctx)
	defer stopLoad()
	var ops atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n := 0; load.Err() == nil; n++ {
				id := fmt.Sprintf("hot-%d-%d", w, n)
				if _, err := f.pub.Book(context.Background(), sh.booking(id, n%4, 100)); err != nil {
					t.Errorf("book: %v", err)
					return
				}
				if _, err := f.pub.Release(context.Background(), id); err != nil {
					t.Errorf("release: %v", err)
					return
				}
				ops.Add(2)
			}
		}(w)
	}

	var casWouldFail, snapshots atomic.Int64
	s.hooks.afterSnapshot = func(_ []string, m publisher.Mark) {
		snapshots.Add(1)
		// Hold the cycle between snapshot and write until the workers
		// have made callsPerCycle more calls: the window a CAS loses.
		from := ops.Load()
		deadline := time.Now().Add(testenv.Patience(2 * time.Minute))
		for ops.Load() < from+callsPerCycle && load.Err() == nil {
			if time.Now().After(deadline) {
				t.Errorf("the booking workers made no progress during a recompute snapshot window")
				return
			}
			time.Sleep(time.Millisecond)
		}
		now, _ := f.rdb.Get(context.Background(), publisher.SeqKey).Int64()
		if now != m.Seq {
			casWouldFail.Add(1)
		}
	}
	cycles := 0
	for ; cycles < wantCycles; cycles++ {
		if err := s.Recompute(f.ctx); err != nil {
			t.Fatalf("recompute cycle %d did not complete under booking load: %v", cycles, err)
		}
	}
	stopLoad()
	wg.Wait()
	s.hooks.afterSnapshot = nil

	t.Logf("%d recompute cycles completed under %d booking+release script calls; "+
		"a CAS reseed would have failed %d of %d snapshots",
		cycles, ops.Load(), casWouldFail.Load(), snapshots.Load())
	if got := snapshots.Load(); got != wantCycles {
		t.Errorf("%d snapshots for %d cycles: a cycle was retried or skipped", got, wantCycles)
	}
	if got := casWouldFail.Load(); got != wantCycles {
		t.Errorf("acct:seq moved inside only %d of %d snapshot windows: the test did not force the starving case", got, wantCycles)
	}
	if r := promread.Value(t, reg, "scheduler_accounting_recompute_retries_total"); r != 0 {
		t.Errorf("recompute retried %v times", r)
	}
	if e := promread.Value(t, reg, "scheduler_accounting_recompute_cycles_total", "result", "error"); e != 0 {
		t.Errorf("%v recompute cycles failed", e)
	}
	if got := sh.subCores(); got != 400 {
		t.Errorf("subscription = %d cores after the load, want the 400 static procs", got)
	}
	f.requireNoDrift()
}
