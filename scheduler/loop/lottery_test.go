package loop_test

import (
	"fmt"
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
