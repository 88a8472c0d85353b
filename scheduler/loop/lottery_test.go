package loop_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/loop"
)

func TestLotteryBudgets(t *testing.T) {
	t.Parallel()
	js := func(prios ...float64) []jobs.Job {
		out := make([]jobs.Job, len(prios))
		for i, p := range prios {
			out[i].Effective = p
		}
		return out
	}
	for _, c := range []struct {
		jobs []jobs.Job
		want string
	}{
		{js(100), "[0]"},                  // a lone job: no budget
		{js(100, 100), "[5 5]"},           // equal weights split the pass
		{js(300, 100), "[8 3]"},           // by weight, rounded up
		{js(1000, 0, -5), "[15 1 1]"},     // floored at 1 frame and weight 1
		{js(10, 20, 30, 40), "[2 4 6 8]"}, // proportional
		{js(50, 50, 50, 50, 50), "[5 5 5 5 5]"},
	} {
		if got := fmt.Sprint(loop.LotteryBudgets(c.jobs, 5)); got != c.want {
			t.Errorf("LotteryBudgets(%v) = %s, want %s", c.jobs, got, c.want)
		}
	}
}

// A tight pass's budgets: each job gets the floor or the ceiling of its
// weighted share of the slots, on average the share itself whatever the
// offset, and they sum to about the slots; a job below its minimum cores
// gets at least one; a job with none sits the pass out.
func TestSlotBudgets(t *testing.T) {
	t.Parallel()
	js := []jobs.Job{{Effective: 300}, {Effective: 300}, {Effective: 300}, {Effective: 300}, {Effective: 300}, {Effective: 100}}
	const slots, draws = 4.0, 1000
	sums := make([]float64, len(js))
	for k := range draws {
		u := (float64(k) + 0.5) / draws
		b := loop.SlotBudgets(js, slots, u)
		total := 0
		for i, n := range b {
			share := slots * max(js[i].Effective, 1) / 1600
			if float64(n) < math.Floor(share) || float64(n) > math.Ceil(share) {
				t.Fatalf("u=%.4f: job %d got %d, share %.3f", u, i, n, share)
			}
			sums[i] += float64(n)
			total += n
		}
		if total < 4 || total > 5 {
			t.Fatalf("u=%.4f: budgets %v sum to %d, want about %v", u, b, total, slots)
		}
	}
	for i, s := range sums {
		want := slots * js[i].Effective / 1600
		if got := s / draws; math.Abs(got-want) > 0.01 {
			t.Errorf("job %d: mean budget %.3f, want its share %.3f", i, got, want)
		}
	}
	// The priority-100 job's budget is 0 on three draws in four: that
	// pass is the others'. Below its minimum cores it always gets one.
	if b := loop.SlotBudgets(js, slots, 0.99); b[5] != 0 {
		t.Errorf("budgets at u=0.99: %v, want the last job's 0", b)
	}
	js[5].BelowMinCores = true
	if b := loop.SlotBudgets(js, slots, 0.99); b[5] != 1 {
		t.Errorf("budgets below minimum: %v, want the last job's 1", b)
	}
	if b := loop.SlotBudgets(js[:1], slots, 0.5); b[0] != 0 {
		t.Errorf("a lone job's budget = %v, want none (0)", b)
	}
}
