package jobs_test

import (
	"context"
	"errors"
	"maps"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type world struct {
	pool     *pgxpool.Pool
	seed     *farmseed.Seeder
	facility string
	other    string
	show     farmseed.Show
	alloc    string
	host     string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w := &world{pool: pool, seed: &farmseed.Seeder{DB: pool}}
	w.facility = must(w.seed.Facility(ctx, "f1"))(t)
	w.other = must(w.seed.Facility(ctx, "f2"))(t)
	w.show = must(w.seed.Show(ctx, "show", true))(t)
	w.alloc = must(w.seed.Alloc(ctx, w.facility, "f1.general", "general"))(t)
	must(w.seed.Subscribe(ctx, w.show, w.alloc, 100, 100))(t)
	w.host = must(w.seed.Host(ctx, farmseed.HostSpec{Name: "h1", Alloc: w.alloc, AllocTag: "general", Cores: 64, MemKB: 256 * farmseed.GB}))(t)
	return w
}

// fixedID is a job id that is the same on every run: the lottery's draws
// hash job ids, so a test counting draws fixes them.
func fixedID(t *testing.T, name string) string {
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte(t.Name()+"/"+name)).String()
}

func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func (w *world) job(t *testing.T, js farmseed.JobSpec) farmseed.Job {
	t.Helper()
	if js.Show.ID == "" {
		js.Show = w.show
	}
	if js.Facility == "" {
		js.Facility = w.facility
	}
	if js.Layers == nil {
		js.Layers = []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 3}}
	}
	return must(w.seed.Job(context.Background(), js))(t)
}

func (w *world) pending(t *testing.T, relief time.Duration, tags ...string) []string {
	t.Helper()
	if len(tags) == 0 {
		tags = []string{"general"}
	}
	q := jobs.PendingQuery{ShowID: w.show.ID, FacilityID: w.facility, Tags: tags, AgeRelief: relief}
	names := pendingNames(t, w.pool, q)
	// The live path (the use read from the accounting store, here summed
	// from the same procs) selects the same jobs in the same order.
	q.Live = procLive{pool: w.pool}
	if live := pendingNames(t, w.pool, q); !slices.Equal(live, names) {
		t.Fatalf("pending with the live use given = %v, summing the procs = %v", live, names)
	}
	return names
}

func pendingNames(t *testing.T, db jobs.DB, q jobs.PendingQuery) []string {
	t.Helper()
	js, err := jobs.Pending(context.Background(), db, q)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range js {
		names = append(names, j.Name)
	}
	return names
}

// procLive is a jobs.LiveSource that sums the proc table (exact
// centicores) as the query's own proc sums do; jobs overrides a job's use,
// notSeeded makes it vouch for nothing and broken fails every read.
type procLive struct {
	pool      *pgxpool.Pool
	jobs      map[string]jobs.Use
	notSeeded bool
	broken    bool // the store cannot be read
}

func (p procLive) LiveUse(ctx context.Context, show string, jobIDs, folders, allocs []string) (jobs.LiveUse, bool, error) {
	if p.broken {
		return jobs.LiveUse{}, false, errors.New("store unreachable")
	}
	if p.notSeeded {
		return jobs.LiveUse{}, false, nil
	}
	out := jobs.LiveUse{Jobs: map[string]jobs.Use{}, Folders: map[string]jobs.Use{}, Allocs: map[string]jobs.Use{}}
	for _, q := range []struct {
		m   map[string]jobs.Use
		sql string
	}{
		{out.Jobs, `SELECT pk_job, sum(int_cores_reserved)::bigint, sum(int_gpus_reserved)::bigint FROM proc WHERE pk_show = $1 GROUP BY pk_job`},
		{out.Folders, `SELECT j.pk_folder, sum(p.int_cores_reserved)::bigint, sum(p.int_gpus_reserved)::bigint FROM proc p
			JOIN job j ON j.pk_job = p.pk_job WHERE p.pk_show = $1 AND j.str_state <> 'FINISHED' GROUP BY j.pk_folder`},
		{out.Allocs, `SELECT h.pk_alloc, sum(p.int_cores_reserved)::bigint, 0::bigint FROM proc p JOIN host h ON h.pk_host = p.pk_host
			WHERE p.pk_show = $1 AND NOT p.b_local GROUP BY h.pk_alloc`},
	} {
		rows, err := p.pool.Query(ctx, q.sql, show)
		if err != nil {
			return out, false, err
		}
		for rows.Next() {
			var id string
			var u jobs.Use
			if err := rows.Scan(&id, &u.Cores, &u.GPUs); err != nil {
				rows.Close()
				return out, false, err
			}
			q.m[id] = u
		}
		rows.Close()
	}
	for id, u := range p.jobs {
		out.Jobs[id] = u
	}
	return out, true, nil
}

