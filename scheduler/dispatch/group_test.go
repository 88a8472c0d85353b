package dispatch_test

import (
	"context"
	"testing"

	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// groupParts splits l's frames over hosts: each host the given count, in order.
func groupParts(frames []jobs.Frame, hosts []sizing.Host, counts ...int) []dispatch.Part {
	var parts []dispatch.Part
	off := 0
	for i, h := range hosts {
		parts = append(parts, dispatch.Part{Host: h, Frames: frames[off : off+counts[i]]})
		off += counts[i]
	}
	return parts
}

// threeHosts seeds three 4-core hosts and a job of one layer of ten 1-core
// frames (mod may change the job), and returns the hosts and the layer.
func threeHosts(h *harness, mod func(*farmseed.JobSpec)) ([]sizing.Host, *jobs.Layer) {
	hosts := []sizing.Host{h.host(farmseed.HostSpec{Cores: 4}), h.host(farmseed.HostSpec{Cores: 4}), h.host(farmseed.HostSpec{Cores: 4})}
	js := farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 10, NotThreadable: true, MemKB: farmseed.GB}}}
	if mod != nil {
		mod(&js)
	}
	return hosts, h.layers(h.job(js))[0]
}

func TestDispatchGroupBooksSeveralHostsInOneTransaction(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	hosts, l := threeHosts(h, nil)
	res := h.d.DispatchGroup(context.Background(), l, groupParts(l.Frames, hosts, 4, 4, 2))
	if len(res) != 3 {
		t.Fatalf("%d results for 3 parts", len(res))
	}
	for i, want := range []int64{0, 0, 200} {
		r := res[i]
		if r.Err != nil || r.Stop != dispatch.Done || len(r.Dispatched) != 4-i/2*2 || r.Host.IdleCores != want {
			t.Fatalf("part %d: %+v", i, r)
		}
		if n := h.count(`SELECT count(*) FROM proc p JOIN frame f ON f.pk_frame = p.pk_frame
			WHERE p.pk_host = $1 AND f.str_host = $2 AND f.str_state = 'RUNNING'`, hosts[i].ID, hosts[i].Name); n != int64(len(r.Dispatched)) {
			t.Fatalf("host %s: %d frames running with their proc there, want %d", hosts[i].Name, n, len(r.Dispatched))
		}
		if n := h.count(`SELECT int_cores_idle FROM host WHERE pk_host = $1`, hosts[i].ID); n != want {
			t.Fatalf("host %s idle cores = %d, want %d", hosts[i].Name, n, want)
		}
	}
	// One transaction: every frame started at the same now().
	if n := h.count(`SELECT count(DISTINCT ts_started) FROM frame WHERE pk_layer = $1`, l.ID); n != 1 {
		t.Fatalf("frames started in %d transactions, want 1", n)
	}
	h.checkBooked(10)
	launched := map[string]int{}
	for _, ln := range h.fake.Launches() {
		launched[ln.Host]++
	}
	if launched[hosts[0].Name] != 4 || launched[hosts[1].Name] != 4 || launched[hosts[2].Name] != 2 {
		t.Fatalf("launches by host %v", launched)
	}
}

// A host whose idle is lower in Postgres than in the cache rolls the group
// back; each host is then committed on its own, so the others still start.
func TestDispatchGroupStaleHostCostsTheOthersNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	hosts, l := threeHosts(h, nil)
	h.exec(`UPDATE host SET int_cores_idle = 200 WHERE pk_host = $1`, hosts[1].ID)
	res := h.d.DispatchGroup(context.Background(), l, groupParts(l.Frames, hosts, 4, 4, 2))
	if res[0].Stop != dispatch.Done || len(res[0].Dispatched) != 4 || res[2].Stop != dispatch.Done || len(res[2].Dispatched) != 2 {
		t.Fatalf("the good hosts: %+v, %+v", res[0], res[2])
	}
	if res[1].Stop != dispatch.HostStale || len(res[1].Dispatched) != 0 || res[1].Host != hosts[1] {
		t.Fatalf("the stale host: %+v", res[1])
	}
	h.checkBooked(6)
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'WAITING' AND int_version = 0`, l.ID); n != 4 {
		t.Fatalf("%d frames untouched, want the stale host's 4", n)
	}
	if n := h.count(`SELECT int_cores_idle FROM host WHERE pk_host = $1`, hosts[1].ID); n != 200 {
		t.Fatalf("stale host idle = %d, want 200 (untouched)", n)
	}
}

// A limit's headroom counts the group's frames in order, across hosts.
func TestDispatchGroupLimitCountsAcrossHosts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	lim := h.must(h.seed.Limit(context.Background(), "licence", 5))
	hosts, l := threeHosts(h, func(js *farmseed.JobSpec) { js.Layers[0].Limits = []string{lim} })
	res := h.d.DispatchGroup(context.Background(), l, groupParts(l.Frames, hosts, 4, 4, 2))
	if len(res[0].Dispatched) != 4 || res[0].Stop != dispatch.Done {
		t.Fatalf("first host: %+v", res[0])
	}
	if len(res[1].Dispatched) != 1 || res[1].Stop != dispatch.LimitReached || len(res[1].Claimed) != 0 {
		t.Fatalf("second host: %+v", res[1])
	}
	if len(res[2].Dispatched) != 0 || res[2].Stop != dispatch.LimitReached || res[2].Host != hosts[2] {
		t.Fatalf("third host: %+v", res[2])
	}
	h.checkBooked(5)
	if n := h.count(`SELECT int_cores_idle FROM host WHERE pk_host = $1`, hosts[2].ID); n != 400 {
		t.Fatalf("third host idle = %d, want 400", n)
	}
}

// The job's core budget carries from host to host within a group.
func TestDispatchGroupJobBudgetCarriesAcrossHosts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	hosts, l := threeHosts(h, func(js *farmseed.JobSpec) { js.MaxCores = 6 })
	res := h.d.DispatchGroup(context.Background(), l, groupParts(l.Frames, hosts, 4, 4, 2))
	if len(res[0].Dispatched) != 4 || len(res[1].Dispatched) != 2 || res[1].Stop != dispatch.JobAtCap ||
		len(res[2].Dispatched) != 0 || res[2].Stop != dispatch.JobAtCap {
		t.Fatalf("results: %+v", res)
	}
	h.checkBooked(6)
}
