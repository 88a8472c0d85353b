package rollout_test

import (
	"bytes"
	"context"
	"fmt"
	"github.com/cuesched/cuesched/shared/appname"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/rollout"
	"github.com/cuesched/cuesched/scheduler/accounting"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// farm is a Cuebot database with the rollout applied, a Redis DB, and:
//
//	show "alpha": subscribed to "lot.general" (size 10, burst 20 cores),
//	              one host, one job with two running frames (procs of 3 and
//	              2 cores); not managed
//	show "beta":  subscribed with burst 0; not managed
//	show "testing" (the seed show)
type farm struct {
	dbURL, redisURL string
	pool            *pgxpool.Pool
	rdb             redis.UniversalClient
	pub             *publisher.Publisher
	alpha, beta     farmseed.Show
	alloc           string
	procs           []string
}

func newFarm(t *testing.T) *farm {
	t.Helper()
	ctx := context.Background()
	f := &farm{dbURL: cuebotdb.Database(t), redisURL: testenv.NewRedisDB(t)}
	var err error
	if f.pool, err = pgxpool.New(ctx, f.dbURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	if f.rdb, err = publisher.NewClient(publisher.ClientConfig{URL: f.redisURL}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.rdb.Close() })
	if f.pub, err = publisher.New(f.rdb, publisher.Options{}); err != nil {
		t.Fatal(err)
	}
	s := &farmseed.Seeder{DB: f.pool}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	fac, err := s.Facility(ctx, "lot")
	must(err)
	f.alloc, err = s.Alloc(ctx, fac, "lot.general", "general")
	must(err)
	f.alpha, err = s.Show(ctx, "alpha", false)
	must(err)
	f.beta, err = s.Show(ctx, "beta", false)
	must(err)
	_, err = s.Subscribe(ctx, f.alpha, f.alloc, 10, 20)
	must(err)
	_, err = s.Subscribe(ctx, f.beta, f.alloc, 10, 0)
	must(err)
	host, err := s.Host(ctx, farmseed.HostSpec{Name: "node1", Alloc: f.alloc, AllocTag: "general", Cores: 16})
	must(err)
	job, err := s.Job(ctx, farmseed.JobSpec{Name: "alpha-job", Show: f.alpha, Facility: fac,
		Layers: []farmseed.LayerSpec{{Name: "render", Frames: 2}}})
	must(err)
	for i, c := range []int{3, 2} {
		p, err := s.Proc(ctx, farmseed.ProcSpec{Host: host, Frame: job.Layers[0].Frames[i], Cores: c, MemKB: farmseed.GB})
		must(err)
		f.procs = append(f.procs, p)
	}
	return f
}

// tool returns a rollout tool over the farm; withRedis false leaves Redis
// out.
func (f *farm) tool(t *testing.T, withRedis bool) *rollout.Tool {
	t.Helper()
	o := rollout.Options{PollInterval: 50 * time.Millisecond}
	if withRedis {
		o.Publisher = f.pub
	}
	tl, err := rollout.New(f.pool, o)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// unreachableTool uses a Redis nobody listens on.
func (f *farm) unreachableTool(t *testing.T) *rollout.Tool {
	t.Helper()
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: "redis://127.0.0.1:1/0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	pub, err := publisher.New(rdb, publisher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tl, err := rollout.New(f.pool, rollout.Options{Publisher: pub, RedisTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

func (f *farm) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (f *farm) managed(t *testing.T, show string) bool {
	t.Helper()
	var m bool
	if err := f.pool.QueryRow(context.Background(), `SELECT b_scheduler_managed FROM show WHERE str_name = $1`, show).Scan(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

var slotSeq atomic.Int64

// uniqueSlot is a sidecar-prefixed slot name unique in the cluster.
func uniqueSlot(t *testing.T) string {
	return fmt.Sprintf("%s_rt%d_%d", migrations.SidecarSlotPrefix, time.Now().UnixNano()%1_000_000_000, slotSeq.Add(1))
}

// withAppName sets application_name on a connection URL.
func withAppName(t *testing.T, raw, app string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

// streamSlot plays a sidecar: a replication connection (application_name
// app) creates a temporary pgoutput slot and streams it, so the slot is
// active until stop (also run at cleanup) closes the connection, which
// drops the slot.
func streamSlot(t *testing.T, dbURL, slot, app string) (stop func()) {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(withAppName(t, dbURL, app))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("replication", "database")
	u.RawQuery = q.Encode()
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Temporary: true})
	if err != nil {
		conn.Close(ctx)
		t.Fatalf("create slot %s: %v", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, slot, lsn, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + migrations.PublicationProc + "'"},
	}); err != nil {
		conn.Close(ctx)
		t.Fatalf("start replication: %v", err)
	}
	done := false
	stop = func() {
		if done {
			return
		}
		done = true
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}
	t.Cleanup(stop)
	return stop
}

// fakeScheduler opens a connection named like a scheduler instance and,
// if lead, takes the accounting loop lock on it as the leader does.
func fakeScheduler(t *testing.T, dbURL, instance string, lead bool) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, withAppName(t, dbURL, appname.Format(appname.RoleScheduler, instance)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if lead {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, accounting.DefaultLockKey).Scan(&ok); err != nil || !ok {
			t.Fatalf("take the loop lock: ok=%v err=%v", ok, err)
		}
	}
	return conn
}

// runScheduler runs the real accounting service (leader election, seeding)
// as a scheduler instance would, with short intervals, until the test ends.
func runScheduler(t *testing.T, f *farm, instance string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool, err := pgxpool.New(ctx, withAppName(t, f.dbURL, appname.Format(appname.RoleScheduler, instance)))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := accounting.New(pool, f.pub, accounting.Config{
		ManagedPollInterval: 100 * time.Millisecond, LeaderPollInterval: 100 * time.Millisecond,
		EpochPollInterval: 100 * time.Millisecond, FlipSettle: 300 * time.Millisecond,
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		pool.Close()
	})
}

// flip runs Flip and returns its output.
func flip(t *testing.T, tl *rollout.Tool, req rollout.FlipRequest) (*rollout.FlipResult, string, error) {
	t.Helper()
	var out bytes.Buffer
	res, err := tl.Flip(context.Background(), req, &out)
	return res, out.String(), err
}

func contains(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s lacks %q:\n%s", what, sub, s)
		}
	}
}

// fakeConn opens a plain connection with the given application_name.
func fakeConn(t *testing.T, dbURL, app string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), withAppName(t, dbURL, app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