// TestPendingReadsTheLiveUse: with a LiveSource the query's headroom comes
// from it, not from the procs (a job the store holds at its cap is left
// out, though it has no proc), and a source that cannot vouch for the show,
// or cannot be read, leaves the query to sum the procs.
func TestPendingReadsTheLiveUse(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.job(t, farmseed.JobSpec{Name: "free"})
	capped := w.job(t, farmseed.JobSpec{Name: "held-in-redis", MaxCores: 2})
	q := jobs.PendingQuery{ShowID: w.show.ID, FacilityID: w.facility, Tags: []string{"general"}}
	both := []string{"free", "held-in-redis"}
	if got := pendingNames(t, w.pool, q); !slices.Equal(sorted(got), both) {
		t.Fatalf("pending, procs summed = %v", got)
	}
	q.Live = procLive{pool: w.pool, jobs: map[string]jobs.Use{capped.ID: {Cores: 200}}}
	if got := pendingNames(t, w.pool, q); !slices.Equal(got, []string{"free"}) {
		t.Fatalf("pending with the job at its cap in the store = %v, want [free]", got)
	}
	q.Live = procLive{pool: w.pool, jobs: map[string]jobs.Use{capped.ID: {Cores: 200}}, notSeeded: true}
	if got := pendingNames(t, w.pool, q); !slices.Equal(sorted(got), both) {
		t.Fatalf("pending with a store that does not vouch for the show = %v, want the procs' answer %v", got, both)
	}
	q.Live = procLive{pool: w.pool, jobs: map[string]jobs.Use{capped.ID: {Cores: 200}}, broken: true}
	if got := pendingNames(t, w.pool, q); !slices.Equal(sorted(got), both) {
		t.Fatalf("pending with an unreachable store = %v, want the procs' answer %v", got, both)
	}
	// The store's subscription use counts too: at the burst, nothing.
	q.Live = allocsAt{procLive{pool: w.pool}, 10000}
	if got := pendingNames(t, w.pool, q); len(got) != 0 {
		t.Fatalf("pending with the subscription at its burst in the store = %v", got)
	}
}

// allocsAt reports every subscription of the show at cores centicores.
type allocsAt struct {
	procLive
	cores int64
}

func (a allocsAt) LiveUse(ctx context.Context, show string, jobIDs, folders, allocs []string) (jobs.LiveUse, bool, error) {
	u, ok, err := a.procLive.LiveUse(ctx, show, jobIDs, folders, allocs)
	for _, id := range allocs {
		u.Allocs[id] = jobs.Use{Cores: a.cores}
	}
	return u, ok, err
}

func sorted(v []string) []string {
	v = slices.Clone(v)
	sort.Strings(v)
	return v
}

func TestPendingOrderAndAgeRelief(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	now := time.Now()
	w.job(t, farmseed.JobSpec{Name: "old-low", Priority: 10, Started: now.Add(-5 * time.Hour)})
	w.job(t, farmseed.JobSpec{Name: "new-high", Priority: 50, Started: now.Add(-time.Minute)})
	w.job(t, farmseed.JobSpec{Name: "new-mid", Priority: 30, Started: now.Add(-time.Minute)})

	if got := w.pending(t, 0); !slices.Equal(got, []string{"new-high", "new-mid", "old-low"}) {
		t.Fatalf("strict priority order = %v", got)
	}
	// One point per 5 minutes: old-low is worth 10 + 60 = 70 > 50.
	if got := w.pending(t, 5*time.Minute); !slices.Equal(got, []string{"old-low", "new-high", "new-mid"}) {
		t.Fatalf("age-relief order = %v", got)
	}
	// One point per hour: 10 + 5 = 15, still last.
	if got := w.pending(t, time.Hour); !slices.Equal(got, []string{"new-high", "new-mid", "old-low"}) {
		t.Fatalf("weak age-relief order = %v", got)
	}
}

