package sim

import (
	"runtime"
	"testing"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/shared/config"
)

// SCALE's schedulers split the work by allocation whenever there are
// several, the default run sized by --schedulers as well as the variants,
// and --work-split, when given, is what they run with.
func TestScaleWorkSplit(t *testing.T) {
	cases := []struct {
		name, flag string
		variant    Variant
		n          int
		want       string
	}{
		{"one scheduler", "", Variant{}, 1, config.WorkSplitNone},
		{"--schedulers 3", "", Variant{}, 3, config.WorkSplitAllocation},
		{"--schedulers 3 --work-split none", config.WorkSplitNone, Variant{}, 3, config.WorkSplitNone},
		{"--schedulers 2 --work-split cluster", config.WorkSplitCluster, Variant{}, 2, config.WorkSplitCluster},
		{"the 3-scheduler variant", "", scaleThree, 3, config.WorkSplitAllocation},
		{"the tenth farm at --schedulers 2", "", scaleBaseline, 2, config.WorkSplitAllocation},
	}
	for _, c := range cases {
		w := &World{Opts: Options{WorkSplit: c.flag}, Variant: c.variant}
		if got := w.scaleWorkSplit(c.n); got != c.want {
			t.Errorf("%s: work_split %q, want %q", c.name, got, c.want)
		}
	}
}

// The heap is charged to the code that allocated it: clusters built by
// package clusters are the schedulers' (scheduler/ on the stack, although
// this package called it), a buffer this package makes is the simulator's.
func TestHeapOwners(t *testing.T) {
	// Every allocation recorded from here, not a sample: the verdict must
	// not depend on which allocations the profiler happened to pick.
	rate := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = rate }()
	before := heapOwners()
	const mib = 1 << 20
	buf := make([][]byte, 64)
	for i := range buf {
		buf[i] = make([]byte, mib)
	}
	tags := make([]clusters.Tag, 64)
	for i := range tags {
		tags[i] = clusters.Tag{Name: "tag", AllocID: string(rune('a' + i))}
	}
	var cs []*clusters.Cluster
	for range 2000 {
		cs = append(cs, clusters.New("facility", "show", tags))
	}
	after := heapOwners()
	if got := after["simulator"] - before["simulator"]; got < 48*mib || got > 96*mib {
		t.Errorf("simulator heap grew %d MiB, want about 64", got/mib)
	}
	if got := after["scheduler"] - before["scheduler"]; got < 4*mib {
		t.Errorf("scheduler heap grew %d KiB, want the clusters' (about 7 MiB)", got>>10)
	}
	runtime.KeepAlive(buf)
	runtime.KeepAlive(cs)
}
