package accounting

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// model is the test's own account of what is charged, updated under the
// read side of mu in the same critical section as the script call that
// changed Redis, so the checker (write side) sees both in step.
type model struct {
	mu sync.RWMutex
	mm sync.Mutex // serializes map updates among read-side holders
	// live: booked and its proc not deleted (or not yet inserted).
	live map[string]int64
	// pending: proc deleted in Postgres, release not applied yet; leaked:
	// booked, never inserted nor rolled back (a crashed dispatcher).
	pending map[string]int64
	leaked  map[string]int64
}

func newModel() *model {
	return &model{live: map[string]int64{}, pending: map[string]int64{}, leaked: map[string]int64{}}
}

func (m *model) add(which map[string]int64, keys []string, c int64) {
	m.mm.Lock()
	defer m.mm.Unlock()
	for _, k := range keys {
		which[k] += c
	}
}

// TestPropertyConcurrentBookReleaseRollback: many goroutines book, release
// (through a sidecar-like LSN batcher) and roll back random procs, some
// bookings leak (a dispatcher crash), while recompute and limit reseed run
// back to back. At every check no cap is exceeded and no counter is below
// what is live (no booking was erased); at quiescence Redis equals
// SUM(proc) for every key.
func TestPropertyConcurrentBookReleaseRollback(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	const burst, folderMax, jobMax = 40, 30, 12
	shows := []*showFx{
		f.addShow(showSpec{managed: true, burstCores: burst, folderMaxCores: folderMax, jobs: 3, jobMaxCores: jobMax, jobMaxGPUs: 2, hosts: 1}),
		f.addShow(showSpec{managed: true, burstCores: burst, folderMaxCores: -1, jobs: 3, jobMaxCores: jobMax, jobMaxGPUs: 2, hosts: 1}),
	}
	const grace = 1500 * time.Millisecond
	s, reg := f.service(Config{InFlightGrace: grace, BatchSize: 16})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	caps := map[string]int64{}
	var keys []string
	for _, sh := range shows {
		caps[keyOf("sub", sh, 0)] = burst
		keys = append(keys, keyOf("sub", sh, 0), keyOf("folder", sh, 0))
		if sh == shows[0] {
			caps[keyOf("folder", sh, 0)] = folderMax
		}
		for j := range sh.jobs {
			caps[keyOf("job", sh, j)] = jobMax
			keys = append(keys, keyOf("job", sh, j))
		}
	}

	m := newModel()
	// The run lasts at least 4 s and until it has exercised enough
	// (counts, not seconds: a loaded machine books and recomputes less
	// per second), within a patient deadline.
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	var stats struct {
		booked, rejected, rolledBack, leaked, released, checks, recomputes, reseeds atomic.Int64
	}
	enough := func() bool {
		return stats.booked.Load() >= 100 && stats.rejected.Load() > 0 && stats.recomputes.Load() >= 5 && stats.checks.Load() >= 20
	}
	go func() {
		defer cancel()
		minEnd, deadline := time.Now().Add(4*time.Second), time.Now().Add(testenv.Patience(4*time.Second))
		for ctx.Err() == nil && time.Now().Before(deadline) && (time.Now().Before(minEnd) || !enough()) {
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var failed atomic.Bool
	fail := func(format string, args ...any) {
		if failed.CompareAndSwap(false, true) {
			t.Errorf(format, args...)
		}
		cancel()
	}

	// The sidecar: applies releases in LSN order, in batches.
	type rel struct {
		id   string
		keys []string
		c    int64
	}
	releases := make(chan rel, 1024)
	var sidecarDone sync.WaitGroup
	sidecarDone.Add(1)
	go func() {
		defer sidecarDone.Done()
		lsn := uint64(0x1000)
		for r := range releases {
			batch := []rel{r}
		more:
			for len(batch) < 8 {
				select {
				case r2, ok := <-releases:
					if !ok {
						break more
					}
					batch = append(batch, r2)
				default:
					break more
				}
			}
			lsn += 0x10
			rs := make([]publisher.Release, len(batch))
			for i, b := range batch {
				rs[i] = publisher.Release{ProcID: b.id}
			}
			m.mu.RLock()
			res, err := f.pub.ReleaseBatch(context.Background(), lsn, rs)
			for _, b := range batch {
				m.add(m.pending, b.keys, -b.c)
			}
			m.mu.RUnlock()
			if err != nil || !res.Applied {
				fail("release batch %X: %+v %v", lsn, res, err)
				return
			}
			stats.released.Add(int64(res.Released))
		}
	}()

	var loops sync.WaitGroup
	loops.Add(3)
	go func() { // recompute, back to back
		defer loops.Done()
		for ctx.Err() == nil {
			if err := s.Recompute(ctx); err != nil && ctx.Err() == nil {
				fail("recompute: %v", err)
			}
			stats.recomputes.Add(1)
		}
	}()
	go func() { // limit reseed, back to back
		defer loops.Done()
		for ctx.Err() == nil {
			if err := s.ReseedLimits(ctx); err != nil && ctx.Err() == nil {
				fail("limit reseed: %v", err)
			}
			stats.reseeds.Add(1)
		}
	}()
	go func() { // checker
		defer loops.Done()
		for ctx.Err() == nil {
			time.Sleep(15 * time.Millisecond)
			m.mu.Lock()
			vals := make([]int64, len(keys))
			pipe := f.rdb.Pipeline()
			cmds := make([]interface{ Int64() (int64, error) }, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.HGet(context.Background(), k, "int_cores")
			}
			_, _ = pipe.Exec(context.Background())
			for i := range keys {
				vals[i], _ = cmds[i].Int64()
			}
			for i, k := range keys {
				v := vals[i]
				lo, hi := m.live[k], m.live[k]+m.pending[k]+m.leaked[k]
				if v < lo {
					fail("check %d: %s = %d cores < %d live: a booking was erased", stats.checks.Load(), k, v, lo)
				}
				if v > hi {
					fail("check %d: %s = %d cores > %d live+pending+leaked: phantom charge", stats.checks.Load(), k, v, hi)
				}
				if c, ok := caps[k]; ok && v > c {
					fail("check %d: %s = %d cores > cap %d", stats.checks.Load(), k, v, c)
				}
			}
			m.mu.Unlock()
			stats.checks.Add(1)
		}
	}()

	var workers sync.WaitGroup
	for w := 0; w < 8; w++ {
		workers.Add(1)
		go func(w int) {
			defer workers.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			type proc struct {
				id   string
				sh   *showFx
				j    int
				keys []string
				c    int64
			}
			var mine []proc
			for n := 0; ctx.Err() == nil; n++ {
				if len(mine) > 0 && rng.IntN(100) < 45 {
					i := rng.IntN(len(mine))
					p := mine[i]
					mine = append(mine[:i], mine[i+1:]...)
					// Cuebot deletes the proc; the release reaches Redis later.
					m.mu.RLock()
					err := f.deleteProc(context.Background(), p.id)
					m.add(m.live, p.keys, -p.c)
					m.add(m.pending, p.keys, p.c)
					m.mu.RUnlock()
					if err != nil {
						fail("delete proc: %v", err)
						return
					}
					releases <- rel{p.id, p.keys, p.c}
					continue
				}
				sh := shows[rng.IntN(len(shows))]
				j := rng.IntN(len(sh.jobs))
				centi := int64(50 + rng.IntN(350)) // 0.5 .. 4 cores, fractions included
				b := sh.booking(fmt.Sprintf("w%d-%d", w, n), j, centi)
				c := publisher.ChargeCores(centi)
				pk := []string{keyOf("sub", sh, j), keyOf("folder", sh, j), keyOf("job", sh, j)}
				m.mu.RLock()
				_, err := f.pub.Book(context.Background(), b)
				if err == nil {
					m.add(m.live, pk, c)
				}
				m.mu.RUnlock()
				var le *publisher.LimitError
				switch {
				case errors.As(err, &le):
					stats.rejected.Add(1)
					if le.Current+le.Delta <= le.Limit {
						fail("rejected although it fits: %v", err)
					}
					continue
				case err != nil:
					fail("book: %v", err)
					return
				}
				stats.booked.Add(1)
				switch r := rng.IntN(100); {
				case r < 12: // the INSERT failed: roll back
					m.mu.RLock()
					res, err := f.pub.Rollback(context.Background(), b.ProcID)
					m.add(m.live, pk, -c)
					m.mu.RUnlock()
					if err != nil || !res.RolledBack {
						fail("rollback: %+v %v", res, err)
						return
					}
					stats.rolledBack.Add(1)
				case r < 15: // the dispatcher crashed before its INSERT
					m.mu.RLock()
					m.add(m.live, pk, -c)
					m.add(m.leaked, pk, c)
					m.mu.RUnlock()
					stats.leaked.Add(1)
				default:
					if err := sh.insertProc(context.Background(), b.ProcID, j, centi, 0); err != nil {
						fail("insert proc: %v", err)
						return
					}
					mine = append(mine, proc{b.ProcID, sh, j, pk, c})
				}
			}
			// Quiesce: release what is left.
			for _, p := range mine {
				m.mu.RLock()
				err := f.deleteProc(context.Background(), p.id)
				m.add(m.live, p.keys, -p.c)
				m.add(m.pending, p.keys, p.c)
				m.mu.RUnlock()
				if err != nil {
					fail("delete proc: %v", err)
					return
				}
				releases <- rel{p.id, p.keys, p.c}
			}
		}(w)
	}
	workers.Wait()
	close(releases)
	sidecarDone.Wait()
	loops.Wait()
	if failed.Load() {
		return
	}
	// Leaked bookings are dropped once past the in-flight grace.
	time.Sleep(grace)
	if err := s.Recompute(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.requireNoDrift()
	for _, k := range keys {
		if v := f.counter(k, "int_cores"); v != 0 {
			t.Errorf("%s = %d after everything was released", k, v)
		}
	}
	t.Logf("booked %d (rejected %d, rolled back %d, leaked %d), released %d; %d recompute and %d limit-reseed cycles, %d checks; %v records dropped",
		stats.booked.Load(), stats.rejected.Load(), stats.rolledBack.Load(), stats.leaked.Load(), stats.released.Load(),
		stats.recomputes.Load(), stats.reseeds.Load(), stats.checks.Load(),
		promread.Value(t, reg, "scheduler_accounting_records_reconciled_total", "action", "dropped"))
	if !enough() {
		t.Errorf("the test did not exercise enough: %d booked, %d rejected, %d recomputes, %d checks",
			stats.booked.Load(), stats.rejected.Load(), stats.recomputes.Load(), stats.checks.Load())
	}
	if d := promread.Value(t, reg, "scheduler_accounting_records_reconciled_total", "action", "dropped"); d < float64(stats.leaked.Load()) {
		t.Errorf("dropped %v records, want at least the %d leaked", d, stats.leaked.Load())
	}
}

func keyOf(kind string, sh *showFx, j int) string {
	switch kind {
	case "sub":
		return publisher.SubKey(sh.id, sh.alloc)
	case "folder":
		return publisher.FolderKey(sh.folder)
	case "job":
		return publisher.JobKey(sh.jobs[j].id)
	}
	panic(kind)
}
