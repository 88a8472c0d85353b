package loop

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/matchertest"
)

// slotFarm is a Worker over a farm that frees a few slots before each
// pass: a job starts what its budget and the free slots allow, in turn
// order; a job named "cant-*" works no layer (a limit without seats, no
// host for its tags) and starts nothing.
type slotFarm struct {
	mu      sync.Mutex
	free    int
	started map[string]int
}

func (f *slotFarm) ProcessInTurn(ctx context.Context, c *clusters.Cluster, j jobs.Job, t matcher.Turn) (matcher.Outcome, error) {
	if t.Wait != nil {
		<-t.Wait
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.Done != nil {
		defer t.Done()
	}
	if strings.HasPrefix(j.Name, "cant-") {
		return matcher.Outcome{}, nil
	}
	n := min(f.free, 20)
	if t.Budget > 0 {
		n = min(n, t.Budget)
	}
	f.free -= n
	f.started[j.Name] += n
	return matcher.Outcome{Dispatched: n, Planned: max(n, 1), Layers: 1}, nil
}

// A tight lottery pass splits the room it finds by weight, whatever the
// draw order, and work that cannot run does not shrink the plan of the
// work that can. Each pass finds 4 free slots.
//   - Five priority-300 jobs and one of priority 100 (PRIORITY_STARVING's
//     shape): the low job's weight share is 6.25%. With each job's share
//     of five frames a job (the old split), the job drawn first took the
//     4 slots and the low job got 4.0%.
//   - Two priority-300 jobs that work no layer beside two healthy jobs of
//     75 and 25: the healthy jobs take every slot, about 3:1. A plan cut
//     to what the last pass started (the first try at this split) fell to
//     75 of the 1,600 slots.
//
// The job ids are fixed (the draw hashes them), so each case is the same
// on every run.
func TestTightPassesSplitTheRoomTheyFind(t *testing.T) {
	type job struct {
		name string
		prio int
	}
	for _, c := range []struct {
		name     string
		jobs     []job
		low      string
		min, max float64 // the low job's share of the starts
	}{
		{"starving", []job{{"h1", 300}, {"h2", 300}, {"h3", 300}, {"h4", 300}, {"h5", 300}, {"low", 100}}, "low", 0.05, 0.075},
		{"cannot-run", []job{{"cant-a", 300}, {"cant-b", 300}, {"high", 75}, {"low", 25}}, "low", 0.2, 0.3},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			f := matchertest.OneAlloc(ctx, t)
			for _, s := range c.jobs {
				id := uuid.NewSHA1(uuid.NameSpaceOID, []byte(t.Name()+"/"+s.name)).String()
				if _, err := f.Seed.Job(ctx, farmseed.JobSpec{ID: id, Name: s.name, Show: f.Show, Facility: f.Facility, Priority: s.prio,
					Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2}}}); err != nil {
					t.Fatal(err)
				}
			}
			// No job below its minimum cores: the draw alone orders them.
			if _, err := f.Pool.Exec(ctx, `UPDATE job_resource SET int_min_cores = 0`); err != nil {
				t.Fatal(err)
			}
			cl := clusters.New(f.Facility, f.Show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: f.Alloc}})
			farm := &slotFarm{started: map[string]int{}}
			p := New(f.Pool, nil, farm, Config{MaxJobsPerPass: 10, Lottery: true, LotterySeed: 1}, Options{})
			const passes, perPass = 400, 4
			for range passes {
				farm.mu.Lock()
				farm.free += perPass
				farm.mu.Unlock()
				p.Pass(ctx, cl)
			}
			got := 0
			for _, n := range farm.started {
				got += n
			}
			share := float64(farm.started[c.low]) / float64(got)
			t.Logf("starts %v: %s's share %.3f", farm.started, c.low, share)
			// The slots left free at the end are at most a few passes' worth.
			if want := passes * perPass; got < want-8*perPass {
				t.Errorf("the jobs started %d of the %d slots freed", got, want)
			}
			if share < c.min || share > c.max {
				t.Errorf("%s took %.3f of the starts, want %.3f..%.3f", c.low, share, c.min, c.max)
			}
		})
	}
}

// A farm with room is not judged tight because the matcher's per-job cap
// (queue.dispatch_frames_per_job_limit) stopped the jobs whose lottery
// budget was above it: five priority-100 jobs and one of priority 1 on a
// farm with room for all, each job capped at 20 frames a pass. A roomy
// pass plans 48 frames for each high job (20 can start) and 1 for the low
// one, and starts 101. Judged on the 241 it planned, that pass "found" 101
// slots: the next passes planned 101 split by weight, the low job's share
// rounded to none in half of them (it started 5 frames in 10 passes).
// Counted up to the cap, every pass keeps the roomy plan.
func TestCappedJobsDoNotMakeARoomyFarmTight(t *testing.T) {
	ctx := context.Background()
	f := matchertest.OneAlloc(ctx, t)
	for i, prio := range []int{100, 100, 100, 100, 100, 1} {
		name := "high"
		if prio == 1 {
			name = "low"
		}
		name = fmt.Sprintf("%s-%d", name, i)
		id := uuid.NewSHA1(uuid.NameSpaceOID, []byte(t.Name()+"/"+name)).String()
		if _, err := f.Seed.Job(ctx, farmseed.JobSpec{ID: id, Name: name, Show: f.Show, Facility: f.Facility, Priority: prio,
			Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.Pool.Exec(ctx, `UPDATE job_resource SET int_min_cores = 0`); err != nil {
		t.Fatal(err)
	}
	cl := clusters.New(f.Facility, f.Show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: f.Alloc}})
	farm := &slotFarm{started: map[string]int{}} // caps each job at 20 a pass
	p := New(f.Pool, nil, farm, Config{MaxJobsPerPass: 10, Lottery: true, LotterySeed: 1, FramesPerJob: 20}, Options{})
	const passes = 10
	for i := range passes {
		farm.mu.Lock()
		farm.free = 1000
		farm.mu.Unlock()
		if got := p.Pass(ctx, cl).Dispatched; got != 101 {
			t.Errorf("pass %d started %d frames, want 101 (20 for each high job, 1 for the low one)", i+1, got)
		}
	}
	if got := farm.started["low-5"]; got != passes {
		t.Errorf("the low job started %d frames in %d passes, want one a pass (starts %v)", got, passes, farm.started)
	}
}