func TestPendingFilters(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	w.job(t, farmseed.JobSpec{Name: "ok"})
	w.job(t, farmseed.JobSpec{Name: "paused", Paused: true})
	w.job(t, farmseed.JobSpec{Name: "elsewhere", Facility: w.other})
	w.job(t, farmseed.JobSpec{Name: "wrong-tag", Layers: []farmseed.LayerSpec{{Tags: []string{"gpu"}, Frames: 1}}})
	w.job(t, farmseed.JobSpec{Name: "later", Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 1, StartAfter: time.Now().Add(time.Hour)}}})
	w.job(t, farmseed.JobSpec{Name: "multi-tag", Layers: []farmseed.LayerSpec{{Tags: []string{"gpu", "general"}, Frames: 1}}})
	capped := w.job(t, farmseed.JobSpec{Name: "job-at-cap", MaxCores: 2})
	folder := must(w.seed.Folder(ctx, w.show, "capped", 2, -1))(t)
	inFolder := w.job(t, farmseed.JobSpec{Name: "folder-at-cap", Folder: folder})
	w.job(t, farmseed.JobSpec{Name: "big-layer-folder", Folder: folder, Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Cores: 4}}})

	// Two running cores each for the capped job and the folder.
	must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: capped.Layers[0].Frames[0], Cores: 2}))(t)
	must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: inFolder.Layers[0].Frames[0], Cores: 2}))(t)

	got := w.pending(t, 0)
	sort.Strings(got)
	if !slices.Equal(got, []string{"multi-tag", "ok"}) {
		t.Fatalf("pending = %v, want [multi-tag ok]", got)
	}
	// Spaces in tags do not matter.
	if got := w.pending(t, 0, " gpu "); !slices.Equal(got, []string{"multi-tag", "wrong-tag"}) && !slices.Equal(got, []string{"wrong-tag", "multi-tag"}) {
		t.Fatalf("pending(gpu) = %v", got)
	}

	// A show with no subscription headroom left has no pending jobs.
	if _, err := w.pool.Exec(ctx, `UPDATE subscription SET int_burst = 400 WHERE pk_show = $1`, w.show.ID); err != nil {
		t.Fatal(err)
	}
	if got := w.pending(t, 0); len(got) != 0 {
		t.Fatalf("pending with the subscription at burst = %v", got)
	}
	// An unmanaged show is never returned.
	if _, err := w.pool.Exec(ctx, `UPDATE subscription SET int_burst = 10000 WHERE pk_show = $1`, w.show.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE show SET b_scheduler_managed = false WHERE pk_show = $1`, w.show.ID); err != nil {
		t.Fatal(err)
	}
	if got := w.pending(t, 0); len(got) != 0 {
		t.Fatalf("pending of an unmanaged show = %v", got)
	}
}

// TestPendingCapsAsCuebot: caps of 0 and below read as Cuebot's
// DispatchQuery reads them. A job max cores of 0, -1 or less than a core
// unit is no candidate (no "unlimited" value for a job); a folder max of 0
// or of a negative value other than -1 is no candidate, -1 is unlimited,
// and a folder needs folder cores + the layer's minimum strictly below its
// max. A job or folder max GPUs of 0 stops layers that need GPUs but not
// CPU layers.
func TestPendingCapsAsCuebot(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := w.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	cpu := []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2}}
	gpu := []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2, GPUs: 1}}
	both := []farmseed.LayerSpec{gpu[0], cpu[0]}

	w.job(t, farmseed.JobSpec{Name: "control", Layers: cpu})
	w.job(t, farmseed.JobSpec{Name: "uncapped", MaxCores: farmseed.Uncapped, MaxGPUs: farmseed.Uncapped, Layers: gpu})
	for name, centi := range map[string]int{"job-max-0": 0, "job-max-neg": -100, "job-max-half": 50} {
		j := w.job(t, farmseed.JobSpec{Name: name, Layers: cpu})
		exec(`UPDATE job_resource SET int_max_cores = $2 WHERE pk_job = $1`, j.ID, centi)
	}
	for _, c := range []struct {
		name   string
		layers []farmseed.LayerSpec
	}{{"job-gpus-0-gpu", gpu}, {"job-gpus-0-cpu", cpu}, {"job-gpus-0-both", both}} {
		j := w.job(t, farmseed.JobSpec{Name: c.name, Layers: c.layers})
		must(0, w.seed.SetJobCaps(ctx, j.ID, 10000, 0))(t)
	}

	folder := func(name string, maxCores, maxGPUs int) string {
		t.Helper()
		f := must(w.seed.Folder(ctx, w.show, name, 0, 0))(t)
		exec(`UPDATE folder_resource SET int_max_cores = $2, int_max_gpus = $3 WHERE pk_folder = $1`, f, maxCores, maxGPUs)
		return f
	}
	w.job(t, farmseed.JobSpec{Name: "folder-unlimited", Folder: folder("unlimited", -1, -1), Layers: gpu})
	w.job(t, farmseed.JobSpec{Name: "folder-max-0", Folder: folder("zero", 0, -1), Layers: cpu})
	w.job(t, farmseed.JobSpec{Name: "folder-max-neg2", Folder: folder("neg2", -2, -1), Layers: cpu})
	w.job(t, farmseed.JobSpec{Name: "folder-max-neg100", Folder: folder("neg100", -100, -1), Layers: cpu})
	noGPUs := folder("no-gpus", -1, 0)
	w.job(t, farmseed.JobSpec{Name: "folder-gpus-0-gpu", Folder: noGPUs, Layers: gpu})
	w.job(t, farmseed.JobSpec{Name: "folder-gpus-0-cpu", Folder: noGPUs, Layers: cpu})
	// Strictly below the max: 2 cores running + 1 needed < 3 is false.
	full := folder("three-full", 300, -1)
	fj := w.job(t, farmseed.JobSpec{Name: "folder-strict-full", Folder: full, Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 3}}})
	must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: fj.Layers[0].Frames[0], Cores: 2}))(t)
	room := folder("four-room", 400, -1)
	rj := w.job(t, farmseed.JobSpec{Name: "folder-strict-room", Folder: room, Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 3}}})
	must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: rj.Layers[0].Frames[0], Cores: 2}))(t)

	got := w.pending(t, 0)
	sort.Strings(got)
	want := []string{"control", "folder-gpus-0-cpu", "folder-strict-room", "folder-unlimited", "job-gpus-0-both", "job-gpus-0-cpu", "uncapped"}
	if !slices.Equal(got, want) {
		t.Fatalf("pending = %v\nwant      %v", got, want)
	}

	// A cap lowered to 0 while the job waits takes it out; -1 stays
	// unlimited only for the folder.
	c := must(w.seed.Job(ctx, farmseed.JobSpec{Name: "lowered", Show: w.show, Facility: w.facility, Layers: cpu}))(t)
	if got := w.pending(t, 0); !slices.Contains(got, "lowered") {
		t.Fatalf("pending before lowering = %v", got)
	}
	must(0, w.seed.SetJobCaps(ctx, c.ID, -1, 100))(t)
	if got := w.pending(t, 0); slices.Contains(got, "lowered") {
		t.Fatalf("a job with max cores -1 is pending: %v", got)
	}
}

// TestLayersJobCapsOfZero: the job-wide budget of Layers treats a job max
// of 0 as no budget at all (never as unlimited), and a job max GPUs of 0
// drops the frames of GPU layers only.
func TestLayersJobCapsOfZero(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	j := w.job(t, farmseed.JobSpec{Name: "j", Layers: []farmseed.LayerSpec{
		{Name: "gpu", Tags: []string{"general"}, Frames: 2, GPUs: 1},
		{Name: "cpu", Tags: []string{"general"}, Frames: 2},
	}})
	layers := func() []*jobs.Layer {
		t.Helper()
		ls, err := jobs.Layers(ctx, w.pool, jobs.LayerQuery{JobID: j.ID, Tags: []string{"general"}})
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	if ls := layers(); len(ls) != 2 || frames(ls) != 4 {
		t.Fatalf("uncapped: layers %v, %d frames", names(ls), frames(ls))
	}
	must(0, w.seed.SetJobCaps(ctx, j.ID, 100, 0))(t)
	if ls := layers(); len(ls) != 1 || ls[0].Name != "cpu" || len(ls[0].Frames) != 2 || ls[0].JobMaxGPUs != 0 {
		t.Fatalf("job max GPUs 0: layers %v, %d frames; want only cpu's 2", names(ls), frames(ls))
	}
	for _, maxCores := range []int{0, -1} {
		must(0, w.seed.SetJobCaps(ctx, j.ID, maxCores, 100))(t)
		if ls := layers(); len(ls) != 0 {
			t.Fatalf("job max cores %d: layers %v, %d frames; want none", maxCores, names(ls), frames(ls))
		}
	}
}

func TestLayers(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	lim := must(w.seed.Limit(ctx, "licence", 3))(t)
	j := w.job(t, farmseed.JobSpec{
		Name: "j", OS: "rocky9", UID: 4242, MaxCores: 100,
		Env: map[string]string{"A": "job", "B": "job"},
		Layers: []farmseed.LayerSpec{
			{Name: "sim", Tags: []string{"general"}, Frames: 30, Cores: 2, MemKB: 3 * farmseed.GB, GPUs: 1,
				GPUMemKB: farmseed.GB, NotThreadable: true, Services: "houdini, shell", Limits: []string{lim},
				Env: map[string]string{"B": "layer", "C": "layer"}, Command: "sim #IFRAME#", Chunk: 1},
			{Name: "other-tag", Tags: []string{"gpu"}, Frames: 2},
			{Name: "later", Tags: []string{"general"}, Frames: 2, StartAfter: time.Now().Add(time.Hour)},
			{Name: "comp", Tags: []string{"general"}, Range: "1-10", Chunk: 5},
		},
	})
	ls, err := jobs.Layers(ctx, w.pool, jobs.LayerQuery{JobID: j.ID, Tags: []string{"general"}, FramesPerLayer: 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 || ls[0].Name != "sim" || ls[1].Name != "comp" {
		t.Fatalf("layers = %v", names(ls))
	}
	sim := ls[0]
	if len(sim.Frames) != 20 {
		t.Fatalf("sim has %d frames, want the per-layer limit 20", len(sim.Frames))
	}
	for i, f := range sim.Frames {
		if f.Number != int64(i+1) || f.Name != frameName(i+1, "sim") || f.ID != j.Layers[0].Frames[i] {
			t.Fatalf("frame %d = %+v", i, f)
		}
		if f.Version != 0 || f.Eligible.IsZero() {
			t.Fatalf("frame %d version/eligible = %d/%v", i, f.Version, f.Eligible)
		}
	}
	if sim.CoresMin != 200 || sim.MemMinKB != 3*farmseed.GB || sim.GPUsMin != 1 || sim.GPUMemMinKB != farmseed.GB || sim.Threadable {
		t.Fatalf("sim resources = %+v", sim)
	}
	if sim.OS != "rocky9" || sim.UID == nil || *sim.UID != 4242 || sim.ShowName != "show" || sim.JobName != "j" {
		t.Fatalf("sim job fields = os %q uid %v show %q job %q", sim.OS, sim.UID, sim.ShowName, sim.JobName)
	}
	if !slices.Equal(sim.Services, []string{"houdini", "shell"}) || !slices.Equal(sim.LimitIDs, []string{lim}) {
		t.Fatalf("services %v limits %v", sim.Services, sim.LimitIDs)
	}
	if sim.Env["A"] != "job" || sim.Env["B"] != "layer" || sim.Env["C"] != "layer" || len(sim.Env) != 3 {
		t.Fatalf("env = %v (layer env must override job env)", sim.Env)
	}
	if sim.JobMaxCores != 10000 || sim.JobCoresLive != 0 {
		t.Fatalf("job cap = %d live %d", sim.JobMaxCores, sim.JobCoresLive)
	}
	comp := ls[1]
	if len(comp.Frames) != 2 || comp.Frames[1].Number != 6 || comp.ChunkSize != 5 || comp.Env["A"] != "job" {
		t.Fatalf("comp = %+v", comp)
	}

	// Excluding a layer (backoff) removes it.
	ls, err = jobs.Layers(ctx, w.pool, jobs.LayerQuery{JobID: j.ID, Tags: []string{"general"}, Exclude: []string{sim.ID}})
	if err != nil || len(ls) != 1 || ls[0].Name != "comp" {
		t.Fatalf("layers excluding sim = %v, %v", names(ls), err)
	}

	// Job cap 10 cores with 6 running leaves 4: two of sim's 2-core frames.
	// comp's 1-core frames come later in dispatch order, after the running
	// sum has passed the budget, so comp has none.
	if _, err := w.pool.Exec(ctx, `UPDATE job_resource SET int_max_cores = 1000 WHERE pk_job = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: j.Layers[0].Frames[29], Cores: 6}))(t)
	ls, err = jobs.Layers(ctx, w.pool, jobs.LayerQuery{JobID: j.ID, Tags: []string{"general"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].Name != "sim" || len(ls[0].Frames) != 2 || ls[0].JobCoresLive != 600 {
		t.Fatalf("capped layers = %v (frames %d)", names(ls), frames(ls))
	}
}

func names(ls []*jobs.Layer) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Name)
	}
	return out
}

