package hostcache

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

// miss checks out r, expects no candidate, and returns the miss's watch.
func (f *farm) miss(r Request) Watch {
	f.t.Helper()
	h, err := f.c.Checkout(context.Background(), r)
	if err == nil {
		f.t.Fatalf("checkout of %v found %s, want no candidate", r.Tags, h.ID)
	}
	var nc *NoCandidateError
	if !errors.As(err, &nc) || !errors.Is(err, ErrNoCandidate) {
		f.t.Fatalf("miss error %T %v is not a *NoCandidateError matching ErrNoCandidate", err, err)
	}
	return nc.Watch
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A layer that missed is woken by exactly the capacity changes that may fit
// it, in its own group: a release on its host (WAL), a host coming back
// from a checkout with room, a host becoming bookable. Changes that cannot
// fit it, and changes in other groups, leave its watch alone.
func TestCapacityWatchMovesOnRelevantGains(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	f := newFarm(t, Config{}, Options{Registerer: reg})
	f.addHosts(
		hostSpec{id: "g1", cores: 8, idleCores: 1, memGB: 32, idleMemGB: 32, tags: []string{"general"}},
		hostSpec{id: "fx1", cores: 8, idleCores: 0, memGB: 32, idleMemGB: 32, tags: []string{"fx"}},
	)
	four := req("general")
	four.CoresMin = 400
	fxFour := req("fx")
	fxFour.CoresMin = 400
	w := f.miss(four)
	fxw := f.miss(fxFour)
	wake := f.c.CapacityChanged()
	if w.Moved() || fxw.Moved() || closed(wake) {
		t.Fatal("watches moved without a change")
	}
	// Other groups and changes that cannot fit four cores stay silent.
	f.mustCommit(f.upd("host", "fx1", map[string]any{"int_cores_idle": int64(200)})) // fx: +2 cores, still < 4
	f.mustCommit(f.upd("host", "g1", map[string]any{"int_cores_idle": int64(300)}))  // general: +2 cores, still < 4
	f.mustCommit(f.upd("host_stat", "st-g1", map[string]any{"int_mem_free": 40 * gib}))
	if w.Moved() || fxw.Moved() || closed(wake) {
		t.Fatalf("moved on gains that fit no waiter: general %v fx %v chan %v", w.Moved(), fxw.Moved(), closed(wake))
	}
	// A release that makes g1 fit four cores moves the general watch only.
	f.mustCommit(f.upd("host", "g1", map[string]any{"int_cores_idle": int64(500)}))
	if !w.Moved() || fxw.Moved() || !closed(wake) {
		t.Fatalf("after a fitting release: general moved %v (want true), fx moved %v (want false), chan closed %v",
			w.Moved(), fxw.Moved(), closed(wake))
	}
	if v := promread.Value(t, reg, "scheduler_host_cache_capacity_wakeups_total"); v != 1 {
		t.Fatalf("capacity_wakeups_total = %v, want 1", v)
	}
	// The bump forgot the floors: a further gain wakes nobody until
	// someone misses again.
	w2 := f.c.Watch(facA, showS, []string{"general", "fx"})
	f.mustCommit(f.upd("host", "g1", map[string]any{"int_cores_idle": int64(100)}))
	f.mustCommit(f.upd("host", "g1", map[string]any{"int_cores_idle": int64(800)}))
	if w2.Moved() {
		t.Fatal("a gain with no waiter moved the cluster watch")
	}
	// The fx waiter is woken by its own group.
	f.mustCommit(f.upd("host", "fx1", map[string]any{"int_cores_idle": int64(400)}))
	if !fxw.Moved() || !w2.Moved() {
		t.Fatalf("fx release: fx moved %v, cluster watch moved %v", fxw.Moved(), w2.Moved())
	}
}

// The race the checkout causes: a layer misses because the only host is
// checked out by another layer; when that one checks the host in with room
// left, the waiter is woken. A check-in without room for it wakes nobody.
func TestCapacityWatchMovesOnCheckinWithRoom(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32, gpus: 2, gpuMemGB: 24})
	ctx := context.Background()
	gpu := req()
	gpu.GPUsMin, gpu.GPUMemMinKB = 1, 8*gib

	h, err := f.c.Checkout(ctx, gpu) // layer A
	if err != nil {
		t.Fatal(err)
	}
	w := f.miss(gpu) // layer B: the host is out
	// A booked both GPUs: nothing for B.
	f.c.Checkin(sizing.Host{ID: h.ID, IdleCores: 600, IdleMemKB: 32 * gib, IdleGPUs: 0, IdleGPUMemKB: 8 * gib})
	if w.Moved() {
		t.Fatal("a check-in with no GPU left woke a GPU waiter")
	}
	// The booking's row arrives, then a frame ends: one GPU is back.
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_cores_idle": int64(600), "int_gpus_idle": int64(0), "int_gpu_mem_idle": 8 * gib}))
	if w.Moved() {
		t.Fatal("the booking's own WAL row woke the waiter")
	}
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_cores_idle": int64(700), "int_gpus_idle": int64(1), "int_gpu_mem_idle": 16 * gib}))
	if !w.Moved() {
		t.Fatal("a GPU released by the WAL did not wake the GPU waiter")
	}

	// Out again; B misses; A books one GPU and checks the host in with one
	// left: B is woken by the check-in.
	h, err = f.c.Checkout(ctx, gpu)
	if err != nil {
		t.Fatal(err)
	}
	w = f.miss(gpu)
	f.c.Checkin(sizing.Host{ID: h.ID, IdleCores: 600, IdleMemKB: 32 * gib, IdleGPUs: 0, IdleGPUMemKB: 8 * gib}) // took the only GPU
	if w.Moved() {
		t.Fatal("woken by a check-in without a GPU")
	}
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_cores_idle": int64(800), "int_gpus_idle": int64(2), "int_gpu_mem_idle": 24 * gib}))
	// (the assumption of 0 GPUs caps the index until the booking's row comes)
	if w.Moved() {
		t.Fatal("a row older than the check-in woke the waiter through the assumption")
	}
	h, err = f.c.Checkout(ctx, Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}, Profile: Profile{CoresMin: 100}})
	if err != nil {
		t.Fatal(err)
	}
	w = f.miss(gpu)
	// It booked one core and 4 GiB on the row Postgres has now (both GPUs
	// free), which also ends the stale 0-GPU assumption.
	f.c.Checkin(sizing.Host{ID: h.ID, IdleCores: 700, IdleMemKB: 28 * gib, IdleGPUs: 2, IdleGPUMemKB: 24 * gib})
	if !w.Moved() {
		t.Fatal("a check-in leaving a GPU did not wake the GPU waiter")
	}
	f.checkInvariants()
}

