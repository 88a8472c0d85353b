package sim_test

import (
	"context"
	"fmt"
	"image/png"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cuesched/cuesched/lab/sim"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
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
		"JOBCAP", "CAPDROP", "DEPENDS", "TAGS_GPU", "GPUSTRAND", "SOLOFILL", "LOCALITY", "FAILOVER", "MIGRATE", "COMPLETIONSTORM",
		"LICENSE_DENIED", "POISON", "OOM", "MEMSTRAND", "STRANDGROW", "LICENSE", "LICENSE_NO_HOSTS", "LIMIT_MIXED"} {
		if !seen[n] {
			t.Errorf("scenario %s missing from the battery", n)
		}
	}
	if _, ok := sim.Lookup("priority"); !ok {
		t.Error("Lookup is not case-insensitive")
	}
	// SCALE runs by name only (make scale), never in "all".
	if s, ok := sim.Lookup("SCALE"); !ok || !s.Explicit || s.Fast {
		t.Errorf("SCALE: found %v, explicit %v, fast %v", ok, s.Explicit, s.Fast)
	}
	for _, s := range sim.BatteryScenarios() {
		if s.Explicit {
			t.Errorf("%s is explicit but in the battery", s.Name)
		}
	}
	if len(sim.BatteryScenarios()) != len(sim.Scenarios())-1 {
		t.Errorf("the battery has %d of %d scenarios", len(sim.BatteryScenarios()), len(sim.Scenarios()))
	}
}

// The fast subset of the battery: the real scheduler and sidecar against
// real Postgres and Redis, each scenario judged by its thresholds and the
// global invariants. (`make verify` runs the whole battery.)
//
// It runs seed 7, or every seed of CUESCHED_SIM_SEEDS ("1-20", "3,8"),
// each as TestFastScenarios/seed=N/SCENARIO: a verdict must not depend on
// the seed, nor on the machine's load (scripts/stress-test.sh --seeds).
func TestFastScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("the battery starts farms")
	}
	seeds, err := parseSeeds(os.Getenv("CUESCHED_SIM_SEEDS"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b, err := sim.NewBattery(ctx, sim.Options{NoVariants: true, Patience: testenv.PatienceFactor(), Progress: func(s string) { t.Log(s) }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ran := 0
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			bs := b.WithSeed(seed)
			for _, s := range sim.Scenarios() {
				if !s.Fast {
					continue
				}
				ran++
				t.Run(s.Name, func(t *testing.T) {
					for _, r := range bs.Run(ctx, s) {
						if r.Pass {
							continue
						}
						var failed []string
						for _, m := range r.Metrics {
							if !m.Pass {
								failed = append(failed, m.String())
							}
						}
						t.Errorf("%s (seed %d) failed: %s %s %s", r.Name(), seed, strings.Join(failed, "; "), strings.Join(r.Notes, "; "), r.Error)
					}
				})
			}
		})
	}
	if ran == 0 {
		t.Fatal("no fast scenario in the battery")
	}
}

// parseSeeds reads CUESCHED_SIM_SEEDS: "" is seed 7; otherwise a
// comma-separated list of seeds and ranges ("1-20", "3,8,10-12").
func parseSeeds(v string) ([]int64, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return []int64{7}, nil
	}
	var out []int64
	for _, part := range strings.Split(v, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseInt(lo, 10, 64)
		b := a
		if err == nil && isRange {
			b, err = strconv.ParseInt(hi, 10, 64)
		}
		if err != nil || a < 1 || b < a || b-a > 10000 {
			return nil, fmt.Errorf("CUESCHED_SIM_SEEDS=%q: want seeds >= 1 and ranges like 1-20, comma-separated", v)
		}
		for s := a; s <= b; s++ {
			out = append(out, s)
		}
	}
	return out, nil
}

func TestParseSeeds(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"": "[7]", "3": "[3]", "1-3": "[1 2 3]", " 2, 5-6 ": "[2 5 6]"} {
		got, err := parseSeeds(in)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("parseSeeds(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"x", "0", "5-2", "1-", "-3"} {
		if _, err := parseSeeds(bad); err == nil {
			t.Errorf("parseSeeds(%q): no error", bad)
		}
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

// The report's fill charts (drawn with lab/chart) decode as PNGs.
func TestWriteReportFillChart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := sim.Result{Scenario: "COLDFILL", Judged: true, Pass: true, Fill: []sim.Point{{T: 0, Fill: 0}, {T: 5, Fill: 0.6}, {T: 10, Fill: 0.97}}}
	if err := sim.WriteReport(dir, []sim.Result{r}, "test"); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir + "/fill-coldfill.png")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatal(err)
	}
}