func frames(ls []*jobs.Layer) int {
	n := 0
	for _, l := range ls {
		n += len(l.Frames)
	}
	return n
}

func frameName(n int, layer string) string {
	s := "000" + itoa(n)
	return s[len(s)-4:] + "-" + layer
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

func TestBackoff(t *testing.T) {
	now := time.Unix(1000, 0)
	b := jobs.NewBackoff(time.Second, 8*time.Second)
	b.SetClock(func() time.Time { return now })
	if d := b.Missed("c", "l"); d != time.Second {
		t.Fatalf("first miss = %v", d)
	}
	if got := b.Held("c"); !slices.Equal(got, []string{"l"}) {
		t.Fatalf("Held = %v", got)
	}
	if got := b.Held("other"); len(got) != 0 {
		t.Fatalf("another cluster holds %v", got)
	}
	for _, want := range []time.Duration{2, 4, 8, 8} {
		if d := b.Missed("c", "l"); d != want*time.Second {
			t.Fatalf("miss = %v, want %v", d, want*time.Second)
		}
	}
	now = now.Add(9 * time.Second)
	if got := b.Held("c"); len(got) != 0 {
		t.Fatalf("Held after expiry = %v", got)
	}
	b.Booked("c", "l")
	if d := b.Missed("c", "l"); d != time.Second {
		t.Fatalf("after a booking the backoff restarts at min, got %v", d)
	}
	// An entry that ended long ago is dropped and restarts at min.
	now = now.Add(time.Minute)
	_ = b.Held("c")
	if b.Len() != 0 {
		t.Fatalf("stale entries kept: %d", b.Len())
	}
	if off := jobs.NewBackoff(0, 0); off.Missed("c", "l") != 0 || off.Held("c") != nil {
		t.Fatal("disabled backoff holds layers")
	}
}

// A Cuebot database older than V47 has no layer.ts_start_after: the
// queries are adapted instead of failing.
func TestOlderSchemaWithoutStartAfter(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	w.job(t, farmseed.JobSpec{Name: "old"})
	if s, err := jobs.DetectSchema(ctx, w.pool); err != nil || s != jobs.CurrentSchema {
		t.Fatalf("DetectSchema on the baseline = %+v, %v", s, err)
	}
	if _, err := w.pool.Exec(ctx, `ALTER TABLE layer DROP COLUMN ts_start_after`); err != nil {
		t.Fatal(err)
	}
	s, err := jobs.DetectSchema(ctx, w.pool)
	if err != nil || s.StartAfter || !s.FrameEligible {
		t.Fatalf("DetectSchema without the column = %+v, %v", s, err)
	}
	if _, err := jobs.Pending(ctx, w.pool, jobs.PendingQuery{ShowID: w.show.ID, FacilityID: w.facility, Tags: []string{"general"}}); err == nil {
		t.Fatal("the unadapted query worked without the column: the test does not exercise anything")
	}
	js, err := jobs.Pending(ctx, w.pool, jobs.PendingQuery{ShowID: w.show.ID, FacilityID: w.facility, Tags: []string{"general"}, Schema: &s})
	if err != nil || len(js) != 1 {
		t.Fatalf("adapted Pending = %v, %v", js, err)
	}
	ls, err := jobs.Layers(ctx, w.pool, jobs.LayerQuery{JobID: js[0].ID, Tags: []string{"general"}, Schema: &s})
	if err != nil || len(ls) != 1 || len(ls[0].Frames) != 3 {
		t.Fatalf("adapted Layers = %v, %v", ls, err)
	}
	if got := (jobs.Schema{StartAfter: true}).Adapt("x COALESCE(fr.ts_eligible, fr.ts_updated, now()) y"); got != "x COALESCE(fr.ts_updated, now()) y" {
		t.Fatalf("Adapt without ts_eligible = %q", got)
	}
}

// The lottery makes priority a rate: over many draws each job comes first
// in proportion to its effective priority, the lowest one included, and the
// same draw always gives the same order. Each job's draw hashes its id and
// the draw's name: both are fixed here, so the counts are the same on every
// run and machine (with fresh ids, about one run in 70 missed a bound: the
// priority-1 job undrawn in 800 draws, or a share 3 deviations off).
func TestPendingLottery(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	prio := map[string]int{"p100": 100, "p50": 50, "p10": 10, "p1": 1}
	for _, n := range []string{"p100", "p50", "p10", "p1"} {
		w.job(t, farmseed.JobSpec{ID: fixedID(t, n), Name: n, Priority: prio[n]})
	}
	draw := func(name string, limit int) []string {
		t.Helper()
		js, err := jobs.Pending(context.Background(), w.pool, jobs.PendingQuery{
			ShowID: w.show.ID, FacilityID: w.facility, Tags: []string{"general"}, Limit: limit,
			Lottery: true, Draw: name,
		})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, j := range js {
			names = append(names, j.Name)
		}
		return names
	}
	const draws = 800
	first := map[string]int{}
	for i := 0; i < draws; i++ {
		got := draw(strconv.Itoa(i), 4)
		if len(got) != 4 {
			t.Fatalf("draw %d returned %v, want all 4 jobs", i, got)
		}
		first[got[0]]++
	}
	total := 0
	for _, p := range prio {
		total += p
	}
	for n, p := range prio {
		want := float64(p) / float64(total)
		got := float64(first[n]) / draws
		if math.Abs(got-want) > 0.05 {
			t.Errorf("%s drawn first %.3f of the time, want %.3f (weight share)", n, got, want)
		}
		if first[n] == 0 {
			t.Errorf("%s was never drawn first in %d draws: a job must keep a chance", n, draws)
		}
	}
	t.Logf("first places over %d draws: %v", draws, first)
	// LIMIT samples without replacement: the lowest job still makes a
	// pass of two sometimes.
	inTwo := 0
	for i := 0; i < draws; i++ {
		if slices.Contains(draw("two-"+strconv.Itoa(i), 2), "p1") {
			inTwo++
		}
	}
	if inTwo == 0 {
		t.Error("the priority-1 job never made a pass limited to two jobs")
	}
	// The same draw is the same order; strict order ignores draws.
	if a, b := draw("same", 4), draw("same", 4); !slices.Equal(a, b) {
		t.Errorf("draw %q gave %v then %v", "same", a, b)
	}
	if got := w.pending(t, 0); !slices.Equal(got, []string{"p100", "p50", "p10", "p1"}) {
		t.Errorf("strict order = %v", got)
	}
}

// A job running below its minimum cores (job_resource.int_min_cores, live
// proc sums) comes before every job at or above its minimum, whatever the
// priorities, in strict order and in the lottery; the lottery draws among
// the jobs of each class.
func TestPendingMinCoresFirst(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	type spec struct {
		prio, running, min int // running and min in whole cores
	}
	specs := map[string]spec{
		"at-min-high":  {prio: 90, running: 2, min: 2},  // exactly at its minimum: not below
		"above-min":    {prio: 60, running: 3, min: 1},  // above
		"no-min":       {prio: 50, running: 0, min: 0},  // a minimum of 0 is none
		"negative-min": {prio: 40, running: 0, min: -1}, // nor is a negative one
		"below-low":    {prio: 1, running: 1, min: 4},   // below, lowest priority
		"idle-default": {prio: 10, running: 0, min: 1},  // nothing running, the default 1-core minimum
	}
	for name, s := range specs {
		j := w.job(t, farmseed.JobSpec{ID: fixedID(t, name), Name: name, Priority: s.prio,
			Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 6}}})
		if _, err := w.pool.Exec(ctx, `UPDATE job_resource SET int_min_cores = $2 WHERE pk_job = $1`, j.ID, s.min*100); err != nil {
			t.Fatal(err)
		}
		if s.running > 0 {
			must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: j.Layers[0].Frames[0], Cores: s.running}))(t)
		}
	}
	below := []string{"idle-default", "below-low"}
	rest := []string{"at-min-high", "above-min", "no-min", "negative-min"}

	js, err := jobs.Pending(ctx, w.pool, jobs.PendingQuery{ShowID: w.show.ID, FacilityID: w.facility, Tags: []string{"general"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, j := range js {
		got = append(got, j.Name)
		if want := slices.Contains(below, j.Name); j.BelowMinCores != want {
			t.Errorf("%s: BelowMinCores = %v, want %v", j.Name, j.BelowMinCores, want)
		}
	}
	if want := append(append([]string{}, below...), rest...); !slices.Equal(got, want) {
		t.Fatalf("strict order = %v, want %v (below minimum first, each class by priority)", got, want)
	}
	// A limit smaller than the below-minimum class takes only from it.
	if js, err := jobs.Pending(ctx, w.pool, jobs.PendingQuery{ShowID: w.show.ID, FacilityID: w.facility,
		Tags: []string{"general"}, Limit: 1}); err != nil || len(js) != 1 || js[0].Name != "idle-default" {
		t.Fatalf("limit 1 = %v, %v", js, err)
	}

	// The lottery: every draw puts the two jobs below their minimum first,
	// and draws among each class (both orders of the first two occur).
	firsts := map[string]int{}
	lastClassFirst := map[string]int{}
	for i := 0; i < 200; i++ {
		js, err := jobs.Pending(ctx, w.pool, jobs.PendingQuery{ShowID: w.show.ID, FacilityID: w.facility,
			Tags: []string{"general"}, Lottery: true, Draw: "d" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, j := range js {
			names = append(names, j.Name)
		}
		if len(names) != 6 {
			t.Fatalf("draw %d: %v", i, names)
		}
		head, tail := slices.Clone(names[:2]), slices.Clone(names[2:])
		sort.Strings(head)
		sort.Strings(tail)
		wantHead, wantTail := slices.Clone(below), slices.Clone(rest)
		sort.Strings(wantHead)
		sort.Strings(wantTail)
		if !slices.Equal(head, wantHead) || !slices.Equal(tail, wantTail) {
			t.Fatalf("draw %d = %v: the jobs below their minimum must come first", i, names)
		}
		firsts[names[0]]++
		lastClassFirst[names[2]]++
	}
	if len(firsts) != 2 || len(lastClassFirst) < 2 {
		t.Fatalf("the lottery did not draw within the classes: firsts %v, first of the rest %v", firsts, lastClassFirst)
	}
}

// TestPassLayersIsEachJobsLayers: the one statement of a pass gives every
// job, once Dispatchable has left out its backed-off layers and applied its
// cap, exactly what the job's own layer query gives it: its live cores
// (procs of that job only) and caps, env, limits, frames; a job with no
// layer on the tags has no entry.
func TestPassLayersIsEachJobsLayers(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	lim := must(w.seed.Limit(ctx, "licence", 3))(t)
	capped := w.job(t, farmseed.JobSpec{Name: "capped", MaxCores: 5, Layers: []farmseed.LayerSpec{
		{Name: "a", Tags: []string{"general"}, Frames: 10, NotThreadable: true},
		{Name: "b", Tags: []string{"general"}, Frames: 10, NotThreadable: true},
	}})
	rich := w.job(t, farmseed.JobSpec{Name: "rich", OS: "rocky9", UID: 7, MaxCores: -1,
		Env: map[string]string{"A": "job", "B": "job"},
		Layers: []farmseed.LayerSpec{
			{Name: "sim", Tags: []string{"general"}, Frames: 30, Cores: 2, Limits: []string{lim},
				Env: map[string]string{"B": "layer"}, Command: "sim #IFRAME#"},
			{Name: "held", Tags: []string{"general"}, Frames: 3},
			{Name: "comp", Tags: []string{"general"}, Range: "1-10", Chunk: 5},
		}})
	gpuOnly := w.job(t, farmseed.JobSpec{Name: "gpu-only", Layers: []farmseed.LayerSpec{{Tags: []string{"gpu"}, Frames: 2}}})
	// Two cores running for capped (3 of its 5 left), three for rich.
	for i := 0; i < 2; i++ {
		must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: capped.Layers[0].Frames[i], Cores: 1, MemKB: farmseed.GB}))(t)
	}
	must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: rich.Layers[0].Frames[0], Cores: 3, MemKB: farmseed.GB}))(t)
	exclude := []string{rich.Layers[1].ID}
	read, err := jobs.PassLayers(ctx, w.pool, jobs.PassLayerQuery{JobIDs: []string{capped.ID, rich.ID, gpuOnly.ID},
		Tags: []string{"general"}, FramesPerLayer: 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := read[gpuOnly.ID]; ok || len(read) != 2 {
		t.Fatalf("pass layers for jobs %v; want capped and rich only", slices.Collect(maps.Keys(read)))
	}
	by := map[string][]*jobs.Layer{}
	for id, ls := range read {
		by[id] = jobs.Dispatchable(ls, exclude)
	}
	for _, j := range []farmseed.Job{capped, rich} {
		one, err := jobs.Layers(ctx, w.pool, jobs.LayerQuery{JobID: j.ID, Tags: []string{"general"}, FramesPerLayer: 20, Exclude: exclude})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(by[j.ID], one) {
			t.Fatalf("job %s: pass read %v (%d frames), its own query %v (%d frames)", j.Name, names(by[j.ID]), frames(by[j.ID]), names(one), frames(one))
		}
	}
	if ls := by[capped.ID]; len(ls) != 1 || len(ls[0].Frames) != 3 || ls[0].JobCoresLive != 200 {
		t.Fatalf("capped: layers %v, %d frames; want a's next 3 under the cap (2 of 5 cores live)", names(ls), frames(ls))
	}
	if ls := by[rich.ID]; len(ls) != 2 || ls[0].Name != "sim" || ls[1].Name != "comp" || ls[0].JobCoresLive != 300 ||
		ls[0].Env["B"] != "layer" || len(ls[0].LimitIDs) != 1 {
		t.Fatalf("rich: layers %v; want sim (its env and limit) and comp, held left out, its own 3 live cores", names(ls))
	}
}

// TestPassLayersTakesTheGivenLiveUse: a job whose live use the pass already
// read (PassLayerQuery.Live, from Pending) is capped by that use, not by
// its procs; a job not given is summed as before. Pending gives every job
// its live use, from the procs or from the store.
func TestPassLayersTakesTheGivenLiveUse(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	capped := w.job(t, farmseed.JobSpec{Name: "capped", MaxCores: 5, Layers: []farmseed.LayerSpec{
		{Name: "a", Tags: []string{"general"}, Frames: 10, NotThreadable: true}}})
	other := w.job(t, farmseed.JobSpec{Name: "other", MaxCores: 5, Layers: []farmseed.LayerSpec{
		{Name: "b", Tags: []string{"general"}, Frames: 10, NotThreadable: true}}})
	// Procs: 2 cores of capped, 1 of other.
	for i := 0; i < 2; i++ {
		must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: capped.Layers[0].Frames[i], Cores: 1, MemKB: farmseed.GB}))(t)
	}
	must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: other.Layers[0].Frames[0], Cores: 1, MemKB: farmseed.GB}))(t)

	q := jobs.PendingQuery{ShowID: w.show.ID, FacilityID: w.facility, Tags: []string{"general"}}
	js, err := jobs.Pending(ctx, w.pool, q)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]jobs.Use{capped.ID: {Cores: 200}, other.ID: {Cores: 100}}
	for _, j := range js {
		if j.Live == nil || *j.Live != want[j.ID] {
			t.Fatalf("pending, procs summed: job %s live %v, want %v", j.Name, j.Live, want[j.ID])
		}
	}
	q.Live = procLive{pool: w.pool, jobs: map[string]jobs.Use{capped.ID: {Cores: 400}}}
	if js, err = jobs.Pending(ctx, w.pool, q); err != nil {
		t.Fatal(err)
	}
	for _, j := range js {
		if j.ID == capped.ID && (j.Live == nil || j.Live.Cores != 400) {
			t.Fatalf("pending with the store: job %s live %v, want the store's 400", j.Name, j.Live)
		}
	}

	// The store says capped holds 4 of its 5 cores: one frame left.
	read, err := jobs.PassLayers(ctx, w.pool, jobs.PassLayerQuery{JobIDs: []string{capped.ID, other.ID},
		Tags: []string{"general"}, FramesPerLayer: 20, Live: map[string]jobs.Use{capped.ID: {Cores: 400}}})
	if err != nil {
		t.Fatal(err)
	}
	if ls := jobs.Dispatchable(read[capped.ID], nil); len(ls) != 1 || len(ls[0].Frames) != 1 || ls[0].JobCoresLive != 400 {
		t.Fatalf("capped with a given use of 4 cores: %v, %d frames; want 1 frame", names(ls), frames(ls))
	}
	if ls := jobs.Dispatchable(read[other.ID], nil); len(ls) != 1 || len(ls[0].Frames) != 4 || ls[0].JobCoresLive != 100 {
		t.Fatalf("other, summed from its procs (1 of 5 cores): %v, %d frames; want 4", names(ls), frames(ls))
	}
}

