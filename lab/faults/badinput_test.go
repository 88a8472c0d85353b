package faults

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/farmseed"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestBadConfigNamesKeyAndFile: `cuesched scheduler --config bad.yaml` and
// `cuesched sidecar --config bad.yaml`, run as real processes, exit
// non-zero before touching anything, naming the file, the line and the key.
// (The loader's rules are tested in shared/config TestErrorsNameKeyAndFile;
// this checks that the binary surfaces them.)
func TestBadConfigNamesKeyAndFile(t *testing.T) {
	t.Parallel()
	bin := cueschedBinary(t)
	dir := t.TempDir()
	cases := []struct {
		name, body string
		want       []string
	}{
		{"typo", "database:\n  url: postgres://nowhere.invalid/cue\nqueue:\n  cluster_emtpy_sleep: 1s\n",
			[]string{":4", `key "queue.cluster_emtpy_sleep"`, "unknown key", "cluster_empty_sleep"}},
		{"bad-duration", "accounting:\n  recompute_interval: often\n",
			[]string{":2", `key "accounting.recompute_interval"`, `"often" is not a duration`}},
		{"bad-yaml", "rqd:\n  grpc_port: [8444\n",
			[]string{"not valid YAML"}},
		{"out-of-range", "database:\n  pool_size: 1\n",
			[]string{`key "database.pool_size"`}},
	}
	for _, tc := range cases {
		for _, mode := range []string{"scheduler", "sidecar"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				path := filepath.Join(dir, mode+"-"+tc.name+".yaml")
				if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				cmd := exec.CommandContext(ctx, bin, mode, "--config", path)
				// Nothing may be reached: a database that does not exist.
				cmd.Env = append(os.Environ(), "CUESCHED_DATABASE_URL=postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				err := cmd.Run()
				code := cmd.ProcessState.ExitCode()
				if err == nil || code == 0 {
					t.Fatalf("exit code %d (err %v); stderr:\n%s", code, err, stderr.String())
				}
				out := stderr.String()
				for _, w := range append([]string{path}, tc.want...) {
					if !strings.Contains(out, w) {
						t.Errorf("stderr does not name %q:\n%s", w, out)
					}
				}
				if n := strings.Count(strings.TrimSpace(out), "\n"); n > 3 {
					t.Errorf("a configuration error should be a short message, got %d lines:\n%s", n+1, out)
				}
			})
		}
	}
}

// fixture builds exact farms for the bad-input tests.
type fixture struct {
	e       *env
	s       *farmseed.Seeder
	fac     string
	general string
	gpu     string
	hosts   []string
	jobs    map[string]farmseed.Job // by name
}

func newFixture(e *env) *fixture {
	f := &fixture{e: e, s: &farmseed.Seeder{DB: e.pool}, jobs: map[string]farmseed.Job{}}
	var err error
	if f.fac, err = f.s.Facility(e.ctx, "spi"); err != nil {
		e.t.Fatal(err)
	}
	if f.general, err = f.s.Alloc(e.ctx, f.fac, "spi.general", "general"); err != nil {
		e.t.Fatal(err)
	}
	if f.gpu, err = f.s.Alloc(e.ctx, f.fac, "spi.gpu", "gpu"); err != nil {
		e.t.Fatal(err)
	}
	return f
}

func (f *fixture) host(spec farmseed.HostSpec) string {
	if spec.Alloc == "" {
		spec.Alloc, spec.AllocTag = f.general, "general"
	}
	if spec.Cores == 0 {
		spec.Cores = 8
	}
	if spec.MemKB == 0 {
		spec.MemKB = 32 * farmseed.GB
	}
	id, err := f.s.Host(f.e.ctx, spec)
	if err != nil {
		f.e.t.Fatal(err)
	}
	f.hosts = append(f.hosts, spec.Name)
	return id
}

func (f *fixture) show(name string, managed bool) farmseed.Show {
	sh, err := f.s.Show(f.e.ctx, name, managed)
	if err != nil {
		f.e.t.Fatal(err)
	}
	return sh
}

