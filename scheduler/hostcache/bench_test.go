package hostcache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/replication"
)

// benchFarm loads n heterogeneous hosts (8–64 cores, 16–256 GiB, partly
// booked, three tags each) through the replication Apply path.
func benchFarm(b *testing.B, n int) *farm {
	b.Helper()
	f := newFarm(b, Config{}, Options{})
	rng := rand.New(rand.NewPCG(uint64(n), 42))
	const batch = 2000
	var cs []replication.Change
	for i := range n {
		cores := int64(8 << rng.IntN(4))  // 8, 16, 32, 64
		memGB := int64(16 << rng.IntN(5)) // 16 .. 256
		cs = append(cs, f.hostChanges(hostSpec{
			id: fmt.Sprintf("host-%06d", i), cores: cores, idleCores: rng.Int64N(cores + 1), memGB: memGB,
			idleMemGB: rng.Int64N(memGB + 1), tags: []string{"general", fmt.Sprintf("rack%d", i%20), "linux"},
		})...)
		if len(cs) >= batch {
			f.mustCommitFast(cs...)
			cs = cs[:0]
		}
	}
	if len(cs) > 0 {
		f.mustCommitFast(cs...)
	}
	return f
}

// mustCommitFast skips the invariant walk (O(n) per call).
func (f *farm) mustCommitFast(changes ...replication.Change) {
	f.t.Helper()
	if err := f.commit(changes...); err != nil {
		f.t.Fatal(err)
	}
}

type benchReq struct{ cores, memKB int64 }

// timeCheckouts times one checkout and release per iteration of r sized by
// reqs in turn (the cluster's group built before the timing), reports the
// miss rate and returns ns per iteration.
func timeCheckouts(ctx context.Context, b *testing.B, c *Cache, r Request, reqs []benchReq) float64 {
	if h, err := c.Checkout(ctx, r); err == nil {
		c.Release(h.ID)
	}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	misses := 0
	for i := 0; i < b.N; i++ {
		q := reqs[i%len(reqs)]
		r.CoresMin, r.MemMinKB = q.cores, q.memKB
		h, err := c.Checkout(ctx, r)
		if err != nil {
			misses++
			continue
		}
		c.Release(h.ID)
	}
	b.ReportMetric(float64(misses)/float64(b.N), "miss-rate")
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

func benchRequests() []benchReq {
	rng := rand.New(rand.NewPCG(7, 7))
	out := make([]benchReq, 1024)
	for i := range out {
		out[i] = benchReq{cores: (rng.Int64N(8) + 1) * 100, memKB: (rng.Int64N(16) + 1) * gib}
	}
	return out
}

// linearCheckout is the baseline: a plain scan of the group's hosts that
// makes the same choice as the index (same eligibility, gates and strategy
// order: core bucket, then memory bucket per the saturation flags, then
// creation order), and marks the winner as held.
type linearCache struct {
	mu    sync.Mutex
	c     *Cache
	hosts []*hostRec
	held  map[*hostRec]bool
}

func newLinear(c *Cache, key ClusterKey) *linearCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := &linearCache{c: c, held: map[*hostRec]bool{}}
	for _, h := range c.st.hosts {
		if fac, ok := c.eligibleLocked(h); ok && fac == key.FacilityID && slices.Contains(h.tags, key.Tag) &&
			c.st.subsByAlloc[h.allocID][key.ShowID] != nil {
			l.hosts = append(l.hosts, h)
		}
	}
	slices.SortFunc(l.hosts, func(a, b *hostRec) int { return int(a.seq) - int(b.seq) })
	return l
}

func (l *linearCache) checkout(r Request, s HostBookingStrategy) *hostRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	var best *hostRec
	var bc, bm uint32
	for _, h := range l.hosts {
		if l.held[h] {
			continue
		}
		v := l.c.effective(h)
		if v.cores < r.CoresMin || v.memKB < r.MemMinKB || v.gpus < r.GPUsMin || v.gpuMemKB < r.GPUMemMinKB {
			continue
		}
		if (r.OS != "" && h.stat.os != r.OS) || (h.threadMode == 1 && !r.Threadable) {
			continue
		}
		c, m := l.c.coreKey(v.cores), l.c.memKey(v.memKB)
		if best != nil {
			better := false
			switch {
			case c != bc:
				better = (c < bc) == s.CoreSaturation
			case m != bm:
				better = (m < bm) == s.MemorySaturation
			}
			if !better {
				continue
			}
		}
		best, bc, bm = h, c, m
	}
	if best != nil {
		l.held[best] = true
	}
	return best
}

func (l *linearCache) checkin(h *hostRec) {
	l.mu.Lock()
	delete(l.held, h)
	l.mu.Unlock()
}

