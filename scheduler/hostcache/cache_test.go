package hostcache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/replication"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

func TestStrategiesOrderTheWalk(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(
		hostSpec{id: "small-small", cores: 4, idleCores: 4, memGB: 8, idleMemGB: 8},
		hostSpec{id: "small-big", cores: 4, idleCores: 4, memGB: 32, idleMemGB: 32},
		hostSpec{id: "big-small", cores: 16, idleCores: 16, memGB: 8, idleMemGB: 8},
		hostSpec{id: "big-big", cores: 16, idleCores: 16, memGB: 32, idleMemGB: 32},
		hostSpec{id: "too-small", cores: 1, idleCores: 1, memGB: 64, idleMemGB: 64},
	)
	cases := []struct {
		core, mem bool
		cores     int64 // whole cores
		memGB     int64
		want      string
	}{
		{true, true, 2, 4, "small-small"},
		{true, false, 2, 4, "small-big"},
		{false, true, 2, 4, "big-small"},
		{false, false, 2, 4, "big-big"},
		{true, true, 8, 4, "big-small"},
		{true, false, 8, 4, "big-big"},
		{true, true, 2, 16, "small-big"},
		{false, true, 2, 16, "big-big"},
		{true, true, 32, 1, ""},
		{false, false, 1, 128, ""},
	}
	for _, c := range cases {
		s := HostBookingStrategy{CoreSaturation: c.core, MemorySaturation: c.mem}
		r := req()
		r.Strategy = &s
		r.CoresMin, r.MemMinKB = c.cores*100, c.memGB*gib
		if got := f.first(r); got != c.want {
			t.Errorf("%v for %d cores %d GiB: got %q, want %q", s, c.cores, c.memGB, got, c.want)
		}
	}
	// The configured default is best-fit cores, worst-fit memory.
	if got := f.first(Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}, Profile: Profile{CoresMin: 200, MemMinKB: 4 * gib}}); got != "small-big" {
		t.Fatalf("default strategy chose %q", got)
	}
	// Draining with worst-fit on both takes the largest first.
	s := HostBookingStrategy{}
	r := req()
	r.Strategy = &s
	if got := f.drain(r); !slices.Equal(got, []string{"big-big", "big-small", "small-big", "small-small", "too-small"}) {
		t.Fatalf("worst-fit drain order %v", got)
	}
}

func TestGates(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(
		hostSpec{id: "rhel", cores: 8, idleCores: 8, memGB: 16, idleMemGB: 16, os: "rhel9"},
		hostSpec{id: "rocky-all", cores: 8, idleCores: 8, memGB: 16, idleMemGB: 16, os: "rocky9", threadMode: 1},
		hostSpec{id: "gpu", cores: 8, idleCores: 8, memGB: 16, idleMemGB: 16, os: "rocky9", gpus: 2, gpuMemGB: 16, gpuFree: 4},
	)
	type tc struct {
		name string
		p    Profile
		want []string
	}
	for _, c := range []tc{
		{"any os, not threadable", Profile{CoresMin: 100}, []string{"gpu", "rhel"}},
		{"threadable may use thread mode ALL", Profile{CoresMin: 100, Threadable: true}, []string{"gpu", "rhel", "rocky-all"}},
		{"os must match exactly", Profile{CoresMin: 100, OS: "rocky9", Threadable: true}, []string{"gpu", "rocky-all"}},
		{"os is case sensitive", Profile{CoresMin: 100, OS: "RHEL9"}, nil},
		{"gpus", Profile{CoresMin: 100, GPUsMin: 1}, []string{"gpu"}},
		{"gpu count", Profile{CoresMin: 100, GPUsMin: 3}, nil},
		{"gpu memory is least(host idle, host_stat free)", Profile{CoresMin: 100, GPUsMin: 1, GPUMemMinKB: 8 * gib}, nil},
		{"gpu memory fits", Profile{CoresMin: 100, GPUsMin: 1, GPUMemMinKB: 4 * gib}, []string{"gpu"}},
		{"fractional cores", Profile{CoresMin: 801}, nil},
		{"memory floor", Profile{CoresMin: 100, MemMinKB: 16*gib + 1}, nil},
	} {
		r := req()
		r.Profile = c.p
		got := f.drain(r)
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
	// Accept is the caller's extra validation.
	r := req()
	r.Accept = func(h Host) bool { return h.Name == "name-rhel" }
	if got := f.drain(r); !slices.Equal(got, []string{"rhel"}) {
		t.Fatalf("Accept: %v", got)
	}
	// The values a checkout sees.
	h, err := f.c.Checkout(context.Background(), Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"},
		Profile: Profile{CoresMin: 100, GPUsMin: 1}})
	if err != nil {
		t.Fatal(err)
	}
	want := Host{Host: sizing.Host{ID: "gpu", Name: "name-gpu", AllocID: allocA, OS: "rocky9",
		TotalCores: 800, IdleCores: 800, TotalMemKB: 16 * gib, IdleMemKB: 16 * gib, IdleGPUs: 2, IdleGPUMemKB: 4 * gib},
		AllocName: "a.a", FacilityID: facA, TotalGPUs: 2, TotalGPUMemKB: 16 * gib, AllocAvailableCores: 100000 - 500}
	h.LastPing, h.LSN, h.Version = time.Time{}, 0, 0
	if h != want {
		t.Fatalf("checked out %+v\nwant          %+v", h, want)
	}
}

