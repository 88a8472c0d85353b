package sim

import (
	"testing"
	"time"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
)

// OOM's split of each layer's runs at its first kill: the runs launched
// before it are its first wave (and count its kills there); a killed run
// launched after it, a retry included, is a late kill. A frame killed n
// times had its first n runs killed, whatever order the launches are
// listed in.
func TestFirstWaves(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	run := func(layer, frame string, s float64, started bool) fakerqd.Launch {
		return fakerqd.Launch{RunFrame: &rqdpb.RunFrame{LayerId: layer, FrameId: frame}, At: at(s), Started: started}
	}
	ls := []fakerqd.Launch{
		run("a", "a3", 3, true),    // after a's first kill (2 s), killed
		run("a", "a1", 0, true),    // first wave, killed (the kill at 2 s)
		run("a", "a1", 2.5, true),  // its retry, after: killed again
		run("a", "a1", 4, true),    // its second retry: succeeded
		run("a", "a2", 1, true),    // first wave, not killed
		run("a", "a4", 1.5, false), // refused by the host: not a run
		run("b", "b1", 0, true),    // a layer never killed: all first wave
	}
	killed := map[string]int{"a1": 2, "a3": 1}
	got := firstWaves(ls, map[string]time.Time{"a": at(2)}, killed)
	if want := (wave{before: 2, beforeKilled: 1, lateKilled: 2}); got["a"] != want {
		t.Errorf("layer a: %+v, want %+v", got["a"], want)
	}
	if want := (wave{before: 1}); got["b"] != want {
		t.Errorf("layer b: %+v, want %+v", got["b"], want)
	}
	if ls[0].RunFrame.GetFrameId() != "a3" {
		t.Error("firstWaves reordered the caller's launches")
	}
}
