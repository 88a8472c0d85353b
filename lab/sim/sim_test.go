package sim_test

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/lab/sim"
)

func TestSpearman(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		xs, ys []float64
		want   float64
	}{
		{[]float64{1, 2, 3, 4}, []float64{10, 20, 30, 40}, 1},
		{[]float64{1, 2, 3, 4}, []float64{40, 30, 20, 10}, -1},
		{[]float64{1, 2, 3, 4}, []float64{1, 100, 2, 3}, 0.4},
		{[]float64{1, 2, 3}, []float64{5, 5, 5}, 0}, // no variance: no correlation
	} {
		if got := sim.Spearman(c.xs, c.ys); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Spearman(%v, %v) = %v, want %v", c.xs, c.ys, got, c.want)
		}
	}
}

// Every scenario the issue lists is in the battery, once, and a scenario
// whose capability is not built yet reports FAIL, never a silent skip.
func TestBatteryNames(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, n := range sim.Names() {
		if seen[n] {
			t.Errorf("scenario %s listed twice", n)
		}
		seen[n] = true
	}
	for _, n := range []string{"COLDFILL", "PRIORITY", "PRIORITY_STARVING", "SHOWTIER", "RESERVATIONS", "LIMIT", "FOLDER",
		"JOBCAP", "CAPDROP", "DEPENDS", "TAGS_GPU", "GPUSTRAND", "SOLOFILL", "LOCALITY", "FAILOVER", "MIGRATE", "COMPLETIONSTORM"} {
		if !seen[n] {
			t.Errorf("scenario %s missing from the battery", n)
		}
	}
	if _, ok := sim.Lookup("priority"); !ok {
		t.Error("Lookup is not case-insensitive")
	}
}

// The fast subset of the battery: the real scheduler and sidecar against
// real Postgres and Redis, each scenario judged by its thresholds and the
// global invariants. (`make verify` runs the whole battery.)
func TestFastScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("the battery starts farms")
	}
	ctx := context.Background()
	b, err := sim.NewBattery(ctx, sim.Options{Seed: 7, NoVariants: true, Progress: func(s string) { t.Log(s) }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ran := 0
	for _, s := range sim.Scenarios() {
		if !s.Fast {
			continue
		}
		ran++
		t.Run(s.Name, func(t *testing.T) {
			for _, r := range b.Run(ctx, s) {
				if r.Pass {
					continue
				}
				var failed []string
				for _, m := range r.Metrics {
					if !m.Pass {
						failed = append(failed, m.String())
					}
				}
				t.Errorf("%s failed: %s %s", r.Name(), strings.Join(failed, "; "), r.Error)
			}
		})
	}
	if ran == 0 {
		t.Fatal("no fast scenario in the battery")
	}
}

// A scenario that is not built yet is a FAIL with its note.
func TestNotBuiltFails(t *testing.T) {
	t.Parallel()
	s := sim.Scenario{Name: "X", NotBuilt: "issue #0"}
	b := &sim.Battery{}
	rs := b.Run(context.Background(), s)
	if len(rs) != 1 || rs[0].Pass || len(rs[0].Notes) == 0 || !strings.Contains(rs[0].Notes[0], "issue #0") {
		t.Fatalf("not-built scenario: %+v, want one FAIL naming the issue", rs)
	}
}

// --json: one object per scenario, its comparison runs folded in.
func TestGroupedJSON(t *testing.T) {
	t.Parallel()
	rs := []sim.Result{
		{Scenario: "A", Judged: true, Pass: true},
		{Scenario: "A", Variant: "old", Pass: false},
		{Scenario: "B", Judged: true},
	}
	var b strings.Builder
	if err := sim.WriteJSON(&b, rs); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"variants":[{"scenario":"A","variant":"old"`) {
		t.Fatalf("JSON lines:\n%s", b.String())
	}
}
