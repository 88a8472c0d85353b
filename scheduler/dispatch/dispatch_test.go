package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cuesched/cuesched/proto/rqdpb"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/rqdclient"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type harness struct {
	t        *testing.T
	pool     *pgxpool.Pool
	seed     *farmseed.Seeder
	rdb      redis.UniversalClient
	pub      *publisher.Publisher
	fake     *fakerqd.Server
	d        *dispatch.Dispatcher
	facility string
	alloc    string
	show     farmseed.Show
	nhost    int
	dsn      string
}

func newHarness(t *testing.T, mod func(*dispatch.Config)) *harness {
	t.Helper()
	ctx := context.Background()
	dsn := cuebotdb.Database(t)
	pool, err := pgxpool.New(ctx, dsn)
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
	rqd := rqdclient.New(rqdclient.Options{Resolve: fake.Resolve, RequestTimeout: 5 * time.Second})
	t.Cleanup(func() { rqd.Close() })
	cfg := dispatch.Config{Policy: sizing.Policy{CoreUnit: 100, MinMemKB: 262144, StrandedMemKB: 2 * farmseed.GB}, SoftLimit: 1.6, HardLimit: 2}
	if mod != nil {
		mod(&cfg)
	}
	h := &harness{t: t, pool: pool, seed: &farmseed.Seeder{DB: pool}, rdb: rdb, pub: pub, fake: fake,
		d: dispatch.New(pool, pub, rqd, cfg, dispatch.Options{Registerer: prometheus.NewRegistry()}), dsn: dsn}
	h.facility = h.must(h.seed.Facility(ctx, "f1"))
	h.show = must2(h.seed.Show(ctx, "show", true))(t)
	h.alloc = h.must(h.seed.Alloc(ctx, h.facility, "f1.general", "general"))
	h.must(h.seed.Subscribe(ctx, h.show, h.alloc, 1000, 1000))
	return h
}