func TestEligibilityFollowsTheWAL(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 16, idleMemGB: 16, tags: []string{"general", "fx"}})
	avail := func(tag string) bool { return f.first(req(tag)) == "h1" }
	step := func(name string, want bool, tag string, cs ...replication.Change) {
		t.Helper()
		f.mustCommit(cs...)
		if got := avail(tag); got != want {
			t.Fatalf("%s: available via %q = %v, want %v", name, tag, got, want)
		}
	}
	step("initial", true, "general")
	step("locked", false, "general", f.upd("host", "h1", map[string]any{"str_lock_state": "LOCKED"}))
	step("unlocked", true, "general", f.upd("host", "h1", map[string]any{"str_lock_state": "OPEN"}))
	step("nimby", false, "general", f.upd("host", "h1", map[string]any{"str_lock_state": "NIMBY_LOCKED"}))
	step("open", true, "general", f.upd("host", "h1", map[string]any{"str_lock_state": "OPEN"}))
	step("down", false, "general", f.upd("host_stat", "st-h1", map[string]any{"str_state": "DOWN"}))
	step("up", true, "general", f.upd("host_stat", "st-h1", map[string]any{"str_state": "UP"}))
	step("repair", false, "general", f.upd("host_stat", "st-h1", map[string]any{"str_state": "REPAIR"}))
	step("up again", true, "fx", f.upd("host_stat", "st-h1", map[string]any{"str_state": "UP"}))
	step("tag removed", false, "fx", f.del("host_tag", "tag-h1-fx"))
	step("other tag stays", true, "general")
	step("tag renamed", true, "comp", f.upd("host_tag", "tag-h1-general", map[string]any{"str_tag": "comp"}))
	step("old tag gone", false, "general")
	step("moved to an unsubscribed alloc", false, "comp", f.upd("host", "h1", map[string]any{"pk_alloc": allocB}))
	step("subscribed", true, "comp", f.ins("subscription", map[string]any{"pk_subscription": "sub-sb", "pk_alloc": allocB, "pk_show": showS, "int_burst": int64(1), "int_cores": int64(0)}))
	step("unsubscribed", false, "comp", f.del("subscription", "sub-sb"))
	step("moved to another facility's alloc", false, "comp", f.upd("host", "h1", map[string]any{"pk_alloc": allocC}))
	if got := f.first(Request{FacilityID: facB, ShowID: showS, Tags: []string{"comp"}, Profile: Profile{CoresMin: 100}}); got != "h1" {
		t.Fatalf("host not found in facility B: %q", got)
	}
	step("alloc moved back to facility A", true, "comp", f.upd("alloc", allocC, map[string]any{"pk_facility": facA}))
	step("alloc deleted", false, "comp", f.del("alloc", allocC))
	step("alloc back, host back", true, "comp", f.ins("alloc", map[string]any{"pk_alloc": allocC, "str_name": "b.c", "pk_facility": facA, "str_tag": "c"}))
	step("host_stat deleted", false, "comp", f.del("host_stat", "st-h1"))
	f.mustCommit(f.hostChanges(hostSpec{id: "h2", alloc: allocC, cores: 2, idleCores: 2, memGB: 4, idleMemGB: 4, tags: []string{"comp"}})...)
	if got := f.first(req("comp")); got != "h2" {
		t.Fatalf("added host not offered: %q", got)
	}
	step("host deleted", false, "comp", f.del("host", "h2"), f.del("host_stat", "st-h2"), f.del("host_tag", "tag-h2-comp"))
	// The other show has no subscription anywhere.
	if got := f.first(Request{FacilityID: facA, ShowID: showT, Tags: []string{"comp"}, Profile: Profile{CoresMin: 100}}); got != "" {
		t.Fatalf("unsubscribed show got %q", got)
	}
}

