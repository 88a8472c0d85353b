package hostcache

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestEPVMCostMath(t *testing.T) {
	t.Parallel()
	cpu := Weights{Cores: 1}
	all := Weights{Cores: 1, Memory: 1, GPUs: 4, GPUMemory: 1}
	empty8 := Usage{TotalCores: 800, IdleCores: 800}
	// One core on an empty 8-core host: e^(1/8) − e^0.
	if got, want := EPVMCost(empty8, Demand{Cores: 100}, cpu), math.Exp(1.0/8)-1; !near(got, want) {
		t.Fatalf("empty host: %v, want %v", got, want)
	}
	// The marginal is convex in use: the same core costs more on a fuller host.
	half8 := Usage{TotalCores: 800, IdleCores: 400}
	if got, want := EPVMCost(half8, Demand{Cores: 100}, cpu), math.Exp(5.0/8)-math.Exp(4.0/8); !near(got, want) {
		t.Fatalf("half-full host: %v, want %v", got, want)
	}
	if EPVMCost(half8, Demand{Cores: 100}, cpu) <= EPVMCost(empty8, Demand{Cores: 100}, cpu) {
		t.Fatal("a fuller host must cost more")
	}
	// Shares, not absolutes: a core on a half-full 64-core host is cheaper
	// than on an empty 8-core host.
	half64 := Usage{TotalCores: 6400, IdleCores: 3200}
	if a, b := EPVMCost(half64, Demand{Cores: 100}, cpu), EPVMCost(empty8, Demand{Cores: 100}, cpu); !(a < b) || !near(a, math.Exp(33.0/64)-math.Exp(0.5)) {
		t.Fatalf("half-full 64-core %v vs empty 8-core %v", a, b)
	}
	// Every resource adds its weighted term; a resource the host has none
	// of is skipped (no GPUs, no GPU memory: their weights do not matter).
	u := Usage{TotalCores: 800, IdleCores: 800, TotalMemKB: 32 * gib, IdleMemKB: 16 * gib}
	d := Demand{Cores: 200, MemKB: 4 * gib, GPUs: 1, GPUMemKB: gib}
	want := (math.Exp(2.0/8) - 1) + (math.Exp(20.0/32) - math.Exp(16.0/32))
	if got := EPVMCost(u, d, all); !near(got, want) {
		t.Fatalf("cores + memory: %v, want %v", got, want)
	}
	if got := EPVMCost(u, d, Weights{Cores: 1, Memory: 1}); !near(got, want) {
		t.Fatalf("GPU weights changed the cost of a host without GPUs: %v", got)
	}
	// Weights scale their terms.
	if got := EPVMCost(u, d, Weights{Cores: 3, Memory: 0.5}); !near(got, 3*(math.Exp(2.0/8)-1)+0.5*(math.Exp(20.0/32)-math.Exp(16.0/32))) {
		t.Fatalf("weighted: %v", got)
	}
	// A GPU host: a GPU frame pays for its GPU and GPU memory...
	g := Usage{TotalCores: 800, IdleCores: 800, TotalGPUs: 2, IdleGPUs: 2, TotalGPUMemKB: 16 * gib, IdleGPUMemKB: 16 * gib}
	gd := Demand{Cores: 400, GPUs: 1, GPUMemKB: 8 * gib}
	want = (math.Exp(4.0/8) - 1) + 4*(math.Exp(0.5)-1) + (math.Exp(0.5) - 1)
	if got := EPVMCost(g, gd, all); !near(got, want) {
		t.Fatalf("GPU frame: %v, want %v", got, want)
	}
	// ...and a CPU frame pays for the GPUs its cores strand: the GPUs count
	// as used at least in the share the cores are.
	want = (math.Exp(1.0/8) - 1) * (1 + 4)
	if got := EPVMCost(g, Demand{Cores: 100}, all); !near(got, want) {
		t.Fatalf("CPU frame on a GPU host: %v, want %v", got, want)
	}
	if a, b := EPVMCost(g, Demand{Cores: 100}, all), EPVMCost(empty8, Demand{Cores: 100}, all); !(a > 4*b) {
		t.Fatalf("CPU frame: GPU host %v should cost far more than a CPU host %v", a, b)
	}
	// Odd inputs stay finite: idle above total reads as empty.
	if got := EPVMCost(Usage{TotalCores: 800, IdleCores: 900}, Demand{Cores: 100}, cpu); !near(got, math.Exp(1.0/8)-1) {
		t.Fatalf("idle above total: %v", got)
	}
}