func (h *harness) must(s string, err error) string {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func must2[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	if _, err := h.pool.Exec(context.Background(), sql, args...); err != nil {
		h.t.Fatal(err)
	}
}

// host inserts a host and returns it as the host cache would hand it out.
func (h *harness) host(spec farmseed.HostSpec) sizing.Host {
	h.t.Helper()
	h.nhost++
	if spec.Name == "" {
		spec.Name = "host" + strconv.Itoa(h.nhost)
	}
	spec.Alloc, spec.AllocTag = h.alloc, "general"
	id := h.must(h.seed.Host(context.Background(), spec))
	return h.load(id)
}

func (h *harness) load(id string) sizing.Host {
	h.t.Helper()
	var d sizing.Host
	var mode int64
	err := h.pool.QueryRow(context.Background(), `SELECT h.pk_host, h.str_name, h.pk_alloc, hs.str_os, h.int_cores, h.int_cores_idle,
		hs.int_mem_total, LEAST(h.int_mem_idle, hs.int_mem_free), h.int_gpus_idle, h.int_gpu_mem_idle, h.int_thread_mode
		FROM host h JOIN host_stat hs ON hs.pk_host = h.pk_host WHERE h.pk_host = $1`, id).Scan(
		&d.ID, &d.Name, &d.AllocID, &d.OS, &d.TotalCores, &d.IdleCores, &d.TotalMemKB, &d.IdleMemKB, &d.IdleGPUs, &d.IdleGPUMemKB, &mode)
	if err != nil {
		h.t.Fatal(err)
	}
	d.ThreadMode = int(mode)
	return d
}

func (h *harness) job(js farmseed.JobSpec) farmseed.Job {
	h.t.Helper()
	js.Show, js.Facility = h.show, h.facility
	if js.Name == "" {
		js.Name = fmt.Sprintf("job%d", time.Now().UnixNano())
	}
	for i := range js.Layers {
		if js.Layers[i].Tags == nil {
			js.Layers[i].Tags = []string{"general"}
		}
	}
	j := must2(h.seed.Job(context.Background(), js))(h.t)
	if err := farmseed.SeedAccounting(context.Background(), h.pool, h.pub, h.show.ID); err != nil {
		h.t.Fatal(err)
	}
	return j
}

func (h *harness) layers(j farmseed.Job) []*jobs.Layer {
	h.t.Helper()
	ls, err := jobs.Layers(context.Background(), h.pool, jobs.LayerQuery{JobID: j.ID, Tags: []string{"general"}, FramesPerLayer: 50})
	if err != nil {
		h.t.Fatal(err)
	}
	return ls
}

func (h *harness) redisInt(key, field string) int64 {
	h.t.Helper()
	v, err := h.rdb.HGet(context.Background(), key, field).Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return v
}

func (h *harness) count(sql string, args ...any) int64 {
	h.t.Helper()
	var n int64
	if err := h.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// checkBooked asserts Postgres and Redis agree the show holds want cores
// (whole cores) of procs on the harness allocation.
func (h *harness) checkBooked(want int64) {
	h.t.Helper()
	pg := h.count(`SELECT COALESCE(SUM(int_cores_reserved), 0) FROM proc WHERE pk_show = $1`, h.show.ID)
	if pg != want*100 {
		h.t.Fatalf("SUM(proc) = %d centicores, want %d", pg, want*100)
	}
	if got := h.redisInt(publisher.SubKey(h.show.ID, h.alloc), "int_cores"); got != want {
		h.t.Fatalf("Redis subscription int_cores = %d, want %d", got, want)
	}
}

func TestDispatchBooksAndLaunches(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 8, MemKB: 32 * farmseed.GB, OS: "rocky9"})
	uid := 4242
	j := h.job(farmseed.JobSpec{UID: uid, Layers: []farmseed.LayerSpec{{Name: "render", Frames: 4, NotThreadable: true, MemKB: 2 * farmseed.GB,
		Command: "render -f #IFRAME# -l #LAYER#", Env: map[string]string{"FOO": "bar"}}}})
	l := h.layers(j)[0]

	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if res.Err != nil || res.Stop != dispatch.Done || len(res.Dispatched) != 4 || res.CoresBooked != 400 {
		t.Fatalf("result = %+v", res)
	}
	if res.Host.IdleCores != 400 || res.Host.IdleMemKB != 24*farmseed.GB {
		t.Fatalf("host after = %+v", res.Host)
	}
	// Postgres: frames RUNNING on the host, version bumped, procs, host.
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'RUNNING' AND str_host = $2
		AND int_version = 1 AND int_cores = 100 AND int_mem_reserved = $3 AND int_retries = 0`, l.ID, host.Name, 2*farmseed.GB); n != 4 {
		t.Fatalf("%d frames running as booked, want 4", n)
	}
	if n := h.count(`SELECT count(*) FROM proc WHERE pk_layer = $1 AND pk_host = $2 AND pk_job = $3 AND pk_show = $4
		AND int_cores_reserved = 100 AND int_mem_reserved = $5 AND int_mem_pre_reserved = $5 AND int_mem_used = 262144 AND NOT b_local`,
		l.ID, host.ID, j.ID, h.show.ID, 2*farmseed.GB); n != 4 {
		t.Fatalf("%d procs as booked, want 4", n)
	}
	if n := h.count(`SELECT int_cores_idle FROM host WHERE pk_host = $1`, host.ID); n != 400 {
		t.Fatalf("host idle cores = %d", n)
	}
	if n := h.count(`SELECT int_running_count FROM job_stat WHERE pk_job = $1`, j.ID); n != 4 {
		t.Fatalf("job_stat running = %d", n)
	}
	// Accounting tables are not touched for a managed show.
	if n := h.count(`SELECT int_cores FROM subscription WHERE pk_show = $1`, h.show.ID); n != 0 {
		t.Fatalf("subscription.int_cores = %d, the dispatcher must leave it to the recompute", n)
	}
	h.checkBooked(4)
	if got := h.redisInt(publisher.JobKey(j.ID), "int_cores"); got != 4 {
		t.Fatalf("Redis job int_cores = %d", got)
	}

	// RQD got exactly these frames, with the right request.
	ls := h.fake.Launches()
	if len(ls) != 4 {
		t.Fatalf("%d launches", len(ls))
	}
	procs := map[string]bool{}
	rows, _ := h.pool.Query(context.Background(), `SELECT pk_proc FROM proc WHERE pk_layer = $1`, l.ID)
	for rows.Next() {
		var p string
		_ = rows.Scan(&p)
		procs[p] = true
	}
	rows.Close()
	for _, launch := range ls {
		rf := launch.RunFrame
		if launch.Host != host.Name || !launch.Started || !procs[rf.ResourceId] {
			t.Fatalf("launch %+v", launch)
		}
		if rf.NumCores != 100 || rf.GetUid() != int32(uid) || rf.Os != "" /* the job has no OS: Cuebot sends "", not the host's */ || rf.SoftMemoryLimit != 2*farmseed.GB*16/10 ||
			rf.HardMemoryLimit != 4*farmseed.GB || rf.Environment["FOO"] != "bar" || rf.Environment["CUE_THREADABLE"] != "0" {
			t.Fatalf("run frame %v", rf)
		}
		want := "render -f " + rf.Environment["CUE_IFRAME"] + " -l render"
		if rf.Command != want {
			t.Fatalf("command %q, want %q", rf.Command, want)
		}
	}
}

func TestDispatchStopsWhenHostIsFull(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 16, MemKB: 32 * farmseed.GB})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 6, NotThreadable: true, MemKB: 10 * farmseed.GB}}})
	l := h.layers(j)[0]
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if res.Stop != dispatch.HostFull || len(res.Dispatched) != 3 {
		t.Fatalf("result = %+v", res)
	}
	h.checkBooked(3)
	// The cache's copy says 2 GB idle now; the same host cannot take more.
	res2 := h.d.Dispatch(context.Background(), l, l.Frames[3:], res.Host)
	if res2.Stop != dispatch.HostFull || len(res2.Dispatched) != 0 {
		t.Fatalf("second batch = %+v", res2)
	}
}

func TestDispatchRedisCapStops(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 32})
	folder := h.must(h.seed.Folder(context.Background(), h.show, "capped", 3, -1))
	j := h.job(farmseed.JobSpec{Folder: folder, Layers: []farmseed.LayerSpec{{Frames: 6, NotThreadable: true}}})
	l := h.layers(j)[0]
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if res.Stop != dispatch.Capped || res.Limit == nil || res.Limit.Table != publisher.TableFolder || len(res.Dispatched) != 3 {
		t.Fatalf("result = %+v", res)
	}
	h.checkBooked(3)
	if got := h.redisInt(publisher.FolderKey(folder), "int_cores"); got != 3 {
		t.Fatalf("Redis folder int_cores = %d", got)
	}
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'WAITING'`, l.ID); n != 3 {
		t.Fatalf("%d frames still waiting, want 3", n)
	}
}

func TestDispatchJobBudgetClampsThreadable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 16, ThreadMode: sizing.All})
	j := h.job(farmseed.JobSpec{MaxCores: 5, Layers: []farmseed.LayerSpec{{Frames: 3}}})
	l := h.layers(j)[0]
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	// Thread mode ALL would take all 16 cores; the job has 5.
	if res.Stop != dispatch.JobAtCap || len(res.Dispatched) != 1 || res.CoresBooked != 500 {
		t.Fatalf("result = %+v", res)
	}
	h.checkBooked(5)
}

func TestDispatchLimitRecord(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 32})
	lim := h.must(h.seed.Limit(context.Background(), "licence", 3))
	a := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 5, NotThreadable: true, Limits: []string{lim}}}})
	b := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 5, NotThreadable: true, Limits: []string{lim}}}})
	la, lb := h.layers(a)[0], h.layers(b)[0]
	res := h.d.Dispatch(context.Background(), la, la.Frames, host)
	if res.Stop != dispatch.LimitReached || len(res.Dispatched) != 3 {
		t.Fatalf("result = %+v", res)
	}
	res = h.d.Dispatch(context.Background(), lb, lb.Frames, res.Host)
	if res.Stop != dispatch.LimitReached || len(res.Dispatched) != 0 {
		t.Fatalf("second layer on the same limit = %+v", res)
	}
	h.checkBooked(3)
	// A frame finishing frees a slot.
	h.exec(`UPDATE frame SET str_state = 'SUCCEEDED' WHERE pk_frame = (SELECT pk_frame FROM proc WHERE pk_layer = $1 LIMIT 1)`, la.ID)
	res = h.d.Dispatch(context.Background(), lb, lb.Frames, h.load(host.ID))
	if len(res.Dispatched) != 1 {
		t.Fatalf("after a frame finished = %+v", res)
	}
}