// A host that already fitted the waiter's floors when it missed (refused by
// Accept) does not wake it on every ping that raises free memory; a host
// becoming bookable (unlocked, up) does.
func TestCapacityWatchIgnoresPingsAndWakesOnEligibility(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32, freeMemGB: 20},
		hostSpec{id: "h2", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32, lock: "LOCKED"})
	r := req()
	r.MemMinKB = 8 * gib
	r.Accept = func(Host) bool { return false }
	w := f.miss(r)
	for _, free := range []int64{18, 24, 19, 30} {
		f.mustCommit(f.upd("host_stat", "st-h1", map[string]any{"int_mem_free": free * gib, "ts_ping": time.Now()}))
	}
	if w.Moved() {
		t.Fatal("pings of a host that already fitted woke the waiter")
	}
	// A host in thread mode ALL coming up does not wake a non-threadable
	// request; an AUTO host does.
	f.addHosts(hostSpec{id: "h3", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32, threadMode: 1})
	if w.Moved() {
		t.Fatal("a thread-mode ALL host woke a non-threadable request")
	}
	f.mustCommit(f.upd("host", "h2", map[string]any{"str_lock_state": "OPEN"}))
	if !w.Moved() {
		t.Fatal("a host unlocked into the group did not wake the waiter")
	}
}

// Cache.Watch (a sleeping cluster) moves when a group of its tags is
// bumped, when any group is built (a checkout after the watch may build one
// of its groups and miss there), on a re-snapshot and on eviction.
func TestClusterWatch(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	f := newFarm(t, Config{GroupIdleTimeout: time.Hour}, Options{Now: now})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 0, memGB: 32, idleMemGB: 32, tags: []string{"general", "fx"}})
	w := f.c.Watch(facA, showS, []string{"general"})
	miss := f.miss(req("general")) // builds the group
	if !w.Moved() {
		t.Fatal("building a group did not move a watch taken before it")
	}
	w = f.c.Watch(facA, showS, []string{"general"})
	if w.Moved() {
		t.Fatal("fresh watch moved")
	}
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_cores_idle": int64(100)}))
	if !w.Moved() || !miss.Moved() {
		t.Fatalf("release: cluster watch moved %v, miss watch moved %v", w.Moved(), miss.Moved())
	}
	w = f.c.Watch(facA, showS, []string{"general"})
	f.snapshot()
	if !w.Moved() {
		t.Fatal("a re-snapshot did not move the watch")
	}
	w = f.c.Watch(facA, showS, []string{"general"})
	mu.Lock()
	clock = clock.Add(2 * time.Hour)
	mu.Unlock()
	f.c.sweep(now())
	if f.c.Stats().Groups != 0 || !w.Moved() {
		t.Fatalf("eviction: %d groups left, watch moved %v", f.c.Stats().Groups, w.Moved())
	}
	if (Watch{}).Moved() {
		t.Fatal("the zero watch moved")
	}
}