func TestChoose(t *testing.T) {
	t.Parallel()
	costs := []float64{1.0, 0.5, 0.5, 0.52, 0.7}
	loc := []int{20, 0, 0, 10, 20} // live, cold, cold, warm, live
	if got := Choose(costs, loc, false, 0.1); got != 1 {
		t.Fatalf("no locality: %d, want the first cheapest (1)", got)
	}
	if got := Choose(costs, loc, true, 0.1); got != 3 {
		t.Fatalf("locality: %d, want the warm host within 10%% (3)", got)
	}
	if got := Choose(costs, loc, true, 0); got != 1 {
		t.Fatalf("tolerance 0: %d, want the cheapest (1)", got)
	}
	if got := Choose(costs, loc, true, 0.5); got != 4 {
		t.Fatalf("tolerance 50%%: %d, want the live host (4)", got)
	}
	if got := Choose([]float64{0.3, 0.3}, []int{10, 10}, true, 0.1); got != 0 {
		t.Fatalf("equal locality and cost: %d, want the first", got)
	}
	if got := Choose([]float64{0.31, 0.3}, []int{10, 10}, true, 0.1); got != 1 {
		t.Fatalf("equal locality: %d, want the cheaper", got)
	}
	if got := Choose(nil, nil, true, 0.1); got != -1 {
		t.Fatalf("no candidates: %d", got)
	}
}

func epvm(k int) *Placement {
	p := DefaultPlacement()
	p.Candidates = k
	return &p
}

// The candidate set: the first K fits of the walk plus K/4 from its other
// end, so with best-fit cores the emptiest host is scored and E-PVM, which
// prefers it, finds it; Accept runs only for the hosts visited.
func TestPlacementScoresABoundedCandidateSet(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{Placement: epvm(4)}, Options{})
	var hs []hostSpec
	for i := range 40 {
		hs = append(hs, hostSpec{id: fmt.Sprintf("h%02d", i), cores: 64, idleCores: int64(1 + i), memGB: 256, idleMemGB: 256})
	}
	f.addHosts(hs...)
	calls := 0
	r := req()
	r.Accept = func(Host) bool { calls++; return true }
	if got := f.first(r); got != "h39" {
		t.Fatalf("E-PVM chose %q, want the emptiest host h39 (from the walk's other end)", got)
	}
	if calls != 1 {
		t.Fatalf("Accept ran %d times, want once (on the cheapest candidate)", calls)
	}
	visited := func() int {
		f.c.mu.Lock()
		defer f.c.mu.Unlock()
		n := 0
		for _, h := range f.c.st.hosts {
			if h.pick == f.c.pickSeq {
				n++
			}
		}
		return n
	}
	if n := visited(); n != 4+1 {
		t.Fatalf("the checkout visited %d hosts, want K + K/4 = 5", n)
	}
	// Accept is asked in order of preference.
	var asked []string
	r.Accept = func(h Host) bool { asked = append(asked, h.ID); return h.ID == "h02" }
	if got := f.first(r); got != "h02" || !slices.Equal(asked, []string{"h39", "h03", "h02"}) {
		t.Fatalf("got %q after asking %v", got, asked)
	}
	// Round 1 (no Placement) takes the first fit of the walk.
	g := newFarm(t, Config{}, Options{})
	g.addHosts(hs...)
	if got := g.first(req()); got != "h00" {
		t.Fatalf("best-fit chose %q, want h00", got)
	}
	// A walk whose hosts Accept refuses still finds the one it accepts.
	calls = 0
	r.Accept = func(h Host) bool { calls++; return h.ID == "h20" }
	if got := f.first(r); got != "h20" {
		t.Fatalf("got %q, want the only accepted host", got)
	}
	if calls != 5+17 {
		t.Fatalf("Accept ran %d times, want the 5 candidates, then the walk from h04 on to h20 (22)", calls)
	}
	f.checkInvariants()
}