// A limit attached to a layer after the pending query read the layer (so
// the caller neither locked nor passed it) is still honoured: the claim
// reads the layer's limits itself and starts nothing past one it did not
// lock; the next read of the layer carries it and books up to it.
func TestDispatchLimitAttachedAfterTheRead(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 32})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 6, NotThreadable: true}}})
	l := h.layers(j)[0]
	if len(l.LimitIDs) != 0 {
		t.Fatalf("layer read with limits %v", l.LimitIDs)
	}
	lim := h.must(h.seed.Limit(context.Background(), "late", 2))
	h.exec(`INSERT INTO layer_limit (pk_layer_limit, pk_layer, pk_limit_record) VALUES (gen_random_uuid()::text, $1, $2)`, l.ID, lim)
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if res.Stop != dispatch.LimitReached || len(res.Dispatched) != 0 {
		t.Fatalf("stale layer (no limits read) = %+v, want nothing started and limit_reached", res)
	}
	h.checkBooked(0)
	l = h.layers(j)[0]
	res = h.d.Dispatch(context.Background(), l, l.Frames, h.load(host.ID))
	if res.Stop != dispatch.LimitReached || len(res.Dispatched) != 2 {
		t.Fatalf("fresh layer = %+v, want 2 started", res)
	}
	h.checkBooked(2)
}

// A frame whose last run ended with a licence-denial exit status of its
// layer's limit is relaunched without counting a retry; any other failure
// counts one. A frame Cuebot marked DEAD for a denial is put back to
// WAITING; one DEAD of a real failure stays DEAD.
func TestDispatchLicenceDenialsDoNotCountRetries(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	ctx := context.Background()
	lim := h.must(h.seed.Limit(ctx, "licence", 10))
	if err := h.seed.LimitDenials(ctx, lim, 42, 43); err != nil {
		t.Fatal(err)
	}
	j := h.job(farmseed.JobSpec{MaxRetries: 1, Layers: []farmseed.LayerSpec{{Frames: 2, NotThreadable: true, Limits: []string{lim}}}})
	// ends stops every running frame of the job as Cuebot's completion does
	// (state, exit status, version) and releases its proc.
	ends := func(state string, exit int) {
		t.Helper()
		h.exec(`UPDATE frame SET str_state = $2, int_exit_status = $3, int_version = int_version + 1 WHERE pk_job = $1 AND str_state = 'RUNNING'`, j.ID, state, exit)
		h.exec(`DELETE FROM proc WHERE pk_job = $1`, j.ID)
	}
	// book starts the waiting frames on a fresh host (the fake RQD still
	// runs the frames the test "stopped" on the previous ones).
	book := func() {
		t.Helper()
		l := h.layers(j)[0]
		if res := h.d.Dispatch(ctx, l, l.Frames, h.host(farmseed.HostSpec{Cores: 32})); len(res.Dispatched) != len(l.Frames) || len(l.Frames) == 0 {
			t.Fatalf("dispatch = %+v", res)
		}
	}
	retries := func() int64 {
		return h.count(`SELECT max(int_retries) FROM frame WHERE pk_job = $1`, j.ID)
	}
	book()
	for i := 0; i < 3; i++ {
		ends("WAITING", 42+i%2)
		book()
		if r := retries(); r != 0 {
			t.Fatalf("after %d denials int_retries = %d, want 0", i+1, r)
		}
	}
	ends("WAITING", 1)
	book()
	if r := retries(); r != 1 {
		t.Fatalf("after a real failure int_retries = %d, want 1", r)
	}
	// Retries spent: Cuebot marks a denial DEAD; the reviver puts it back.
	ends("DEAD", 42)
	if n, err := dispatch.ReviveDenied(ctx, h.pool); err != nil || n != 2 {
		t.Fatalf("ReviveDenied = %d, %v; want 2", n, err)
	}
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_job = $1 AND str_state = 'WAITING'`, j.ID); n != 2 {
		t.Fatalf("%d frames WAITING after the revival, want 2", n)
	}
	book()
	ends("DEAD", 1)
	if n, err := dispatch.ReviveDenied(ctx, h.pool); err != nil || n != 0 {
		t.Fatalf("ReviveDenied after a real failure = %d, %v; want 0", n, err)
	}
}

func TestDispatchLostRacesAndGuards(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 32})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 4, NotThreadable: true}}})
	l := h.layers(j)[0]
	// Frame 0 was re-versioned (retried elsewhere), frame 1 is running.
	h.exec(`UPDATE frame SET int_version = 7 WHERE pk_frame = $1`, l.Frames[0].ID)
	h.exec(`UPDATE frame SET str_state = 'DEAD' WHERE pk_frame = $1`, l.Frames[1].ID)
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	sort.Strings(res.Claimed)
	want := []string{l.Frames[0].ID, l.Frames[1].ID}
	sort.Strings(want)
	if len(res.Dispatched) != 2 || fmt.Sprint(res.Claimed) != fmt.Sprint(want) {
		t.Fatalf("result = %+v", res)
	}
	h.checkBooked(2)

	// A show that stopped being managed is never booked.
	j2 := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 2, NotThreadable: true}}})
	l2 := h.layers(j2)[0]
	h.exec(`UPDATE show SET b_scheduler_managed = false WHERE pk_show = $1`, h.show.ID)
	res = h.d.Dispatch(context.Background(), l2, l2.Frames, res.Host)
	if len(res.Dispatched) != 0 || len(res.Claimed) != 2 {
		t.Fatalf("unmanaged show = %+v", res)
	}
	h.checkBooked(2)
	h.exec(`UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, h.show.ID)

	// A layer deferred after it was read is not started.
	h.exec(`UPDATE layer SET ts_start_after = now() + interval '1 hour' WHERE pk_layer = $1`, l2.ID)
	res = h.d.Dispatch(context.Background(), l2, l2.Frames, h.load(host.ID))
	if len(res.Dispatched) != 0 {
		t.Fatalf("deferred layer = %+v", res)
	}
	h.checkBooked(2)
}