func TestIdleValuesRebucketAndToastIsKept(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 16, idleMemGB: 16, freeMemGB: 12})
	check := func(cores, memKB int64) {
		t.Helper()
		h, indexed, ok := f.c.Lookup("h1", showS)
		if !ok || !indexed || h.IdleCores != cores || h.IdleMemKB != memKB {
			t.Fatalf("h1 = %d centicores %d KB (indexed %v), want %d %d", h.IdleCores, h.IdleMemKB, indexed, cores, memKB)
		}
	}
	f.first(req())     // build the group
	check(800, 12*gib) // least(host idle 16, host_stat free 12)
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_cores_idle": int64(250), "int_mem_idle": 3 * gib}))
	check(250, 3*gib)
	r := req()
	r.CoresMin = 300
	if got := f.first(r); got != "" {
		t.Fatalf("a 2.5-core host served 3 cores")
	}
	// An unchanged TOAST value leaves the cached value alone.
	f.mustCommit(f.upd("host", "h1", map[string]any{"str_name": unchanged, "int_cores_idle": int64(400)}))
	check(400, 3*gib)
	if h, _, _ := f.c.Lookup("h1", showS); h.Name != "name-h1" {
		t.Fatalf("name after unchanged-toast update = %q", h.Name)
	}
	f.mustCommit(f.upd("host_stat", "st-h1", map[string]any{"int_mem_free": 1 * gib}))
	check(400, 1*gib)
}

func TestTruncateAsksForResync(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 16, idleMemGB: 16})
	err := f.commit(f.truncate("host_tag"))
	if !errors.Is(err, replication.ErrResync) {
		t.Fatalf("TRUNCATE: %v", err)
	}
	f.snapshot() // what the stream does next
	if got := f.first(req()); got != "" {
		t.Fatalf("host without tags still offered after the truncate resync")
	}
	f.checkInvariants()
}

