package matcher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/rqdclient"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type harness struct {
	t        *testing.T
	fake     *fakerqd.Server
	pool     *pgxpool.Pool
	seed     *farmseed.Seeder
	pub      *publisher.Publisher
	hosts    *farmseed.DBHosts
	backoff  *jobs.Backoff
	permits  *matcher.Permits
	m        *matcher.Matcher
	disp     *dispatch.Dispatcher
	policy   sizing.Policy
	facility string
	alloc    string
	show     farmseed.Show
	cluster  *clusters.Cluster
	n        int
}

func newHarness(t *testing.T, attempts int) *harness {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: testenv.NewRedisDB(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	pub, err := publisher.New(rdb, publisher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fake, err := fakerqd.Start(fakerqd.Config{Default: fakerqd.Behavior{RunTime: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Stop)
	rqd := rqdclient.New(rqdclient.Options{Resolve: fake.Resolve})
	t.Cleanup(func() { rqd.Close() })
	policy := sizing.Policy{CoreUnit: 100, StrandedMemKB: 2 * farmseed.GB, MinMemKB: 262144}
	d := dispatch.New(pool, pub, rqd, dispatch.Config{Policy: policy},
		dispatch.Options{Registerer: prometheus.NewRegistry()})
	h := &harness{t: t, fake: fake, pool: pool, seed: &farmseed.Seeder{DB: pool}, pub: pub, hosts: farmseed.NewDBHosts(pool),
		backoff: jobs.NewBackoff(time.Minute, time.Hour), permits: matcher.NewPermits(), disp: d, policy: policy}
	h.m = matcher.New(pool, h.hosts, d, matcher.Config{Attempts: attempts, FramesPerLayer: 20, Policy: policy},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: h.backoff, Permits: h.permits})
	h.facility = h.str(h.seed.Facility(ctx, "f1"))
	s, err := h.seed.Show(ctx, "show", true)
	if err != nil {
		t.Fatal(err)
	}
	h.show = s
	h.alloc = h.str(h.seed.Alloc(ctx, h.facility, "f1.general", "general"))
	h.str(h.seed.Subscribe(ctx, h.show, h.alloc, 1000, 1000))
	h.cluster = clusters.New(h.facility, h.show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: h.alloc}})
	return h
}

func (h *harness) str(s string, err error) string {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *harness) host(cores int, os string) {
	h.t.Helper()
	h.n++
	h.str(h.seed.Host(context.Background(), farmseed.HostSpec{Name: fmt.Sprintf("h%d", h.n), Alloc: h.alloc, AllocTag: "general", Cores: cores, OS: os}))
}

func (h *harness) job(js farmseed.JobSpec) jobs.Job {
	h.t.Helper()
	h.n++
	js.Show, js.Facility, js.Name = h.show, h.facility, fmt.Sprintf("job%d", h.n)
	j, err := h.seed.Job(context.Background(), js)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := farmseed.SeedAccounting(context.Background(), h.pool, h.pub, h.show.ID); err != nil {
		h.t.Fatal(err)
	}
	return jobs.Job{ID: j.ID, Name: j.Name, ShowID: h.show.ID}
}

func (h *harness) process(j jobs.Job) matcher.Outcome {
	h.t.Helper()
	out, err := h.m.Process(context.Background(), h.cluster, j)
	if err != nil {
		h.t.Fatal(err)
	}
	if n := h.hosts.Out(); n != 0 {
		h.t.Fatalf("%d hosts left checked out", n)
	}
	return out
}

func layer(frames int, tags ...string) farmseed.LayerSpec {
	if len(tags) == 0 {
		tags = []string{"general"}
	}
	return farmseed.LayerSpec{Tags: tags, Frames: frames, NotThreadable: true, MemKB: farmseed.GB}
}

func TestProcessSpreadsALayerOverHosts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(4, "")
	h.host(4, "")
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(10)}})
	out := h.process(j)
	if out.Dispatched != 8 || out.Layers != 1 {
		t.Fatalf("outcome = %+v, want 8 frames on two 4-core hosts", out)
	}
	if h.hosts.Checkouts != 2 {
		t.Fatalf("%d checkouts, want 2", h.hosts.Checkouts)
	}
	// Booked something: the layer is not backed off.
	if held := h.backoff.Held(h.cluster.Key()); len(held) != 0 {
		t.Fatalf("layer backed off after booking: %v", held)
	}
	if h.permits.Len() != 0 {
		t.Fatalf("permit leaked")
	}
}