func TestDispatchHostStale(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 8})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 4, NotThreadable: true}}})
	l := h.layers(j)[0]
	// Someone else booked the host meanwhile; the cached copy is stale.
	h.exec(`UPDATE host SET int_cores_idle = 200 WHERE pk_host = $1`, host.ID)
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if res.Stop != dispatch.HostStale || len(res.Dispatched) != 0 {
		t.Fatalf("result = %+v", res)
	}
	h.checkBooked(0)
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'WAITING' AND int_version = 0`, l.ID); n != 4 {
		t.Fatalf("%d frames untouched, want 4", n)
	}
	if procs, _ := h.pub.ShowProcs(context.Background(), h.show.ID); len(procs) != 0 {
		t.Fatalf("Redis still holds booking records %v", procs)
	}
}

func TestDispatchLaunchFailureCompensatesOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 8, MemKB: 16 * farmseed.GB})
	h.fake.SetHost(host.Name, fakerqd.Behavior{Mode: fakerqd.Unreachable})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 3, NotThreadable: true}}})
	l := h.layers(j)[0]
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if len(res.Dispatched) != 0 || len(res.LaunchFailed) != 3 {
		t.Fatalf("result = %+v", res)
	}
	if res.Host.IdleCores != host.IdleCores || res.Host.IdleMemKB != host.IdleMemKB {
		t.Fatalf("host after compensation = %+v, want %+v", res.Host, host)
	}
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'WAITING' AND int_exit_status = 299 AND int_version = 2`, l.ID); n != 3 {
		t.Fatalf("%d frames back to WAITING, want 3", n)
	}
	if n := h.count(`SELECT int_cores_idle FROM host WHERE pk_host = $1`, host.ID); n != 800 {
		t.Fatalf("host idle = %d, want 800", n)
	}
	if n := h.count(`SELECT int_waiting_count FROM job_stat WHERE pk_job = $1`, j.ID); n != 3 {
		t.Fatalf("job_stat waiting = %d", n)
	}
	h.checkBooked(0)

	// The frames can be dispatched again (fresh versions) once RQD is back.
	h.fake.ClearHost(host.Name)
	l = h.layers(j)[0]
	res = h.d.Dispatch(context.Background(), l, l.Frames, h.load(host.ID))
	if len(res.Dispatched) != 3 {
		t.Fatalf("redispatch = %+v", res)
	}
	h.checkBooked(3)
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND int_retries = 0`, l.ID); n != 3 {
		t.Fatalf("a failed launch must not count as a retry: %d frames with 0 retries", n)
	}
}

func TestDispatchDryRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *dispatch.Config) { c.DryRun = true })
	host := h.host(farmseed.HostSpec{Cores: 8})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 2, NotThreadable: true}}})
	l := h.layers(j)[0]
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if len(res.Dispatched) != 2 || len(h.fake.Launches()) != 0 {
		t.Fatalf("dry run = %+v, launches %d", res, len(h.fake.Launches()))
	}
	h.checkBooked(2)
}

// Many dispatchers race for the same frames on different hosts: every frame
// runs exactly once and the books balance.
func TestDispatchConcurrentClaims(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	const hosts, frames = 8, 40
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: frames, NotThreadable: true}}})
	var hs []sizing.Host
	for i := 0; i < hosts; i++ {
		hs = append(hs, h.host(farmseed.HostSpec{Cores: 64}))
	}
	l := h.layers(j)[0]
	var wg sync.WaitGroup
	results := make([]dispatch.Result, hosts)
	for i := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cp := *l
			results[i] = h.d.Dispatch(context.Background(), &cp, l.Frames, hs[i])
		}()
	}
	wg.Wait()
	seen := map[string]int{}
	for _, r := range results {
		if r.Err != nil {
			t.Fatalf("dispatch error: %v", r.Err)
		}
		for _, f := range r.Dispatched {
			seen[f]++
		}
	}
	if len(seen) != frames {
		t.Fatalf("%d distinct frames dispatched, want %d", len(seen), frames)
	}
	for f, n := range seen {
		if n != 1 {
			t.Fatalf("frame %s dispatched %d times", f, n)
		}
	}
	if d := h.fake.DoubleLaunches(); len(d) != 0 {
		t.Fatalf("double launches: %v", d)
	}
	h.checkBooked(frames)
	if n := h.count(`SELECT count(*) FROM host WHERE int_cores_idle < 0 OR int_cores - int_cores_idle <> (SELECT COALESCE(SUM(int_cores_reserved), 0) FROM proc WHERE proc.pk_host = host.pk_host)`); n != 0 {
		t.Fatalf("%d hosts whose idle does not match their procs", n)
	}
}

// pauseOnBook is the accounting with a hook: after the first bookings it
// runs stop (pauses or kills the job), so the claim transaction is the
// first thing to see the change: "after the pending query, after the Redis
// booking, before the claim", forced rather than timed.
type pauseOnBook struct {
	dispatch.Accounting
	once sync.Once
	stop func()
}

func (p *pauseOnBook) BookAll(ctx context.Context, bs []publisher.Booking) ([]publisher.Result, []error) {
	r, errs := p.Accounting.BookAll(ctx, bs)
	p.once.Do(p.stop)
	return r, errs
}

// A job paused or killed between the pending query and the claim starts
// nothing: no frame leaves WAITING, no proc, the host keeps its idle
// values, RQD is not called, the Redis bookings are rolled back, and the
// batch reports JobStopped (not frames claimed elsewhere).
func TestDispatchJobPausedOrKilledBeforeTheClaim(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 16, MemKB: 32 * farmseed.GB})
	rqd := rqdclient.New(rqdclient.Options{Resolve: h.fake.Resolve, RequestTimeout: 5 * time.Second})
	t.Cleanup(func() { rqd.Close() })
	cfg := dispatch.Config{Policy: sizing.Policy{CoreUnit: 100, MinMemKB: 262144, StrandedMemKB: 2 * farmseed.GB}, SoftLimit: 1.6, HardLimit: 2}

	nothingStarted := func(what string, j farmseed.Job, l *jobs.Layer, res dispatch.Result) {
		t.Helper()
		if res.Stop != dispatch.JobStopped || res.Err != nil || len(res.Dispatched) != 0 || len(res.Claimed) != 0 ||
			len(res.LaunchFailed) != 0 || res.CoresBooked != 0 {
			t.Fatalf("%s: result = %+v, want JobStopped with nothing started or claimed", what, res)
		}
		if res.Host != host {
			t.Fatalf("%s: host after = %+v, want the host as given %+v", what, res.Host, host)
		}
		if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'WAITING' AND int_version = 0 AND str_host IS NULL`, l.ID); n != int64(len(l.Frames)) {
			t.Fatalf("%s: %d frames untouched, want %d", what, n, len(l.Frames))
		}
		if n := h.count(`SELECT count(*) FROM proc WHERE pk_job = $1`, j.ID); n != 0 {
			t.Fatalf("%s: %d procs", what, n)
		}
		if n := h.count(`SELECT int_cores_idle FROM host WHERE pk_host = $1`, host.ID); n != 1600 {
			t.Fatalf("%s: host idle = %d, want 1600", what, n)
		}
		if n := h.count(`SELECT int_running_count FROM job_stat WHERE pk_job = $1`, j.ID); n != 0 {
			t.Fatalf("%s: job_stat running = %d", what, n)
		}
		h.checkBooked(0)
		if got := h.redisInt(publisher.JobKey(j.ID), "int_cores"); got != 0 {
			t.Fatalf("%s: Redis job int_cores = %d, the booking was not rolled back", what, got)
		}
		if procs, _ := h.pub.ShowProcs(context.Background(), h.show.ID); len(procs) != 0 {
			t.Fatalf("%s: Redis still holds booking records %v", what, procs)
		}
		if ls := h.fake.Launches(); len(ls) != 0 {
			t.Fatalf("%s: %d launches", what, len(ls))
		}
	}

	// Killed (no longer PENDING) after the pending query read it.
	j2 := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 2, NotThreadable: true}}})
	l2 := h.layers(j2)[0]
	h.exec(`UPDATE job SET str_state = 'FINISHED' WHERE pk_job = $1`, j2.ID)
	nothingStarted("killed", j2, l2, h.d.Dispatch(context.Background(), l2, l2.Frames, host))

	// Paused after the Redis bookings, before the claim.
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 3, NotThreadable: true}}})
	l := h.layers(j)[0]
	acct := &pauseOnBook{Accounting: h.pub, stop: func() { h.exec(`UPDATE job SET b_paused = true WHERE pk_job = $1`, j.ID) }}
	d := dispatch.New(h.pool, acct, rqd, cfg, dispatch.Options{Registerer: prometheus.NewRegistry()})
	nothingStarted("paused", j, l, d.Dispatch(context.Background(), l, l.Frames, host))

	// Resumed: the same frames (the versions read before the pause) start.
	h.exec(`UPDATE job SET b_paused = false WHERE pk_job = $1`, j.ID)
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if res.Stop != dispatch.Done || len(res.Dispatched) != 3 || len(h.fake.Launches()) != 3 {
		t.Fatalf("after resuming: %+v", res)
	}
	h.checkBooked(3)
}