// The ordering rule between a check-in and the WAL.
func TestCheckinOrderingWithTheWAL(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	f := newFarm(t, Config{AssumeTTL: 10 * time.Second}, Options{Now: now})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32})
	ctx := context.Background()
	checkout := func() Host {
		t.Helper()
		h, err := f.c.Checkout(ctx, req())
		if err != nil || h.ID != "h1" {
			t.Fatalf("checkout: %v %v", h.ID, err)
		}
		if _, err := f.c.Checkout(ctx, req()); !errors.Is(err, ErrNoCandidate) {
			t.Fatalf("a checked-out host was handed out twice: %v", err)
		}
		return h
	}
	idleOf := func() (int64, int64) {
		t.Helper()
		h, indexed, _ := f.c.Lookup("h1", showS)
		if !indexed {
			t.Fatalf("h1 not indexed")
		}
		return h.IdleCores, h.IdleMemKB
	}
	booking := func(cores, memKB int64) replication.Change {
		return f.upd("host", "h1", map[string]any{"int_cores_idle": cores, "int_mem_idle": memKB})
	}
	assumed := func() int { return f.c.Stats().Assumed }

	// 1. Nothing booked: the WAL state stands, nothing assumed.
	h := checkout()
	f.c.Checkin(h.Host)
	if assumed() != 0 {
		t.Fatal("unchanged check-in created an assumption")
	}

	// 2. Check-in before the WAL: the values are assumed, then confirmed.
	checkout()
	f.c.Checkin(sizing.Host{ID: "h1", IdleCores: 600, IdleMemKB: 28 * gib})
	if c, m := idleOf(); c != 600 || m != 28*gib || assumed() != 1 {
		t.Fatalf("assumed values not used: %d %d (%d assumed)", c, m, assumed())
	}
	// An older transaction (committed before the booking) arrives first
	// with more idle memory: the assumption still caps it.
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_mem_idle": 30 * gib}))
	if c, m := idleOf(); c != 600 || m != 28*gib {
		t.Fatalf("older WAL state resurrected idle resources: %d %d", c, m)
	}
	f.mustCommit(booking(600, 28*gib)) // the booking itself
	if assumed() != 0 {
		t.Fatal("booking in the WAL did not confirm the assumption")
	}
	// Later WAL changes win: a release frees cores.
	f.mustCommit(booking(800, 32*gib))
	if c, m := idleOf(); c != 800 || m != 32*gib {
		t.Fatalf("after the release: %d %d", c, m)
	}

	// 3. The WAL delivers the booking and a newer release before the
	// check-in: the stale check-in must not overwrite them.
	checkout()
	f.mustCommit(booking(400, 24*gib)) // our booking
	f.mustCommit(booking(700, 30*gib)) // a release after it
	f.c.Checkin(sizing.Host{ID: "h1", IdleCores: 400, IdleMemKB: 24 * gib})
	if c, m := idleOf(); c != 700 || m != 30*gib || assumed() != 0 {
		t.Fatalf("stale check-in overwrote newer WAL state: %d %d (%d assumed)", c, m, assumed())
	}

	// 4. A check-in never confirmed is forgotten after AssumeTTL.
	checkout()
	f.c.Checkin(sizing.Host{ID: "h1", IdleCores: 100, IdleMemKB: 1 * gib})
	if c, _ := idleOf(); c != 100 {
		t.Fatalf("assumed cores %d", c)
	}
	advance(5 * time.Second)
	f.c.sweep(now())
	if c, _ := idleOf(); c != 100 {
		t.Fatal("assumption forgotten early")
	}
	advance(6 * time.Second)
	f.c.sweep(now())
	if c, m := idleOf(); c != 700 || m != 30*gib || assumed() != 0 {
		t.Fatalf("after AssumeTTL: %d %d (%d assumed)", c, m, assumed())
	}
	f.checkInvariants()

	// 5. Eligibility changes while checked out are not undone by the check-in.
	for _, c := range []struct {
		name   string
		change func() []replication.Change
		undo   func() []replication.Change
	}{
		{"locked", func() []replication.Change {
			return []replication.Change{f.upd("host", "h1", map[string]any{"str_lock_state": "LOCKED"})}
		}, func() []replication.Change {
			return []replication.Change{f.upd("host", "h1", map[string]any{"str_lock_state": "OPEN"})}
		}},
		{"down", func() []replication.Change {
			return []replication.Change{f.upd("host_stat", "st-h1", map[string]any{"str_state": "DOWN"})}
		}, func() []replication.Change {
			return []replication.Change{f.upd("host_stat", "st-h1", map[string]any{"str_state": "UP"})}
		}},
		{"re-tagged", func() []replication.Change {
			return []replication.Change{f.upd("host_tag", "tag-h1-general", map[string]any{"str_tag": "other"})}
		}, func() []replication.Change {
			return []replication.Change{f.upd("host_tag", "tag-h1-general", map[string]any{"str_tag": "general"})}
		}},
		{"deleted", func() []replication.Change {
			return []replication.Change{f.del("host", "h1"), f.del("host_stat", "st-h1"), f.del("host_tag", "tag-h1-general")}
		}, func() []replication.Change {
			return f.hostChanges(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32})
		}},
	} {
		checkout()
		f.mustCommit(c.change()...)
		f.c.Checkin(sizing.Host{ID: "h1", IdleCores: 800, IdleMemKB: 32 * gib})
		if _, indexed, _ := f.c.Lookup("h1", showS); indexed {
			t.Fatalf("%s while checked out: the check-in re-indexed it", c.name)
		}
		f.mustCommit(c.undo()...)
		if got := f.first(req()); got != "h1" {
			t.Fatalf("%s undone: host not back", c.name)
		}
	}

	// 6. Deleted and re-created while checked out: still exclusive.
	checkout()
	f.mustCommit(f.del("host", "h1"), f.del("host_stat", "st-h1"), f.del("host_tag", "tag-h1-general"))
	f.mustCommit(f.hostChanges(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32})...)
	if got := f.first(req()); got != "" {
		t.Fatalf("re-created host handed out while its predecessor is checked out")
	}
	f.c.Checkin(sizing.Host{ID: "h1", IdleCores: 800, IdleMemKB: 32 * gib})
	if got := f.first(req()); got != "h1" {
		t.Fatalf("re-created host not back after check-in")
	}
	f.checkInvariants()
}

