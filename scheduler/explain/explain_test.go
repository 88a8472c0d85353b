package explain_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/explain"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newFarm is a fresh Cuebot database, a pool on it and a seeder.
func newFarm(t *testing.T) (*pgxpool.Pool, *farmseed.Seeder) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, &farmseed.Seeder{DB: pool}
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// One farm with a layer held by each gate: every reason is produced by the
// real query against the Cuebot schema, and counted per show.
func TestEveryReason(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := newFarm(t)
	str, show, job := must[string](t), must[farmseed.Show](t), must[farmseed.Job](t)

	fac := str(s.Facility(ctx, "f1"))
	sh := show(s.Show(ctx, "alpha", true))
	other := show(s.Show(ctx, "beta", true))
	legacy := show(s.Show(ctx, "legacy", false))
	alloc := str(s.Alloc(ctx, fac, "f1.general", "general"))
	str(s.Subscribe(ctx, sh, alloc, 100, 100))
	str(s.Subscribe(ctx, other, alloc, 1, 1))
	str(s.Subscribe(ctx, legacy, alloc, 100, 100))
	cpu := str(s.Host(ctx, farmseed.HostSpec{Name: "cpu1", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 32 * farmseed.GB}))
	gpu := str(s.Host(ctx, farmseed.HostSpec{Name: "gpu1", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 32 * farmseed.GB,
		GPUs: 1, GPUMemKB: 8 * farmseed.GB}))

	general := func(name string, ls farmseed.LayerSpec) farmseed.LayerSpec {
		ls.Name = name
		if ls.Tags == nil {
			ls.Tags = []string{"general"}
		}
		if ls.Frames == 0 {
			ls.Frames = 2
		}
		return ls
	}
	one := func(js farmseed.JobSpec, ls farmseed.LayerSpec) farmseed.Job {
		t.Helper()
		if js.Show.ID == "" {
			js.Show = sh
		}
		js.Facility = fac
		js.Layers = []farmseed.LayerSpec{general(js.Name, ls)}
		return job(s.Job(ctx, js))
	}
	run := func(host, frame string, cores, gpus int) {
		t.Helper()
		str(s.Proc(ctx, farmseed.ProcSpec{Host: host, Frame: frame, Cores: cores, MemKB: farmseed.GB, GPUs: gpus}))
	}

	one(farmseed.JobSpec{Name: "held", Paused: true}, farmseed.LayerSpec{})
	dep := one(farmseed.JobSpec{Name: "depend"}, farmseed.LayerSpec{})
	if _, err := pool.Exec(ctx, `UPDATE frame SET str_state = 'DEPEND', int_depend_count = 1 WHERE pk_frame = $1`, dep.Layers[0].Frames[1]); err != nil {
		t.Fatal(err)
	}
	one(farmseed.JobSpec{Name: "nohost"}, farmseed.LayerSpec{Tags: []string{"nowhere"}})
	one(farmseed.JobSpec{Name: "nofit"}, farmseed.LayerSpec{Cores: 64})
	one(farmseed.JobSpec{Name: "nofit-os", OS: "rhel9"}, farmseed.LayerSpec{})
	burst := one(farmseed.JobSpec{Name: "burst", Show: other}, farmseed.LayerSpec{})
	run(cpu, burst.Layers[0].Frames[0], 1, 0)
	folder := str(s.Folder(ctx, sh, "capped", 1, -1))
	fc := one(farmseed.JobSpec{Name: "foldercap", Folder: folder}, farmseed.LayerSpec{})
	run(cpu, fc.Layers[0].Frames[0], 1, 0)
	jc := one(farmseed.JobSpec{Name: "jobcap", MaxCores: 1}, farmseed.LayerSpec{})
	run(cpu, jc.Layers[0].Frames[0], 1, 0)
	lim := str(s.Limit(ctx, "nuke", 0))
	one(farmseed.JobSpec{Name: "limit"}, farmseed.LayerSpec{Limits: []string{lim}})
	gj := one(farmseed.JobSpec{Name: "capacity"}, farmseed.LayerSpec{GPUs: 1, GPUMemKB: farmseed.GB})
	run(gpu, gj.Layers[0].Frames[0], 1, 1)
	one(farmseed.JobSpec{Name: "flowing"}, farmseed.LayerSpec{})
	one(farmseed.JobSpec{Name: "unmanaged", Show: legacy}, farmseed.LayerSpec{})
	// Held by the fail-fast backoff until a known time; a hold that ended
	// holds nothing.
	until := time.Now().Add(90 * time.Second).UTC().Truncate(time.Second)
	poison := one(farmseed.JobSpec{Name: "failing"}, farmseed.LayerSpec{})
	ended := one(farmseed.JobSpec{Name: "failed-once"}, farmseed.LayerSpec{})
	if _, err := pool.Exec(ctx, `INSERT INTO cuesched_layer_backoff (pk_layer, int_level, ts_until, int_fails, int_avg_run_ms)
		VALUES ($1, 3, $2, 7, 1200), ($3, 1, now() - interval '1 second', 5, 900)`, poison.Layers[0].ID, until, ended.Layers[0].ID); err != nil {
		t.Fatal(err)
	}

	ls, err := explain.Layers(ctx, pool, "", "", true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]explain.LayerReport{}
	for _, l := range ls {
		got[l.Job] = l
		t.Logf("%-10s %-10s waiting=%d depend=%d: %s", l.Job, l.Reason, l.Waiting, l.Depend, l.Detail)
	}
	want := map[string]explain.Reason{
		"held": explain.Held, "depend": explain.Flowing, "nohost": explain.NoHost, "nofit": explain.NoFit,
		"nofit-os": explain.NoFit, "burst": explain.Burst, "foldercap": explain.FolderCap, "jobcap": explain.JobCap,
		"limit": explain.Limit, "capacity": explain.Capacity, "flowing": explain.Flowing,
		"failing": explain.FailingFast, "failed-once": explain.Flowing,
	}
	for j, r := range want {
		if got[j].Reason != r {
			t.Errorf("job %s: reason %q (%s), want %q", j, got[j].Reason, got[j].Detail, r)
		}
	}
	if _, ok := got["unmanaged"]; ok {
		t.Error("a show Cuebot dispatches was explained")
	}
	if l := got["flowing"]; l.BestIdle != "cpu1" {
		t.Errorf("flowing layer's best host = %q, want cpu1 (the GPU host is busy)", l.BestIdle)
	}
	if l := got["capacity"]; l.BestTotal != "gpu1" || l.FitIdle != 0 {
		t.Errorf("capacity layer: best when idle %q, fitting now %d; want gpu1, 0", l.BestTotal, l.FitIdle)
	}

	if l := got["failing"]; !l.HeldUntil.Equal(until) || !strings.Contains(l.Detail, until.Format(time.RFC3339)) ||
		!strings.Contains(l.Detail, "7 failed runs averaging 1.2s") {
		t.Errorf("failing layer: held until %v, detail %q; want %v named", l.HeldUntil, l.Detail, until)
	}

	// One job, one layer.
	one1, err := explain.Layers(ctx, pool, "jobcap", "jobcap", true)
	if err != nil || len(one1) != 1 || one1[0].Reason != explain.JobCap {
		t.Fatalf("explain jobcap jobcap = %+v, %v", one1, err)
	}

	counts, err := explain.Waiting(ctx, pool, true)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]int{}
	for _, c := range counts {
		byKey[c.Show+"/"+string(c.Reason)] = c.Frames
	}
	wantExactly(t, "waiting frames", byKey, map[string]int{
		"alpha/held": 2, "alpha/depend": 1, "alpha/no host": 2, "alpha/no fit": 4, "alpha/folder cap": 1,
		"alpha/job cap": 1, "alpha/limit": 2, "alpha/capacity": 1, "alpha/flowing": 5, "beta/burst": 1, "alpha/failing fast": 2,
	})
}

