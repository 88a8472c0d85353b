package accounting

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testenv"
)

// TestRecomputeNeverStarves books and releases as fast as the machine
// allows while the recompute runs back to back: every cycle must complete
// (no retry, no skip). For contrast it records how often the reference
// design's acct:seq compare-and-swap would have failed the same cycle
// (acct:seq moved between the read before the snapshot and the write).
func TestRecomputeNeverStarves(t *testing.T) {
	t.Parallel()
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

	var casWouldFail, snapshots, cycles atomic.Int64
	s.hooks.afterSnapshot = func(_ []string, m publisher.Mark) {
		snapshots.Add(1)
		now, _ := f.rdb.Get(context.Background(), publisher.SeqKey).Int64()
		if now != m.Seq {
			casWouldFail.Add(1)
		}
	}
	ctx, cancel := context.WithTimeout(f.ctx, 3*time.Second)
	defer cancel()
	var ops atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
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
	start := time.Now()
	var maxCycle time.Duration
	for ctx.Err() == nil {
		c0 := time.Now()
		if err := s.Recompute(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			t.Fatalf("recompute cycle %d did not complete: %v", cycles.Load(), err)
		}
		cycles.Add(1)
		maxCycle = max(maxCycle, time.Since(c0))
	}
	elapsed := time.Since(start)
	wg.Wait()
	s.hooks.afterSnapshot = nil

	rate := float64(ops.Load()) / elapsed.Seconds()
	t.Logf("%.0f booking+release script calls/s for %v; %d recompute cycles completed (every one; max %v, mean %v); "+
		"a CAS reseed would have failed %d of %d (%.0f%%)",
		rate, elapsed.Round(time.Millisecond), cycles.Load(), maxCycle.Round(time.Millisecond),
		(elapsed / time.Duration(max(cycles.Load(), 1))).Round(time.Millisecond),
		casWouldFail.Load(), snapshots.Load(), 100*float64(casWouldFail.Load())/float64(max(snapshots.Load(), 1)))
	if cycles.Load() < 5 {
		t.Errorf("only %d recompute cycles in %v", cycles.Load(), elapsed)
	}
	if r := metric(t, reg, "scheduler_accounting_recompute_retries_total"); r != 0 {
		t.Errorf("recompute retried %v times", r)
	}
	if e := metric(t, reg, "scheduler_accounting_recompute_cycles_total", "result", "error"); e != 0 {
		t.Errorf("%v recompute cycles failed", e)
	}
	if got := sh.subCores(); got != 400 {
		t.Errorf("subscription = %d cores after the load, want the 400 static procs", got)
	}
	f.requireNoDrift()
}