func TestGroupEvictionAndLeakedLeases(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	reg := prometheus.NewRegistry()
	f := newFarm(t, Config{GroupIdleTimeout: time.Hour, LeaseTimeout: time.Minute}, Options{Now: now, Registerer: reg})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32, tags: []string{"general", "fx"}},
		hostSpec{id: "h2", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32, tags: []string{"general"}})
	f.first(req("general"))
	f.first(req("fx"))
	if s := f.c.Stats(); s.Groups != 2 {
		t.Fatalf("groups = %d", s.Groups)
	}
	advance(40 * time.Minute)
	f.first(req("general"))
	advance(30 * time.Minute)
	f.c.sweep(now())
	if s := f.c.Stats(); s.Groups != 1 {
		t.Fatalf("after 70 min: groups = %d, want the fx group evicted", s.Groups)
	}
	f.checkInvariants()
	if got := f.first(req("fx")); got != "h1" { // rebuilt from memory
		t.Fatalf("evicted group rebuilt wrong: %q", got)
	}
	// A leaked checkout comes back after LeaseTimeout.
	h, err := f.c.Checkout(context.Background(), req("fx"))
	if err != nil {
		t.Fatal(err)
	}
	advance(2 * time.Minute)
	f.c.sweep(now())
	if _, indexed, _ := f.c.Lookup(h.ID, showS); !indexed {
		t.Fatal("leaked lease not returned")
	}
	f.c.Checkin(sizing.Host{ID: h.ID}) // the late holder's check-in is ignored
	if got, _, _ := f.c.Lookup(h.ID, showS); got.IdleCores != 800 {
		t.Fatalf("late check-in applied: %+v", got)
	}
	if v := promread.Value(t, reg, "scheduler_host_cache_lease_expired_total"); v != 1 {
		t.Fatalf("lease_expired_total = %v", v)
	}
	if v := promread.Value(t, reg, "scheduler_host_cache_hits_total"); v < 4 {
		t.Fatalf("hits_total = %v", v)
	}
	f.first(req("nope"))
	if v := promread.Value(t, reg, "scheduler_host_cache_misses_total"); v != 1 {
		t.Fatalf("misses_total = %v", v)
	}
	if v := promread.Value(t, reg, "scheduler_host_cache_size"); v != 2 {
		t.Fatalf("size = %v", v)
	}
}

