package sizing

import "testing"

func TestPolicyLayerRules(t *testing.T) {
	p := Policy{CoreUnit: 100, StrandedMemKB: 2 * gb, MinMemKB: 256 * 1024, SelfishServices: []string{"houdini"}}
	l := Shape{CoresMin: 100, MemMinKB: gb, Threadable: true, Services: []string{"maya", "houdini"}, JobMaxCores: 10000}

	if !p.Selfish(l) || p.Selfish(Shape{Services: []string{"maya"}}) {
		t.Fatal("selfish: a layer is selfish when one of its services is")
	}
	if r := p.Request(l); !r.Selfish || r.MemKB != gb || r.CoresMin != 100 || !r.Threadable {
		t.Fatalf("request = %+v", r)
	}
	if got := p.MemKB(Shape{MemMinKB: -5}); got != 256*1024 {
		t.Fatalf("a negative memory minimum is mem_reserved_min, got %d", got)
	}
	if got := p.JobBudget(Shape{JobMaxCores: 300, JobCoresLive: 500}); got != 0 {
		t.Fatalf("an over-cap job's budget is 0, got %d", got)
	}
	if f := p.Floor(Shape{CoresMin: -200, MemMinKB: -1, GPUsMin: -1}); f != (Floor{Cores: 100, MemKB: 256 * 1024}) {
		t.Fatalf("floor of sentinels and bad data = %+v", f)
	}
	for _, c := range []struct {
		l    Shape
		want int64
	}{
		{Shape{CoresMin: 800}, 100},                   // non-threadable: one core
		{Shape{CoresMin: 250, Threadable: true}, 300}, // whole cores, rounded up
		{Shape{CoresMin: 0, Threadable: true}, 0},     // whole host
		{Shape{CoresMin: -100, Threadable: true}, 0},  // all but one
	} {
		if got := p.FrameCores(c.l); got != c.want {
			t.Errorf("FrameCores(%+v) = %d, want %d", c.l, got, c.want)
		}
	}
}

func TestPolicyPlanAgreesWithFits(t *testing.T) {
	p := Policy{CoreUnit: 100, StrandedMemKB: 2 * gb}
	l := Shape{CoresMin: 200, MemMinKB: 4 * gb, Threadable: true, JobMaxCores: 500}
	h := host(16, 16, 64, 64, Auto)
	if !p.Fits(h, l) {
		t.Fatal("one frame fits")
	}
	// The job budget (5 cores) allows two frames of two cores, then one core.
	rs, why := p.Plan(h, l, 10)
	if why != NoCores && why != JobAtCap {
		t.Fatalf("plan stopped with %q", why)
	}
	var cores int64
	for _, r := range rs {
		cores += r.Cores
	}
	if cores > l.JobMaxCores || len(rs) == 0 {
		t.Fatalf("plan = %+v: %d centicores over a budget of %d", rs, cores, l.JobMaxCores)
	}
	// Every frame Plan books is one Fits would have accepted on what the
	// frames before it left.
	for _, r := range rs {
		if !p.Fits(h, l) {
			t.Fatalf("plan booked a frame Fits refuses on %+v", h)
		}
		h.Take(r)
		l.JobCoresLive += r.Cores
	}
	if p.Fits(h, l) {
		t.Fatal("Fits accepts a frame Plan did not book")
	}
	if rs, why := p.Plan(h, Shape{CoresMin: 100, MemMinKB: gb, Threadable: true}, 3); len(rs) != 0 || why != JobAtCap {
		t.Fatalf("a job with no cap books nothing: %+v %q", rs, why)
	}
}

func TestPolicyFitsIdle(t *testing.T) {
	p := Policy{CoreUnit: 100}
	busy := host(8, 0, 32, 0, Auto)
	busy.IdleGPUs = 0
	if !p.FitsIdle(busy, Shape{CoresMin: 800, MemMinKB: 16 * gb, Threadable: true}) {
		t.Fatal("a busy host that fits the frame when idle")
	}
	if p.FitsIdle(busy, Shape{CoresMin: 1200, MemMinKB: gb, Threadable: true}) {
		t.Fatal("more cores than the host has")
	}
}

// A retry larger than a host books the host's whole memory when that still
// holds the killed run's max RSS, never more; a host below the floor, or
// one with any memory in use, refuses it; a larger host books the retry.
func TestRetryClampsToHostMemory(t *testing.T) {
	p := Policy{CoreUnit: 100, History: History{Threadable: ModeHistory}}
	l := Shape{CoresMin: 100, MemMinKB: 4 * gb, SizedMemKB: 4 * gb, FrameMemKB: 72 * gb, FrameFloorKB: 48 * gb, JobMaxCores: 10000}
	host := func(memKB, idleKB int64) Host {
		return Host{TotalCores: 1600, IdleCores: 1600, TotalMemKB: memKB, IdleMemKB: idleKB}
	}
	if f := p.Floor(l); f.MemKB != 48*gb {
		t.Fatalf("a retry's host floor is its least size, got %d", f.MemKB)
	}
	if rs, why := p.Plan(host(64*gb, 64*gb), l, 1); why != Fits || rs[0].MemKB != 64*gb {
		t.Fatalf("72 GB retry on an idle 64 GB host: %+v %q, want 64 GB booked", rs, why)
	}
	if !p.FitsIdle(host(64*gb, 0), l) {
		t.Fatal("FitsIdle must agree with the clamp")
	}
	if p.Fits(host(64*gb, 60*gb), l) {
		t.Fatal("the clamped retry needs the whole host's memory idle")
	}
	if p.Fits(host(32*gb, 32*gb), l) {
		t.Fatal("a host below the killed run's max RSS must refuse the retry")
	}
	if rs, why := p.Plan(host(128*gb, 128*gb), l, 1); why != Fits || rs[0].MemKB != 72*gb {
		t.Fatalf("a host larger than the retry books it as sized: %+v %q", rs, why)
	}
	// Without a floor the retry size is exact (bad data, an old caller).
	exact := l
	exact.FrameFloorKB = 0
	if p.Fits(host(64*gb, 64*gb), exact) || p.Floor(exact).MemKB != 72*gb {
		t.Fatal("a retry without a floor books exactly its size")
	}
	// Threadable cores follow the clamped memory, not the retry size.
	th := l
	th.Threadable, th.RSSKB = true, 24*gb
	if rs, why := p.Plan(host(64*gb, 64*gb), th, 1); why != Fits || rs[0].Cores != 1600 || rs[0].MemKB != 64*gb {
		t.Fatalf("threadable clamped retry: %+v %q, want 16 cores and 64 GB", rs, why)
	}
}