// blockingLauncher is an RQD that never answers a launch: LaunchFrame
// returns only when its deadline passes. Kills answer at once.
type blockingLauncher struct {
	mu       sync.Mutex
	launches int
	kills    []string
	killErr  error // what kills answer (nil: success)
}

func (b *blockingLauncher) LaunchFrame(ctx context.Context, host string, rf *rqdpb.RunFrame) error {
	b.mu.Lock()
	b.launches++
	b.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (b *blockingLauncher) KillRunningFrame(ctx context.Context, host, frameID, reason string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.kills = append(b.kills, frameID)
	return b.killErr
}

// RunningProcs: nothing runs (no launch got through).
func (b *blockingLauncher) RunningProcs(ctx context.Context, host string) (map[string]bool, error) {
	return map[string]bool{}, nil
}

// lostReply is an RQD whose launch replies are lost: each launch reaches
// the fake RQD (the frame starts) and the caller sees its deadline pass.
type lostReply struct {
	dispatch.Launcher
}

func (l lostReply) LaunchFrame(ctx context.Context, host string, rf *rqdpb.RunFrame) error {
	if err := l.Launcher.LaunchFrame(ctx, host, rf); err != nil {
		return err
	}
	return fmt.Errorf("launch frame %s on %s: %w", rf.GetFrameName(), host, status.Error(codes.DeadlineExceeded, "context deadline exceeded"))
}

// dispatchTwo dispatches a layer of two 8-core frames on a new 8-core host
// through rqd (launchTimeout 0: the default), with the compensation's
// whole budget.
func (h *harness) dispatchTwo(rqd dispatch.Launcher, launchTimeout time.Duration, reg prometheus.Registerer) (*jobs.Layer, sizing.Host, dispatch.Result) {
	d := dispatch.New(h.pool, h.pub, rqd, dispatch.Config{Policy: sizing.Policy{CoreUnit: 100, MinMemKB: 262144,
		StrandedMemKB: 2 * farmseed.GB}, SoftLimit: 1.6, HardLimit: 2,
		LaunchTimeout: launchTimeout, CompensateTimeout: testenv.Patience(20 * time.Second)},
		dispatch.Options{Registerer: reg})
	host := h.host(farmseed.HostSpec{Cores: 8, MemKB: 32 * farmseed.GB})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 2, NotThreadable: true, MemKB: 2 * farmseed.GB}}})
	l := h.layers(j)[0]
	return l, host, d.Dispatch(context.Background(), l, l.Frames, host)
}