// Many goroutines check out and in while WAL transactions change the hosts
// (idle values, locks, tags): no host is ever held by two callers and the
// index never holds a host under stale buckets.
func TestConcurrentCheckoutsWithWALUpdates(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{MemoryKeyDivisor: 1 << 30}, Options{})
	const nHosts = 60
	var specs []hostSpec
	for i := range nHosts {
		specs = append(specs, hostSpec{id: fmt.Sprintf("h%02d", i), cores: 16, idleCores: int64(1 + i%16), memGB: 64,
			idleMemGB: int64(1 + i%64), tags: []string{"general", []string{"fx", "comp"}[i%2]}})
	}
	f.addHosts(specs...)
	holders := make([]atomic.Int32, nHosts)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	var checkouts atomic.Int64
	var violations atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil {
				r := req([]string{"general", "fx", "comp"}[rng.IntN(3)])
				r.CoresMin = int64(rng.IntN(4)+1) * 100
				r.MemMinKB = int64(rng.IntN(8)) * gib
				s := HostBookingStrategy{rng.IntN(2) == 0, rng.IntN(2) == 0}
				r.Strategy = &s
				h, err := f.c.Checkout(context.Background(), r)
				if err != nil {
					continue
				}
				checkouts.Add(1)
				var idx int
				fmt.Sscanf(h.ID, "h%02d", &idx)
				if holders[idx].Add(1) != 1 {
					violations.Add(1)
				}
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				holders[idx].Add(-1)
				if rng.IntN(2) == 0 {
					f.c.Release(h.ID)
				} else {
					f.c.Checkin(sizing.Host{ID: h.ID, IdleCores: h.IdleCores - 100, IdleMemKB: h.IdleMemKB - gib})
				}
			}
		}()
	}
	wg.Add(1)
	var walTxns int
	go func() { // the WAL (the farm is single-threaded: only this goroutine commits)
		defer wg.Done()
		rng := rand.New(rand.NewPCG(99, 1))
		for ctx.Err() == nil {
			id := fmt.Sprintf("h%02d", rng.IntN(nHosts))
			var c replication.Change
			switch rng.IntN(4) {
			case 0:
				c = f.upd("host", id, map[string]any{"str_lock_state": []string{"OPEN", "LOCKED"}[rng.IntN(2)]})
			case 1:
				c = f.upd("host_stat", "st-"+id, map[string]any{"int_mem_free": int64(rng.IntN(64)) * gib})
			default:
				c = f.upd("host", id, map[string]any{"int_cores_idle": int64(rng.IntN(17)) * 100, "int_mem_idle": int64(rng.IntN(65)) * gib})
			}
			if err := f.commit(c); err != nil {
				t.Error(err)
				return
			}
			walTxns++
			if walTxns%50 == 0 {
				if err := f.c.checkInvariants(); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	wg.Wait()
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d times a host was held by two callers", v)
	}
	if checkouts.Load() < 100 || walTxns < 100 {
		t.Fatalf("too little concurrency to mean anything: %d checkouts, %d WAL transactions", checkouts.Load(), walTxns)
	}
	f.checkInvariants()
	t.Logf("%d checkouts, %d WAL transactions", checkouts.Load(), walTxns)
}

func TestConfigFrom(t *testing.T) {
	c := config.Default()
	c.Database.URL = "postgres://x@h/db"
	c.HostCache.MemoryKeyDivisor = config.GiB
	c.Queue.HostBookingStrategy.MemorySaturation = true
	got := ConfigFrom(c)
	if got.ConnString != c.Database.URL || got.MemoryKeyDivisor != 1<<30 || got.GroupIdleTimeout != 3*time.Hour ||
		got.Publication != "cuesched_hostcache" || *got.Strategy != (HostBookingStrategy{true, true}) {
		t.Fatalf("ConfigFrom = %+v (strategy %v)", got, *got.Strategy)
	}
	if got.Placement == nil || *got.Placement != DefaultPlacement() || got.WarmFrames != 8 {
		t.Fatalf("default placement: %+v, warm frames %d", got.Placement, got.WarmFrames)
	}
	c.Queue.Placement = config.PlacementBestFit
	if got := ConfigFrom(c); got.Placement != nil || *got.Strategy != (HostBookingStrategy{true, true}) {
		t.Fatalf("best_fit: placement %+v strategy %v, want round 1's walk", got.Placement, *got.Strategy)
	}
	c.Queue.Placement = config.PlacementWorstFit
	if got := ConfigFrom(c); got.Placement != nil || *got.Strategy != (HostBookingStrategy{}) {
		t.Fatalf("worst_fit: placement %+v strategy %v", got.Placement, *got.Strategy)
	}
	c.Queue.Placement = config.PlacementEPVM
	c.Queue.Locality.Enabled = false
	c.Queue.PlacementWeights.GPUs = 2
	if got := ConfigFrom(c); got.Placement == nil || got.Placement.Locality || got.Placement.Weights.GPUs != 2 {
		t.Fatalf("epvm without locality: %+v", got.Placement)
	}
	if _, err := New(Config{ConnString: "x", Placement: &Placement{Candidates: 4}}, Options{}); err == nil {
		t.Fatal("placement weights all zero were accepted")
	}
	if _, err := New(Config{ConnString: "x", MemoryKeyDivisor: 1000}, Options{}); err == nil {
		t.Fatal("a memory divisor below 1 MiB was accepted")
	}
	if _, err := New(Config{ConnString: "x", SlotName: "Bad"}, Options{}); err == nil {
		t.Fatal("a bad slot name was accepted")
	}
}

// A recompute rewrites the subscription's booked cores (and, for an
// instant, its burst) on every pass: nothing indexed depends on them, so no
// host of the allocation is re-indexed, while a checkout still reads the new
// headroom. A change of the subscription's show or allocation re-indexes.
func TestSubscriptionTotalsDoNotReindex(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 16, idleMemGB: 16},
		hostSpec{id: "h2", cores: 8, idleCores: 8, memGB: 16, idleMemGB: 16})
	version := func() uint64 {
		f.c.mu.Lock()
		defer f.c.mu.Unlock()
		return f.c.st.hosts["h1"].version + f.c.st.hosts["h2"].version
	}
	before := version()
	f.mustCommit(f.upd("subscription", "sub-sa", map[string]any{"int_cores": int64(700), "int_burst": int64(-100001)}),
		f.upd("subscription", "sub-sa", map[string]any{"int_burst": int64(90000)}))
	if got := version(); got != before {
		t.Fatalf("host versions moved %d -> %d on a subscription totals update", before, got)
	}
	h, err := f.c.Checkout(context.Background(), req())
	if err != nil {
		t.Fatal(err)
	}
	f.c.Checkin(h.Host)
	if h.AllocAvailableCores != 90000-700 {
		t.Fatalf("headroom %d, want %d", h.AllocAvailableCores, 90000-700)
	}
	// Moving the subscription to another allocation does re-index.
	f.mustCommit(f.upd("subscription", "sub-sa", map[string]any{"pk_alloc": allocB}))
	if got := version(); got == before {
		t.Fatal("a subscription moved to another allocation re-indexed nothing")
	}
	if got := f.first(req()); got != "" {
		t.Fatalf("host %q still offered to a show no longer subscribed to its allocation", got)
	}
}