// BenchmarkCheckout measures one checkout plus its check-in through the
// B-tree index at 1k, 10k and 100k hosts in the group, next to a linear scan
// making the same choice; the linear line reports how many times slower the
// scan is (x-vs-linear-ratio).
func BenchmarkCheckout(b *testing.B) {
	reqs := benchRequests()
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			f := benchFarm(b, n)
			f.rows = nil // the harness's copy of the rows is not part of the cache
			ctx := context.Background()
			strategy := DefaultStrategy()
			key := ClusterKey{FacilityID: facA, ShowID: showS, Tag: "general"}
			var btreeNs float64
			b.Run("btree", func(b *testing.B) {
				r := Request{FacilityID: key.FacilityID, ShowID: key.ShowID, Tags: []string{key.Tag}}
				btreeNs = timeCheckouts(ctx, b, f.c, r, reqs)
			})
			b.Run("linear", func(b *testing.B) {
				l := newLinear(f.c, key)
				if len(l.hosts) != n {
					b.Fatalf("linear baseline sees %d hosts, want %d", len(l.hosts), n)
				}
				runtime.GC()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					q := reqs[i%len(reqs)]
					if h := l.checkout(Request{Profile: Profile{CoresMin: q.cores, MemMinKB: q.memKB}}, strategy); h != nil {
						l.checkin(h)
					}
				}
				linearNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
				if btreeNs > 0 {
					b.ReportMetric(linearNs/btreeNs, "x-vs-linear-ratio")
				}
			})
		})
	}
}

// TestLinearBaselineAgreesWithIndex keeps the benchmark honest: the scan and
// the index choose hosts from the same bucket for every request and
// strategy.
func TestLinearBaselineAgreesWithIndex(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	rng := rand.New(rand.NewPCG(3, 3))
	var cs []replication.Change
	for i := range 500 {
		cores := int64(8 << rng.IntN(4))
		memGB := int64(16 << rng.IntN(5))
		cs = append(cs, f.hostChanges(hostSpec{id: fmt.Sprintf("host-%04d", i), cores: cores, idleCores: rng.Int64N(cores + 1),
			memGB: memGB, idleMemGB: rng.Int64N(memGB + 1)})...)
	}
	f.mustCommit(cs...)
	key := ClusterKey{FacilityID: facA, ShowID: showS, Tag: "general"}
	f.first(req())
	l := newLinear(f.c, key)
	for _, q := range benchRequests()[:200] {
		for _, s := range []HostBookingStrategy{{true, true}, {true, false}, {false, true}, {false, false}} {
			r := Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}, Profile: Profile{CoresMin: q.cores, MemMinKB: q.memKB}, Strategy: &s}
			h, err := f.c.Checkout(context.Background(), r)
			lh := l.checkout(r, s)
			if (err != nil) != (lh == nil) {
				t.Fatalf("index err %v, linear %v", err, lh)
			}
			if lh == nil {
				continue
			}
			v := f.c.effective(lh)
			if got, want := [2]uint32{f.c.coreKey(h.IdleCores), f.c.memKey(h.IdleMemKB)}, [2]uint32{f.c.coreKey(v.cores), f.c.memKey(v.memKB)}; got != want {
				t.Fatalf("%v for %+v: index chose bucket %v, scan %v", s, q, got, want)
			}
			f.c.Release(h.ID)
			l.checkin(lh)
		}
	}
}

// BenchmarkBytesPerHost reports the heap the cache holds per host: the
// mirror alone, and the mirror plus one group's index entry.
func BenchmarkBytesPerHost(b *testing.B) {
	const n = 100000
	for i := 0; i < b.N; i++ {
		var m0, m1, m2 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		f := benchFarm(b, n)
		f.rows = nil
		runtime.GC()
		runtime.ReadMemStats(&m1)
		f.first(Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}})
		runtime.GC()
		runtime.ReadMemStats(&m2)
		b.ReportMetric(float64(m1.HeapAlloc-m0.HeapAlloc)/n, "bytes/host")
		b.ReportMetric(float64(m2.HeapAlloc-m1.HeapAlloc)/n, "index-bytes/host")
		runtime.KeepAlive(f)
	}
}

// BenchmarkFreshness measures host UPDATE commit → visible in the cache
// against real Postgres, over 1000 updates per iteration (p50/p99/max).
// The clock starts before the UPDATE is sent, so the numbers include the
// client round trip and the commit: an upper bound. The writing session uses
// synchronous_commit=on (Cuebot's default): the walsender only sends WAL
// that is flushed, and the test cluster's global synchronous_commit=off
// would add up to wal_writer_delay (200 ms) to every change.
func BenchmarkFreshness(b *testing.B) {
	e := startPG(b, Config{}, func(e *pgEnv) { e.addHost("fresh", seedAllocGeneral, 64, 64, "general") })
	ctx := context.Background()
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range 1000 {
			want := int64(100 * (1 + (i*1000+j)%60))
			ch := e.c.Changed()
			start := time.Now()
			if _, err := e.pool.Exec(ctx, `UPDATE host SET int_cores_idle = $1 WHERE pk_host = 'fresh'`, want); err != nil {
				b.Fatal(err)
			}
			for {
				if h, _, _ := e.c.Lookup("fresh", seedShowTesting); h.IdleCores == want {
					break
				}
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
					b.Fatalf("update %d not visible after 5s", j)
				}
				ch = e.c.Changed()
			}
			lat = append(lat, time.Since(start))
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(1), "max-ms")
	b.ReportMetric(float64(len(lat)), "updates")
}
