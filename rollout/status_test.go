package rollout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/cuesched/cuesched/shared/appname"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/rollout"
)

func statusOf(t *testing.T, tl *rollout.Tool, audit bool) (*rollout.StatusReport, string) {
	t.Helper()
	rep, err := tl.Status(context.Background(), rollout.StatusOptions{Audit: audit})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := rep.Write(&out); err != nil {
		t.Fatal(err)
	}
	return rep, out.String()
}

func TestStatusHealthyFarm(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	slot := uniqueSlot(t)
	streamSlot(t, f.dbURL, slot, appname.Format(appname.RoleSidecar, "cb1"))
	// A second sidecar instance without the slot: a standby.
	standby := fakeConn(t, f.dbURL, appname.Format(appname.RoleSidecar, "cb2"))
	_ = standby
	runScheduler(t, f, "sched-a")
	fakeScheduler(t, f.dbURL, "sched-b", false)
	tl := f.tool(t, true)
	if _, out, err := flip(t, tl, rollout.FlipRequest{Show: "alpha", On: true, Wait: 20 * time.Second}); err != nil {
		t.Fatalf("flip: %v\n%s", err, out)
	}

	rep, out := statusOf(t, tl, true)
	if !rep.Healthy() {
		t.Fatalf("healthy farm needs attention: %v\n%s", rep.Attention, out)
	}
	if rep.Leader == nil || rep.Leader.Instance != "scheduler/sched-a" {
		t.Errorf("leader %+v", rep.Leader)
	}
	roles := map[string]rollout.Instance{}
	for _, in := range rep.Instances {
		roles[in.Label()] = in
	}
	if a := roles["scheduler/sched-a"]; !a.Leader || len(a.Conns) == 0 {
		t.Errorf("sched-a %+v", a)
	}
	if b, ok := roles["scheduler/sched-b"]; !ok || b.Leader {
		t.Errorf("sched-b %+v (present %v)", b, ok)
	}
	if s := roles["sidecar/cb1"]; len(s.Slots) != 1 || s.Slots[0] != slot {
		t.Errorf("sidecar/cb1 %+v", s)
	}
	if s, ok := roles["sidecar/cb2"]; !ok || len(s.Slots) != 0 {
		t.Errorf("sidecar/cb2 %+v", s)
	}
	if len(rep.Slots) != 1 || !rep.Slots[0].Active || !rep.Slots[0].Sidecar || rep.Slots[0].Holder != "cuesched-sidecar/cb1" {
		t.Errorf("slots %+v", rep.Slots)
	}
	if len(rep.Managed) != 1 || rep.Managed[0].Name != "alpha" || rep.Managed[0].Seeded != rollout.SeededYes {
		t.Errorf("managed %+v", rep.Managed)
	}
	if rep.Audit == nil || rep.Audit.Drifts != 0 || rep.Audit.Shows != 1 || rep.Audit.Procs != 2 {
		t.Errorf("audit %+v (skipped %q)", rep.Audit, rep.AuditSkipped)
	}
	contains(t, "status", out, "loop leader: scheduler/sched-a", "loop leader", "follower", "streams "+slot,
		"standby (holds no slot)", "reachable, bootstrapped", "managed shows: 1", "drift:\n  none", "status: OK")

	// JSON carries the same.
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back rollout.StatusReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Leader == nil || len(back.Instances) != 4 || len(back.Attention) != 0 {
		t.Errorf("JSON round trip: %v %+v\n%s", err, back, js.String())
	}
}