func TestPlacementAvoidsGPUHostsForCPUWork(t *testing.T) {
	t.Parallel()
	hosts := []hostSpec{
		{id: "cpu", cores: 16, idleCores: 16, memGB: 64, idleMemGB: 64},
		{id: "gpu", cores: 16, idleCores: 16, memGB: 64, idleMemGB: 64, gpus: 2, gpuMemGB: 32},
	}
	round1 := newFarm(t, Config{}, Options{})
	round1.addHosts(hosts...)
	r := req()
	r.MemMinKB = 4 * gib
	if got := round1.first(r); got != "gpu" {
		t.Fatalf("round 1 chose %q; the test needs it to take the GPU host", got)
	}
	f := newFarm(t, Config{Placement: epvm(24)}, Options{})
	f.addHosts(hosts...)
	if got := f.first(r); got != "cpu" {
		t.Fatalf("E-PVM chose %q for CPU work, want the CPU host", got)
	}
	// Still at 3/4 busy the CPU host is cheaper than an idle GPU host...
	f.mustCommit(f.upd("host", "cpu", map[string]any{"int_cores_idle": int64(400), "int_mem_idle": 16 * gib}))
	if got := f.first(r); got != "cpu" {
		t.Fatalf("CPU host 3/4 busy: E-PVM chose %q", got)
	}
	// ...and a GPU frame goes where the GPUs are.
	gr := r
	gr.GPUsMin, gr.GPUMemMinKB = 1, 8*gib
	if got := f.first(gr); got != "gpu" {
		t.Fatalf("GPU frame: %q", got)
	}
	// With no room left on the CPU host, CPU work takes the GPU host.
	f.mustCommit(f.upd("host", "cpu", map[string]any{"int_cores_idle": int64(0)}))
	if got := f.first(r); got != "gpu" {
		t.Fatalf("full CPU host: %q", got)
	}
}

// checkoutFor checks out a host for layer (returning the view Accept saw)
// and leaves it checked out.
func (f *farm) checkoutFor(layer string, r Request) Host {
	f.t.Helper()
	r.LayerID = layer
	h, err := f.c.Checkout(context.Background(), r)
	if err != nil {
		f.t.Fatalf("checkout for %s: %v", layer, err)
	}
	return h
}