// A launch whose reply is lost (its deadline passed in flight) but whose
// frame RQD runs is kept as launched: no compensation, no kill, the frame
// RUNNING with its proc and the fake running it once; the metric says so.
// A launch whose reply is lost and whose frame RQD does not run is
// compensated (TestLaunchUsingItsWholeBudgetIsCompensated).
func TestLaunchWithALostReplyIsKeptWhenRQDRunsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rqd := rqdclient.New(rqdclient.Options{Resolve: h.fake.Resolve, RequestTimeout: 5 * time.Second})
	t.Cleanup(func() { rqd.Close() })
	reg := prometheus.NewRegistry()
	l, _, res := h.dispatchTwo(lostReply{rqd}, 0, reg)
	if len(res.Dispatched) != 2 || len(res.LaunchFailed) != 0 {
		t.Fatalf("dispatched=%d launchFailed=%d, want 2 and 0 (%+v)", len(res.Dispatched), len(res.LaunchFailed), res)
	}
	if n := h.count(`SELECT count(*) FROM frame f JOIN proc p ON p.pk_frame = f.pk_frame WHERE f.pk_layer = $1 AND f.str_state = 'RUNNING'`, l.ID); n != 2 {
		t.Errorf("%d frames RUNNING with their procs, want 2", n)
	}
	if n := h.fake.RunningCount(); n != 2 {
		t.Errorf("fake RQD runs %d frames, want 2", n)
	}
	if c := h.fake.Completions(); len(c) != 0 {
		t.Errorf("completions %+v, want none (no kill)", c)
	}
	h.checkBooked(2)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "scheduler_rqd_launch_unknown_outcomes_total" {
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["running"] != 2 || got["not_running"] != 0 || got["no_answer"] != 0 {
		t.Errorf("unknown outcomes by result = %v, want running 2", got)
	}
}

// TestLaunchUsingItsWholeBudgetIsCompensated: launches that block until
// the launch deadline still have their bookings undone, because the
// compensation has its own deadline (it used to share the launch's and
// started with an expired context: dispatched=0 launchFailed=2 but the
// frames stayed RUNNING with their procs and booked cores).
func TestLaunchUsingItsWholeBudgetIsCompensated(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bl := &blockingLauncher{}
	l, host, res := h.dispatchTwo(bl, 300*time.Millisecond, prometheus.NewRegistry())
	if len(res.Dispatched) != 0 || len(res.LaunchFailed) != 2 {
		t.Fatalf("dispatched=%d launchFailed=%d, want 0 and 2 (%+v)", len(res.Dispatched), len(res.LaunchFailed), res)
	}
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'WAITING'`, l.ID); n != 2 {
		t.Errorf("%d frames WAITING after the compensation, want 2", n)
	}
	if n := h.count(`SELECT count(*) FROM proc WHERE pk_layer = $1`, l.ID); n != 0 {
		t.Errorf("%d procs left, want 0", n)
	}
	if n := h.count(`SELECT int_cores_idle FROM host WHERE pk_host = $1`, host.ID); n != 800 {
		t.Errorf("host idle cores = %d, want 800 (given back)", n)
	}
	if res.Host.IdleCores != 800 {
		t.Errorf("result host idle cores = %d, want 800", res.Host.IdleCores)
	}
	h.checkBooked(0)
	bl.mu.Lock()
	defer bl.mu.Unlock()
	if bl.launches != 2 || len(bl.kills) != 2 {
		t.Errorf("launches %d kills %d, want 2 and 2", bl.launches, len(bl.kills))
	}
}

// TestStallAfterCommitLaunchesNothingLate: a scheduler stalled between its
// commit and its launches (SIGSTOP, a paused VM) past the launch deadline,
// which is anchored before the commit, sends no LaunchFrame when it
// resumes: Cuebot's orphaned-proc check may have cleared the proc and the
// frame may already run again elsewhere. The booking is compensated. (The
// launch budget used to start after the commit returned, so a stalled
// process got a fresh one on waking: lab/faults TestFaultFreeze saw a
// frame started while its first run was still live.)
func TestStallAfterCommitLaunchesNothingLate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bl := &blockingLauncher{}
	// A booking budget the commit meets even on a loaded machine (it takes
	// milliseconds); the stall below is measured from the anchored
	// deadline, not guessed, and the test lasts about this long.
	book, launch := 5*time.Second, 200*time.Millisecond
	d := dispatch.New(h.pool, h.pub, bl, dispatch.Config{Policy: sizing.Policy{CoreUnit: 100, MinMemKB: 262144,
		StrandedMemKB: 2 * farmseed.GB}, SoftLimit: 1.6, HardLimit: 2,
		BookTimeout: book, LaunchTimeout: launch, CompensateTimeout: testenv.Patience(20 * time.Second)},
		dispatch.Options{Registerer: prometheus.NewRegistry()})
	var anchored time.Time
	dispatch.SetAfterCommit(d, func(launchBy time.Time) {
		anchored = launchBy
		time.Sleep(time.Until(launchBy) + 50*time.Millisecond) // resume past it
	})
	host := h.host(farmseed.HostSpec{Cores: 8, MemKB: 32 * farmseed.GB})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 2, NotThreadable: true, MemKB: 2 * farmseed.GB}}})
	l := h.layers(j)[0]

	start := time.Now()
	res := d.Dispatch(context.Background(), l, l.Frames, host)
	returned := time.Now()
	if len(res.Dispatched) != 0 || len(res.LaunchFailed) != 2 {
		t.Fatalf("dispatched=%d launchFailed=%d, want 0 and 2 (%+v)", len(res.Dispatched), len(res.LaunchFailed), res)
	}
	bl.mu.Lock()
	launches := bl.launches
	bl.mu.Unlock()
	if launches != 0 {
		t.Errorf("%d LaunchFrame calls after the stall, want none", launches)
	}
	// The deadline is the booking's own (set after start, before the
	// commit) plus the launch timeout, not a fresh budget from the resume.
	if base := anchored.Add(-book - launch); base.Before(start) || base.After(returned) {
		t.Errorf("launch deadline %s after the dispatch began, want BookTimeout + LaunchTimeout (%s) from a moment within the dispatch (%s)",
			anchored.Sub(start), book+launch, returned.Sub(start))
	}
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'WAITING'`, l.ID); n != 2 {
		t.Errorf("%d frames WAITING after the compensation, want 2", n)
	}
	if n := h.count(`SELECT count(*) FROM proc WHERE pk_layer = $1`, l.ID); n != 0 {
		t.Errorf("%d procs left, want 0", n)
	}
	h.checkBooked(0)
}

