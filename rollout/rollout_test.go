package rollout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/cuesched/cuesched/shared/appname"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/rollout"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

func TestAppName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		role, inst, want string
	}{
		{appname.RoleScheduler, "render-a", "cuesched-scheduler/render-a"},
		{appname.RoleSidecar, "", "cuesched-sidecar"},
		{appname.RoleSidecar, "cuebot-1/blue", "cuesched-sidecar/cuebot-1/blue"},
		{appname.RoleScheduler, "héte\n1", "cuesched-scheduler/h__te_1"},
		{appname.RoleScheduler, strings.Repeat("x", 80), "cuesched-scheduler/" + strings.Repeat("x", 63-len("cuesched-scheduler/"))},
	} {
		got := appname.Format(tc.role, tc.inst)
		if got != tc.want {
			t.Errorf("appname.Format(%q, %q) = %q, want %q", tc.role, tc.inst, got, tc.want)
		}
		role, _, ok := appname.Parse(got)
		if !ok || role != tc.role {
			t.Errorf("appname.Parse(%q) = %q, %v", got, role, ok)
		}
	}
	role, inst, ok := appname.Parse("cuesched-sidecar/cuebot-1/blue")
	if !ok || role != "sidecar" || inst != "cuebot-1/blue" {
		t.Errorf("ParseAppName kept %q %q %v", role, inst, ok)
	}
	for _, bad := range []string{"", "psql", "cuesched-", "cuesched-/x", "cuesched"} {
		if _, _, ok := appname.Parse(bad); ok {
			t.Errorf("appname.Parse(%q) accepted", bad)
		}
	}
}

func TestShowListTableAndJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFarm(t)
	f.exec(t, `UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, f.alpha.ID)
	// alpha is seeded in Redis with its two procs charged.
	if err := farmseed.SeedAccounting(ctx, f.pool, f.pub, f.alpha.ID); err != nil {
		t.Fatal(err)
	}
	// beta carries a stale marker (not managed).
	// (written by hand: the seed script refuses a marker of an unknown epoch)
	if err := f.pub.Client().HSet(ctx, publisher.ShowKey(f.beta.ID), "seeded", "old").Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.pub.Client().SAdd(ctx, publisher.ShowsKey, f.beta.ID).Err(); err != nil {
		t.Fatal(err)
	}
	var job, layer, folder string
	if err := f.pool.QueryRow(ctx, `SELECT j.pk_job, p.pk_layer, j.pk_folder FROM proc p JOIN job j ON j.pk_job = p.pk_job LIMIT 1`).Scan(&job, &layer, &folder); err != nil {
		t.Fatal(err)
	}
	for i, c := range []int64{300, 200} {
		if _, err := f.pub.ForceBook(ctx, publisher.Booking{ProcID: f.procs[i], ShowID: f.alpha.ID, AllocID: f.alloc,
			FolderID: folder, JobID: job, LayerID: layer, DeptID: farmseed.SeedDept, Centicores: c}); err != nil {
			t.Fatal(err)
		}
	}

	list, err := f.tool(t, true).ListShows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]rollout.ShowInfo{}
	for _, s := range list.Shows {
		byName[s.Name] = s
	}
	a, b := byName["alpha"], byName["beta"]
	if !a.Managed || a.Seeded != rollout.SeededYes || a.Procs != 2 || a.Centicores != 500 || len(a.Subscriptions) != 1 {
		t.Fatalf("alpha: %+v", a)
	}
	sub := a.Subscriptions[0]
	if sub.Alloc != "lot.general" || sub.Size != 1000 || sub.Burst != 2000 || sub.Booked != 500 || sub.Redis == nil ||
		sub.Redis.Booked != 5 || sub.Redis.Burst != 20 {
		t.Fatalf("alpha subscription: %+v redis %+v", sub, sub.Redis)
	}
	if b.Managed || b.Seeded != rollout.SeededStale || b.Procs != 0 {
		t.Fatalf("beta: %+v", b)
	}
	if _, ok := byName["testing"]; !ok {
		t.Fatal("the seed show is not listed")
	}

	var out bytes.Buffer
	if err := list.Write(&out); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	contains(t, "table", table, "SHOW / ALLOCATION", "REDIS BOOKED/BURST",
		"WARNING: 1 show(s) are scheduler-managed but no sidecar slot (cuesched_sidecar*)")
	if len(list.Warnings) != 1 {
		t.Errorf("warnings %q", list.Warnings)
	}
	var alphaRow, alphaSub string
	for _, l := range strings.Split(table, "\n") {
		switch {
		case strings.HasPrefix(l, "alpha "):
			alphaRow = l
		case strings.HasPrefix(l, "  lot.general") && alphaSub == "":
			alphaSub = l
		}
	}
	if strings.Join(strings.Fields(alphaRow), " ") != "alpha yes yes yes 2 5" {
		t.Errorf("alpha row %q", alphaRow)
	}
	if strings.Join(strings.Fields(alphaSub), " ") != "lot.general 5 10 20 5/20" {
		t.Errorf("alpha subscription row %q", alphaSub)
	}
	// Columns line up: every row's PROCS column starts at the same offset.
	header := strings.SplitN(table, "\n", 2)[0]
	col := strings.Index(header, "PROCS")
	if col < 0 || len(alphaRow) <= col || alphaRow[col] != '2' {
		t.Errorf("PROCS column not aligned at %d in %q", col, alphaRow)
	}

	out.Reset()
	if err := list.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Shows []struct {
			Name          string `json:"name"`
			Seeded        string `json:"seeded"`
			Cores         float64
			Subscriptions []struct {
				Alloc string `json:"alloc"`
				Redis *struct {
					Booked int64 `json:"int_cores"`
				} `json:"redis"`
			} `json:"subscriptions"`
		} `json:"shows"`
		Redis struct {
			Reachable bool `json:"reachable"`
		} `json:"redis"`
	}
	if err := json.Unmarshal(out.Bytes(), &decoded); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	found := false
	for _, s := range decoded.Shows {
		if s.Name == "alpha" {
			found = s.Seeded == "yes" && s.Cores == 5 && len(s.Subscriptions) == 1 && s.Subscriptions[0].Redis != nil && s.Subscriptions[0].Redis.Booked == 5
		}
	}
	if !found || !decoded.Redis.Reachable {
		t.Errorf("JSON lacks alpha as listed:\n%s", out.String())
	}

	// Without Redis: the Postgres part only.
	list, err = f.tool(t, false).ListShows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Shows {
		if s.Seeded != rollout.SeededNA {
			t.Errorf("no Redis: %s seeded %q", s.Name, s.Seeded)
		}
	}
	out.Reset()
	_ = list.Write(&out)
	contains(t, "table without Redis", out.String(), "Redis: not given")

	// Unreachable Redis: listed anyway, seeding unknown.
	list, err = f.unreachableTool(t).ListShows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if list.Redis.Reachable || list.Shows[0].Seeded != rollout.SeededUnknown {
		t.Errorf("unreachable Redis: %+v, first show %+v", list.Redis, list.Shows[0])
	}
	out.Reset()
	_ = list.Write(&out)
	contains(t, "table with unreachable Redis", out.String(), "Redis: UNREACHABLE")
}

func TestFlipUnknownShowSuggests(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	_, _, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "alhpa", On: true})
	var unknown *rollout.UnknownShowError
	if !errors.As(err, &unknown) {
		t.Fatalf("want UnknownShowError, got %v", err)
	}
	if unknown.Suggestion != "alpha" {
		t.Errorf("suggestion %q", unknown.Suggestion)
	}
	contains(t, "error", err.Error(), `no show named "alhpa"`, `did you mean "alpha"?`, "known shows: alpha, beta, testing")
	if _, _, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "zzzzzzzz", On: false}); err == nil ||
		strings.Contains(err.Error(), "did you mean") || !strings.Contains(err.Error(), "known shows: alpha, beta, testing") {
		t.Errorf("far-off name: %v", err)
	}
	// An alias resolves to its show.
	res, out, err := flip(t, f.tool(t, false), rollout.FlipRequest{Show: "test", On: false})
	if err != nil || res.Show.Name != "testing" {
		t.Fatalf("alias: %v %+v", err, res)
	}
	contains(t, "alias output", out, `"test" is an alias of show "testing"`, "already Cuebot-managed")
}

func TestFlipOnRefusedWithoutSidecarUnlessForced(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	tl := f.tool(t, true)
	// A sidecar of another database does not count.
	other := newFarm(t)
	streamSlot(t, other.dbURL, uniqueSlot(t), "cuesched-sidecar/elsewhere")

	_, out, err := flip(t, tl, rollout.FlipRequest{Show: "alpha", On: true})
	var refused *rollout.RefusedError
	if !errors.As(err, &refused) || !refused.Forcible {
		t.Fatalf("want a forcible refusal, got %v", err)
	}
	if f.managed(t, "alpha") {
		t.Fatal("refused flip changed the flag")
	}
	contains(t, "refusal", err.Error(), "nothing was changed", "sidecar:", "counters only grow", "other databases", "--force")
	contains(t, "preflight output", out, "preflight FAIL sidecar", "preflight ok   redis", "preflight warn scheduler")

	// Unreachable Redis is a refusal too.
	_, _, err = flip(t, f.unreachableTool(t), rollout.FlipRequest{Show: "alpha", On: true})
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "Redis unreachable") {
		t.Fatalf("unreachable Redis: %v", err)
	}
	// No Redis at all as well.
	_, _, err = flip(t, f.tool(t, false), rollout.FlipRequest{Show: "alpha", On: true})
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "no Redis given") {
		t.Fatalf("no Redis: %v", err)
	}

	res, out, err := flip(t, tl, rollout.FlipRequest{Show: "alpha", On: true, Force: true})
	if err != nil || !res.Changed || !res.Forced {
		t.Fatalf("forced flip: %v %+v", err, res)
	}
	if !f.managed(t, "alpha") {
		t.Fatal("forced flip did not change the flag")
	}
	contains(t, "forced output", out, "--force: flipping despite 1 failed check(s)", `show "alpha" is now scheduler-managed`, "flip-settle")
}

func TestFlipOnWithSidecarAndWaitForSeed(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	streamSlot(t, f.dbURL, uniqueSlot(t), "cuesched-sidecar/cb1")
	runScheduler(t, f, "sched-a")
	tl := f.tool(t, true)

	res, out, err := flip(t, tl, rollout.FlipRequest{Show: "alpha", On: true, Wait: 20 * time.Second})
	if err != nil {
		t.Fatalf("flip: %v\n%s", err, out)
	}
	if !res.Changed || res.Forced || res.Wait == nil || !res.Wait.Bookable() {
		t.Fatalf("result %+v wait %+v", res, res.Wait)
	}
	contains(t, "output", out, "preflight ok   sidecar", "waiting up to 20s", "leader scheduler/sched-a", `show "alpha" is seeded: bookable`)
	if res.Wait.Leader == nil || res.Wait.Leader.Instance != "scheduler/sched-a" {
		t.Errorf("leader %+v", res.Wait.Leader)
	}
	// The scheduler adopted Cuebot's two procs while seeding.
	procs, err := f.pub.ShowProcs(context.Background(), f.alpha.ID)
	if err != nil || len(procs) != 2 {
		t.Errorf("records after the seed: %v %v", procs, err)
	}

	// Idempotent: flipping on again changes nothing and succeeds at once.
	res, out, err = flip(t, tl, rollout.FlipRequest{Show: "alpha", On: true, Wait: 5 * time.Second})
	if err != nil || res.Changed || !res.Wait.Bookable() {
		t.Fatalf("second flip: %v %+v", err, res)
	}
	contains(t, "second output", out, `show "alpha" is already scheduler-managed: nothing changed`)
	if strings.Contains(out, "preflight") {
		t.Errorf("a no-op flip ran the preflight:\n%s", out)
	}

	// Off with a wait: the leader removes the marker.
	res, out, err = flip(t, tl, rollout.FlipRequest{Show: "alpha", On: false, Wait: 20 * time.Second})
	if err != nil || !res.Changed {
		t.Fatalf("off: %v %+v\n%s", err, res, out)
	}
	contains(t, "off output", out, "now Cuebot-managed", "recalculate_subs", "closed for booking")
	seeded, _ := f.pub.Seeded(context.Background(), []string{f.alpha.ID})
	if seeded[f.alpha.ID] {
		t.Error("marker still present after off --wait")
	}
}

func TestFlipWaitTimesOutWithoutScheduler(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	streamSlot(t, f.dbURL, uniqueSlot(t), "cuesched-sidecar/cb1")
	// Redis is bootstrapped but no scheduler runs: nobody seeds the show.
	if err := f.pub.BeginBootstrap(context.Background(), "e1"); err != nil {
		t.Fatal(err)
	}
	if err := f.pub.SetEpoch(context.Background(), "e1"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, out, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "alpha", On: true, Wait: 700 * time.Millisecond})
	var we *rollout.WaitError
	if !errors.As(err, &we) {
		t.Fatalf("want WaitError, got %v\n%s", err, out)
	}
	if d := time.Since(start); d < 700*time.Millisecond {
		t.Errorf("gave up after %v", d)
	}
	if !res.Changed || !f.managed(t, "alpha") {
		t.Error("the flip must stay in effect after a wait timeout")
	}
	contains(t, "timeout error", err.Error(), `show "alpha" is scheduler-managed but NOT bookable yet`,
		"loop leader: none", "is a scheduler running?", "set-managed alpha off")
	contains(t, "output", out, "no scheduler connected", "marker absent")

	// A follower without the lock: named in the message.
	g := newFarm(t)
	streamSlot(t, g.dbURL, uniqueSlot(t), "cuesched-sidecar/cb1")
	fakeScheduler(t, g.dbURL, "follower-1", false)
	_, _, err = flip(t, g.tool(t, true), rollout.FlipRequest{Show: "alpha", On: true, Wait: 300 * time.Millisecond})
	if !errors.As(err, &we) || !strings.Contains(err.Error(), "1 scheduler instance(s) connected, none holds the accounting lock") ||
		!strings.Contains(err.Error(), "not bootstrapped") {
		t.Fatalf("follower only: %v", err)
	}
}

func TestFlipOnRemovesStaleMarker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFarm(t)
	streamSlot(t, f.dbURL, uniqueSlot(t), "cuesched-sidecar/cb1")
	// (written by hand: the seed script refuses a marker of an unknown epoch)
	if err := f.pub.Client().HSet(ctx, publisher.ShowKey(f.alpha.ID), "seeded", "previous-period").Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.pub.Client().SAdd(ctx, publisher.ShowsKey, f.alpha.ID).Err(); err != nil {
		t.Fatal(err)
	}
	res, out, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "alpha", On: true})
	if err != nil || !res.Preflight.StaleMarker {
		t.Fatalf("flip: %v %+v", err, res)
	}
	contains(t, "output", out, "removed the stale seeding marker")
	seeded, err := f.pub.Seeded(ctx, []string{f.alpha.ID})
	if err != nil || seeded[f.alpha.ID] {
		t.Fatalf("stale marker survived: %v %v", seeded, err)
	}
}

func TestFlipWarnsAboutZeroBurst(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	streamSlot(t, f.dbURL, uniqueSlot(t), "cuesched-sidecar/cb1")
	res, out, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "beta", On: true})
	if err != nil || !res.Changed {
		t.Fatalf("a warning must not refuse: %v", err)
	}
	var burst *rollout.Check
	for i, c := range res.Preflight.Checks {
		if c.Name == rollout.CheckBurst {
			burst = &res.Preflight.Checks[i]
		}
	}
	if burst == nil || burst.OK || burst.Blocking {
		t.Fatalf("burst check %+v", burst)
	}
	contains(t, "output", out, "preflight warn burst", "can never book")
}

func TestFlipRefusedWhenRolloutIncomplete(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	streamSlot(t, f.dbURL, uniqueSlot(t), "cuesched-sidecar/cb1")
	f.exec(t, `DROP PUBLICATION cuesched_proc`)
	_, _, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "alpha", On: true})
	var refused *rollout.RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "publication cuesched_proc missing") {
		t.Fatalf("want a rollout refusal, got %v", err)
	}
	// Off is allowed: only the column matters for it.
	f.exec(t, `UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, f.alpha.ID)
	if _, _, err := flip(t, f.tool(t, false), rollout.FlipRequest{Show: "alpha", On: false}); err != nil {
		t.Fatalf("off on an incomplete rollout: %v", err)
	}
}

