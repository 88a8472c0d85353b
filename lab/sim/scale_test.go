package sim

import (
	"runtime"
	"testing"

	"github.com/cuesched/cuesched/scheduler/clusters"
)

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
