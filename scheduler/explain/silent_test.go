package explain_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/explain"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// TestSilentHostProcsGauge: scheduler_procs_on_silent_hosts{show} counts the
// procs of managed shows older than their layer's longest frame on hosts
// whose RQD stopped reporting (an RQD dead mid-frame), and only those.
func TestSilentHostProcsGauge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := newFarm(t)
	str, show, job := must[string](t), must[farmseed.Show](t), must[farmseed.Job](t)
	fac := str(s.Facility(ctx, "f1"))
	sh := show(s.Show(ctx, "alpha", true))
	legacy := show(s.Show(ctx, "legacy", false))
	alloc := str(s.Alloc(ctx, fac, "f1.general", "general"))
	for _, x := range []farmseed.Show{sh, legacy} {
		str(s.Subscribe(ctx, x, alloc, 100, 100))
	}
	silent := str(s.Host(ctx, farmseed.HostSpec{Name: "dead1", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 32 * farmseed.GB}))
	alive := str(s.Host(ctx, farmseed.HostSpec{Name: "live1", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 32 * farmseed.GB}))
	spec := func(x farmseed.Show, name string) farmseed.JobSpec {
		return farmseed.JobSpec{Name: name, Show: x, Facility: fac,
			Layers: []farmseed.LayerSpec{{Name: "render", Tags: []string{"general"}, Frames: 4}}}
	}
	j := job(s.Job(ctx, spec(sh, "alpha_job")))
	lj := job(s.Job(ctx, spec(legacy, "legacy_job")))
	old := []string{
		str(s.Proc(ctx, farmseed.ProcSpec{Host: silent, Frame: j.Layers[0].Frames[0], Cores: 1, MemKB: farmseed.GB})),  // counted
		str(s.Proc(ctx, farmseed.ProcSpec{Host: alive, Frame: j.Layers[0].Frames[1], Cores: 1, MemKB: farmseed.GB})),   // host reports
		str(s.Proc(ctx, farmseed.ProcSpec{Host: silent, Frame: lj.Layers[0].Frames[0], Cores: 1, MemKB: farmseed.GB})), // not managed
	}
	str(s.Proc(ctx, farmseed.ProcSpec{Host: silent, Frame: j.Layers[0].Frames[2], Cores: 1, MemKB: farmseed.GB})) // young
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO layer_usage (pk_layer_usage, pk_layer, pk_job)
		SELECT DISTINCT ON (p.pk_layer) gen_random_uuid()::text, p.pk_layer, p.pk_job FROM proc p
		WHERE NOT EXISTS (SELECT 1 FROM layer_usage lu WHERE lu.pk_layer = p.pk_layer)`)
	exec(`UPDATE layer_usage SET int_clock_time_high = 600`)
	exec(`UPDATE proc SET ts_booked = now() - interval '1 hour' WHERE pk_proc = ANY($1)`, old)
	exec(`UPDATE host_stat SET ts_ping = now() - interval '10 minutes' WHERE pk_host = $1`, silent)

	ps, err := explain.SilentProcs(ctx, pool, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].ProcID != old[0] || ps[0].Host != "dead1" || ps[0].Show != "alpha" {
		t.Fatalf("silent procs = %+v, want only %s", ps, old[0])
	}
	reg := prometheus.NewRegistry()
	g, err := explain.NewGauge(pool, 0, nil, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	g.Update(ctx)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got float64
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "scheduler_procs_on_silent_hosts" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == "alpha" {
					got, found = m.GetGauge().GetValue(), true
				}
			}
		}
	}
	if !found || got != 1 {
		t.Fatalf("scheduler_procs_on_silent_hosts{show=alpha} = %v (found %v), want 1", got, found)
	}
}