func TestFlipChecksCuebotVersion(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	streamSlot(t, f.dbURL, uniqueSlot(t), "cuesched-sidecar/cb1")
	// The slice of Flyway's history table the check reads.
	f.exec(t, `CREATE TABLE flyway_schema_history (installed_rank int PRIMARY KEY, version varchar(50), success boolean NOT NULL)`)
	f.exec(t, `INSERT INTO flyway_schema_history SELECT v, v::text, true FROM generate_series(1, 44) v`)
	f.exec(t, `INSERT INTO flyway_schema_history VALUES (100, '46', false), (101, NULL, true)`)
	_, _, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "alpha", On: true})
	var refused *rollout.RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "Cuebot's schema history stops at V44") {
		t.Fatalf("old Cuebot: %v", err)
	}
	f.exec(t, `INSERT INTO flyway_schema_history VALUES (45, '45', true), (46, '47', true)`)
	res, out, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "alpha", On: true})
	if err != nil || !res.Changed {
		t.Fatalf("current Cuebot: %v\n%s", err, out)
	}
	contains(t, "output", out, "preflight ok   cuebot       Cuebot's schema is at V47")
}

// TestSidecarSlotRecognisedByItsHolder: sidecar.slot_name may be anything,
// so a slot streamed by a cuesched sidecar counts whatever its name; a
// slot of another tool, not named like ours, does not.
func TestSidecarSlotRecognisedByItsHolder(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	tl := f.tool(t, true)
	show, err := tl.FindShow(context.Background(), "alpha")
	if err != nil {
		t.Fatal(err)
	}
	sidecarCheck := func() rollout.Check {
		t.Helper()
		pf, err := tl.Preflight(context.Background(), show, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range pf.Checks {
			if c.Name == rollout.CheckSidecar {
				return c
			}
		}
		t.Fatalf("no sidecar check in %+v", pf.Checks)
		return rollout.Check{}
	}
	n := slotSeq.Add(1)
	other := fmt.Sprintf("othertool_rt%d", n)
	stopOther := streamSlot(t, f.dbURL, other, "pg_recvlogical")
	if c := sidecarCheck(); c.OK {
		t.Fatalf("another tool's slot counted as a sidecar: %+v", c)
	}
	stopOther()

	custom := fmt.Sprintf("studio_release_rt%d", n)
	streamSlot(t, f.dbURL, custom, appname.Format(appname.RoleSidecar, "cb1"))
	if c := sidecarCheck(); !c.OK || !strings.Contains(c.Detail, custom) {
		t.Fatalf("a sidecar's custom-named slot was not recognised: %+v", c)
	}
	rep, _ := statusOf(t, tl, false)
	var found bool
	for _, s := range rep.Slots {
		if s.Name == custom {
			found = true
			if !s.Sidecar || !s.Active || s.Holder != "cuesched-sidecar/cb1" {
				t.Errorf("status slot %+v", s)
			}
		}
	}
	if !found {
		t.Errorf("status does not list the custom-named sidecar slot: %+v", rep.Slots)
	}
}

// A limit shared by the show's pending jobs and a show Cuebot keeps
// dispatching is named as a warning (Cuebot books its side without the
// scheduler's lock on the limit); the flip still goes ahead.
func TestFlipWarnsAboutSharedLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFarm(t)
	streamSlot(t, f.dbURL, uniqueSlot(t), "cuesched-sidecar/cb1")
	s := &farmseed.Seeder{DB: f.pool}
	lim, err := s.Limit(ctx, "nuke", 4)
	if err != nil {
		t.Fatal(err)
	}
	var fac string
	if err := f.pool.QueryRow(ctx, `SELECT pk_facility FROM facility WHERE str_name = 'lot'`).Scan(&fac); err != nil {
		t.Fatal(err)
	}
	for _, sh := range []farmseed.Show{f.alpha, f.beta} {
		if _, err := s.Job(ctx, farmseed.JobSpec{Name: sh.Name + "-comp", Show: sh, Facility: fac,
			Layers: []farmseed.LayerSpec{{Name: "comp", Frames: 1, Limits: []string{lim}}}}); err != nil {
			t.Fatal(err)
		}
	}
	res, out, err := flip(t, f.tool(t, true), rollout.FlipRequest{Show: "alpha", On: true})
	if err != nil || !res.Changed {
		t.Fatalf("a warning must not refuse: %v", err)
	}
	var shared *rollout.Check
	for i, c := range res.Preflight.Checks {
		if c.Name == rollout.CheckSharedLimit {
			shared = &res.Preflight.Checks[i]
		}
	}
	// It names the limit and the worst case (docs/operator-guide.md, "A
	// limit shared with a show Cuebot still dispatches").
	if shared == nil || shared.OK || shared.Blocking || !strings.Contains(shared.Detail, "nuke") ||
		!strings.Contains(shared.Detail, "at worst the limit plus the frames Cuebot books from one stale read") {
		t.Fatalf("shared-limit check %+v", shared)
	}
	contains(t, "output", out, "preflight warn shared-limit")
}
