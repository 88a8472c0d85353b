package accounting

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// farm is a Cuebot database plus a Redis DB, with shows built by addShow.
type farm struct {
	t        *testing.T
	ctx      context.Context
	dbURL    string
	redisURL string
	pool     *pgxpool.Pool
	rdb      redis.UniversalClient
	pub      *publisher.Publisher
	reg      *prometheus.Registry
}

type farmOpt func(*farmCfg)

type farmCfg struct {
	redisURL string
	dbURL    string
	tombTTL  time.Duration
}

// withDatabase builds the farm on a Cuebot database the test made
// (heldcommit.Database) instead of a fresh cuebotdb.Database.
func withDatabase(u string) farmOpt { return func(c *farmCfg) { c.dbURL = u } }

func withRedisURL(u string) farmOpt { return func(c *farmCfg) { c.redisURL = u } }

func newFarm(t *testing.T, opts ...farmOpt) *farm {
	t.Helper()
	var c farmCfg
	for _, o := range opts {
		o(&c)
	}
	if c.redisURL == "" {
		c.redisURL = testenv.NewRedisDB(t)
	}
	if c.dbURL == "" {
		c.dbURL = cuebotdb.Database(t)
	}
	ctx := context.Background()
	f := &farm{t: t, ctx: ctx, dbURL: c.dbURL, redisURL: c.redisURL}
	var err error
	f.pool, err = pgxpool.New(ctx, f.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	f.rdb, f.pub, f.reg = f.newPublisher(c.tombTTL)
	return f
}

func (f *farm) newPublisher(ttl time.Duration) (redis.UniversalClient, *publisher.Publisher, *prometheus.Registry) {
	f.t.Helper()
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: f.redisURL, PoolSize: 64})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = rdb.Close() })
	reg := prometheus.NewRegistry()
	pub, err := publisher.New(rdb, publisher.Options{Registerer: reg, TombstoneTTL: ttl})
	if err != nil {
		f.t.Fatal(err)
	}
	return rdb, pub, reg
}

// service builds a Service on the farm's database with its own registry.
func (f *farm) service(cfg Config) (*Service, *prometheus.Registry) {
	f.t.Helper()
	reg := prometheus.NewRegistry()
	log := hclog.NewNullLogger()
	if testing.Verbose() {
		log = hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: testWriter{f.t}})
	}
	s, err := New(f.pool, f.pub, cfg, log, reg)
	if err != nil {
		f.t.Fatal(err)
	}
	return s, reg
}

// secondService is another "process" on the same database and Redis: its
// own pool, Redis client and publisher.
func (f *farm) secondService(cfg Config) (*Service, *publisher.Publisher) {
	f.t.Helper()
	pool2, err := pgxpool.New(f.ctx, f.dbURL)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(pool2.Close)
	_, pub2, _ := f.newPublisher(0)
	s2, err := New(pool2, pub2, cfg, nil, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return s2, pub2
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (f *farm) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", strings.Fields(sql)[0], err)
	}
}

// showFx is a show with one subscription (on local.general), a root folder,
// a point, jobs with one layer each, and hosts.
type showFx struct {
	f      *farm
	id     string
	alloc  string
	folder string
	dept   string
	jobs   []jobFx
	hosts  []string
}

type jobFx struct{ id, layer string }

type showSpec struct {
	managed        bool
	burstCores     int64 // subscription burst, whole cores
	folderMaxCores int64 // -1 unlimited
	jobs           int
	jobMaxCores    int64 // per job; -1 unlimited (written as a huge cap)
	jobMaxGPUs     int64
	hosts          int
}