func TestAddWantKeepsTheWeakest(t *testing.T) {
	t.Parallel()
	fl := func(cores, mem, gpus, gpuMem int64) want {
		return want{floor: idle{cores, mem, gpus, gpuMem}, threadable: true}
	}
	g := &group{}
	g.addWant(fl(400, 8, 0, 0))
	g.addWant(fl(800, 16, 0, 0)) // implied by the first: any host fitting it fits {400, 8}
	if !slices.Equal(g.wants, []want{fl(400, 8, 0, 0)}) {
		t.Fatalf("wants %v", g.wants)
	}
	g.addWant(fl(100, 4, 0, 0)) // weaker: replaces
	g.addWant(fl(100, 2, 1, 0)) // incomparable: kept
	if !slices.Equal(g.wants, []want{fl(100, 4, 0, 0), fl(100, 2, 1, 0)}) {
		t.Fatalf("wants %v", g.wants)
	}
	// Gates: a non-threadable or OS-bound request is stricter than a
	// threadable, any-OS one with the same floors.
	strict := want{floor: idle{100, 4, 0, 0}, os: "rocky9"}
	g.addWant(strict)
	if len(g.wants) != 2 {
		t.Fatalf("a stricter request was added: %v", g.wants)
	}
	g2 := &group{}
	g2.addWant(strict)
	if g2.gained(idle{800, 8, 0, 0}, idle{}, []string{"rhel9"}, false, true) ||
		g2.gained(idle{800, 8, 0, 0}, idle{}, []string{"rocky9"}, true, true) ||
		g2.gained(idle{800, 8, 0, 0}, idle{}, nil, false, true) {
		t.Fatal("a host the gates refuse would wake the request")
	}
	if !g2.gained(idle{800, 8, 0, 0}, idle{}, []string{"rocky9"}, false, true) {
		t.Fatal("a fitting host would not wake the request")
	}
	// A host serving several OS values wakes a request for any of them.
	if !g2.gained(idle{800, 8, 0, 0}, idle{}, []string{"rhel9", "rocky9"}, false, true) {
		t.Fatal("a host listing the request's OS would not wake it")
	}
	for i := range maxWants + 2 {
		g.addWant(fl(int64(1000-i), 1, 0, int64(i)))
	}
	if len(g.wants) > maxWants {
		t.Fatalf("%d wants kept, bound %d", len(g.wants), maxWants)
	}
	// Whatever was merged, a host fitting any of the requests still wakes.
	for _, v := range []idle{{100, 4, 0, 0}, {100, 2, 1, 0}, {1000, 1, 0, 0}, {1000 - maxWants - 1, 1, 0, maxWants + 1}} {
		if !g.gained(v, idle{}, []string{"linux"}, true, false) {
			t.Errorf("a host with %v fits a waiter but would not wake it (wants %v)", v, g.wants)
		}
	}
}

// The dispatcher reports memory after a booking as min(the row it
// committed, the checked-out view minus what it took). When host_stat's
// free memory lowered the view, that is less than the committed row: the
// booking's WAL row must still confirm the check-in, or the host looks
// busier than it is (released resources hidden) until AssumeTTL.
func TestCheckinWithViewCappedMemoryIsConfirmed(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{AssumeTTL: time.Hour}, Options{})
	f.addHosts(hostSpec{id: "h1", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32, freeMemGB: 20})
	h, err := f.c.Checkout(context.Background(), req())
	if err != nil || h.IdleMemKB != 20*gib {
		t.Fatalf("checkout: %+v %v", h, err)
	}
	// Booked 2 cores and 4 GiB: Postgres' row says 28 GiB idle, the
	// dispatcher reports min(28, 20-4) = 16.
	f.c.Checkin(sizing.Host{ID: "h1", IdleCores: 600, IdleMemKB: 16 * gib})
	if f.c.Stats().Assumed != 1 {
		t.Fatal("check-in not assumed")
	}
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_cores_idle": int64(600), "int_mem_idle": 28 * gib})) // the booking
	if n := f.c.Stats().Assumed; n != 0 {
		t.Fatalf("the booking's row did not confirm the check-in (%d assumed)", n)
	}
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_cores_idle": int64(800), "int_mem_idle": 32 * gib})) // the frame ends
	if got, _, _ := f.c.Lookup("h1", showS); got.IdleCores != 800 || got.IdleMemKB != 20*gib {
		t.Fatalf("after the release the cache shows %d centicores %d KB, want 800 and 20 GiB", got.IdleCores, got.IdleMemKB)
	}
	// A row that differs in cores is not the booking: still assumed.
	h, _ = f.c.Checkout(context.Background(), req())
	f.c.Checkin(sizing.Host{ID: "h1", IdleCores: 700, IdleMemKB: 19 * gib})
	f.mustCommit(f.upd("host", "h1", map[string]any{"int_cores_idle": int64(800), "int_mem_idle": 31 * gib}))
	if got, _, _ := f.c.Lookup("h1", showS); got.IdleCores != 700 || f.c.Stats().Assumed != 1 {
		t.Fatalf("an older row confirmed the check-in: %d centicores, %d assumed", got.IdleCores, f.c.Stats().Assumed)
	}
	_ = h
}
