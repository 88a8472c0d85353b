package sizing

import (
	"testing"
	"time"
)

func testHistory() History {
	return History{Memory: ModeHistory, Threadable: ModeHistory, Quantile: 0.95, Headroom: 0.1, MinKB: 256 << 10,
		WindowFrames: 32, MinSamples: 4, MaxAge: 12 * time.Hour, OOMRetryFactor: 1.5, OOMBumpKills: 3, OOMBumpWindow: time.Hour, ProbeFrames: 3}
}

func TestQuantileNearestRank(t *testing.T) {
	s := []int64{5, 1, 4, 2, 3} // unsorted on purpose
	for q, want := range map[float64]int64{0.01: 1, 0.2: 1, 0.21: 2, 0.5: 3, 0.8: 4, 0.81: 5, 0.95: 5, 1: 5} {
		if got := Quantile(s, q); got != want {
			t.Errorf("Quantile(%v) = %d, want %d", q, got, want)
		}
	}
	if s[0] != 5 {
		t.Error("Quantile sorted its input")
	}
	if Quantile(nil, 0.5) != 0 {
		t.Error("no samples: 0")
	}
}

func TestDecideFromHistory(t *testing.T) {
	h := testHistory()
	// A layer asking 32 GB whose frames peak near 6 GB books ~6.6 GB.
	samples := []int64{5 * gb, 6 * gb, 6 * gb, 5 * gb, 6 * gb, 4 * gb}
	d := h.Decide(Input{RequestKB: 32 * gb, SamplesKB: samples})
	if d.Source != SourceHistory || d.QuantileKB != 6*gb || d.HeadroomKB != 6*gb/10+1 && d.HeadroomKB != 6*gb/10 || d.MemKB != d.QuantileKB+d.HeadroomKB {
		t.Fatalf("decision %+v", d)
	}
	if d.MemKB >= 32*gb || d.RSSKB != 6*gb || d.Samples != 6 {
		t.Fatalf("decision %+v", d)
	}
	// Under-requesting: it books above the request.
	d = h.Decide(Input{RequestKB: 4 * gb, SamplesKB: []int64{9 * gb, 9 * gb, 8 * gb, 9 * gb}})
	if d.MemKB <= 9*gb || d.Source != SourceHistory {
		t.Fatalf("under-request %+v", d)
	}
}

func TestDecideTail(t *testing.T) {
	h := testHistory()
	// 19 small frames and one 10x tail: p95 of 20 samples is rank 19 (the
	// largest small one), p100 is the tail.
	var s []int64
	for range 19 {
		s = append(s, 2*gb)
	}
	s = append(s, 20*gb)
	if d := h.Decide(Input{RequestKB: gb, SamplesKB: s}); d.QuantileKB != 2*gb {
		t.Fatalf("p95 follows the body, not the 5%% tail: %+v", d)
	}
	h.Quantile = 1
	if d := h.Decide(Input{RequestKB: gb, SamplesKB: s}); d.QuantileKB != 20*gb {
		t.Fatalf("p100 is the tail: %+v", d)
	}
	// With 10 samples one tail sample is 10%: p95 takes it.
	h.Quantile = 0.95
	if d := h.Decide(Input{RequestKB: gb, SamplesKB: s[10:]}); d.QuantileKB != 20*gb {
		t.Fatalf("p95 of 10 samples with one tail: %+v", d)
	}
}

func TestDecideNoHistoryAndClamps(t *testing.T) {
	h := testHistory()
	// Too few samples: the request.
	d := h.Decide(Input{RequestKB: 8 * gb, SamplesKB: []int64{gb, gb, gb}})
	if d.Source != SourceRequest || d.MemKB != 8*gb || d.QuantileKB != 0 || d.RSSKB != 0 {
		t.Fatalf("3 samples of 4: %+v", d)
	}
	if d := h.Decide(Input{RequestKB: 8 * gb}); d.Source != SourceRequest || d.MemKB != 8*gb {
		t.Fatalf("no history: %+v", d)
	}
	// Tiny frames clamp to min_memory.
	d = h.Decide(Input{RequestKB: 8 * gb, SamplesKB: []int64{1000, 1000, 1000, 1000}})
	if d.MemKB != 256<<10 || d.Clamp != "min_memory" {
		t.Fatalf("min clamp: %+v", d)
	}
	// Huge frames clamp to max_memory.
	h.MaxKB = 64 * gb
	d = h.Decide(Input{RequestKB: 8 * gb, SamplesKB: []int64{100 * gb, 100 * gb, 100 * gb, 100 * gb}})
	if d.MemKB != 64*gb || d.Clamp != "max_memory" {
		t.Fatalf("max clamp: %+v", d)
	}
	// Sizing off: the request, whatever the samples (Cuebot's behaviour).
	h.Memory = ModeRequest
	d = h.Decide(Input{RequestKB: 8 * gb, SamplesKB: []int64{gb, gb, gb, gb}, BumpKB: 20 * gb})
	if d.MemKB != 8*gb || d.Source != SourceRequest || d.RSSKB != gb {
		t.Fatalf("off: %+v", d)
	}
}

