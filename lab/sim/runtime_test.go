package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/cuesched/cuesched/proto/rqdpb"
)

// A frame's run time is a function of the seed, the frame and the attempt:
// the same whatever order the launches arrive in, within the range, and
// spread over it.
func TestRunTimeIsTheFramesOwn(t *testing.T) {
	t.Parallel()
	mk := func(seed int64) *World {
		return &World{Opts: Options{Seed: seed}, runMin: 500 * time.Millisecond, runMax: 1500 * time.Millisecond}
	}
	frame := func(i int) *rqdpb.RunFrame {
		return &rqdpb.RunFrame{JobName: "job", FrameName: fmt.Sprintf("%04d-render", i), FrameId: fmt.Sprintf("id%d", i)}
	}
	a, b, other := mk(7), mk(7), mk(8)
	const n = 400
	forward := make([]time.Duration, n)
	for i := range n {
		forward[i] = a.runTimeOf(frame(i))
	}
	var sum time.Duration
	same := 0
	for i := n - 1; i >= 0; i-- { // the other order
		d := b.runTimeOf(frame(i))
		if d != forward[i] {
			t.Fatalf("frame %d: %v launched last, %v launched first", i, d, forward[i])
		}
		if d < 500*time.Millisecond || d >= 1500*time.Millisecond {
			t.Fatalf("frame %d: %v outside [500ms, 1.5s)", i, d)
		}
		sum += d
		if other.runTimeOf(frame(i)) == d {
			same++
		}
	}
	if mean := sum / n; mean < 900*time.Millisecond || mean > 1100*time.Millisecond {
		t.Errorf("mean run time %v, want about 1s", mean)
	}
	if same > n/20 {
		t.Errorf("seed 8 gave %d of %d frames seed 7's run time", same, n)
	}
	if a.runTimeOf(frame(0)) == forward[0] && a.runTimeOf(frame(1)) == forward[1] && a.runTimeOf(frame(2)) == forward[2] {
		t.Error("a retry (second launch) ran exactly as long as the first, three times over")
	}
}

// A layer's own run span overrides the world's: fixed, or drawn within it.
func TestLayerRunTimes(t *testing.T) {
	t.Parallel()
	w := &World{Opts: Options{Seed: 7}, runMin: 500 * time.Millisecond, runMax: 1500 * time.Millisecond}
	w.LayerRunTime("fixed", 4*time.Second)
	w.LayerRunTimes("spread", 2*time.Second, 6*time.Second)
	seen := map[time.Duration]bool{}
	for i := range 200 {
		name := fmt.Sprintf("%04d-comp", i)
		if d := w.runTimeOf(&rqdpb.RunFrame{LayerId: "fixed", JobName: "j", FrameName: name, FrameId: "f" + name}); d != 4*time.Second {
			t.Fatalf("fixed layer: %v", d)
		}
		d := w.runTimeOf(&rqdpb.RunFrame{LayerId: "spread", JobName: "j", FrameName: name, FrameId: "s" + name})
		if d < 2*time.Second || d >= 6*time.Second {
			t.Fatalf("spread layer: %v outside [2s, 6s)", d)
		}
		seen[d.Truncate(time.Second)] = true
	}
	if len(seen) != 4 {
		t.Errorf("spread layer's run times fell in %d of its 4 seconds", len(seen))
	}
}
