package sim

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// With Options.SchedulerBin, a scale world runs its scheduler as a child
// process of the deployed binary: the child books the farm through the
// fake RQD, the world reads its metrics over HTTP where it would gather an
// in-process registry, its RSS and CPU are its own, and SIGTERM at the end
// drains it cleanly.
func TestChildScheduler(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a farm")
	}
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "cuesched")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/cuesched/cuesched/cmd/cuesched")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, out)
	}
	ctx := context.Background()
	env, err := StartEnv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	w, err := newWorld(ctx, env, Options{Seed: 1, SchedulerBin: bin, Patience: testenv.PatienceFactor()}, "CHILD", Variant{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if _, err := w.seedScale(ctx, 40, 1200); err != nil {
		t.Fatal(err)
	}
	w.ScaleMode()
	w.RunTimes(time.Hour, 2*time.Hour) // nothing ends: the fill is the bookings
	if err := w.Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	pids := w.childPIDs()
	if len(pids) != 1 || pids[0] == os.Getpid() {
		t.Fatalf("child pids %v, want one other than ours (%d)", pids, os.Getpid())
	}
	if !w.WaitFor(ctx, w.Patient(60*time.Second), func() bool { return w.LaunchedFill() >= 0.95 }) {
		t.Fatalf("the child scheduler filled %.0f%% of the farm; notes: %v", w.LaunchedFill()*100, w.notes)
	}
	if got := w.Counter("scheduler_bookings_planned_total", "", ""); got <= 0 {
		t.Errorf("scheduler_bookings_planned_total scraped from the child = %v, want > 0", got)
	}
	if g := w.Gauges("scheduler_host_cache_staleness_seconds"); len(g) != 1 {
		t.Errorf("staleness gauges %v, want the child's one", g)
	}
	if w.Leader() != 0 {
		t.Errorf("Leader() = %d, want the only scheduler (0)", w.Leader())
	}
	if rss := procStatus(pids[0], "VmHWM"); rss < 1<<20 || rss == procStatus(0, "VmHWM") {
		t.Errorf("the child's peak RSS %d B: not its own", rss)
	}
	if procCPU(pids[0]) <= 0 {
		t.Error("the child used no CPU")
	}
	w.stop()
	for _, n := range w.notes {
		if strings.Contains(n, "scheduler 0") {
			t.Errorf("the child did not end as asked: %s", n)
		}
	}
	if err := w.sidecarCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if n := w.Int(ctx, `SELECT count(*) FROM proc`); int64(w.Fake.Totals().Launched) != n {
		t.Errorf("%d launches on the fake RQD, %d procs in the database", w.Fake.Totals().Launched, n)
	}
}