func (f *fixture) sub(sh farmseed.Show, alloc string, size, burst int) {
	if _, err := f.s.Subscribe(f.e.ctx, sh, alloc, size, burst); err != nil {
		f.e.t.Fatal(err)
	}
}

// job seeds a job of n one-core frames tagged general (unless the spec
// says otherwise).
func (f *fixture) job(js farmseed.JobSpec) farmseed.Job {
	js.Facility = f.fac
	if js.Priority == 0 {
		js.Priority = 100
	}
	for i := range js.Layers {
		if js.Layers[i].Name == "" {
			js.Layers[i].Name = js.Name + "-l"
		}
		if len(js.Layers[i].Tags) == 0 {
			js.Layers[i].Tags = []string{"general"}
		}
		if js.Layers[i].Frames == 0 {
			js.Layers[i].Frames = 4
		}
		if js.Layers[i].MemKB == 0 {
			js.Layers[i].MemKB = farmseed.GB
		}
		js.Layers[i].NotThreadable = true
	}
	j, err := f.s.Job(f.e.ctx, js)
	if err != nil {
		f.e.t.Fatal(err)
	}
	f.jobs[js.Name] = j
	return j
}

func (f *fixture) exec(sql string, args ...any) {
	f.e.t.Helper()
	if _, err := f.e.pool.Exec(f.e.ctx, sql, args...); err != nil {
		f.e.t.Fatalf("%s: %v", sql, err)
	}
}

// jobStates returns, per job name, "<state> x<n>" of its frames.
func (e *env) jobStates() map[string]string {
	rows, err := e.pool.Query(e.ctx, `SELECT j.str_name, f.str_state, count(*) FROM frame f JOIN job j ON j.pk_job = f.pk_job
		GROUP BY j.str_name, f.str_state ORDER BY 1, 2`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var job, state string
		var n int
		if err := rows.Scan(&job, &state, &n); err != nil {
			e.t.Fatal(err)
		}
		if out[job] != "" {
			out[job] += ", "
		}
		out[job] += fmt.Sprintf("%s x%d", state, n)
	}
	return out
}

// launchedByJob counts the frames started on the fake RQD, per job id.
func (e *env) launchedByJob() map[string]int {
	out := map[string]int{}
	for _, l := range e.fake.Launches() {
		if l.RunFrame != nil {
			out[l.RunFrame.GetJobId()]++
		}
	}
	return out
}

