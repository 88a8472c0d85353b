package memsize

import (
	"strings"
	"testing"

	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/config"
)

func TestExplainSaysWhy(t *testing.T) {
	p := FromConfig(config.Default().Sizing)
	p.Threadable = sizing.ModeHistory
	if p != policy() {
		t.Fatalf("defaults %+v differ from the tests' policy %+v", p, policy())
	}
	h := History{MemMinKB: 6 * gb, SubmittedKB: 4 * gb, Kills: 1, SamplesKB: []int64{5 * gb, 6 * gb, 5 * gb, 5 * gb, 6 * gb}}
	e := Explain(p, h)
	for _, want := range []string{"books 6.6GiB", "p95 of 5 RSS samples", "= 6.0GiB + 10% headroom 0.6GiB", "request 4.0GiB",
		"layer.int_mem_min 6.0GiB is Cuebot's ratchet", "1 memory kill(s)"} {
		if !strings.Contains(e.Text, want) {
			t.Errorf("%q lacks %q", e.Text, want)
		}
	}
	if e.Source != sizing.SourceHistory || e.Samples != 5 || e.QuantileKB != 6*gb {
		t.Errorf("%+v", e)
	}
	h.BumpKB, h.Bumps = 10*gb, 1
	if e := Explain(p, h); e.Source != sizing.SourceBump || !strings.Contains(e.Text, "raised after 2 memory kills within 1h0m0s (1 bump(s))") {
		t.Errorf("bump: %+v", e)
	}
	p.Memory = sizing.ModeRequest
	if e := Explain(p, h); e.BookedKB != 6*gb || !strings.Contains(e.Text, "sizing.memory: request") {
		t.Errorf("off: %+v", e)
	}
}