// TestFailedKillAfterUncertainLaunchIsCounted: a launch whose outcome is
// unknown (its deadline passed) is compensated with a best-effort kill;
// when that kill fails too, the frame may run untracked on its host, so it
// is logged at WARN and counted, not dropped at debug level.
func TestFailedKillAfterUncertainLaunchIsCounted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bl := &blockingLauncher{killErr: errors.New("rqd unreachable")}
	reg := prometheus.NewRegistry()
	var logs strings.Builder
	var mu sync.Mutex
	log := hclog.New(&hclog.LoggerOptions{Output: lockedWriter{&mu, &logs}, Level: hclog.Info})
	d := dispatch.New(h.pool, h.pub, bl, dispatch.Config{Policy: sizing.Policy{CoreUnit: 100, MinMemKB: 262144,
		StrandedMemKB: 2 * farmseed.GB}, SoftLimit: 1.6, HardLimit: 2,
		LaunchTimeout: 100 * time.Millisecond, CompensateTimeout: testenv.Patience(20 * time.Second)},
		dispatch.Options{Registerer: reg, Logger: log})
	host := h.host(farmseed.HostSpec{Cores: 8, MemKB: 32 * farmseed.GB})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 2, NotThreadable: true}}})
	l := h.layers(j)[0]
	if res := d.Dispatch(context.Background(), l, l.Frames, host); len(res.LaunchFailed) != 2 {
		t.Fatalf("result = %+v", res)
	}
	if got := promread.Value(t, reg, "scheduler_dispatch_kill_failures_total"); got != 2 {
		t.Errorf("scheduler_dispatch_kill_failures_total = %v, want 2", got)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if !strings.Contains(out, "[WARN]") || !strings.Contains(out, "best-effort kill after a failed launch failed") {
		t.Errorf("no WARN for the failed kill:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// A booking transaction cut short by its deadline (here: the host row is
// locked by someone else, so the host update waits) is sent in one piece,
// so its outcome is unknown to the client: it is resolved by waiting for
// the batch's frames and looking for the procs. Nothing was committed, so
// nothing starts and every booking is rolled back.
func TestDispatchCutShortIsResolved(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *dispatch.Config) { c.BookTimeout = 300 * time.Millisecond })
	host := h.host(farmseed.HostSpec{Cores: 8})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 4, NotThreadable: true}}})
	l := h.layers(j)[0]
	ctx := context.Background()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM host WHERE pk_host = $1 FOR UPDATE`, host.ID); err != nil {
		t.Fatal(err)
	}
	res := h.d.Dispatch(ctx, l, l.Frames, host)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res.Stop != dispatch.Failed || len(res.Dispatched) != 0 {
		t.Fatalf("result = %+v, want failed with nothing started", res)
	}
	h.checkBooked(0)
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'WAITING' AND int_version = 0`, l.ID); n != 4 {
		t.Fatalf("%d frames untouched, want 4", n)
	}
	if n := h.count(`SELECT count(*) FROM proc`); n != 0 {
		t.Fatalf("%d procs left", n)
	}
}

// TestDispatchCutShortBeforeItsLocksIsResolved: a batch cut short while it
// still waits before its frame claim (here on its limit's lock, held by
// someone else) holds no frame lock the resolution could wait on, so
// reading its procs at once would find none while the transaction could
// still commit once the lock is released, after its Redis bookings were
// rolled back. Nothing commits, ever, and Postgres and Redis agree. (Here
// pgx's cancel request also ends the statement; the backend is ended
// anyway for the window where that request arrives before the batch
// runs, which no test can force.)
func TestDispatchCutShortBeforeItsLocksIsResolved(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *dispatch.Config) { c.BookTimeout = 300 * time.Millisecond })
	host := h.host(farmseed.HostSpec{Cores: 8})
	lim := h.must(h.seed.Limit(context.Background(), "licence", 10))
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 4, NotThreadable: true, Limits: []string{lim}}}})
	l := h.layers(j)[0]
	ctx := context.Background()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM limit_record WHERE pk_limit_record = $1 FOR UPDATE`, lim); err != nil {
		t.Fatal(err)
	}
	res := h.d.Dispatch(ctx, l, l.Frames, host)
	if res.Stop != dispatch.Failed || len(res.Dispatched) != 0 {
		t.Fatalf("result = %+v, want failed with nothing started", res)
	}
	// The lock goes: a batch still waiting behind it would now commit.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Wait until no backend of this database runs a booking statement (a
	// live batch commits or fails within its statement's run).
	waitFor(t, "no booking statement runs", func() bool { return batchEnded(h) })
	if n := h.count(`SELECT count(*) FROM proc`); n != 0 {
		t.Fatalf("%d procs committed after the batch was resolved as failed and rolled back in Redis", n)
	}
	h.checkBooked(0)
}

// TestDispatchCutOffFromPostgresKeepsItsBookings: a booking transaction
// whose connection is lost while it waits (here on a host row someone else
// holds) has an unknown outcome, and with Postgres unreachable until the
// resolution's deadline the outcome stays unknown. The transaction commits
// once the lock goes (the whole pipeline, Sync included, was already with
// the server), so the Redis bookings must still be there: rolled back,
// Redis would count 0 cores for 4 committed procs and the gate would let
// another instance book past the caps (the faults suite's partition test
// once saw a job at 32 cores of a 23-core cap). Nothing is launched. Once
// Postgres answers, Run puts the committed frames back and releases them.
func TestDispatchCutOffFromPostgresKeepsItsBookings(t *testing.T) {
	t.Parallel()
	h, d, proxy, res, reg := dispatchCutOff(t, cutCommitted)
	if res.Stop != dispatch.Failed || len(res.Dispatched) != 0 {
		t.Fatalf("result = %+v, want failed with nothing started", res)
	}
	if n := h.count(`SELECT count(*) FROM proc WHERE pk_show = $1`, h.show.ID); n != 4 {
		t.Fatalf("%d procs committed, want the cut-off batch's 4", n)
	}
	h.checkBooked(4)

	// Run settles it once Postgres answers.
	settleOnceRestored(t, d, proxy, reg, "put_back")
	h.checkBooked(0)
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_job IN (SELECT pk_job FROM job WHERE pk_show = $1)
		AND str_state = 'WAITING' AND int_exit_status = 299 AND int_retries = 0`, h.show.ID); n != 4 {
		t.Fatalf("%d frames put back to WAITING, want 4", n)
	}
	if n := h.count(`SELECT int_cores_idle FROM host WHERE str_name = $1`, res.Host.Name); n != 800 {
		t.Fatalf("host idle = %d centicores after the put-back, want 800", n)
	}
}

