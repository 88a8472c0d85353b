package sidecar_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
	"github.com/cuesched/cuesched/sidecar"
)

// Child processes: the test binary re-executes itself as a sidecar process
// (so tests can kill -9 a real process) when this variable is set.
const childEnv = "CUESCHED_SIDECAR_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	testenv.Main(m)
}

// childConfig is the sidecar configuration tests use: short intervals so
// restarts and takeovers are quick.
func childConfig(db, slot string, create bool, logger hclog.Logger, reg prometheus.Registerer) sidecar.Config {
	return sidecar.Config{
		DatabaseURL: db, SlotName: slot, CreateSlot: create,
		StandbyRetry: 100 * time.Millisecond, StatusInterval: 100 * time.Millisecond,
		CheckpointInterval: 50 * time.Millisecond, SlotPollInterval: 200 * time.Millisecond,
		Logger: logger, Registerer: reg,
	}
}

func runChild() int {
	level := hclog.LevelFromString(os.Getenv(childEnv + "_LOG"))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: os.Getenv(childEnv), Level: level, Output: os.Stderr})
	opt, err := redis.ParseURL(os.Getenv(childEnv + "_REDIS"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if d, err := time.ParseDuration(os.Getenv(childEnv + "_REDIS_DELAY")); err == nil && d > 0 {
		// A slow Redis widens every window between receiving a transaction
		// and acknowledging it, where a kill must not lose anything.
		rdb.AddHook(slowRedis{d})
	}
	cfg := childConfig(os.Getenv(childEnv+"_DB"), os.Getenv(childEnv+"_SLOT"), os.Getenv(childEnv+"_CREATE") == "1", logger, prometheus.NewRegistry())
	sc, err := sidecar.New(cfg, rdb)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := sc.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "sidecar:", err)
		return 1
	}
	return 0
}

// slowRedis delays every command and pipeline by d.
type slowRedis struct{ d time.Duration }

func (s slowRedis) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s slowRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(s.d)
		return next(ctx, cmd)
	}
}
func (s slowRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(s.d)
		return next(ctx, cmds)
	}
}

// showFx is one show of the fixture: one host, job and layer.
type showFx struct {
	name    string
	rows    cuebotemu.ShowRows
	managed bool
	host    string
	alloc   string
	job     string
	layer   string
}

// procFx is a booked proc and what it charged in Redis.
type procFx struct {
	id          string
	show        *showFx
	centi, gpus int64
	inRedis     bool
	keys        [5]string
	// private: the test deletes it itself, so the deleter never picks it
	// (both deleting it would forget it twice).
	private bool
}

// harness is a Cuebot database with three shows (a and b scheduler-managed,
// u Cuebot-managed), a Redis DB, and the expected Redis counters.
type harness struct {
	t        testing.TB
	ctx      context.Context
	dbURL    string
	pool     *pgxpool.Pool
	redisURL string
	rdb      *redis.Client
	pub      *publisher.Publisher
	slot     string
	fx       cuebotemu.Fixture
	a, b, u  *showFx
	// childRedisDelay slows every Redis call of spawned sidecars.
	childRedisDelay time.Duration

	mu       sync.Mutex
	live     map[string]*procFx
	released map[string]*procFx
	cores    map[string]int64 // expected int_cores per key
	gpus     map[string]int64
	allKeys  map[string]bool
}

type harnessOpts struct {
	redisURL string // default: a fresh DB of the shared server
	dbURL    string // default: cuebotdb.Database
	// syncCommit is the harness sessions' synchronous_commit (default on).
	syncCommit string
}