// waitJobsDone waits until every frame of the named jobs SUCCEEDED and no
// proc is left.
func (e *env) waitJobsDone(jobs []farmseed.Job, timeout time.Duration) {
	e.t.Helper()
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	deadline := time.Now().Add(testenv.Patience(timeout))
	for {
		var left, procs int
		err := e.pool.QueryRow(e.ctx, `SELECT (SELECT count(*) FROM frame WHERE pk_job = ANY($1) AND str_state <> 'SUCCEEDED'),
			(SELECT count(*) FROM proc)`, ids).Scan(&left, &procs)
		if err == nil && left == 0 && procs == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("jobs not done after %s (%d frames left, %d procs): %v", timeout, left, procs, e.jobStates())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// limitsFarm is four 8-core general hosts and one GPU host, a managed show
// "sane" with a control job, and whatever extra sets up.
func limitsFarm(extra func(f *fixture, sane farmseed.Show)) envOpts {
	return envOpts{RunMin: 300 * time.Millisecond, StrictRecords: true, Fixture: func(e *env) {
		f := newFixture(e)
		for i := 0; i < 4; i++ {
			f.host(farmseed.HostSpec{Name: fmt.Sprintf("gen%02d", i)})
		}
		f.host(farmseed.HostSpec{Name: "gpu00", Alloc: f.gpu, AllocTag: "gpu", GPUs: 2, GPUMemKB: 16 * farmseed.GB})
		sane := f.show("sane", true)
		f.sub(sane, f.general, 16, 24)
		f.sub(sane, f.gpu, 8, 8)
		f.job(farmseed.JobSpec{Name: "control", Show: sane, Layers: []farmseed.LayerSpec{{}}})
		extra(f, sane)
		e.fixture = f
	}}
}

// runLimits runs the farm until the jobs in runs are done, gives the
// others a few more seconds to be (wrongly) booked, and returns the frames
// launched per job name.
func runLimits(t *testing.T, o envOpts, runs []string) (*env, map[string]int) {
	e := newEnv(t, o)
	f := e.fixture
	e.run()
	var done []farmseed.Job
	for _, n := range append([]string{"control"}, runs...) {
		done = append(done, f.jobs[n])
	}
	e.waitJobsDone(done, 60*time.Second)
	// Several passes, layer backoffs and a limit reseed.
	time.Sleep(4 * time.Second)
	e.smp.finish(t)
	byID := e.launchedByJob()
	out := map[string]int{}
	for name, j := range f.jobs {
		out[name] = byID[j.ID]
	}
	e.note("frames by job: %v", e.jobStates())
	return e, out
}

// TestBadLimits: negative, zero and absurd limits in the Cuebot tables.
// Nothing crashes, nothing is booked beyond a cap, and the limits are read
// as Cuebot reads them: a subscription burst <= 0, or no subscription on
// the allocation, books nothing; values at the top of the integer range
// (burst, size, job max cores and GPUs) neither overflow nor refuse; a
// layer that fits no host does not wedge its show. The control job and the
// huge-limit jobs run to completion and Redis ends equal to Postgres.
// (Zero job/folder caps: TestBadZeroCaps; negative memory:
// TestBadNegativeLayerMemory.)
func TestBadLimits(t *testing.T) {
	t.Parallel()
	o := limitsFarm(func(f *fixture, sane farmseed.Show) {
		f.job(farmseed.JobSpec{Name: "job-max-huge", Show: sane, Layers: []farmseed.LayerSpec{{}}})
		f.exec(`UPDATE job_resource SET int_max_cores = 2147483647, int_max_gpus = 2147483647 WHERE pk_job = $1`, f.jobs["job-max-huge"].ID)
		f.job(farmseed.JobSpec{Name: "fits-no-host", Show: sane, Layers: []farmseed.LayerSpec{{Cores: 64}}})

		neg := f.show("negburst", true)
		f.sub(neg, f.general, 0, 1)
		f.exec(`UPDATE subscription SET int_burst = -100, int_size = -100 WHERE pk_show = $1`, neg.ID)
		f.job(farmseed.JobSpec{Name: "burst-negative", Show: neg, Layers: []farmseed.LayerSpec{{}}})
		zero := f.show("zeroburst", true)
		f.sub(zero, f.general, 0, 1)
		f.exec(`UPDATE subscription SET int_burst = 0 WHERE pk_show = $1`, zero.ID)
		f.job(farmseed.JobSpec{Name: "burst-zero", Show: zero, Layers: []farmseed.LayerSpec{{}}})
		huge := f.show("hugeburst", true)
		f.sub(huge, f.general, 1, 1)
		f.exec(`UPDATE subscription SET int_size = 2147483647, int_burst = 2147483647 WHERE pk_show = $1`, huge.ID)
		f.job(farmseed.JobSpec{Name: "burst-huge", Show: huge, Layers: []farmseed.LayerSpec{{}}})
		nosub := f.show("nosub", true)
		f.sub(nosub, f.gpu, 8, 8)
		f.job(farmseed.JobSpec{Name: "no-subscription", Show: nosub, Layers: []farmseed.LayerSpec{{}}})
	})
	e, launched := runLimits(t, o, []string{"job-max-huge", "burst-huge"})
	for _, n := range []string{"fits-no-host", "burst-negative", "burst-zero", "no-subscription"} {
		if launched[n] > 0 {
			t.Errorf("%s: %d frames launched, want none", n, launched[n])
		}
	}
	// Why: the layer that fits no host backs off and is counted.
	m, err := e.schedulers[0].metrics(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("CUESCHED_FAULTS_DUMP_METRICS") != "" {
		for _, k := range sortedKeys(m) {
			if strings.HasPrefix(k, "scheduler_") && m[k] != 0 && !strings.Contains(k, "_bucket") {
				t.Logf("%s %v", k, m[k])
			}
		}
	}
	if n := sum(m, "scheduler_no_candidate_iterations_total"); n == 0 {
		t.Errorf("scheduler_no_candidate_iterations_total = 0: nothing says why fits-no-host never ran")
	}
	e.checkLaunches()
	e.checkAccounting()
	e.checkRecovered()
}

// TestBadZeroCaps: Cuebot books a job only while job_resource.int_cores +
// need <= int_max_cores (and the same for GPUs), and a folder only when
// folder_resource.int_max_cores is -1 or has room; so a job or folder max
// of 0 (what an operator sets to stop a job or a folder taking more cores)
// books nothing, and neither does a job max GPUs of 0 for a GPU layer. Those
// jobs stay WAITING while the control job runs, and Redis ends equal to
// Postgres.
func TestBadZeroCaps(t *testing.T) {
	t.Parallel()
	o := limitsFarm(func(f *fixture, sane farmseed.Show) {
		frozen, err := f.s.Folder(f.e.ctx, sane, "frozen", 0, -1)
		if err != nil {
			f.e.t.Fatal(err)
		}
		f.job(farmseed.JobSpec{Name: "job-max-0", Show: sane, Layers: []farmseed.LayerSpec{{}}})
		f.job(farmseed.JobSpec{Name: "job-gpus-max-0", Show: sane, Layers: []farmseed.LayerSpec{{Tags: []string{"gpu"}, GPUs: 1, GPUMemKB: farmseed.GB}}})
		f.job(farmseed.JobSpec{Name: "folder-max-0", Show: sane, Folder: frozen, Layers: []farmseed.LayerSpec{{}}})
		f.exec(`UPDATE job_resource SET int_max_cores = 0 WHERE pk_job = $1`, f.jobs["job-max-0"].ID)
		f.exec(`UPDATE job_resource SET int_max_gpus = 0 WHERE pk_job = $1`, f.jobs["job-gpus-max-0"].ID)
	})
	e, launched := runLimits(t, o, nil)
	for _, n := range []string{"job-max-0", "job-gpus-max-0", "folder-max-0"} {
		if launched[n] > 0 {
			t.Errorf("%s: %d frames launched, want none (Cuebot books nothing under a cap of 0)", n, launched[n])
		}
	}
	e.checkAccounting()
	e.checkRecovered()
}

// TestBadNegativeLayerMemory: a layer whose int_mem_min is negative (bad
// data: the column has no CHECK) must not be booked with a negative memory
// reservation (which would *add* memory to the host, int_mem_idle above
// int_mem, and send RQD negative memory limits): the reservation is raised
// to queue.mem_reserved_min and the frames run.
func TestBadNegativeLayerMemory(t *testing.T) {
	t.Parallel()
	o := limitsFarm(func(f *fixture, sane farmseed.Show) {
		f.job(farmseed.JobSpec{Name: "negative-memory", Show: sane, Layers: []farmseed.LayerSpec{{}}})
		f.exec(`UPDATE layer SET int_mem_min = -1048576 WHERE pk_job = $1`, f.jobs["negative-memory"].ID)
	})
	e, launched := runLimits(t, o, []string{"negative-memory"})
	if launched["negative-memory"] == 0 {
		t.Errorf("no frame of the negative-memory job ran")
	}
	var neg int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM frame WHERE pk_job = $1 AND int_mem_reserved < 0`,
		e.fixture.jobs["negative-memory"].ID).Scan(&neg); err != nil {
		t.Fatal(err)
	}
	if neg > 0 {
		t.Errorf("%d frames ran with a negative memory reservation", neg)
	}
	for _, l := range e.fake.Launches() {
		if rf := l.RunFrame; rf != nil && (rf.GetSoftMemoryLimit() < 0 || rf.GetHardMemoryLimit() < 0) {
			t.Errorf("RQD got negative memory limits for %s: soft %d, hard %d KB", rf.GetFrameName(), rf.GetSoftMemoryLimit(), rf.GetHardMemoryLimit())
			break
		}
	}
	e.checkAccounting()
	e.checkRecovered()
}

// TestBadHosts: hosts with no OS (host_stat.str_os is NOT NULL in Cuebot's
// schema, so ” here, and NULL through a join for the host without a
// host_stat row), zero memory, zero cores, or no host_stat row at all sit
// next to healthy ones. (Negative idle values cannot be written: Cuebot's
// host trigger refuses them.) Nothing
// panics; the host cache and the matcher skip what cannot run a frame (a job
// that names an OS never lands on a host without one); every frame runs on
// a healthy host; Redis ends equal to Postgres.
func TestBadHosts(t *testing.T) {
	t.Parallel()
	var f *fixture
	bad := []string{"zeromem", "zerocores", "nostat"}
	e := newEnv(t, envOpts{RunMin: 300 * time.Millisecond, StrictRecords: true, Fixture: func(e *env) {
		f = newFixture(e)
		for i := 0; i < 3; i++ {
			f.host(farmseed.HostSpec{Name: fmt.Sprintf("gen%02d", i)})
		}
		ids := map[string]string{}
		for _, n := range append([]string{"nullos"}, bad...) {
			ids[n] = f.host(farmseed.HostSpec{Name: n})
		}
		// host_stat.str_os is NOT NULL in Cuebot's schema: a host with no
		// OS is an empty one here, and NULL is what a join sees for the
		// host without a host_stat row (nostat).
		f.exec(`UPDATE host_stat SET str_os = '' WHERE pk_host = $1`, ids["nullos"])
		f.exec(`UPDATE host SET int_mem = 0, int_mem_idle = 0 WHERE pk_host = $1`, ids["zeromem"])
		f.exec(`UPDATE host_stat SET int_mem_total = 0, int_mem_free = 0 WHERE pk_host = $1`, ids["zeromem"])
		f.exec(`UPDATE host SET int_cores = 0, int_cores_idle = 0 WHERE pk_host = $1`, ids["zerocores"])
		f.exec(`DELETE FROM host_stat WHERE pk_host = $1`, ids["nostat"])
		sh := f.show("hosts", true)
		f.sub(sh, f.general, 64, 64)
		f.job(farmseed.JobSpec{Name: "any-os", Show: sh, Layers: []farmseed.LayerSpec{{Frames: 12}}})
		f.job(farmseed.JobSpec{Name: "linux-only", Show: sh, OS: "linux", Layers: []farmseed.LayerSpec{{Frames: 12}}})
		e.fixture = f
	}})
	e.run()
	e.waitJobsDone([]farmseed.Job{f.jobs["any-os"], f.jobs["linux-only"]}, 60*time.Second)
	e.smp.finish(t)
	isBad := map[string]bool{}
	for _, n := range bad {
		isBad[n] = true
	}
	perHost := map[string]int{}
	for _, l := range e.fake.Launches() {
		if l.RunFrame == nil {
			continue
		}
		perHost[l.Host]++
		if isBad[l.Host] {
			t.Errorf("frame %s launched on broken host %s", l.RunFrame.GetFrameName(), l.Host)
		}
		if l.Host == "nullos" && l.RunFrame.GetJobId() == f.jobs["linux-only"].ID {
			t.Errorf("frame %s of a linux job launched on a host without an OS", l.RunFrame.GetFrameName())
		}
	}
	e.note("launches per host: %v", perHost)
	e.checkLaunches()
	e.checkAccounting()
	e.checkRecovered()
}

// TestBadRQDGarbage: some render hosts answer every call with bytes that
// do not decode (and one refuses launches). Their frames go back to WAITING
// with the booking released (Postgres and Redis), run elsewhere, and
// nothing leaks: hosts whole, Redis equal to Postgres, no frame started
// twice. (Unreachable RQDs are lab/e2e TestEndToEndUnreachableHosts.)
func TestBadRQDGarbage(t *testing.T) {
	t.Parallel()
	var broken []string
	e := newEnv(t, envOpts{StrictRecords: true, Setup: func(e *env) {
		// One host of each kind stays healthy (the farm puts one of each
		// kind first); of the rest, every third answers garbage and one
		// refuses launches.
		for i, h := range e.farm.HostNames {
			switch {
			case i < 4:
			case i%3 == 0:
				e.fake.SetHost(h, fakerqdGarbage())
				broken = append(broken, h)
			case i == 5:
				e.fake.SetHost(h, fakerqdRefuse())
				broken = append(broken, h)
			}
		}
	}})
	e.note("broken RQDs: %v", broken)
	e.run()
	e.finish(90 * time.Second)
	isBroken := map[string]bool{}
	for _, h := range broken {
		isBroken[h] = true
	}
	tried := 0
	for _, l := range e.fake.Launches() {
		if isBroken[l.Host] {
			tried++
			if l.Started {
				t.Errorf("a frame started on broken host %s", l.Host)
			}
		}
	}
	if tried == 0 {
		t.Fatal("no launch reached a broken RQD: the test exercised nothing")
	}
	m, err := e.schedulers[0].metrics(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	failures := sum(m, "scheduler_rqd_launch_failures_total")
	comps := sum(m, "scheduler_dispatch_compensations_total", `result="restored"`)
	if failures == 0 || comps == 0 {
		t.Errorf("after %d failed launches: scheduler_rqd_launch_failures_total = %v, scheduler_dispatch_compensations_total{result=\"restored\"} = %v",
			tried, failures, comps)
	}
	if errs := sum(m, "scheduler_dispatch_compensations_total", `result="error"`); errs > 0 {
		t.Errorf("%v compensations failed", errs)
	}
	e.note("%d launches on broken RQDs; scheduler counted %v launch failures, %v compensations", tried, failures, comps)
}

// TestBadWALUnexpectedRelations: a table cuesched does not know is added to
// all three of its publications and written (INSERT, UPDATE, DELETE,
// TRUNCATE) all through a run. The sidecar and the host cache ignore it and
// keep streaming without a reconnect: the queue drains, no booking is lost
// at any instant (strict record sampling), Redis ends equal to Postgres.
// (A new column on a known table: shared/replication
// TestTruncateAndAddColumnKeepStreaming. Tables named like ours in another
// schema: TestBadWALLookAlikeRelations.)
func TestBadWALUnexpectedRelations(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{StrictRecords: true, Setup: func(e *env) {
		for _, sql := range []string{
			`CREATE TABLE cuesched_faults_extra (id bigserial PRIMARY KEY, payload text, n int)`,
			`ALTER PUBLICATION cuesched_hostcache ADD TABLE cuesched_faults_extra`,
			`ALTER PUBLICATION cuesched_accounting ADD TABLE cuesched_faults_extra`,
			`ALTER PUBLICATION cuesched_proc ADD TABLE cuesched_faults_extra`,
		} {
			if _, err := e.pool.Exec(e.ctx, sql); err != nil {
				e.t.Fatalf("%s: %v", sql, err)
			}
		}
	}})
	w := e.poison([]string{
		`INSERT INTO cuesched_faults_extra (payload, n) SELECT md5(random()::text), g FROM generate_series(1, 5) g`,
		`UPDATE cuesched_faults_extra SET n = n + 1 WHERE id % 3 = 0`,
		`DELETE FROM cuesched_faults_extra WHERE id % 7 = 0`,
		`TRUNCATE cuesched_faults_extra`,
	})
	e.run()
	e.waitDrained(60 * time.Second)
	w.halt(t)
	e.finish(10 * time.Second)
	e.noStreamRestarts()
}

// TestBadWALLookAlikeRelations: tables named like cuesched's in another
// schema (shadow.proc, shadow.show, shadow.subscription, shadow.host) are
// added to its publications and written with poisoned copies of the real
// rows. Were a relation identified by its table name alone, they would be
// applied as Cuebot's:
//
//   - shadow.proc DELETEs (cuesched_proc) would release the bookings of
//     procs that are still running: lost bookings, Redis below SUM(proc);
//   - shadow.show UPDATEs (cuesched_accounting) would flip the managed set
//     the sidecar derives from the stream: it would stop releasing;
//   - shadow.subscription UPDATEs (cuesched_accounting) would write their
//     bursts to Redis as cap changes;
//   - shadow.host UPDATEs (cuesched_hostcache) would overwrite the cached
//     hosts: all locked and full, nothing dispatched.
//
// The sidecar and the host cache accept a relation only in the schema
// Cuebot's table resolves to on their search_path (shared/replication
// ResolveTables), so the farm drains, nothing is lost and Redis ends equal
// to Postgres. The default part runs the proc (sidecar) and host (host
// cache) cases; the full suite all four (the sidecar and host cache unit
// tests cover every table).
func TestBadWALLookAlikeRelations(t *testing.T) {
	t.Parallel()
	cases := []struct {
		table, publication, poison string
	}{
		{"proc", "cuesched_proc", `DELETE FROM shadow.proc; INSERT INTO shadow.proc SELECT * FROM public.proc`},
		{"host", "cuesched_hostcache", `UPDATE shadow.host SET int_cores_idle = 0, int_mem_idle = 0, str_lock_state = 'LOCKED'`},
	}
	if fullMode() {
		cases = append(cases, []struct{ table, publication, poison string }{
			{"show", "cuesched_accounting", `UPDATE shadow.show SET b_scheduler_managed = NOT b_scheduler_managed`},
			{"subscription", "cuesched_accounting", `UPDATE shadow.subscription SET int_burst = 100 + (random() * 100)::int`},
		}...)
	}
	for _, tc := range cases {
		t.Run("shadow."+tc.table, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, envOpts{StrictRecords: true, Setup: func(e *env) {
				for _, sql := range []string{
					`CREATE SCHEMA shadow`,
					fmt.Sprintf(`CREATE TABLE shadow.%[1]s (LIKE public.%[1]s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)`, tc.table),
					fmt.Sprintf(`ALTER TABLE shadow.%s REPLICA IDENTITY FULL`, tc.table),
					fmt.Sprintf(`ALTER PUBLICATION %s ADD TABLE shadow.%s`, tc.publication, tc.table),
					fmt.Sprintf(`INSERT INTO shadow.%[1]s SELECT * FROM public.%[1]s`, tc.table),
				} {
					if _, err := e.pool.Exec(e.ctx, sql); err != nil {
						e.t.Fatalf("%s: %v", sql, err)
					}
				}
			}})
			w := e.poison([]string{tc.poison})
			e.run()
			e.waitDrained(30 * time.Second)
			w.halt(t)
			e.finish(10 * time.Second)
		})
	}
}

// poisoner runs SQL statements in a loop (round robin, every 15 ms).
type poisoner struct {
	stop   chan struct{}
	done   chan struct{}
	writes atomic.Int64
}

func (e *env) poison(stmts []string) *poisoner {
	p := &poisoner{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-time.After(15 * time.Millisecond):
			}
			if _, err := e.pool.Exec(e.ctx, stmts[i%len(stmts)]); err == nil {
				p.writes.Add(1)
			} else if e.ctx.Err() == nil {
				e.note("poison write failed: %v", err)
			}
		}
	}()
	return p
}

func (p *poisoner) halt(t *testing.T) {
	t.Helper()
	// At least minPoisonWrites, however fast the run drained (counts, not
	// seconds), within a patient deadline.
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for p.writes.Load() < minPoisonWrites && time.Now().Before(deadline) {
		time.Sleep(15 * time.Millisecond)
	}
	close(p.stop)
	<-p.done
	if n := p.writes.Load(); n < minPoisonWrites {
		t.Errorf("only %d writes to the unknown relations: the test exercised little", n)
	}
}

const minPoisonWrites = 50

// noStreamRestarts fails the test if a process had to restart a
// replication stream (what ignoring a relation must not need).
func (e *env) noStreamRestarts() {
	for _, d := range append(append([]*daemon(nil), e.schedulers...), e.sidecars...) {
		if n := grepCount(d.logText(), "session ended; reconnecting"); n > 0 {
			e.t.Errorf("%s restarted its replication stream %d times", d.name, n)
		}
	}
}

// TestBadShowFlipMidRun: shows are flipped with `cuesched show set-managed`
// (the real command, preflight and seeding wait included) while their jobs
// run: a managed show goes back to Cuebot and returns, and the Cuebot show
// is handed to the scheduler. Nothing of a show is dispatched while it is
// Cuebot's; no cap is exceeded and no booking is lost at any instant; every
// frame of the shows managed at the end runs exactly once; Redis ends equal
// to Postgres, except the records of procs that finished while their show
// was Cuebot's (no release is due then), which the recompute drops after
// the in-flight grace.
func TestBadShowFlipMidRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{StrictRecords: true, UnmanagedTouched: true})
	e.run()
	shows := map[string]string{}
	for _, sh := range e.farm.Shows {
		shows[sh.Name] = sh.ID
	}
	e.waitProgress(0.15, 60*time.Second)

	e.setManaged("aurora", false, 0)
	off := time.Now()
	e.mu.Lock()
	e.unmanagedWindows[shows["aurora"]] = [][2]time.Time{{off, {}}}
	e.wasManaged[shows["aurora"]] = true
	e.mu.Unlock()
	time.Sleep(1500 * time.Millisecond)
	// Flips to the scheduler take effect after the leader's flip settle
	// (10 s): do not wait for them here, the drain does.
	e.setManaged("delta", true, 0)
	time.Sleep(500 * time.Millisecond)
	on := time.Now()
	e.setManaged("aurora", true, 0)
	e.mu.Lock()
	e.unmanagedWindows[shows["aurora"]][0][1] = on
	e.mu.Unlock()

	// While aurora was Cuebot's, nothing of it started (a claim commits
	// only while the show is managed; allow for a launch in flight).
	var auroraJobs = map[string]bool{}
	rows, err := e.pool.Query(e.ctx, `SELECT pk_job FROM job WHERE pk_show = $1`, shows["aurora"])
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		auroraJobs[id] = true
	}
	rows.Close()
	for _, l := range e.fake.Launches() {
		if l.RunFrame != nil && auroraJobs[l.RunFrame.GetJobId()] && l.At.After(off.Add(500*time.Millisecond)) && l.At.Before(on) {
			t.Errorf("frame %s of aurora launched at %s while the show was Cuebot's (flipped off at %s)",
				l.RunFrame.GetFrameName(), l.At.Format("15:04:05.000"), off.Format("15:04:05.000"))
		}
	}
	// Every show is managed now: the queue is all four.
	var managedFrames int64
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM frame f JOIN job j ON j.pk_job = f.pk_job
		JOIN show s ON s.pk_show = j.pk_show WHERE s.b_scheduler_managed`).Scan(&managedFrames); err != nil {
		t.Fatal(err)
	}
	e.managed.Store(managedFrames)
	e.finish(90 * time.Second)
}

// setManaged runs `cuesched show set-managed <show> on|off --wait wait`.
func (e *env) setManaged(show string, on bool, wait time.Duration) {
	e.t.Helper()
	state := "off"
	if on {
		state = "on"
	}
	ctx, cancel := context.WithTimeout(e.ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.bin, "show", "set-managed", show, state, "--wait", wait.String(),
		"--database-url", e.dbURL, "--redis-url", e.redisURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("cuesched show set-managed %s %s: %v\n%s", show, state, err, out)
	}
	e.note("cuesched show set-managed %s %s: %s", show, state, strings.TrimSpace(lastLine(string(out))))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