// TestDispatchCutOffBeforeItCommitsIsRolledBack: the batch still waits on
// the lock when Postgres answers again: Run ends its backend, finds no
// proc and rolls the bookings back; the batch never commits.
func TestDispatchCutOffBeforeItCommitsIsRolledBack(t *testing.T) {
	t.Parallel()
	h, d, proxy, res, reg := dispatchCutOff(t, cutWaiting)
	if res.Stop != dispatch.Failed || len(res.Dispatched) != 0 {
		t.Fatalf("result = %+v, want failed with nothing started", res)
	}
	// Kept while the outcome is unknown.
	if got := h.redisInt(publisher.SubKey(h.show.ID, h.alloc), "int_cores"); got != 4 {
		t.Fatalf("Redis subscription int_cores = %d while the outcome is unknown, want the 4 kept", got)
	}
	settleOnceRestored(t, d, proxy, reg, "not_committed")
	waitFor(t, "the cut-off batch ends", func() bool { return batchEnded(h) })
	if n := h.count(`SELECT count(*) FROM proc`); n != 0 {
		t.Fatalf("%d procs committed", n)
	}
	h.checkBooked(0)
}

// TestDispatchCutOffBrieflyIsResolved: the same batch, with Postgres back
// before the resolution's deadline: the resolution, tried again, finds the
// committed procs and the frames start.
func TestDispatchCutOffBrieflyIsResolved(t *testing.T) {
	t.Parallel()
	h, _, _, res, reg := dispatchCutOff(t, cutBriefly)
	if len(res.Dispatched) != 4 {
		t.Fatalf("result = %+v, want the 4 committed frames started", res)
	}
	for _, r := range []string{"put_back", "not_committed", "left"} {
		if got := promread.Value(t, reg, "scheduler_dispatch_unresolved_transactions_total", "result", r); got != 0 {
			t.Errorf("unresolved transactions %s = %v, want 0", r, got)
		}
	}
	h.checkBooked(4)
}

// settleOnceRestored runs d.Run, restores the proxy and waits until Run
// has settled the unresolved transaction with result.
func settleOnceRestored(t *testing.T, d *dispatch.Dispatcher, proxy *testenv.Proxy, reg *prometheus.Registry, result string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	proxy.Restore()
	waitFor(t, "the unresolved transaction is settled", func() bool {
		return promread.Value(t, reg, "scheduler_dispatch_unresolved_transactions_total", "result", result) == 1
	})
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// How dispatchCutOff's batch goes on after the cut.
type cutMode int

const (
	cutCommitted cutMode = iota // the lock goes, the batch commits, Postgres stays cut
	cutBriefly                  // the lock goes, the batch commits, the proxy is restored
	cutWaiting                  // the lock stays (released at the test's end), Postgres stays cut
)

// dispatchCutOff dispatches 4 frames (dry run) through a proxy to
// Postgres, cuts the proxy while the batch waits on a host row lock, and
// goes on as mode says.
func dispatchCutOff(t *testing.T, mode cutMode) (*harness, *dispatch.Dispatcher, *testenv.Proxy, dispatch.Result, *prometheus.Registry) {
	h := newHarness(t, nil)
	ctx := context.Background()
	host := h.host(farmseed.HostSpec{Cores: 8})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 4, NotThreadable: true}}})
	l := h.layers(j)[0]

	pc, err := pgxpool.ParseConfig(h.dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testenv.StartProxy(net.JoinHostPort(pc.ConnConfig.Host, strconv.Itoa(int(pc.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	pc.ConnConfig.Host, pc.ConnConfig.Port = "127.0.0.1", uint16(proxy.Port())
	pc.ConnConfig.ConnectTimeout = 2 * time.Second
	cut, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cut.Close)
	reg := prometheus.NewRegistry()
	d := dispatch.New(cut, h.pub, nil, dispatch.Config{
		Policy:    sizing.Policy{CoreUnit: 100, MinMemKB: 262144, StrandedMemKB: 2 * farmseed.GB},
		SoftLimit: 1.6, HardLimit: 2, BookTimeout: testenv.Patience(20 * time.Second), DryRun: true,
	}, dispatch.Options{Registerer: reg})

	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM host WHERE pk_host = $1 FOR UPDATE`, host.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan dispatch.Result, 1)
	go func() { done <- d.Dispatch(ctx, l, l.Frames, host) }()
	// The batch is with the server, waiting on the host lock (the claim's
	// proc insert checks its host key): cut.
	waitFor(t, "the booking batch waits on the host row", func() bool {
		select {
		case r := <-done:
			t.Fatalf("dispatch returned before the cut: %+v", r)
		default:
		}
		return h.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock'`) > 0
	})
	proxy.Cut()
	if mode == cutWaiting {
		return h, d, proxy, <-done, reg
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cut-off batch ends", func() bool { return batchEnded(h) })
	if mode == cutBriefly {
		proxy.Restore()
	}
	return h, d, proxy, <-done, reg
}

// batchEnded reports whether no backend runs a booking statement.
func batchEnded(h *harness) bool {
	return h.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND pid <> pg_backend_pid() AND query LIKE '%SKIP LOCKED%' AND state <> 'idle'`) == 0
}

// waitFor polls cond until it holds, failing the test after a patient 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDispatchAtALaterHostTakeGeneration: the host update's later texts
// (re-prepared as the committed frames double) book as the first does.
func TestDispatchAtALaterHostTakeGeneration(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	host := h.host(farmseed.HostSpec{Cores: 8})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 3, NotThreadable: true}}})
	l := h.layers(j)[0]
	dispatch.SetCommitted(h.d, 1<<20)
	res := h.d.Dispatch(context.Background(), l, l.Frames, host)
	if len(res.Dispatched) != 3 {
		t.Fatalf("result = %+v, want 3 started", res)
	}
	if n := h.count(`SELECT int_cores_idle FROM host WHERE pk_host = $1`, host.ID); n != 500 || res.Host.IdleCores != 500 {
		t.Fatalf("host idle = %d centicores (result says %d), want 500", n, res.Host.IdleCores)
	}
	h.checkBooked(3)
}