// TestPassLayersReusesItsPlan: the layer read is planned once per
// connection, not on every pass. PostgreSQL keeps a prepared statement's
// generic plan only if its estimated cost is no higher than the custom
// plans'; at SCALE's full farm the custom plans took 3.1 ms of planning a
// call beside 5.8 ms of execution. (That the generic plan finds the layers
// by job, not through the tags' index, is the statement's shape, not
// checked here: this farm is too small for the planner to use either.)
func TestPassLayersReusesItsPlan(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	var ids []string
	for i := range 4 {
		j := w.job(t, farmseed.JobSpec{Name: "j" + strconv.Itoa(i), Layers: []farmseed.LayerSpec{
			{Name: "a", Tags: []string{"general"}, Frames: 40}, {Name: "b", Tags: []string{"general"}, Frames: 40}}})
		ids = append(ids, j.ID)
		for f := range 8 {
			must(w.seed.Proc(ctx, farmseed.ProcSpec{Host: w.host, Frame: j.Layers[0].Frames[f], Cores: 1, MemKB: farmseed.GB}))(t)
		}
	}
	// A running farm: 20,000 procs of another job (written in one statement;
	// the frames' state does not matter to this read).
	busy := w.job(t, farmseed.JobSpec{Name: "busy", Layers: []farmseed.LayerSpec{{Name: "a", Tags: []string{"general"}, Frames: 20000}}})
	if _, err := w.pool.Exec(ctx, `INSERT INTO proc (pk_proc, pk_host, pk_show, pk_layer, pk_job, pk_frame,
		int_cores_reserved, int_mem_reserved, int_mem_pre_reserved)
		SELECT gen_random_uuid()::text, $2, j.pk_show, f.pk_layer, f.pk_job, f.pk_frame, 100, 1048576, 1048576
		FROM frame f JOIN job j ON j.pk_job = f.pk_job WHERE f.pk_job = $1`, busy.ID, w.host); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	conn, err := w.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const calls = 12
	for i := range calls {
		q := jobs.PassLayerQuery{JobIDs: ids, Tags: []string{"general"}, FramesPerLayer: 20}
		if i%2 == 1 { // the pass gave the jobs' live use: nothing to sum
			q.Live = map[string]jobs.Use{}
			for _, id := range ids {
				q.Live[id] = jobs.Use{Cores: 800}
			}
		}
		read, err := jobs.PassLayers(ctx, conn, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(read) != len(ids) {
			t.Fatalf("call %d: layers of %d jobs, want %d", i, len(read), len(ids))
		}
	}
	var generic, custom int64
	if err := conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement LIKE '%WITH lay AS MATERIALIZED%'`).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	// PostgreSQL plans the first five executions for their parameters, then
	// compares.
	if custom > 6 || generic < calls-6 {
		t.Fatalf("the layer read was planned for its parameters %d times in %d calls (generic plan used %d times): it pays its planning on every pass", custom, calls, generic)
	}
}