// wantExactly fails t unless got holds exactly want's keys and values.
func wantExactly[K, V comparable](t *testing.T, what string, got, want map[K]V) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s %v = %+v, want %+v", what, k, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: %+v, want exactly %+v", what, got, want)
	}
}

// Host facts are counted once per need and allocation and summed over the
// allocations each show subscribes to: two shows with layers of the same
// needs see the hosts of their own subscriptions, layers of one show with
// the same needs see the same hosts, and the roomiest host is chosen over
// every allocation, CPU hosts before a GPU host.
func TestHostsPerShowAndAllocation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := newFarm(t)
	str, show, job := must[string](t), must[farmseed.Show](t), must[farmseed.Job](t)

	fac := str(s.Facility(ctx, "f1"))
	wide := show(s.Show(ctx, "wide", true))
	narrow := show(s.Show(ctx, "narrow", true))
	a1 := str(s.Alloc(ctx, fac, "f1.a", "ta"))
	a2 := str(s.Alloc(ctx, fac, "f1.b", "tb"))
	str(s.Subscribe(ctx, wide, a1, 1000, 1000))
	str(s.Subscribe(ctx, wide, a2, 1000, 1000))
	str(s.Subscribe(ctx, narrow, a2, 1000, 1000))
	render := []farmseed.HostTag{{Name: "render", Type: "MANUAL"}}
	idle := map[string]int{}
	for _, h := range []struct {
		name        string
		alloc, tag  string
		cores, idle int
		gpus        int
	}{
		{"a-huge", a1, "ta", 24, 2, 0},
		{"a-gpu", a1, "ta", 32, 32, 1},
		{"b-big", a2, "tb", 16, 4, 0},
		{"b-mid", a2, "tb", 12, 12, 0},
	} {
		id := str(s.Host(ctx, farmseed.HostSpec{Name: h.name, Alloc: h.alloc, AllocTag: h.tag, Cores: h.cores,
			MemKB: 64 * farmseed.GB, GPUs: h.gpus, GPUMemKB: int64(h.gpus) * 8 * farmseed.GB, Tags: render}))
		idle[id] = h.idle
	}
	for id, n := range idle {
		if _, err := pool.Exec(ctx, `UPDATE host SET int_cores_idle = $2 WHERE pk_host = $1`, id, n*100); err != nil {
			t.Fatal(err)
		}
	}
	one := func(name string, sh farmseed.Show, cores int) {
		t.Helper()
		job(s.Job(ctx, farmseed.JobSpec{Name: name, Show: sh, Facility: fac, Layers: []farmseed.LayerSpec{
			{Name: name, Tags: []string{"render"}, Frames: 2, Cores: cores, MemKB: farmseed.GB}}}))
	}
	one("wide1", wide, 1)
	one("wide2", wide, 1)
	one("wide-ten", wide, 10)
	one("narrow1", narrow, 1)

	ls, err := explain.Layers(ctx, pool, "", "", true)
	if err != nil {
		t.Fatal(err)
	}
	type facts struct {
		hosts, fitTotal, fitIdle int
		bestIdle, bestTotal      string
	}
	got := map[string]facts{}
	for _, l := range ls {
		got[l.Job] = facts{l.Hosts, l.FitTotal, l.FitIdle, l.BestIdle, l.BestTotal}
	}
	wantExactly(t, "host facts of job", got, map[string]facts{
		// b-mid has the most idle cores of the CPU hosts, a-huge the most
		// cores; a-gpu has more of both but is a GPU host.
		"wide1":    {4, 4, 4, "b-mid", "a-huge"},
		"wide2":    {4, 4, 4, "b-mid", "a-huge"},
		"wide-ten": {4, 4, 2, "b-mid", "a-huge"},
		"narrow1":  {2, 2, 2, "b-mid", "b-big"},
	})
}