func TestDecideBump(t *testing.T) {
	h := testHistory()
	d := h.Decide(Input{RequestKB: 4 * gb, SamplesKB: []int64{gb, gb, gb, gb}, BumpKB: 9 * gb})
	if d.MemKB != 9*gb || d.Source != SourceBump || d.BumpKB != 9*gb {
		t.Fatalf("bump above history: %+v", d)
	}
	d = h.Decide(Input{RequestKB: 4 * gb, BumpKB: 9 * gb})
	if d.MemKB != 9*gb || d.Source != SourceBump {
		t.Fatalf("bump above request: %+v", d)
	}
	d = h.Decide(Input{RequestKB: 4 * gb, SamplesKB: []int64{10 * gb, 10 * gb, 10 * gb, 10 * gb}, BumpKB: 9 * gb})
	if d.Source != SourceHistory || d.MemKB != 11*gb {
		t.Fatalf("history above bump: %+v", d)
	}
}

func TestRetryKBAndMemoryKill(t *testing.T) {
	h := testHistory()
	if got := h.RetryKB(6*gb, 4*gb); got != 9*gb {
		t.Fatalf("retry of a 6 GB kill booked at 4 GB: %d", got)
	}
	if got := h.RetryKB(2*gb, 4*gb); got != 6*gb {
		t.Fatalf("a kill below its booking retries above the booking: %d", got)
	}
	h.MaxKB = 8 * gb
	if got := h.RetryKB(6*gb, 4*gb); got != 8*gb {
		t.Fatalf("max_memory clamps the retry: %d", got)
	}
	for _, c := range []struct {
		exit, rss, res int64
		want           bool
	}{
		{33, 0, 0, true}, {137, gb, 2 * gb, true}, {9, 3 * gb, 2 * gb, true}, {1, 3 * gb, 2 * gb, true},
		{1, gb, 2 * gb, false}, {0, 3 * gb, 2 * gb, false}, {-1, 3 * gb, 2 * gb, false},
		{299, 3 * gb, 2 * gb, false}, {399, 3 * gb, 2 * gb, false}, {1, 3 * gb, 0, false},
	} {
		if got := MemoryKill(c.exit, c.rss, c.res); got != c.want {
			t.Errorf("MemoryKill(%d, %d, %d) = %v", c.exit, c.rss, c.res, got)
		}
	}
}

func TestThreadableCoresFromRSS(t *testing.T) {
	p := Policy{CoreUnit: 100, StrandedMemKB: 2 * gb, History: testHistory()}
	host := Host{ThreadMode: Auto, TotalCores: 3200, IdleCores: 3200, TotalMemKB: 128 * gb, IdleMemKB: 128 * gb} // 4 GB per core
	l := Shape{CoresMin: 100, CoresMax: 0, MemMinKB: 2 * gb, Threadable: true, JobMaxCores: 1 << 30, SizedMemKB: 20 * gb, RSSKB: 18 * gb}
	rs, why := p.Plan(host, l, 2)
	if why != Fits || len(rs) != 2 || rs[0].Cores != 500 || rs[0].MemKB != 20*gb { // round(18/4) = 5 (4.5 rounds up)
		t.Fatalf("derived cores: %+v %v", rs, why)
	}
	l.CoresMax = 300
	if rs, _ := p.Plan(host, l, 1); rs[0].Cores != 300 {
		t.Fatalf("within the layer max: %+v", rs)
	}
	l.CoresMax, l.CoresMin = 0, 800
	if rs, _ := p.Plan(host, l, 1); rs[0].Cores != 800 {
		t.Fatalf("within the layer min: %+v", rs)
	}
	// Probing (no RSS yet) or threadable sizing off: Cuebot's rule (memory
	// over memory per core, at least the request).
	l.CoresMin, l.RSSKB = 100, 0
	if rs, _ := p.Plan(host, l, 1); rs[0].Cores != 500 {
		t.Fatalf("probe: %+v", rs)
	}
	p.History.Threadable = ModeRequest
	l.RSSKB = 2 * gb
	if rs, _ := p.Plan(host, l, 1); rs[0].Cores != 500 {
		t.Fatalf("off: %+v", rs)
	}
	// A frame's retry size wins over the layer's.
	l.FrameMemKB = 30 * gb
	if p.MemKB(l) != 30*gb || p.Floor(l).MemKB != 30*gb {
		t.Fatalf("retry size: %d", p.MemKB(l))
	}
}