func TestProcessAttemptsBudget(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1)
	h.host(4, "")
	h.host(4, "")
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(10)}})
	if out := h.process(j); out.Dispatched != 4 {
		t.Fatalf("outcome = %+v, want one host's worth with one attempt", out)
	}
}

func TestProcessNoCandidateBacksOff(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(4, "linux")
	big := farmseed.LayerSpec{Tags: []string{"general"}, Frames: 2, Cores: 16, MemKB: farmseed.GB}
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{big}})
	if out := h.process(j); out.Dispatched != 0 || out.Layers != 1 {
		t.Fatalf("outcome = %+v", out)
	}
	if held := h.backoff.Held(h.cluster.Key()); len(held) != 1 {
		t.Fatalf("held = %v, want the layer", held)
	}
	// Backed off: the next pass does not even look at it.
	if out := h.process(j); out.Layers != 0 {
		t.Fatalf("backed-off layer worked again: %+v", out)
	}
	// OS mismatch is also no candidate.
	j2 := h.job(farmseed.JobSpec{OS: "rocky9", Layers: []farmseed.LayerSpec{layer(2)}})
	if out := h.process(j2); out.Dispatched != 0 {
		t.Fatalf("frame of an OS-constrained job landed on a host of another OS: %+v", out)
	}
}

func TestProcessSkipsForeignTagsAndHeldPermits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(8, "")
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(2, "gpu"), layer(2)}})
	ls, err := jobs.Layers(context.Background(), h.pool, jobs.LayerQuery{JobID: j.ID, Tags: []string{"general"}})
	if err != nil || len(ls) != 1 {
		t.Fatalf("layers = %v, %v", ls, err)
	}
	if !h.permits.Acquire(ls[0].ID, time.Minute) {
		t.Fatal("could not take the permit")
	}
	if out := h.process(j); out.Dispatched != 0 || out.Layers != 0 {
		t.Fatalf("layer with a held permit was worked: %+v", out)
	}
	h.permits.Release(ls[0].ID)
	if out := h.process(j); out.Dispatched != 2 {
		t.Fatalf("outcome = %+v", out)
	}
}

func TestProcessStopsAtJobCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(8, "")
	h.host(8, "")
	j := h.job(farmseed.JobSpec{MaxCores: 3, Layers: []farmseed.LayerSpec{layer(5), layer(5)}})
	out := h.process(j)
	if out.Dispatched != 3 {
		t.Fatalf("outcome = %+v, want 3 (job cap)", out)
	}
	var booked int64
	if err := h.pool.QueryRow(context.Background(), `SELECT COALESCE(SUM(int_cores_reserved),0) FROM proc WHERE pk_job = $1`, j.ID).Scan(&booked); err != nil || booked != 300 {
		t.Fatalf("booked %d centicores, %v", booked, err)
	}
}

// A host whose RQD cannot be reached is held out of later checkouts, so the
// layer's frames go elsewhere instead of bouncing off it.
func TestProcessQuarantinesUnreachableHosts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(4, "") // h1..: the first host, picked first by best fit
	h.fake.SetHost("h1", fakerqd.Behavior{Mode: fakerqd.Unreachable})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(3)}})
	if out := h.process(j); out.Dispatched != 0 {
		t.Fatalf("outcome with only an unreachable host = %+v", out)
	}
	attempts := func() int {
		n := 0
		for _, l := range h.fake.Launches() {
			if l.Host == "h1" {
				if l.Started {
					t.Fatal("a frame started on the unreachable host")
				}
				n++
			}
		}
		return n
	}
	first := attempts()
	if first != 6 { // three frames, each retried once on UNAVAILABLE
		t.Fatalf("%d launch attempts on the unreachable host, want 6", first)
	}
	// The layer found no usable host, so it backed off; lift that.
	for _, l := range h.backoff.Held(h.cluster.Key()) {
		h.backoff.Booked(h.cluster.Key(), l)
	}
	h.host(4, "")
	out := h.process(j)
	if out.Dispatched != 3 {
		t.Fatalf("outcome = %+v, want the frames on the healthy host", out)
	}
	if n := attempts(); n != first {
		t.Fatalf("the quarantined host got %d more launch attempts", n-first)
	}
}