// oneShow seeds a managed show "alpha" subscribed to one allocation with
// one 8-core host, and returns a function adding a job of one 2-frame
// layer that the host fits (named name).
func oneShow(t *testing.T, s *farmseed.Seeder) func(name string) {
	t.Helper()
	ctx := context.Background()
	str, show, job := must[string](t), must[farmseed.Show](t), must[farmseed.Job](t)
	fac := str(s.Facility(ctx, "f1"))
	sh := show(s.Show(ctx, "alpha", true))
	alloc := str(s.Alloc(ctx, fac, "f1.general", "general"))
	str(s.Subscribe(ctx, sh, alloc, 100, 100))
	str(s.Host(ctx, farmseed.HostSpec{Name: "cpu1", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 32 * farmseed.GB}))
	return func(name string) {
		t.Helper()
		job(s.Job(ctx, farmseed.JobSpec{Name: name, Show: sh, Facility: fac,
			Layers: []farmseed.LayerSpec{{Name: "l", Tags: []string{"general"}, Frames: 2}}}))
	}
}

// The count runs with JIT off: with PostgreSQL's default jit = on, the
// planner's high estimate of the host counts had every call compiled and
// optimised (2.7 to 5.3 s a call at 1,000 hosts, where the query takes
// about 20 ms). Forced here by making every statement of the database a
// JIT candidate; pg_stat_statements says whether the count was compiled.
func TestCountIsNotJITCompiled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := newFarm(t)
	var available bool
	if err := pool.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		t.Skip("this PostgreSQL has no JIT")
	}
	oneShow(t, s)("j")
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE EXTENSION IF NOT EXISTS pg_stat_statements`,
		`ALTER DATABASE "` + db + `" SET jit = on`,
		`ALTER DATABASE "` + db + `" SET jit_above_cost = 0`,
		`ALTER DATABASE "` + db + `" SET jit_optimize_above_cost = 0`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// Fresh connections, which read the database's settings.
	pool.Reset()
	var control int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT pk_layer FROM layer UNION SELECT pk_job FROM job) x`).Scan(&control); err != nil {
		t.Fatal(err)
	}
	ls, err := explain.Layers(ctx, pool, "", "", true)
	if err != nil || len(ls) != 1 {
		t.Fatalf("explain = %+v, %v", ls, err)
	}
	jit := func(prefix string) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT COALESCE(sum(jit_functions), -1)::bigint FROM pg_stat_statements s
			JOIN pg_database d ON d.oid = s.dbid AND d.datname = current_database()
			WHERE ltrim(query) LIKE $1`, prefix+"%").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The control statement was compiled: the forcing works here.
	if n := jit("SELECT count(*) FROM (SELECT pk_layer FROM layer UNION"); n <= 0 {
		t.Fatalf("the control statement compiled %d JIT functions: JIT is not forced on this server", n)
	}
	if n := jit("WITH gpuwant AS"); n != 0 {
		t.Errorf("the waiting-frames count compiled %d JIT functions, want 0 (jit off)", n)
	}
}

// A count gets at most one interval: one that has not answered by then is
// abandoned with a warning, and the gauge keeps its last values (forced
// here with an interval of a nanosecond).
func TestGaugeCountHasADeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := newFarm(t)
	add := oneShow(t, s)
	add("first")
	var logs strings.Builder
	reg := prometheus.NewRegistry()
	g, err := explain.NewGauge(pool, time.Minute, nil, hclog.New(&hclog.LoggerOptions{Output: &logs}), reg)
	if err != nil {
		t.Fatal(err)
	}
	flowing := func() float64 {
		return promread.Value(t, reg, "scheduler_waiting_frames", "show", "alpha", "reason", "flowing")
	}
	g.Update(ctx)
	if n := flowing(); n != 2 {
		t.Fatalf("flowing frames = %v, want 2", n)
	}
	add("second")
	g.Interval = time.Nanosecond
	g.Update(ctx)
	if n := flowing(); n != 2 {
		t.Errorf("flowing frames after an abandoned count = %v, want the last count's 2", n)
	}
	if !strings.Contains(logs.String(), "waiting-frame count failed") {
		t.Errorf("no warning for the abandoned count; logs:\n%s", logs.String())
	}
	g.Interval = time.Minute
	g.Update(ctx)
	if n := flowing(); n != 4 {
		t.Errorf("flowing frames = %v, want 4", n)
	}
}

func TestClassifyOrder(t *testing.T) {
	// Every gate closed: the first in check order wins.
	f := explain.Facts{Paused: true, Hosts: 0, BurstFull: true, FolderFull: true, JobFull: true, LimitFull: "x",
		HeldUntil: time.Now().Add(time.Minute), HeldLevel: 2, HeldFails: 5, HeldAvgRun: time.Second}
	order := explain.Reasons()
	steps := []func(*explain.Facts){
		func(f *explain.Facts) { f.Paused = false },
		func(f *explain.Facts) { f.HeldUntil = time.Time{} },
		func(f *explain.Facts) { f.Hosts = 1 },
		func(f *explain.Facts) { f.FitTotal = 1 },
		func(f *explain.Facts) { f.BurstFull = false },
		func(f *explain.Facts) { f.FolderFull = false },
		func(f *explain.Facts) { f.JobFull = false },
		func(f *explain.Facts) { f.LimitFull = "" },
		func(f *explain.Facts) { f.FitIdle = 1 },
	}
	want := []explain.Reason{explain.Held, explain.FailingFast, explain.NoHost, explain.NoFit, explain.Burst, explain.FolderCap,
		explain.JobCap, explain.Limit, explain.Capacity, explain.Flowing}
	for i := 0; ; i++ {
		if r, _ := explain.Classify(f); r != want[i] {
			t.Fatalf("step %d: %q, want %q", i, r, want[i])
		}
		if i == len(steps) {
			break
		}
		steps[i](&f)
	}
	if len(order) != 12 {
		t.Errorf("Reasons() = %v", order)
	}
}

// A CPU layer whose only room is a GPU host's, held for its idle GPU while
// GPU work waits: strand with GPU protection, flowing without.
func TestStrand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := newFarm(t)
	str, show, job := must[string](t), must[farmseed.Show](t), must[farmseed.Job](t)
	fac := str(s.Facility(ctx, "f1"))
	sh := show(s.Show(ctx, "alpha", true))
	alloc := str(s.Alloc(ctx, fac, "f1.gpu", "gpu"))
	str(s.Subscribe(ctx, sh, alloc, 100, 100))
	gpu := str(s.Host(ctx, farmseed.HostSpec{Name: "gpu1", Alloc: alloc, AllocTag: "gpu", Cores: 8, MemKB: 64 * farmseed.GB,
		GPUs: 1, GPUMemKB: 16 * farmseed.GB}))
	busy := job(s.Job(ctx, farmseed.JobSpec{Name: "busy", Show: sh, Facility: fac,
		Layers: []farmseed.LayerSpec{{Name: "busy", Tags: []string{"gpu"}, Frames: 1}}}))
	str(s.Proc(ctx, farmseed.ProcSpec{Host: gpu, Frame: busy.Layers[0].Frames[0], Cores: 5, MemKB: farmseed.GB}))
	job(s.Job(ctx, farmseed.JobSpec{Name: "gpujob", Show: sh, Facility: fac,
		Layers: []farmseed.LayerSpec{{Name: "g", Tags: []string{"gpu"}, Frames: 1, Cores: 4, GPUs: 1, GPUMemKB: farmseed.GB}}}))
	job(s.Job(ctx, farmseed.JobSpec{Name: "cpujob", Show: sh, Facility: fac,
		Layers: []farmseed.LayerSpec{{Name: "c", Tags: []string{"gpu"}, Frames: 2}}}))
	for _, c := range []struct {
		protect bool
		want    explain.Reason
	}{{true, explain.Strand}, {false, explain.Flowing}} {
		ls, err := explain.Layers(ctx, pool, "cpujob", "", c.protect)
		if err != nil || len(ls) != 1 {
			t.Fatalf("explain cpujob: %+v, %v", ls, err)
		}
		if ls[0].Reason != c.want {
			t.Errorf("GPU protection %t: reason %q (%s), want %q", c.protect, ls[0].Reason, ls[0].Detail, c.want)
		}
	}
	ls, err := explain.Layers(ctx, pool, "gpujob", "", true)
	if err != nil || len(ls) != 1 || ls[0].Reason != explain.Capacity {
		t.Fatalf("the GPU layer (3 idle cores, needs 4): %+v, %v; want capacity", ls, err)
	}
}

// A flowing layer under a limit with 3 free frames counts 3 waiting frames
// as flowing and the rest as limit (not all of them flowing); a node-locked
// limit whose one seat a host holds says so; a limit of 0 is named first.
func TestLimitRoomAndSeats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s := newFarm(t)
	str, show, job := must[string](t), must[farmseed.Show](t), must[farmseed.Job](t)
	fac := str(s.Facility(ctx, "f1"))
	sh := show(s.Show(ctx, "alpha", true))
	alloc := str(s.Alloc(ctx, fac, "f1.general", "general"))
	str(s.Subscribe(ctx, sh, alloc, 100, 100))
	h1 := str(s.Host(ctx, farmseed.HostSpec{Name: "h1", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 32 * farmseed.GB}))
	str(s.Host(ctx, farmseed.HostSpec{Name: "h2", Alloc: alloc, AllocTag: "general", Cores: 8, MemKB: 32 * farmseed.GB}))
	frames := str(s.Limit(ctx, "frames3", 3))
	seat := str(s.Limit(ctx, "seat1", 1))
	if err := s.LimitPerHost(ctx, seat, true); err != nil {
		t.Fatal(err)
	}
	zero := str(s.Limit(ctx, "zero", 0))
	mk := func(name, lim string) farmseed.Job {
		return job(s.Job(ctx, farmseed.JobSpec{Name: name, Show: sh, Facility: fac,
			Layers: []farmseed.LayerSpec{{Name: name, Tags: []string{"general"}, Frames: 10, Limits: []string{lim}}}}))
	}
	mk("room", frames)
	sj := mk("seated", seat)
	mk("zeroed", zero)
	str(s.Proc(ctx, farmseed.ProcSpec{Host: h1, Frame: sj.Layers[0].Frames[0], Cores: 8, MemKB: farmseed.GB}))

	ls, err := explain.Layers(ctx, pool, "", "", true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]explain.LayerReport{}
	for _, l := range ls {
		got[l.Job] = l
		t.Logf("%-8s %-8s waiting=%d room=%d: %s", l.Job, l.Reason, l.Waiting, l.LimitRoom, l.Detail)
	}
	if l := got["room"]; l.Reason != explain.Flowing || l.LimitRoom != 3 || !strings.Contains(l.Detail, "3 of its 10 waiting frames") {
		t.Errorf("room: %s room %d, want flowing with room 3", l.Reason, l.LimitRoom)
	}
	if l := got["seated"]; l.Reason != explain.Limit || !strings.Contains(l.Detail, "node-locked") {
		t.Errorf("seated: %s %q, want a node-locked limit", l.Reason, l.Detail)
	}
	if l := got["zeroed"]; l.Reason != explain.Limit || !strings.Contains(l.Detail, "max of 0") {
		t.Errorf("zeroed: %s %q, want a limit of 0", l.Reason, l.Detail)
	}
	counts, err := explain.Waiting(ctx, pool, true)
	if err != nil {
		t.Fatal(err)
	}
	by := map[explain.Reason]int{}
	for _, c := range counts {
		by[c.Reason] += c.Frames
	}
	// room: 3 flowing + 7 limit; seated: 9 limit; zeroed: 10 limit.
	if by[explain.Flowing] != 3 || by[explain.Limit] != 7+9+10 {
		t.Errorf("waiting by reason %v, want 3 flowing and 26 limit", by)
	}
}