func newHarness(t testing.TB, o harnessOpts) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	h := &harness{t: t, ctx: ctx, live: map[string]*procFx{}, released: map[string]*procFx{},
		cores: map[string]int64{}, gpus: map[string]int64{}, allKeys: map[string]bool{}}
	h.dbURL = o.dbURL
	if h.dbURL == "" {
		h.dbURL = cuebotdb.Database(t)
	}
	h.redisURL = o.redisURL
	if h.redisURL == "" {
		h.redisURL = testenv.NewRedisDB(t)
	}
	// The harness plays Cuebot, whose commits are durable (the test
	// cluster's default is synchronous_commit=off, which a crash test would
	// see as lost deletes).
	pcfg, err := pgxpool.ParseConfig(h.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	if o.syncCommit != "" {
		pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = o.syncCommit
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h.pool = pool
	opt, err := redis.ParseURL(h.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	h.rdb = redis.NewClient(opt)
	t.Cleanup(func() { h.rdb.Close() })
	if h.pub, err = publisher.New(h.rdb, publisher.Options{}); err != nil {
		t.Fatal(err)
	}
	h.slot = "sc_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
	t.Cleanup(func() {
		// The slot is cluster-wide: drop it even if the database outlives us.
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for i := 0; i < 50; i++ {
			_, err := h.pool.Exec(c, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, h.slot)
			_, err2 := h.pool.Exec(c, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, h.slot)
			if err == nil && err2 == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	h.fx = cuebotemu.Fixture{Pool: pool}
	h.a = h.show("a", true)
	h.b = h.show("b", true)
	h.u = h.show("u", false)
	return h
}

func (h *harness) show(name string, managed bool) *showFx {
	h.t.Helper()
	s := &showFx{name: name, managed: managed, alloc: cuebot.SeedAllocLocalGeneral}
	var err error
	full := name + "-" + uuid.NewString()[:6]
	if s.rows, err = h.fx.Show(h.ctx, full, managed, s.alloc); err != nil {
		h.t.Fatal(err)
	}
	if s.host, err = h.fx.Host(h.ctx, full+"-host", s.alloc, 100000, 1<<30, 8); err != nil {
		h.t.Fatal(err)
	}
	if s.job, err = h.fx.Job(h.ctx, s.rows, full+"-job", 3); err != nil {
		h.t.Fatal(err)
	}
	if s.layer, err = h.fx.Layer(h.ctx, s.job, full+"-layer"); err != nil {
		h.t.Fatal(err)
	}
	return s
}

// book creates n procs of show s (no frame: the sidecar only cares about
// proc rows), charging Redis first for managed shows as the scheduler does.
func (h *harness) book(s *showFx, n int) []*procFx {
	h.t.Helper()
	return h.bookAs(s, n, false)
}

// bookPrivate books procs the deleter never picks: the test deletes them.
func (h *harness) bookPrivate(s *showFx, n int) []*procFx {
	h.t.Helper()
	return h.bookAs(s, n, true)
}

func (h *harness) bookAs(s *showFx, n int, private bool) []*procFx {
	h.t.Helper()
	sizes := []int64{50, 100, 150, 250, 400}
	out := make([]*procFx, n)
	ids := make([]string, n)
	centis := make([]int64, n)
	gpuss := make([]int64, n)
	for i := range out {
		p := &procFx{id: uuid.NewString(), show: s, centi: sizes[rand.IntN(len(sizes))], gpus: int64(rand.IntN(2)), private: private}
		if s.managed {
			b := publisher.Booking{ProcID: p.id, ShowID: s.rows.ShowID, AllocID: s.alloc, FolderID: s.rows.FolderID,
				JobID: s.job, LayerID: s.layer, DeptID: s.rows.DeptID, Centicores: p.centi, GPUs: p.gpus}
			if _, err := h.pub.ForceBook(h.ctx, b); err != nil {
				h.t.Fatalf("book %s in redis: %v", p.id, err)
			}
			p.inRedis = true
			p.keys = [5]string{publisher.SubKey(s.rows.ShowID, s.alloc), publisher.FolderKey(s.rows.FolderID),
				publisher.JobKey(s.job), publisher.LayerKey(s.layer), publisher.PointKey(s.rows.DeptID, s.rows.ShowID)}
		}
		out[i], ids[i], centis[i], gpuss[i] = p, p.id, p.centi, p.gpus
	}
	_, err := h.pool.Exec(h.ctx, `
		INSERT INTO proc (pk_proc, pk_host, pk_show, pk_job, pk_layer, int_cores_reserved, int_mem_reserved, int_gpus_reserved)
		SELECT id, $2, $3, $4, $5, c, 1048576, g FROM unnest($1::text[], $6::int8[], $7::int4[]) AS x(id, c, g)`,
		ids, s.host, s.rows.ShowID, s.job, s.layer, centis, gpuss)
	if err != nil {
		h.t.Fatalf("insert procs: %v", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range out {
		h.live[p.id] = p
		if p.inRedis {
			for _, k := range p.keys {
				h.cores[k] += publisher.ChargeCores(p.centi)
				h.gpus[k] += p.gpus
				h.allKeys[k] = true
			}
		}
	}
	return out
}

// del deletes procs in one transaction (Cuebot's unbook, reduced to what
// the sidecar reads) and updates the expectation.
func (h *harness) del(ps ...*procFx) {
	h.t.Helper()
	if err := h.tryDel(h.ctx, ps...); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) tryDel(ctx context.Context, ps ...*procFx) error {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.id
	}
	tag, err := h.pool.Exec(ctx, `DELETE FROM proc WHERE pk_proc = ANY($1)`, ids)
	if err != nil {
		return fmt.Errorf("delete procs: %w", err)
	}
	if int(tag.RowsAffected()) != len(ids) {
		return fmt.Errorf("deleted %d procs, want %d", tag.RowsAffected(), len(ids))
	}
	h.forget(ps...)
	return nil
}

func (h *harness) forget(ps ...*procFx) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range ps {
		if h.live[p.id] == nil {
			continue // forgotten already: its release is counted once
		}
		delete(h.live, p.id)
		h.released[p.id] = p
		if p.inRedis && p.show.managed {
			for _, k := range p.keys {
				h.cores[k] -= publisher.ChargeCores(p.centi)
				h.gpus[k] -= p.gpus
			}
		}
	}
}

// liveProcs returns the live procs in a stable order.
func (h *harness) liveProcs() []*procFx {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*procFx, 0, len(h.live))
	for _, p := range h.live {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// walNow is the current WAL insert position (after every commit so far;
// with synchronous_commit off the write position can lag behind it).
func (h *harness) walNow() uint64 {
	h.t.Helper()
	var s string
	if err := h.pool.QueryRow(h.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		h.t.Fatal(err)
	}
	var hi, lo uint64
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		h.t.Fatalf("parse %q: %v", s, err)
	}
	return hi<<32 | lo
}

// waitCheckpoint waits until Redis's checkpoint reaches lsn: every
// transaction committed before it has been applied.
func (h *harness) waitCheckpoint(lsn uint64, timeout time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(testenv.Patience(timeout))
	for {
		cp, ok, err := h.pub.Checkpoint(h.ctx)
		if err == nil && ok && cp >= lsn {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("redis checkpoint %X (ok=%v, err=%v) did not reach %X within %s", cp, ok, err, lsn, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// assertExact checks every counter the procs charged, the set of per-proc
// records, and that the unmanaged show left no trace in Redis.
func (h *harness) assertExact() {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	bad := 0
	keys := make([]string, 0, len(h.allKeys))
	for k := range h.allKeys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, err := h.rdb.HMGet(h.ctx, k, "int_cores", "int_gpus").Result()
		if err != nil {
			h.t.Fatal(err)
		}
		got := [2]int64{atoi(v[0]), atoi(v[1])}
		if want := [2]int64{h.cores[k], h.gpus[k]}; got != want {
			bad++
			h.t.Errorf("%s: redis cores,gpus = %v, want %v", k, got, want)
		}
	}
	recs, err := scanKeys(h.ctx, h.rdb, "acct:proc:*")
	if err != nil {
		h.t.Fatal(err)
	}
	want := map[string]bool{}
	for id, p := range h.live {
		if p.inRedis {
			want["acct:proc:"+id] = true
		}
	}
	for _, r := range recs {
		if !want[r] {
			bad++
			if bad < 10 {
				h.t.Errorf("record %s left for a released proc", r)
			}
		}
		delete(want, r)
	}
	for r := range want {
		bad++
		if bad < 10 {
			h.t.Errorf("record %s missing for a live proc (released twice or lost)", r)
		}
	}
	// The Cuebot-managed show is never touched: no key names it, no
	// tombstone for any of its procs.
	touched, err := scanKeys(h.ctx, h.rdb, "*"+h.u.rows.ShowID+"*")
	if err != nil {
		h.t.Fatal(err)
	}
	if len(touched) > 0 {
		h.t.Errorf("unmanaged show touched in redis: %v", touched)
	}
	for id, p := range h.released {
		if p.show == h.u {
			if n, _ := h.rdb.Exists(h.ctx, publisher.TombKey(id)).Result(); n != 0 {
				h.t.Errorf("tombstone written for proc %s of the unmanaged show", id)
				break
			}
		}
	}
	if bad > 0 {
		h.t.FailNow()
	}
}

func atoi(v any) int64 {
	s, _ := v.(string)
	var n int64
	fmt.Sscan(s, &n)
	return n
}

func scanKeys(ctx context.Context, rdb *redis.Client, pattern string) ([]string, error) {
	var out []string
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	return out, iter.Err()
}

// inProcess is a sidecar running in this test process.
type inProcess struct {
	sc     *sidecar.Sidecar
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	logs   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a sidecar in this process until the test ends (or stop).
func (h *harness) start(create bool, tweak ...func(*sidecar.Config)) *inProcess {
	h.t.Helper()
	return h.startWith(h.rdb, create, tweak...)
}

func (h *harness) startWith(rdb redis.UniversalClient, create bool, tweak ...func(*sidecar.Config)) *inProcess {
	h.t.Helper()
	ip := &inProcess{reg: prometheus.NewRegistry(), done: make(chan error, 1), logs: &syncBuffer{}}
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: ip.logs})
	cfg := childConfig(h.dbURL, h.slot, create, logger, ip.reg)
	for _, f := range tweak {
		f(&cfg)
	}
	sc, err := sidecar.New(cfg, rdb)
	if err != nil {
		h.t.Fatal(err)
	}
	ip.sc = sc
	ctx, cancel := context.WithCancel(h.ctx)
	ip.cancel = cancel
	go func() { ip.done <- sc.Run(ctx) }()
	h.t.Cleanup(func() {
		ip.stop(h.t)
		if h.t.Failed() {
			h.t.Logf("sidecar log:\n%s", tail(ip.logs.String(), 8000))
		}
	})
	return ip
}

func (ip *inProcess) stop(t testing.TB) {
	ip.cancel()
	select {
	case err, ok := <-ip.done:
		if ok && err != nil {
			t.Errorf("sidecar Run: %v", err)
		}
		if ok {
			close(ip.done)
		}
	case <-time.After(testenv.Patience(30 * time.Second)):
		t.Errorf("sidecar did not stop after its context ended")
	}
}

func (ip *inProcess) waitActive(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(testenv.Patience(timeout))
	for !ip.sc.Status().Active {
		if time.Now().After(deadline) {
			t.Fatalf("sidecar not active within %s: %+v\n%s", timeout, ip.sc.Status(), tail(ip.logs.String(), 4000))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// metric returns the value of a counter or gauge (summed over series whose
// labels include want).
func (ip *inProcess) metric(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	return gather(t, ip.reg, name, want)
}

// waitMetric waits until a metric reaches want (metrics are updated just
// after the Redis write a test waits for).
func (ip *inProcess) waitMetric(t testing.TB, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(testenv.Patience(5 * time.Second))
	for {
		got := ip.metric(t, name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func gather(t testing.TB, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !labelsMatch(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// child is a sidecar running as a separate process (the test binary).
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func (h *harness) spawn(name string, create bool) *child {
	h.t.Helper()
	return h.spawnWith(name, create, "")
}

// spawnWith passes extra connection parameters (k=v&k=v) to the child.
func (h *harness) spawnWith(name string, create bool, params string) *child {
	h.t.Helper()
	dir := h.t.TempDir()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	create1 := "0"
	if create {
		create1 = "1"
	}
	sep := "?"
	if strings.Contains(h.dbURL, "?") {
		sep = "&"
	}
	cmd.Env = append(os.Environ(),
		childEnv+"="+name,
		childEnv+"_DB="+h.dbURL+sep+"application_name="+name+ampersand(params),
		childEnv+"_REDIS="+h.redisURL,
		childEnv+"_SLOT="+h.slot,
		childEnv+"_CREATE="+create1,
		childEnv+"_LOG=debug",
		childEnv+"_REDIS_DELAY="+h.childRedisDelay.String(),
	)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	c := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	h.t.Cleanup(func() {
		c.kill()
		if h.t.Failed() {
			b, _ := os.ReadFile(logPath)
			h.t.Logf("child %s log:\n%s", name, tail(string(b), 6000))
		}
	})
	return c
}

func ampersand(params string) string {
	if params == "" {
		return ""
	}
	return "&" + params
}

// kill is kill -9.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// slotHolder returns the application_name of the walsender holding the
// slot ("" when inactive).
func (h *harness) slotHolder() string {
	var name *string
	err := h.pool.QueryRow(h.ctx, `SELECT r.application_name FROM pg_replication_slots s
		LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, h.slot).Scan(&name)
	if err != nil || name == nil {
		return ""
	}
	return *name
}

func (h *harness) waitHolder(pred func(string) bool, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(testenv.Patience(timeout))
	for {
		if n := h.slotHolder(); pred(n) {
			return n, nil
		}
		if time.Now().After(deadline) {
			return "", errors.New("timeout")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
