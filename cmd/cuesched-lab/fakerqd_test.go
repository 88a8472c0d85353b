package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/clitest"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/scheduler/rqdclient"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func runFakeRQDT(ctx context.Context, env map[string]string, args ...string) (int, *clitest.SyncBuffer, *clitest.SyncBuffer) {
	out, errb := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
	c := &cli.Env{Stdout: out, Stderr: errb, Getenv: func(k string) string { return env[k] }, Logger: hclog.NewNullLogger()}
	return runFakeRQD(ctx, c, args), out, errb
}

// fakeRun is "cuesched-lab fake-rqd" running in a goroutine.
type fakeRun struct {
	errb   *clitest.SyncBuffer
	cancel context.CancelFunc
	done   chan int
	code   int
	ended  bool
}

// startFakeRQD runs the command with args until stop (or the test's end).
func startFakeRQD(t *testing.T, env map[string]string, args ...string) *fakeRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &fakeRun{errb: &clitest.SyncBuffer{}, cancel: cancel, done: make(chan int, 1)}
	c := &cli.Env{Stdout: io.Discard, Stderr: r.errb, Getenv: func(k string) string { return env[k] }, Logger: hclog.NewNullLogger()}
	go func() { r.done <- runFakeRQD(ctx, c, args) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the run (as SIGTERM does) and returns its exit code.
func (r *fakeRun) stop(t *testing.T) int {
	t.Helper()
	if r.ended {
		return r.code
	}
	r.cancel()
	select {
	case r.code = <-r.done:
		r.ended = true
	case <-time.After(testenv.Patience(30 * time.Second)):
		t.Fatalf("fake-rqd did not stop; stderr:\n%s", r.errb.String())
	}
	return r.code
}

// logged waits until the log matches re and returns the first submatch.
func (r *fakeRun) logged(t *testing.T, re *regexp.Regexp) string {
	t.Helper()
	var m []string
	waitFor(t, func() bool {
		m = re.FindStringSubmatch(r.errb.String())
		return m != nil
	}, func() string { return fmt.Sprintf("log never matched %s; stderr:\n%s", re, r.errb.String()) })
	if len(m) > 1 {
		return m[1]
	}
	return m[0]
}

var (
	servingRE = regexp.MustCompile(`fake RQD serving: addr=(\S+)`)
	metricsRE = regexp.MustCompile(`serving /metrics, /healthz, /readyz: addr=(\S+)`)
)

// waitFor polls cond until it holds, failing with msg() after a patient
// deadline.
func waitFor(t *testing.T, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(testenv.Patience(20 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(msg())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rqdTo is the scheduler's RQD client, with every host resolved to addr.
func rqdTo(t *testing.T, addr string) *rqdclient.Pool {
	t.Helper()
	p := rqdclient.New(rqdclient.Options{Resolve: func(string) string { return addr }})
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestFakeRQDUsageAndErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	code, out, errb := runFakeRQDT(ctx, nil, "-h")
	if code != 0 || !strings.Contains(out.String(), "usage: cuesched-lab fake-rqd") || !strings.Contains(out.String(), "-run-time") {
		t.Errorf("-h: code %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	cases := []struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		{[]string{"--bogus"}, nil, 2, "flag provided but not defined: -bogus"},
		{[]string{"extra"}, nil, 2, `unexpected argument "extra"`},
		{[]string{"--run-time", "soon"}, nil, 2, "--run-time"},
		{[]string{"--run-time", "10s..1s"}, nil, 2, "MIN <= MAX"},
		{[]string{"--hosts", " , "}, nil, 2, "--hosts"},
		{[]string{"--log-level", "loud"}, nil, 2, "--log-level"},
		{[]string{"--complete"}, nil, 2, "no database"},
		{[]string{"--complete", "--config", "/nonexistent/cuesched.yaml"}, nil, 1, "/nonexistent/cuesched.yaml"},
		// An address it cannot listen on fails at start, naming the flag.
		{[]string{"--listen", "256.0.0.1:1"}, nil, 1, "--listen"},
	}
	for _, tc := range cases {
		code, _, errb := runFakeRQDT(ctx, tc.env, tc.args...)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("fake-rqd %v: code %d, stderr %q; want %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
	for _, ok := range []string{"0s", "5s", "1s..2m", " 1s .. 1s "} {
		if _, _, err := parseRunTime(ok); err != nil {
			t.Errorf("parseRunTime(%q): %v", ok, err)
		}
	}
}

// A LaunchFrame over real gRPC for an answered host is accepted and logged;
// a host outside --hosts answers UNAVAILABLE; /healthz and /metrics work;
// cancellation stops it cleanly.
func TestFakeRQDAcceptsAndLogsLaunches(t *testing.T) {
	t.Parallel()
	r := startFakeRQD(t, nil, "--listen", "127.0.0.1:0", "--hosts", "node1,node2", "--run-time", "1h",
		"--metrics-listen", "127.0.0.1:0")
	addr := r.logged(t, servingRE)
	maddr := r.logged(t, metricsRE)
	rqd := rqdTo(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience(30*time.Second))
	defer cancel()

	rf := &rqdpb.RunFrame{ResourceId: "proc-1", JobId: "job-1", JobName: "show-shot-render", FrameId: "frame-1",
		FrameName: "0001-render", NumCores: 200, SoftMemoryLimit: 1600000, HardMemoryLimit: 2000000}
	if err := rqd.LaunchFrame(ctx, "node2", rf); err != nil {
		t.Fatalf("launch on an answered host: %v", err)
	}
	r.logged(t, regexp.MustCompile(`frame launched: host=node2 job=show-shot-render frame=0001-render cores=2 mem_soft_kb=1600000 mem_hard_kb=2000000`))

	err := rqd.LaunchFrame(ctx, "node9", &rqdpb.RunFrame{FrameId: "frame-2", FrameName: "0002-render", NumCores: 100})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("launch on a host outside --hosts: %v, want UNAVAILABLE", err)
	}
	r.logged(t, regexp.MustCompile(`launch refused: host=node9 code=Unavailable`))
	// A second launch of the running frame on the same host is refused as a
	// real RQD refuses it.
	if err := rqd.LaunchFrame(ctx, "node2", rf); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("duplicate launch: %v, want INVALID_ARGUMENT", err)
	}

	get := func(path string) string {
		resp, err := http.Get("http://" + maddr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s\n%s", path, resp.Status, b)
		}
		return string(b)
	}
	if body := get("/healthz"); !strings.Contains(body, "ok") {
		t.Errorf("/healthz: %q", body)
	}
	m := get("/metrics")
	for _, want := range []string{`fakerqd_launches_total{code="OK"} 1`, `fakerqd_launches_total{code="Unavailable"} 2`,
		`fakerqd_launches_total{code="InvalidArgument"} 1`, "fakerqd_running_frames 1"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code := r.stop(t); code != 0 {
		t.Fatalf("exit code %d after cancellation; stderr:\n%s", code, r.errb.String())
	}
	if !strings.Contains(r.errb.String(), "frames_dropped=1") {
		t.Errorf("stop did not report the running frame dropped; stderr:\n%s", r.errb.String())
	}
}

// runningFrameFarm seeds a farm with a job of n frames, each running on a
// host with a proc as a dispatcher would have booked it.
type runningFrameFarm struct {
	db     string
	pool   *pgxpool.Pool
	job    farmseed.Job
	host   string
	procs  []string
	frames []string
}

func newRunningFrameFarm(t *testing.T, n int) *runningFrameFarm {
	t.Helper()
	ctx := context.Background()
	f := &runningFrameFarm{db: cuebotdb.Database(t), host: "fakenode1"}
	var err error
	if f.pool, err = pgxpool.New(ctx, f.db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	s := &farmseed.Seeder{DB: f.pool}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	fac, err := s.Facility(ctx, "rehearsal")
	must(err)
	alloc, err := s.Alloc(ctx, fac, "rehearsal.general", "general")
	must(err)
	show, err := s.Show(ctx, "staging", false)
	must(err)
	_, err = s.Subscribe(ctx, show, alloc, 10, 20)
	must(err)
	host, err := s.Host(ctx, farmseed.HostSpec{Name: f.host, Alloc: alloc, AllocTag: "general", Cores: 16})
	must(err)
	f.job, err = s.Job(ctx, farmseed.JobSpec{Name: "staging-sh010-render", Show: show, Facility: fac,
		Layers: []farmseed.LayerSpec{{Name: "render", Frames: n}}})
	must(err)
	f.frames = f.job.Layers[0].Frames
	for _, fr := range f.frames {
		p, err := s.Proc(ctx, farmseed.ProcSpec{Host: host, Frame: fr, Cores: 1, MemKB: farmseed.GB})
		must(err)
		f.procs = append(f.procs, p)
	}
	return f
}

// runFrame is the RunFrame the dispatcher would send for frame i.
func (f *runningFrameFarm) runFrame(i int) *rqdpb.RunFrame {
	return &rqdpb.RunFrame{ResourceId: f.procs[i], JobId: f.job.ID, JobName: f.job.Name, LayerId: f.job.Layers[0].ID,
		FrameId: f.frames[i], FrameName: fmt.Sprintf("%04d-render", i+1), NumCores: 100,
		SoftMemoryLimit: farmseed.GB * 16 / 10, HardMemoryLimit: farmseed.GB * 2}
}

// frameState is the frame's state and exit status, and whether a proc still
// runs it.
func (f *runningFrameFarm) frameState(t *testing.T, i int) (state string, exit int, hasProc bool) {
	t.Helper()
	err := f.pool.QueryRow(context.Background(), `
		SELECT f.str_state, f.int_exit_status, EXISTS (SELECT 1 FROM proc p WHERE p.pk_proc = $2)
		  FROM frame f WHERE f.pk_frame = $1`, f.frames[i], f.procs[i]).Scan(&state, &exit, &hasProc)
	if err != nil {
		t.Fatal(err)
	}
	return state, exit, hasProc
}

// With --complete, a launched frame that ends is reported through Cuebot's
// tables: its proc row is deleted and the frame is SUCCEEDED. A frame still
// running at the stop is cleared: proc released, frame WAITING (299).
func TestFakeRQDCompletesThroughCuebotTables(t *testing.T) {
	t.Parallel()
	f := newRunningFrameFarm(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience(60*time.Second))
	defer cancel()

	// The database comes from the environment, as for the other commands.
	r := startFakeRQD(t, map[string]string{"CUESCHED_DATABASE_URL": f.db},
		"--listen", "127.0.0.1:0", "--complete", "--run-time", "0s..50ms")
	if err := rqdTo(t, r.logged(t, servingRE)).LaunchFrame(ctx, f.host, f.runFrame(0)); err != nil {
		t.Fatalf("launch: %v", err)
	}
	waitFor(t, func() bool {
		state, _, hasProc := f.frameState(t, 0)
		return state == "SUCCEEDED" && !hasProc
	}, func() string {
		state, exit, hasProc := f.frameState(t, 0)
		return fmt.Sprintf("frame 1 is %s (exit %d, proc present %v), want SUCCEEDED without proc; stderr:\n%s",
			state, exit, hasProc, r.errb.String())
	})
	r.logged(t, regexp.MustCompile(`frame finished: host=fakenode1 job=staging-sh010-render frame=0001-render exit_status=0 .*reported=completed`))
	var idle int64
	if err := f.pool.QueryRow(ctx, `SELECT int_cores_idle FROM host WHERE str_name = $1`, f.host).Scan(&idle); err != nil {
		t.Fatal(err)
	}
	if idle != 1500 {
		t.Errorf("host idle cores %d after one of two procs was released, want 1500", idle)
	}
	// Its connections are named for "cuesched status".
	var named int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'cuesched-fake-rqd/%'`).Scan(&named); err != nil {
		t.Fatal(err)
	}
	if named == 0 {
		t.Error("no connection named cuesched-fake-rqd/<instance> in pg_stat_activity")
	}
	if code := r.stop(t); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, r.errb.String())
	}

	// The --config file's database.url serves as well; a frame running at
	// the stop is cleared.
	path := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(path, []byte("database:\n  url: "+f.db+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = startFakeRQD(t, nil, "--listen", "127.0.0.1:0", "--complete", "--config", path, "--run-time", "1h")
	if err := rqdTo(t, r.logged(t, servingRE)).LaunchFrame(ctx, f.host, f.runFrame(1)); err != nil {
		t.Fatalf("launch: %v", err)
	}
	r.logged(t, regexp.MustCompile(`frame launched: host=fakenode1 .*frame=0002-render`))
	if state, _, hasProc := f.frameState(t, 1); state != "RUNNING" || !hasProc {
		t.Fatalf("frame 2 is %s (proc present %v) while it runs", state, hasProc)
	}
	if code := r.stop(t); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, r.errb.String())
	}
	if state, exit, hasProc := f.frameState(t, 1); state != "WAITING" || exit != 299 || hasProc {
		t.Fatalf("frame 2 after the stop: %s, exit %d, proc present %v; want WAITING, 299, no proc; stderr:\n%s",
			state, exit, hasProc, r.errb.String())
	}
	if !strings.Contains(r.errb.String(), "cleared=1 failed=0") {
		t.Errorf("the stop did not report the cleared frame; stderr:\n%s", r.errb.String())
	}
}

// TestFakeRQDRetriesCompletionReports: a completion report the database
// refuses (the fake's connection to Postgres cut, as in a restart or a
// failover) is retried with backoff until it is accepted, as RQD resends
// its FrameCompleteReport: the frame ends SUCCEEDED once the database is
// back, instead of staying RUNNING.
func TestFakeRQDRetriesCompletionReports(t *testing.T) {
	t.Parallel()
	f := newRunningFrameFarm(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience(60*time.Second))
	defer cancel()
	u, err := url.Parse(f.db)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testenv.StartProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	r := startFakeRQD(t, map[string]string{"CUESCHED_DATABASE_URL": u.String()},
		"--listen", "127.0.0.1:0", "--complete", "--run-time", "300ms", "--log-level", "debug")
	addr := r.logged(t, servingRE)
	proxy.Cut()
	if err := rqdTo(t, addr).LaunchFrame(ctx, f.host, f.runFrame(0)); err != nil {
		t.Fatalf("launch: %v", err)
	}
	r.logged(t, regexp.MustCompile(`reporting it failed, retrying until it is accepted`))
	r.logged(t, regexp.MustCompile(`completion report refused again`))
	if state, _, hasProc := f.frameState(t, 0); state != "RUNNING" || !hasProc {
		t.Fatalf("frame is %s (proc present %v) while its report cannot reach the database", state, hasProc)
	}
	proxy.Restore()
	waitFor(t, func() bool {
		state, _, hasProc := f.frameState(t, 0)
		return state == "SUCCEEDED" && !hasProc
	}, func() string {
		state, _, hasProc := f.frameState(t, 0)
		return fmt.Sprintf("frame is %s (proc present %v) after the database came back; stderr:\n%s", state, hasProc, r.errb.String())
	})
	r.logged(t, regexp.MustCompile(`frame finished: .*frame=0001-render .*attempts=\d+ reported=completed`))
	if code := r.stop(t); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, r.errb.String())
	}
}

// The real scheduler, pointed at the fake with rqd.address_override,
// launches a managed show's frames on it, and the fake's completions finish
// them: every frame SUCCEEDED, no proc left.
func TestFakeRQDWithRealScheduler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const frames = 6
	db, pool := farmseed.OneHostFarm(t, "rh", "rehearse", "rhhost", "rhjob", frames)

	fake := startFakeRQD(t, map[string]string{"CUESCHED_DATABASE_URL": db},
		"--listen", "127.0.0.1:0", "--complete", "--run-time", "0s..100ms", "--hosts", "rhhost")
	addr := fake.logged(t, servingRE)

	path := filepath.Join(t.TempDir(), "cfg.yaml")
	cfg := "metrics:\n  listen: \"\"\nqueue:\n  active_scan_interval: 50ms\naccounting:\n  leader_poll_interval: 50ms\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CUESCHED_DATABASE_URL": db, "CUESCHED_ACCOUNTING_REDIS_URL": testenv.NewRedisDB(t),
		"CUESCHED_RQD_ADDRESS_OVERRIDE": addr}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan int, 1)
	serrb := &clitest.SyncBuffer{}
	go func() { done <- runScheduler(sctx, t, env, path, "rh", serrb) }()
	stopScheduler := func() int {
		cancel()
		return <-done
	}

	deadline := time.Now().Add(testenv.Patience(60 * time.Second))
	for {
		var succeeded, procs int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM frame WHERE str_state = 'SUCCEEDED'),
			(SELECT count(*) FROM proc)`).Scan(&succeeded, &procs); err != nil {
			t.Fatal(err)
		}
		if succeeded == frames && procs == 0 {
			break
		}
		if time.Now().After(deadline) {
			stopScheduler()
			t.Fatalf("%d of %d frames SUCCEEDED, %d procs left; scheduler stderr:\n%s\nfake-rqd stderr:\n%s",
				succeeded, frames, procs, serrb.String(), fake.errb.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code := stopScheduler(); code != 0 {
		t.Fatalf("scheduler exit code %d; stderr:\n%s", code, serrb.String())
	}
	if n := strings.Count(fake.errb.String(), "frame launched: host=rhhost job=rhjob"); n < frames {
		t.Errorf("fake logged %d launches, want at least %d; stderr:\n%s", n, frames, fake.errb.String())
	}
	if code := fake.stop(t); code != 0 {
		t.Fatalf("fake-rqd exit code %d; stderr:\n%s", code, fake.errb.String())
	}
}

// runScheduler runs the scheduler package (what "cuesched scheduler" runs)
// on the configuration file path with the environment env, scheduling
// facility; its log goes to logs, and the code is 0 when it
// stopped cleanly.
func runScheduler(ctx context.Context, t *testing.T, env map[string]string, path, facility string, logs *clitest.SyncBuffer) int {
	cfg, err := config.Load(path, func(k string) string { return env[k] })
	if err != nil {
		t.Error(err)
		return 1
	}
	cfg.Scheduler.Facility = facility
	log := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	s, err := scheduler.New(ctx, cfg, scheduler.Deps{Logger: log})
	if err != nil {
		t.Error(err)
		return 1
	}
	defer s.Close()
	if err := s.Run(ctx); err != nil {
		log.Error("scheduler stopped", "error", err)
		return 1
	}
	return 0
}
