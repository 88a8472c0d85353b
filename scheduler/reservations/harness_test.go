package reservations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/hostcache"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/reservations"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// harness is a farm in a real Postgres, a real Redis and the real
// replication-fed host cache.
type harness struct {
	t        *testing.T
	ctx      context.Context
	pool     *pgxpool.Pool
	rdb      redis.UniversalClient
	seed     *farmseed.Seeder
	cache    *hostcache.Cache
	facility string
	alloc    string
	show     farmseed.Show
	cluster  *clusters.Cluster
	hosts    map[string]string // name -> id
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	url := cuebotdb.Database(t)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: testenv.NewRedisDB(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	h := &harness{t: t, ctx: ctx, pool: pool, rdb: rdb, seed: &farmseed.Seeder{DB: pool}, hosts: map[string]string{}}
	h.facility = h.must(h.seed.Facility(ctx, "f1"))
	h.alloc = h.must(h.seed.Alloc(ctx, h.facility, "f1.general", "general"))
	sh, err := h.seed.Show(ctx, "show", true)
	if err != nil {
		t.Fatal(err)
	}
	h.show = sh
	h.must(h.seed.Subscribe(ctx, h.show, h.alloc, 10000, 10000))
	h.cluster = clusters.New(h.facility, h.show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: h.alloc}})

	cfg := hostcache.DefaultConfig(url)
	cfg.SlotName = fmt.Sprintf("resv_test_%d", time.Now().UnixNano()%1e9)
	cfg.StatusInterval = 200 * time.Millisecond
	h.cache, err = hostcache.New(cfg, hostcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.cache.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, testenv.Patience(10*time.Second))
	defer wcancel()
	if err := h.cache.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) must(s string, err error) string {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	if _, err := h.pool.Exec(h.ctx, sql, args...); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
}

// host adds a host of cores cores (4 GiB per core) and waits until the
// cache serves it.
func (h *harness) host(name string, cores int) string {
	h.t.Helper()
	id := h.must(h.seed.Host(h.ctx, farmseed.HostSpec{Name: name, Alloc: h.alloc, AllocTag: "general", Cores: cores,
		MemKB: int64(cores) * 4 * farmseed.GB}))
	h.hosts[name] = id
	h.eventually("the cache serves "+name, func() bool {
		for _, s := range h.cache.Serving(h.facility, h.show.ID, []string{"general"}, "", true) {
			if s.ID == id {
				return true
			}
		}
		return false
	})
	return id
}

func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// job seeds a job of one layer.
func (h *harness) job(name string, priority int, l farmseed.LayerSpec) farmseed.Job {
	h.t.Helper()
	if l.Tags == nil {
		l.Tags = []string{"general"}
	}
	j, err := h.seed.Job(h.ctx, farmseed.JobSpec{Name: name, Show: h.show, Facility: h.facility, Priority: priority,
		MaxCores: farmseed.Uncapped, Layers: []farmseed.LayerSpec{l}})
	if err != nil {
		h.t.Fatal(err)
	}
	return j
}

// wide seeds a job with a layer of threadable frames of cores cores.
func (h *harness) wide(name string, cores, frames int) (farmseed.Job, *jobs.Layer) {
	h.t.Helper()
	j := h.job(name, 50, farmseed.LayerSpec{Name: "sim", Frames: frames, Cores: cores, MemKB: 16 * farmseed.GB})
	return j, h.layer(j)
}

// layer reads the job's (first) layer as the matcher does.
func (h *harness) layer(j farmseed.Job) *jobs.Layer {
	h.t.Helper()
	ls, err := jobs.Layers(h.ctx, h.pool, jobs.LayerQuery{JobID: j.ID, Tags: []string{"general"}, FramesPerLayer: 5})
	if err != nil {
		h.t.Fatal(err)
	}
	if len(ls) == 0 {
		h.t.Fatalf("job %s has no dispatchable layer", j.Name)
	}
	return ls[0]
}

// fill runs n 1-core frames of job j's layer on host (as if booked).
func (h *harness) fill(j farmseed.Job, from int, host string, n int) {
	h.t.Helper()
	for i := from; i < from+n; i++ {
		if _, err := h.seed.Proc(h.ctx, farmseed.ProcSpec{Host: h.hosts[host], Frame: j.Layers[0].Frames[i], Cores: 1,
			MemKB: farmseed.GB}); err != nil {
			h.t.Fatal(err)
		}
	}
}

type managerOpt func(*reservations.Config)

func (h *harness) manager(instance string, opts ...managerOpt) (*reservations.Manager, *prometheus.Registry) {
	h.t.Helper()
	return h.managerOver(instance, h.cache, opts...)
}

// managerOver is manager with hosts answering Serving (the cache, or a
// rendezvous over it).
func (h *harness) managerOver(instance string, hosts reservations.Hosts, opts ...managerOpt) (*reservations.Manager, *prometheus.Registry) {
	h.t.Helper()
	cfg := reservations.Config{Enabled: true, BlockedFor: time.Second, MaxGrants: 8, MaxFraction: 1, Timeout: time.Hour,
		Interval: 100 * time.Millisecond, Policy: sizing.Policy{CoreUnit: 100, StrandedMemKB: 2 * farmseed.GB}, Seed: 1}
	for _, o := range opts {
		o(&cfg)
	}
	reg := prometheus.NewRegistry()
	return reservations.New(h.pool, h.rdb, hosts, cfg, reservations.Options{Registerer: reg, Instance: instance}), reg
}

// rendezvous is a Hosts that holds the first n calls of Serving until all
// n have arrived; later calls pass at once. A grant round calls Serving
// after it has refreshed its snapshot from Redis and before it grants, so
// n managers ticking at once all read the board before any of them grants:
// the race for one host is forced, not left to the goroutine scheduler.
type rendezvous struct {
	reservations.Hosts
	t       *testing.T
	mu      sync.Mutex
	waiting int
	all     chan struct{}
}

func newRendezvous(t *testing.T, hosts reservations.Hosts, n int) *rendezvous {
	return &rendezvous{Hosts: hosts, t: t, waiting: n, all: make(chan struct{})}
}

func (r *rendezvous) EachServing(facilityID, showID string, tags []string, os string, threadable bool, fn func(hostcache.Host)) {
	r.mu.Lock()
	if r.waiting > 0 {
		r.waiting--
		if r.waiting == 0 {
			close(r.all)
		}
	}
	r.mu.Unlock()
	select {
	case <-r.all:
	case <-time.After(testenv.Patience(10 * time.Second)):
		r.t.Error("rendezvous: not every manager reached its grant (EachServing)")
	}
	r.Hosts.EachServing(facilityID, showID, tags, os, threadable, fn)
}

// blocked reports l blocked in the harness cluster for the last d.
func (h *harness) blocked(m *reservations.Manager, l *jobs.Layer, d time.Duration) {
	now := time.Now()
	m.Observe(h.cluster, l, matcher.OutcomeBlocked, now.Add(-d))
	m.Observe(h.cluster, l, matcher.OutcomeBlocked, now)
}

func (h *harness) tick(m *reservations.Manager) {
	h.t.Helper()
	if err := m.Tick(h.ctx); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) list() []reservations.Reservation {
	h.t.Helper()
	rs, err := reservations.List(h.ctx, h.rdb)
	if err != nil {
		h.t.Fatal(err)
	}
	return rs
}