// TestProcessJobBudget: dispatch_frames_per_job_limit caps what one job
// books in one pass over all its layers, worked in dispatch order, so a job
// of many layers gets the share of a pass a one-layer job gets.
func TestProcessJobBudget(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(16, "")
	many := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(4), layer(4), layer(4)}})
	one := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(12)}})
	m := matcher.New(h.pool, h.hosts, h.disp, matcher.Config{Attempts: 10, FramesPerLayer: 20, FramesPerJob: 5, Policy: h.policy},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: h.backoff, Permits: h.permits})
	for _, c := range []struct {
		job  jobs.Job
		name string
	}{{many, "three layers"}, {one, "one layer"}} {
		out, err := m.Process(context.Background(), h.cluster, c.job)
		if err != nil {
			t.Fatal(err)
		}
		if out.Dispatched != 5 {
			t.Fatalf("%s: %+v, want the job budget of 5 frames", c.name, out)
		}
	}
	var perLayer []int
	rows, err := h.pool.Query(context.Background(), `SELECT count(*) FILTER (WHERE f.str_state = 'RUNNING') FROM layer l
		JOIN frame f USING (pk_layer) WHERE l.pk_job = $1 GROUP BY l.pk_layer, l.int_dispatch_order ORDER BY l.int_dispatch_order`, many.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		perLayer = append(perLayer, n)
	}
	rows.Close()
	if fmt.Sprint(perLayer) != "[4 1 0]" {
		t.Fatalf("running per layer in dispatch order = %v, want [4 1 0]", perLayer)
	}
	// Without a budget the job books every frame that fits.
	rest := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(2), layer(2), layer(2)}})
	if out := h.process(rest); out.Dispatched != 6 {
		t.Fatalf("no budget: %+v, want all 6 frames", out)
	}
}

