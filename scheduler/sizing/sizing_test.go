package sizing

import "testing"

const gb = 1 << 20

func host(cores, idle int64, memGB, idleMemGB int64, mode int) Host {
	return Host{TotalCores: cores * 100, IdleCores: idle * 100, TotalMemKB: memGB * gb, IdleMemKB: idleMemGB * gb, ThreadMode: mode}
}

func TestReserve(t *testing.T) {
	p := Policy{CoreUnit: 100, StrandedMemKB: 2 * gb}
	cases := []struct {
		name   string
		h      Host
		r      Request
		budget int64
		cores  int64 // whole cores; 0 with a reason
		reason Reason
	}{
		{"non-threadable books one core", host(16, 16, 64, 64, Auto), Request{CoresMin: 800, MemKB: gb}, -1, 1, Fits},
		{"memory balanced: 8GB on 4GB/core = 2", host(16, 16, 64, 64, Auto), Request{CoresMin: 100, MemKB: 8 * gb, Threadable: true}, -1, 2, Fits},
		{"request above balance wins", host(16, 16, 64, 64, Auto), Request{CoresMin: 600, MemKB: 8 * gb, Threadable: true}, -1, 6, Fits},
		{"layer cap", host(16, 16, 64, 64, Auto), Request{CoresMin: 100, CoresMax: 300, MemKB: 40 * gb, Threadable: true}, -1, 3, Fits},
		{"thread mode ALL takes every idle core", host(16, 12, 64, 64, All), Request{CoresMin: 100, MemKB: gb, Threadable: true}, -1, 12, Fits},
		{"ALL still honours the layer cap", host(16, 12, 64, 64, All), Request{CoresMin: 100, CoresMax: 400, MemKB: gb, Threadable: true}, -1, 4, Fits},
		{"VARIABLE small request books two", host(16, 16, 64, 64, Variable), Request{CoresMin: 100, MemKB: gb, Threadable: true}, -1, 2, Fits},
		{"selfish takes every idle core", host(16, 10, 64, 64, Auto), Request{CoresMin: 100, MemKB: gb, Threadable: true, Selfish: true}, -1, 10, Fits},
		{"stranded memory takes every idle core", host(16, 10, 64, 5, Auto), Request{CoresMin: 100, MemKB: 4 * gb, Threadable: true}, -1, 10, Fits},
		{"zero means the whole host", host(16, 16, 64, 64, Auto), Request{CoresMin: 0, MemKB: gb, Threadable: true}, -1, 16, Fits},
		{"zero on a busy host does not fit", host(16, 8, 64, 64, Auto), Request{CoresMin: 0, MemKB: gb, Threadable: true}, -1, 0, NoCores},
		{"all but two", host(16, 16, 64, 64, Auto), Request{CoresMin: -200, MemKB: gb, Threadable: true}, -1, 14, Fits},
		{"job budget clamps", host(16, 16, 64, 64, All), Request{CoresMin: 100, MemKB: gb, Threadable: true}, 300, 3, Fits},
		{"job budget exhausted", host(16, 16, 64, 64, Auto), Request{CoresMin: 100, MemKB: gb}, 50, 0, JobAtCap},
		{"not enough memory", host(16, 16, 64, 3, Auto), Request{CoresMin: 100, MemKB: 4 * gb}, -1, 0, NoMemory},
		{"not enough cores", host(16, 1, 64, 64, Auto), Request{CoresMin: 400, MemKB: gb, Threadable: true}, -1, 0, NoCores},
		{"no idle core", host(16, 0, 64, 64, Auto), Request{CoresMin: 100, MemKB: gb}, -1, 0, NoCores},
		{"gpus", Host{TotalCores: 800, IdleCores: 800, TotalMemKB: 64 * gb, IdleMemKB: 64 * gb, IdleGPUs: 1}, Request{CoresMin: 100, MemKB: gb, GPUs: 2}, -1, 0, NoGPUs},
		{"gpu memory", Host{TotalCores: 800, IdleCores: 800, TotalMemKB: 64 * gb, IdleMemKB: 64 * gb, IdleGPUs: 2, IdleGPUMemKB: gb}, Request{CoresMin: 100, MemKB: gb, GPUs: 1, GPUMemKB: 2 * gb}, -1, 0, NoGPUMemory},
		{"sub-core minimum rounds up", host(16, 16, 64, 64, Auto), Request{CoresMin: 10, MemKB: gb, Threadable: true}, -1, 1, Fits},
	}
	for _, c := range cases {
		r, why := p.Reserve(c.h, c.r, c.budget)
		if why != c.reason || r.Cores != c.cores*100 {
			t.Errorf("%s: Reserve = %+v, %q; want %d cores, %q", c.name, r, why, c.cores, c.reason)
			continue
		}
		if why == Fits && (r.MemKB != c.r.MemKB || r.GPUs != c.r.GPUs || r.GPUMemKB != c.r.GPUMemKB) {
			t.Errorf("%s: memory/GPU reservation %+v differs from the request %+v", c.name, r, c.r)
		}
	}
}

func TestTake(t *testing.T) {
	h := Host{IdleCores: 800, IdleMemKB: 10, IdleGPUs: 2, IdleGPUMemKB: 5}
	h.Take(Reservation{Cores: 300, MemKB: 4, GPUs: 1, GPUMemKB: 2})
	if h.IdleCores != 500 || h.IdleMemKB != 6 || h.IdleGPUs != 1 || h.IdleGPUMemKB != 3 {
		t.Fatalf("Take left %+v", h)
	}
}

// TestNegativeRequestsAreClamped: a negative layer memory (bad data) is
// reserved as the configured minimum, never as a negative reservation that
// would give the host memory; negative GPU values reserve none.
func TestNegativeRequestsAreClamped(t *testing.T) {
	h := Host{TotalCores: 800, IdleCores: 800, TotalMemKB: 8 * gb, IdleMemKB: 8 * gb, IdleGPUs: 1, IdleGPUMemKB: gb}
	for _, p := range []Policy{{CoreUnit: 100, MinMemKB: 256 << 10}, {CoreUnit: 100}} {
		res, why := p.Reserve(h, Request{CoresMin: 100, MemKB: -gb, GPUs: -2, GPUMemKB: -gb}, -1)
		if why != Fits {
			t.Fatalf("min %d: refused: %s", p.MinMemKB, why)
		}
		if res.MemKB != p.MinMemKB || res.GPUs != 0 || res.GPUMemKB != 0 {
			t.Errorf("min %d: reserved %+v, want %d KB and no GPUs", p.MinMemKB, res, p.MinMemKB)
		}
		hh := h
		hh.Take(res)
		if hh.IdleMemKB > hh.TotalMemKB || hh.IdleGPUs > 1 || hh.IdleGPUMemKB > gb {
			t.Errorf("min %d: booking gave the host resources: %+v", p.MinMemKB, hh)
		}
	}
	// A minimum the host cannot hold is refused like any other request.
	small := Host{TotalCores: 800, IdleCores: 800, TotalMemKB: 8 * gb, IdleMemKB: 100}
	if _, why := (Policy{CoreUnit: 100, MinMemKB: 256 << 10}).Reserve(small, Request{CoresMin: 100, MemKB: -1}, -1); why != NoMemory {
		t.Errorf("clamped minimum on a full host: %q, want %q", why, NoMemory)
	}
}