// Locality: bookings make a host live for their layer; the host row giving
// cores back turns it warm; frames of other layers cool it; a warm or live
// host wins a near tie; the split is counted.
func TestLocalityFollowsBookingsAndTheWAL(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	f := newFarm(t, Config{Placement: epvm(24), WarmFrames: 3}, Options{Registerer: reg})
	f.addHosts(
		hostSpec{id: "a", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32},
		hostSpec{id: "b", cores: 8, idleCores: 8, memGB: 32, idleMemGB: 32},
	)
	r := req()
	first := f.first(r)
	other := map[string]string{"a": "b", "b": "a"}[first]
	// Book two frames of L on the host the walk does not prefer.
	r.Accept = func(h Host) bool { return h.ID == other }
	h := f.checkoutFor("L", r)
	if h.ID != other || h.Locality != Cold || h.LayerCores != 0 {
		t.Fatalf("first checkout %+v", h)
	}
	f.c.Booked(other, "L", 2, 200)
	f.c.Checkin(sizing.Host{ID: other, IdleCores: 600, IdleMemKB: 30 * gib})
	r.Accept = nil
	look := func(layer string) Host {
		t.Helper()
		var seen Host
		rr := r
		rr.LayerID = layer
		rr.Accept = func(h Host) bool {
			if h.ID == other {
				seen = h
			}
			return false // ask every candidate
		}
		f.first(rr)
		return seen
	}
	if v := look("L"); v.Locality != Live || v.LayerCores != 200 {
		t.Fatalf("after the booking: %v %d, want live with 200", v.Locality, v.LayerCores)
	}
	// Live but with 2 of 8 cores busy: outside the 10% band of the empty
	// host, which wins.
	if got := f.first(Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}, Profile: Profile{CoresMin: 100}, LayerID: "L"}); got != first {
		t.Fatalf("live host 2/8 busy won over the empty one: %q", got)
	}
	// The WAL confirms the booking, then one frame ends: one core back.
	f.mustCommit(f.upd("host", other, map[string]any{"int_cores_idle": int64(600), "int_mem_idle": 30 * gib}))
	f.mustCommit(f.upd("host", other, map[string]any{"int_cores_idle": int64(700)}))
	if v := look("L"); v.Locality != Live || v.LayerCores != 100 {
		t.Fatalf("one frame ended: %v %d, want live with 100", v.Locality, v.LayerCores)
	}
	// The other ends: warm, and in an exact tie the warm host wins.
	f.mustCommit(f.upd("host", other, map[string]any{"int_cores_idle": int64(800), "int_mem_idle": 32 * gib}))
	if v := look("L"); v.Locality != Warm || v.LayerCores != 0 {
		t.Fatalf("both ended: %v %d, want warm", v.Locality, v.LayerCores)
	}
	lr := Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}, Profile: Profile{CoresMin: 100}, LayerID: "L"}
	if got := f.first(lr); got != other {
		t.Fatalf("equal fits: L went to %q, want its warm host %q", got, other)
	}
	if got := f.first(Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}, Profile: Profile{CoresMin: 100}, LayerID: "M"}); got != first {
		t.Fatalf("another layer: %q, want the walk's first %q", got, first)
	}
	// Three frames of other work on that host cool it (WarmFrames 3).
	f.checkoutFor("M", Request{FacilityID: facA, ShowID: showS, Tags: []string{"general"}, Profile: Profile{CoresMin: 100},
		Accept: func(h Host) bool { return h.ID == other }})
	f.c.Booked(other, "M", 3, 300)
	f.c.Checkin(sizing.Host{ID: other, IdleCores: 500, IdleMemKB: 29 * gib})
	if v := look("L"); v.Locality != Cold {
		t.Fatalf("after 3 frames of M: %v, want cold", v.Locality)
	}
	if v := look("M"); v.Locality != Live || v.LayerCores != 300 {
		t.Fatalf("M: %v %d", v.Locality, v.LayerCores)
	}
	if c, w, l := promread.Value(t, reg, "scheduler_placements_total", "locality", "cold"), promread.Value(t, reg, "scheduler_placements_total", "locality", "warm"),
		promread.Value(t, reg, "scheduler_placements_total", "locality", "live"); c != 5 || w != 0 || l != 0 {
		t.Fatalf("placements cold %v warm %v live %v, want 5 0 0", c, w, l)
	}
	// A re-snapshot keeps what the cache learnt; deleting the host forgets it.
	f.mustCommit(f.upd("host", other, map[string]any{"int_cores_idle": int64(500), "int_mem_idle": 29 * gib}))
	f.snapshot()
	if v := look("M"); v.Locality != Live {
		t.Fatalf("after a re-snapshot M is %v", v.Locality)
	}
	f.mustCommit(f.del("host", other))
	f.c.mu.Lock()
	n := len(f.c.layerHosts)
	f.c.mu.Unlock()
	if n != 0 {
		t.Fatalf("layer index keeps %d layers of a deleted host", n)
	}
}