// A pass's turn caps a job's frames below the configured job budget, and a
// job waits for its turn before its first checkout, then hands it on.
func TestProcessInTurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	// Two hosts: the turn passes on at the first job's checkout, while
	// that host is still checked out for its dispatch.
	h.host(16, "")
	h.host(16, "")
	m := matcher.New(h.pool, h.hosts, h.disp, matcher.Config{Attempts: 10, FramesPerLayer: 20, FramesPerJob: 5, Policy: h.policy},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: h.backoff, Permits: h.permits})
	first := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(4)}})
	second := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(4)}})

	// The second job's turn comes after the first's: started first, it
	// must not book until the first job has had its pick.
	gate := make(chan struct{})
	handed := make(chan struct{})
	type result struct {
		out matcher.Outcome
		err error
	}
	secondDone := make(chan result, 1)
	go func() {
		out, err := m.ProcessInTurn(context.Background(), h.cluster, second, matcher.Turn{Wait: gate, Budget: 2})
		secondDone <- result{out, err}
	}()
	var bookedEarly int
	out, err := m.ProcessInTurn(context.Background(), h.cluster, first,
		matcher.Turn{Budget: 3, Done: func() {
			// The second job started first but waits for this turn.
			if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM proc WHERE pk_job = $1`, second.ID).Scan(&bookedEarly); err != nil {
				t.Error(err)
			}
			close(handed)
			close(gate)
		}})
	if bookedEarly != 0 {
		t.Fatalf("the second job booked %d frames before its turn", bookedEarly)
	}
	if err != nil {
		t.Fatal(err)
	}
	if out.Dispatched != 3 {
		t.Fatalf("first job: %+v, want its turn's budget of 3 frames", out)
	}
	select {
	case <-handed:
	default:
		t.Fatal("the first job never handed its turn on")
	}
	r := <-secondDone
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.out.Dispatched != 2 {
		t.Fatalf("second job: %+v, want its turn's budget of 2 frames", r.out)
	}
}

// pausingDispatcher pauses the job before its first batch reaches the
// dispatcher, i.e. after the matcher read the job's layers.
type pausingDispatcher struct {
	h     *harness
	job   string
	calls int
}

func (p *pausingDispatcher) Dispatch(ctx context.Context, l *jobs.Layer, frames []jobs.Frame, host sizing.Host) dispatch.Result {
	p.calls++
	if p.calls == 1 {
		if _, err := p.h.pool.Exec(ctx, `UPDATE job SET b_paused = true WHERE pk_job = $1`, p.job); err != nil {
			p.h.t.Error(err)
		}
	}
	return p.h.disp.Dispatch(ctx, l, frames, host)
}

// A job paused after the matcher read its layers: the first batch comes
// back JobStopped, and the job's other layers are not tried (nor backed
// off: the pause is not a lack of hosts).
func TestProcessStopsWhenTheJobIsPaused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(8, "")
	h.host(8, "")
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(4), layer(4)}})
	pd := &pausingDispatcher{h: h, job: j.ID}
	m := matcher.New(h.pool, h.hosts, pd, matcher.Config{Attempts: 10, FramesPerLayer: 20, Policy: h.policy},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: h.backoff, Permits: h.permits})
	out, err := m.Process(context.Background(), h.cluster, j)
	if err != nil {
		t.Fatal(err)
	}
	if out.Dispatched != 0 || out.Layers != 1 || pd.calls != 1 {
		t.Fatalf("outcome = %+v after %d batches, want one batch and the job left alone", out, pd.calls)
	}
	if n := h.hosts.Out(); n != 0 {
		t.Fatalf("%d hosts left checked out", n)
	}
	if held := h.backoff.Held(h.cluster.Key()); len(held) != 0 {
		t.Fatalf("layers backed off for a pause: %v", held)
	}
	var procs int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM proc WHERE pk_job = $1`, j.ID).Scan(&procs); err != nil || procs != 0 {
		t.Fatalf("%d procs of the paused job, %v", procs, err)
	}
}

// keepGuard holds back 4 cores and 8 GB per idle GPU.
type keepGuard struct{ held int }

func (g *keepGuard) Keep(tags []string, idleGPUs int64) (int64, int64) {
	return 400 * idleGPUs, 8 * farmseed.GB * idleGPUs
}
func (g *keepGuard) Held() { g.held++ }

// With a GPU guard, CPU frames leave an idle GPU's bundle free; GPU frames
// are not held back by it.
func TestProcessLeavesIdleGPUsTheirBundle(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.str(h.seed.Host(context.Background(), farmseed.HostSpec{Name: "gpu1", Alloc: h.alloc, AllocTag: "general", Cores: 8,
		MemKB: 64 * farmseed.GB, GPUs: 1, GPUMemKB: 16 * farmseed.GB}))
	g := &keepGuard{}
	m := matcher.New(h.pool, h.hosts, h.disp, matcher.Config{Attempts: 10, FramesPerLayer: 20, Policy: h.policy},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: h.backoff, Permits: h.permits, Guard: g})
	cpu := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(8)}})
	out, err := m.Process(context.Background(), h.cluster, cpu)
	if err != nil {
		t.Fatal(err)
	}
	if out.Dispatched != 4 || g.held == 0 {
		t.Fatalf("CPU job on an 8-core host with an idle GPU: %+v (held %d), want 4 frames, 4 cores left for the GPU", out, g.held)
	}
	gpu := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Name: "g", Tags: []string{"general"}, Frames: 1, Cores: 4,
		GPUs: 1, GPUMemKB: farmseed.GB, MemKB: farmseed.GB, NotThreadable: true}}})
	out, err = m.Process(context.Background(), h.cluster, gpu)
	if err != nil {
		t.Fatal(err)
	}
	if out.Dispatched != 1 {
		t.Fatalf("GPU frame: %+v, want it booked on the kept bundle", out)
	}
}