func TestStatusNeedsAttention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFarm(t)
	// A fake scheduler leads; the show is managed and seeded by hand; no
	// sidecar streams.
	fakeScheduler(t, f.dbURL, "sched-x", true)
	f.exec(t, `UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, f.alpha.ID)
	if err := f.pub.BeginBootstrap(ctx, "e1"); err != nil {
		t.Fatal(err)
	}
	if err := f.pub.SetEpoch(ctx, "e1"); err != nil {
		t.Fatal(err)
	}
	if err := f.pub.MarkSeeded(ctx, f.alpha.ID, "e1"); err != nil {
		t.Fatal(err)
	}
	tl := f.tool(t, true)
	rep, out := statusOf(t, tl, true)
	if rep.Healthy() {
		t.Fatalf("no sidecar and no records must need attention:\n%s", out)
	}
	if rep.Leader == nil || rep.Leader.Instance != "scheduler/sched-x" {
		t.Errorf("leader %+v", rep.Leader)
	}
	contains(t, "status", out, "status: NEEDS ATTENTION", "no sidecar slot (cuesched_sidecar*)", "accounting drift:",
		"by table:", "KIND", "record", "loop leader: scheduler/sched-x")
	if rep.Audit == nil || rep.Audit.Drifts == 0 || rep.Audit.ByKind["record"] != 2 {
		t.Errorf("audit %+v", rep.Audit)
	}

	// --no-audit: drift is not looked at, the guardrail still is.
	rep, out = statusOf(t, tl, false)
	if rep.Audit != nil || rep.AuditSkipped != "--no-audit" || rep.Healthy() {
		t.Errorf("no audit: %+v", rep)
	}
	contains(t, "status --no-audit", out, "not audited (--no-audit)")

	// Unseeded managed show and no leader.
	g := newFarm(t)
	streamSlot(t, g.dbURL, uniqueSlot(t), appname.Format(appname.RoleSidecar, "cb1"))
	g.exec(t, `UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, g.beta.ID)
	rep, out = statusOf(t, g.tool(t, true), false)
	contains(t, "status", out, `managed show "beta" is not seeded`, "no scheduler is connected", "Redis is not bootstrapped")
	for _, a := range rep.Attention {
		if strings.Contains(a, "sidecar") {
			t.Errorf("a streaming sidecar is reported: %s", a)
		}
	}

	// Unreachable Redis.
	rep, out = statusOf(t, f.unreachableTool(t), true)
	contains(t, "status", out, "UNREACHABLE", "Redis unreachable")
	if rep.Healthy() || rep.Managed[0].Seeded != rollout.SeededUnknown {
		t.Errorf("unreachable Redis: %+v", rep)
	}
}

func TestStatusEmptyFarmIsHealthy(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	rep, out := statusOf(t, f.tool(t, false), true)
	if !rep.Healthy() {
		t.Fatalf("nothing managed, nothing running: %v\n%s", rep.Attention, out)
	}
	contains(t, "status", out, "loop leader: none", "instances:\n  none connected", "no cuesched* slot", "not given", "not audited (no Redis given)", "status: OK")
}

// TestStatusWarnsOfProcsOnSilentHosts: RQD died mid-frame. Its host stops
// reporting (host_stat.ts_ping goes stale) and its frames stay RUNNING with
// their cores booked until Cuebot clears the procs; cuesched cannot, but
// status names them once they have outlived their layer's longest frame.
func TestStatusWarnsOfProcsOnSilentHosts(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	f.exec(t, `UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, f.alpha.ID)
	tl := f.tool(t, false)
	silentWarning := "run past their layer's longest frame on hosts whose RQD has not reported"

	// Young procs, the host reporting: nothing to say.
	f.exec(t, `INSERT INTO layer_usage (pk_layer_usage, pk_layer, pk_job)
		SELECT DISTINCT ON (p.pk_layer) gen_random_uuid()::text, p.pk_layer, p.pk_job FROM proc p
		WHERE NOT EXISTS (SELECT 1 FROM layer_usage lu WHERE lu.pk_layer = p.pk_layer)`)
	f.exec(t, `UPDATE layer_usage SET int_clock_time_high = 600`) // the layer's longest frame: 10 min
	rep, out := statusOf(t, tl, false)
	if len(rep.SilentProcs) != 0 || strings.Contains(out, silentWarning) {
		t.Fatalf("healthy procs reported:\n%s", out)
	}
	// The procs are older than the layer's longest frame, but the host
	// still reports: a slow frame, not a dead RQD.
	f.exec(t, `UPDATE proc SET ts_booked = now() - interval '2 hours'`)
	if rep, _ = statusOf(t, tl, false); len(rep.SilentProcs) != 0 {
		t.Fatalf("procs on a reporting host: %+v", rep.SilentProcs)
	}
	// The host went silent ten minutes ago.
	f.exec(t, `UPDATE host_stat SET ts_ping = now() - interval '10 minutes'`)
	rep, out = statusOf(t, tl, false)
	if len(rep.SilentProcs) != 2 || rep.Healthy() {
		t.Fatalf("silent procs = %+v\n%s", rep.SilentProcs, out)
	}
	contains(t, "status", out, silentWarning, "2 proc(s)", "5 cores", "node1")
}