func TestRecentLayersAreBounded(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{WarmFrames: 100}, Options{})
	f.addHosts(hostSpec{id: "a", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256})
	for i := range 3 * maxRecent {
		if _, err := f.c.Checkout(context.Background(), req()); err != nil {
			t.Fatal(err)
		}
		f.c.Booked("a", fmt.Sprintf("L%d", i), 1, 100)
		f.c.Checkin(sizing.Host{ID: "a", IdleCores: int64(6400 - 100*(i+1)), IdleMemKB: 256 * gib})
	}
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	h := f.c.st.hosts["a"]
	if len(h.recent) != maxRecent || h.recent[0].layer != fmt.Sprintf("L%d", 3*maxRecent-1) {
		t.Fatalf("recent = %+v", h.recent)
	}
	if len(f.c.layerHosts) != maxRecent {
		t.Fatalf("layer index has %d layers, want %d", len(f.c.layerHosts), maxRecent)
	}
	// Among live layers, the most recently booked ranks first; a layer the
	// host forgot ranks as cold.
	newest, older := fmt.Sprintf("L%d", 3*maxRecent-1), fmt.Sprintf("L%d", 3*maxRecent-2)
	if a, b, c := h.localityRank(newest), h.localityRank(older), h.localityRank("L0"); !(a > b && b > 0 && c == 0) {
		t.Fatalf("ranks: newest %d, older %d, forgotten %d", a, b, c)
	}
}

func (e *pgEnv) addGPUHost(id string, cores, memGB, gpus, gpuMemGB int64) {
	e.t.Helper()
	e.exec(`INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_cores_idle, int_mem, int_mem_idle, int_thread_mode,
		int_gpus, int_gpus_idle, int_gpu_mem, int_gpu_mem_idle)
		VALUES ($1, $2, $3, 'OPEN', $4, $4, $5, $5, 0, $6, $6, $7, $7)`, id, seedAllocGeneral, "name-"+id, cores*100, memGB*gib, gpus, gpuMemGB*gib)
	e.exec(`INSERT INTO host_stat (pk_host_stat, pk_host, int_mem_total, int_mem_free, int_gpu_mem_free, str_state, str_os)
		VALUES ($1, $2, $3, $3, $4, 'UP', 'linux')`, "st-"+id, id, memGB*gib, gpuMemGB*gib)
	e.exec(`INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type) VALUES ($1, $2, 'general', 'MANUAL')`, "tag-"+id+"-general", id)
}

func (e *pgEnv) first(r Request) Host {
	e.t.Helper()
	h, err := e.c.Checkout(context.Background(), r)
	if err != nil {
		e.t.Fatalf("checkout: %v", err)
	}
	e.c.Release(h.ID)
	return h
}

// E-PVM against the WAL-fed mirror of a real database: CPU work keeps off
// an idle GPU host, and a half-full big host beats an empty small one as
// the formula says.
func TestEPVMWithPostgres(t *testing.T) {
	t.Parallel()
	e := startPG(t, Config{Placement: epvm(24)}, func(e *pgEnv) {
		e.addHost("cpu", seedAllocGeneral, 8, 32, "general")
		e.addGPUHost("gpu", 8, 32, 1, 16)
	})
	r := pgReq("general")
	r.MemMinKB = 2 * gib
	e.eventually("both hosts", func() bool { return len(e.offered(r)) == 2 })
	g, _, _ := e.c.Lookup("gpu", seedShowTesting)
	if g.TotalGPUs != 1 || g.TotalGPUMemKB != 16*gib || g.IdleGPUs != 1 {
		t.Fatalf("GPU totals not mirrored: %+v", g)
	}
	if h := e.first(r); h.ID != "cpu" {
		t.Fatalf("CPU work went to %q, want the CPU host", h.ID)
	}
	// Half the CPU host busy: still cheaper than the idle GPU host.
	e.exec(`UPDATE host SET int_cores_idle = 400, int_mem_idle = $1 WHERE pk_host = 'cpu'`, 16*gib)
	e.eventually("cpu half busy", func() bool { h, _, _ := e.c.Lookup("cpu", seedShowTesting); return h.IdleCores == 400 })
	if h := e.first(r); h.ID != "cpu" {
		t.Fatalf("CPU host half busy: CPU work went to %q", h.ID)
	}
	gr := r
	gr.GPUsMin, gr.GPUMemMinKB = 1, 4*gib
	if h := e.first(gr); h.ID != "gpu" {
		t.Fatalf("GPU work went to %q", h.ID)
	}

	// A half-full 64-core host and an empty 8-core one.
	e.exec(`UPDATE host SET str_lock_state = 'LOCKED' WHERE pk_host IN ('cpu', 'gpu')`)
	e.addHost("big", seedAllocGeneral, 64, 256, "general")
	e.addHost("small", seedAllocGeneral, 8, 32, "general")
	e.exec(`UPDATE host SET int_cores_idle = 3200, int_mem_idle = $1 WHERE pk_host = 'big'`, 128*gib)
	e.eventually("big half busy, small empty", func() bool {
		b, bi, _ := e.c.Lookup("big", seedShowTesting)
		_, si, _ := e.c.Lookup("small", seedShowTesting)
		_, ci, _ := e.c.Lookup("cpu", seedShowTesting)
		return bi && si && !ci && b.IdleCores == 3200 && b.IdleMemKB == 128*gib
	})
	b, _, _ := e.c.Lookup("big", seedShowTesting)
	s, _, _ := e.c.Lookup("small", seedShowTesting)
	d := Demand{Cores: r.CoresMin, MemKB: r.MemMinKB}
	w := DefaultPlacement().Weights
	if cb, cs := EPVMCost(UsageOf(b), d, w), EPVMCost(UsageOf(s), d, w); !(cb < cs) {
		t.Fatalf("formula: big %v, small %v", cb, cs)
	}
	if h := e.first(r); h.ID != "big" {
		t.Fatalf("chose %q, want the half-full big host", h.ID)
	}
	e.checkInvariants()
}