func (f *farm) addShow(spec showSpec) *showFx {
	f.t.Helper()
	s := &showFx{f: f, id: uuid.NewString(), alloc: cuebot.SeedAllocLocalGeneral, folder: uuid.NewString(), dept: cuebot.SeedDeptPipeline}
	name := "show-" + s.id[:8]
	f.exec(`INSERT INTO show (pk_show, str_name, b_scheduler_managed) VALUES ($1, $2, $3)`, s.id, name, spec.managed)
	f.exec(`INSERT INTO subscription (pk_subscription, pk_alloc, pk_show, int_size, int_burst) VALUES ($1, $2, $3, $4, $5)`,
		uuid.NewString(), s.alloc, s.id, spec.burstCores*100, spec.burstCores*100)
	f.exec(`INSERT INTO folder (pk_folder, pk_show, str_name, pk_dept) VALUES ($1, $2, $3, $4)`, s.folder, s.id, name, s.dept)
	fmax := spec.folderMaxCores
	if fmax > 0 {
		fmax *= 100
	}
	f.exec(`UPDATE folder_resource SET int_max_cores = $2 WHERE pk_folder = $1`, s.folder, fmax)
	f.exec(`INSERT INTO point (pk_point, pk_dept, pk_show) VALUES ($1, $2, $3)`, uuid.NewString(), s.dept, s.id)
	for i := 0; i < spec.jobs; i++ {
		j := jobFx{id: uuid.NewString(), layer: uuid.NewString()}
		f.exec(`INSERT INTO job (pk_job, pk_folder, pk_show, str_name, str_visible_name, str_shot, str_user, str_state, pk_facility, pk_dept)
			VALUES ($1, $2, $3, $4, $4, 'shot', 'user', 'PENDING', $5, $6)`,
			j.id, s.folder, s.id, fmt.Sprintf("%s-job%d", name, i), cuebot.SeedFacilityLocal, s.dept)
		jmax := spec.jobMaxCores * 100
		if spec.jobMaxCores < 0 {
			jmax = 1 << 30
		}
		f.exec(`UPDATE job_resource SET int_max_cores = $2, int_max_gpus = $3 WHERE pk_job = $1`, j.id, jmax, spec.jobMaxGPUs)
		f.exec(`INSERT INTO layer (pk_layer, pk_job, str_name, str_cmd, str_range, str_type) VALUES ($1, $2, 'render', 'true', '1-100', 'RENDER')`,
			j.layer, j.id)
		s.jobs = append(s.jobs, j)
	}
	for i := 0; i < spec.hosts; i++ {
		h := uuid.NewString()
		f.exec(`INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state) VALUES ($1, $2, $3, 'OPEN')`, h, s.alloc, "host-"+h[:13])
		s.hosts = append(s.hosts, h)
	}
	return s
}

func (s *showFx) setManaged(v bool) {
	s.f.exec(`UPDATE show SET b_scheduler_managed = $2 WHERE pk_show = $1`, s.id, v)
}

// booking for job j of the show, on its first host.
func (s *showFx) booking(proc string, j int, centi int64) publisher.Booking {
	return publisher.Booking{ProcID: proc, ShowID: s.id, AllocID: s.alloc, FolderID: s.folder, JobID: s.jobs[j].id,
		LayerID: s.jobs[j].layer, DeptID: s.dept, Centicores: centi}
}

// insertProc is the dispatcher's (or Cuebot's) INSERT proc.
func (s *showFx) insertProc(ctx context.Context, proc string, j int, centi, gpus int64) error {
	_, err := s.f.pool.Exec(ctx, `INSERT INTO proc (pk_proc, pk_host, pk_job, pk_show, pk_layer, int_cores_reserved, int_mem_reserved, int_gpus_reserved)
		VALUES ($1, $2, $3, $4, $5, $6, 1048576, $7)`, proc, s.hosts[0], s.jobs[j].id, s.id, s.jobs[j].layer, centi, gpus)
	return err
}

func (s *showFx) mustInsertProc(proc string, j int, centi, gpus int64) {
	s.f.t.Helper()
	if err := s.insertProc(s.f.ctx, proc, j, centi, gpus); err != nil {
		s.f.t.Fatal(err)
	}
}

func (f *farm) deleteProc(ctx context.Context, proc string) error {
	_, err := f.pool.Exec(ctx, `DELETE FROM proc WHERE pk_proc = $1`, proc)
	return err
}

// counter reads an int field of a hash (0 when missing).
func (f *farm) counter(key, field string) int64 {
	f.t.Helper()
	v, err := f.rdb.HGet(f.ctx, key, field).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		f.t.Fatalf("HGET %s %s: %v", key, field, err)
	}
	return v
}

func (s *showFx) subCores() int64 {
	return s.f.counter(publisher.SubKey(s.id, s.alloc), "int_cores")
}

// requireNoDrift runs the audit and fails on any difference.
func (f *farm) requireNoDrift() {
	f.t.Helper()
	rep, err := Audit(f.ctx, f.pool, f.pub)
	if err != nil {
		f.t.Fatalf("audit: %v", err)
	}
	if len(rep.Drifts) > 0 {
		var b strings.Builder
		rep.Write(&b)
		f.t.Fatalf("drift:\n%s", b.String())
	}
}

// pgInt reads one integer.
func (f *farm) pgInt(sql string, args ...any) int64 {
	f.t.Helper()
	var v int64
	if err := f.pool.QueryRow(f.ctx, sql, args...).Scan(&v); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// runReady starts a service of cfg (f.service), runs it until the test
// ends and waits for its booking gate to open (the first bootstrap).
func (f *farm) runReady(cfg Config) (*Service, *prometheus.Registry) {
	f.t.Helper()
	s, reg := f.service(cfg)
	runService(f.t, s)
	ctx, cancel := context.WithTimeout(f.ctx, testenv.Patience(10*time.Second))
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		f.t.Fatal(err)
	}
	return s, reg
}

// runService runs s.Run until the test ends (or stop is called).
func runService(t *testing.T, s *Service) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	patience := testenv.Patience(within)
	for !cond() {
		if time.Since(start) > patience {
			t.Fatalf("%s: not within %v", what, patience)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}