// Locality against a real database: a layer's frame runs on the host the
// walk does not prefer; after it ends (the host row is back to idle, as the
// WAL reports), the layer's next frame goes back to that warm host while
// another layer takes the walk's first.
func TestLocalityWithPostgres(t *testing.T) {
	t.Parallel()
	e := startPG(t, Config{Placement: epvm(24)}, func(e *pgEnv) {
		e.addHost("h1", seedAllocGeneral, 8, 32, "general")
		e.addHost("h2", seedAllocGeneral, 8, 32, "general")
	})
	r := pgReq("general")
	e.eventually("both hosts", func() bool { return len(e.offered(r)) == 2 })
	first := e.first(r).ID
	other := map[string]string{"h1": "h2", "h2": "h1"}[first]

	lr := r
	lr.LayerID = "layer-L"
	lr.Accept = func(h Host) bool { return h.ID == other }
	h, err := e.c.Checkout(context.Background(), lr)
	if err != nil || h.ID != other || h.Locality != Cold {
		t.Fatalf("checkout = %+v, %v", h, err)
	}
	after := h.Host
	if err := e.pool.QueryRow(context.Background(), `UPDATE host SET int_cores_idle = int_cores_idle - 100, int_mem_idle = int_mem_idle - $2
		WHERE pk_host = $1 RETURNING int_cores_idle, int_mem_idle, int_gpus_idle, int_gpu_mem_idle`, other, gib).
		Scan(&after.IdleCores, &after.IdleMemKB, &after.IdleGPUs, &after.IdleGPUMemKB); err != nil {
		t.Fatal(err)
	}
	e.c.Booked(other, "layer-L", 1, 100)
	e.c.Checkin(after)
	// The frame ends.
	e.exec(`UPDATE host SET int_cores_idle = int_cores, int_mem_idle = int_mem WHERE pk_host = $1`, other)
	e.eventually("the host idle again", func() bool {
		v, indexed, _ := e.c.Lookup(other, seedShowTesting)
		return indexed && v.IdleCores == 800 && v.IdleMemKB == 32*gib && e.c.Stats().Assumed == 0
	})
	lr.Accept = nil
	if h := e.first(lr); h.ID != other || h.Locality != Warm {
		t.Fatalf("layer L went to %s (%v), want its warm host %s", h.ID, h.Locality, other)
	}
	mr := r
	mr.LayerID = "layer-M"
	if h := e.first(mr); h.ID != first || h.Locality != Cold {
		t.Fatalf("layer M went to %s (%v), want %s", h.ID, h.Locality, first)
	}
	if v := promread.Value(t, e.reg, "scheduler_placements_total", "locality", "cold"); v != 1 {
		t.Fatalf("cold placements %v, want 1", v)
	}
	e.checkInvariants()
}
