package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/appname"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/accounting"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// roFarm is a rolled-out Cuebot database and a Redis DB with show "alpha"
// (subscription burst 20 cores, one host, two running procs of 3 and 2
// cores) and show "beta" (burst 0), both Cuebot-managed.
type roFarm struct {
	db, redis string
	pool      *pgxpool.Pool
	pub       *publisher.Publisher
	env       map[string]string
}

func newROFarm(t *testing.T) *roFarm {
	t.Helper()
	ctx := context.Background()
	f := &roFarm{db: cuebotdb.Database(t), redis: testenv.NewRedisDB(t)}
	f.env = map[string]string{"CUESCHED_DATABASE_URL": f.db, "CUESCHED_ACCOUNTING_REDIS_URL": f.redis}
	var err error
	if f.pool, err = pgxpool.New(ctx, f.db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: f.redis})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	if f.pub, err = publisher.New(rdb, publisher.Options{}); err != nil {
		t.Fatal(err)
	}
	s := &farmseed.Seeder{DB: f.pool}
	step := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	fac, err := s.Facility(ctx, "lot")
	step(nil, err)
	alloc, err := s.Alloc(ctx, fac, "lot.general", "general")
	step(nil, err)
	alpha, err := s.Show(ctx, "alpha", false)
	step(nil, err)
	beta, err := s.Show(ctx, "beta", false)
	step(nil, err)
	step(s.Subscribe(ctx, alpha, alloc, 10, 20))
	step(s.Subscribe(ctx, beta, alloc, 10, 0))
	host, err := s.Host(ctx, farmseed.HostSpec{Name: "node1", Alloc: alloc, AllocTag: "general", Cores: 16})
	step(nil, err)
	job, err := s.Job(ctx, farmseed.JobSpec{Name: "alpha-job", Show: alpha, Facility: fac,
		Layers: []farmseed.LayerSpec{{Name: "render", Frames: 2}}})
	step(nil, err)
	for i, c := range []int{3, 2} {
		step(s.Proc(ctx, farmseed.ProcSpec{Host: host, Frame: job.Layers[0].Frames[i], Cores: c, MemKB: farmseed.GB}))
	}
	return f
}

func (f *roFarm) managed(t *testing.T, show string) bool {
	t.Helper()
	var m bool
	if err := f.pool.QueryRow(context.Background(), `SELECT b_scheduler_managed FROM show WHERE str_name = $1`, show).Scan(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func roAppURL(t *testing.T, raw, app string, extra ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

var roSlotSeq atomic.Int64

// roSidecarSlot plays a sidecar streaming a temporary slot named with the
// sidecar prefix until the test ends.
func roSidecarSlot(t *testing.T, dbURL string) string {
	t.Helper()
	ctx := context.Background()
	slot := fmt.Sprintf("%s_cli%d_%d", migrations.SidecarSlotPrefix, time.Now().UnixNano()%1_000_000_000, roSlotSeq.Add(1))
	conn, err := pgconn.Connect(ctx, roAppURL(t, dbURL, appname.Format(appname.RoleSidecar, "cb1"), "replication", "database"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	})
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Temporary: true})
	if err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, slot, lsn, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + migrations.PublicationProc + "'"},
	}); err != nil {
		t.Fatal(err)
	}
	return slot
}

// roScheduler runs the real accounting service as scheduler instance
// "sched-a" (short intervals) until the test ends.
func roScheduler(t *testing.T, f *roFarm) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool, err := pgxpool.New(ctx, roAppURL(t, f.db, appname.Format(appname.RoleScheduler, "sched-a")))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := accounting.New(pool, f.pub, accounting.Config{ManagedPollInterval: 100 * time.Millisecond,
		LeaderPollInterval: 100 * time.Millisecond, EpochPollInterval: 100 * time.Millisecond, FlipSettle: 300 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; pool.Close() })
}

func runShowT(env map[string]string, args ...string) (int, string, string) {
	c, out, errb := testCLI(env)
	code := runShow(context.Background(), c, args)
	return code, out.String(), errb.String()
}

func TestShowCLIUsage(t *testing.T) {
	t.Parallel()
	env := map[string]string{"CUESCHED_DATABASE_URL": "postgres://nobody@127.0.0.1:1/x"}
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{nil, 2, "usage: cuesched show"},
		{[]string{"frobnicate"}, 2, `unknown subcommand "frobnicate"`},
		{[]string{"list", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"set-managed"}, 2, "want a show name and on or off, got 0"},
		{[]string{"set-managed", "alpha"}, 2, "got 1 argument(s)"},
		{[]string{"set-managed", "alpha", "maybe"}, 2, `"maybe" is not on or off`},
		{[]string{"set-managed", "alpha", "on", "x"}, 2, "got 3 argument(s)"},
		{[]string{"set-managed", "alpha", "on", "--wait", "-1s"}, 2, "is negative"},
		{[]string{"list", "--bogus"}, 2, "flag provided but not defined"},
	} {
		code, _, errOut := runShowT(env, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.msg) {
			t.Errorf("show %v: code %d (want %d), stderr lacks %q:\n%s", tc.args, code, tc.code, tc.msg, errOut)
		}
	}
	if code, out, errOut := runShowT(env, "help"); code != 0 || !strings.Contains(out, "set-managed <show> on|off") || errOut != "" {
		t.Errorf("help: %d %q %q", code, out, errOut)
	}
	if code, out, errOut := runShowT(env, "set-managed", "-h"); code != 0 || !strings.Contains(out, "exit status") || errOut != "" {
		t.Errorf("set-managed -h: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runShowT(map[string]string{}, "list"); code != 2 || !strings.Contains(errOut, "no database") {
		t.Errorf("no database: %d %s", code, errOut)
	}
	if code, _, errOut := runShowT(env, "list"); code != 1 || !strings.Contains(errOut, "connect to the database") {
		t.Errorf("unreachable database: %d %s", code, errOut)
	}
}

func TestShowListCLI(t *testing.T) {
	t.Parallel()
	f := newROFarm(t)
	code, out, errOut := runShowT(f.env, "list")
	if code != 0 {
		t.Fatalf("list: %d %s", code, errOut)
	}
	var alphaRow string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "alpha ") {
			alphaRow = strings.Join(strings.Fields(l), " ")
		}
	}
	// Redis is empty: alpha is not seeded.
	if alphaRow != "alpha yes no no 2 5" {
		t.Errorf("alpha row %q in\n%s", alphaRow, out)
	}
	if strings.Contains(out, "WARNING") {
		t.Errorf("nothing is managed, yet:\n%s", out)
	}
	if !strings.Contains(out, "not bootstrapped") {
		t.Errorf("an empty Redis is not pointed out:\n%s", out)
	}

	// Redis is optional; JSON.
	env := map[string]string{"CUESCHED_DATABASE_URL": f.db}
	code, out, errOut = runShowT(env, "list", "--json")
	if code != 0 {
		t.Fatalf("list --json: %d %s", code, errOut)
	}
	var js struct {
		Shows []struct {
			Name   string `json:"name"`
			Seeded string `json:"seeded"`
			Procs  int    `json:"procs"`
		} `json:"shows"`
	}
	if err := json.Unmarshal([]byte(out), &js); err != nil || len(js.Shows) != 3 || js.Shows[0].Name != "alpha" ||
		js.Shows[0].Procs != 2 || js.Shows[0].Seeded != "-" {
		t.Errorf("json: %v %+v\n%s", err, js, out)
	}
}

func TestShowSetManagedCLI(t *testing.T) {
	t.Parallel()
	f := newROFarm(t)

	// Unknown show: the known names and the closest one.
	code, _, errOut := runShowT(f.env, "set-managed", "Alpha", "on")
	if code != 1 || !strings.Contains(errOut, `no show named "Alpha" (did you mean "alpha"?)`) ||
		!strings.Contains(errOut, "known shows: alpha, beta, testing") {
		t.Fatalf("unknown show: %d\n%s", code, errOut)
	}

	// No sidecar: refused, nothing changed.
	code, out, errOut := runShowT(f.env, "set-managed", "alpha", "on")
	if code != 1 || !strings.Contains(errOut, "refusing") || !strings.Contains(errOut, "no sidecar streams an active replication slot") {
		t.Fatalf("without sidecar: %d\n%s\n%s", code, out, errOut)
	}
	if f.managed(t, "alpha") {
		t.Fatal("refused flip changed the flag")
	}

	// --force (flags after the arguments): flipped; no wait.
	code, out, errOut = runShowT(f.env, "set-managed", "alpha", "on", "--force", "--wait", "0")
	if code != 0 || !f.managed(t, "alpha") || !strings.Contains(out, "now scheduler-managed") {
		t.Fatalf("forced: %d\n%s\n%s", code, out, errOut)
	}
	// Idempotent.
	code, out, _ = runShowT(f.env, "set-managed", "--wait=0", "alpha", "on")
	if code != 0 || !strings.Contains(out, "already scheduler-managed: nothing changed") {
		t.Fatalf("again: %d\n%s", code, out)
	}
	// Waiting with no scheduler: times out, exit 1, explains.
	code, out, errOut = runShowT(f.env, "set-managed", "alpha", "on", "--wait", "300ms")
	if code != 1 || !strings.Contains(errOut, "NOT bookable yet") || !strings.Contains(errOut, "is a scheduler running?") ||
		!strings.Contains(out, "waiting up to 300ms") {
		t.Fatalf("wait timeout: %d\n%s\n%s", code, out, errOut)
	}
	// Off: explains, exit 0.
	code, out, errOut = runShowT(f.env, "set-managed", "alpha", "off")
	if code != 0 || f.managed(t, "alpha") || !strings.Contains(out, "Cuebot releases their procs") {
		t.Fatalf("off: %d\n%s\n%s", code, out, errOut)
	}

	// With a sidecar and a scheduler: the default wait ends when seeded.
	roSidecarSlot(t, f.db)
	roScheduler(t, f)
	start := time.Now()
	code, out, errOut = runShowT(f.env, "set-managed", "alpha", "on")
	if code != 0 || !strings.Contains(out, "waiting up to 1m0s") || !strings.Contains(out, `show "alpha" is seeded: bookable`) {
		t.Fatalf("on with sidecar and scheduler: %d\n%s\n%s", code, out, errOut)
	}
	t.Logf("seeded after %v", time.Since(start))
}

// roLeaderConn takes the accounting lock on a connection named like a
// scheduler.
func roLeaderConn(t *testing.T, dbURL string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), roAppURL(t, dbURL, appname.Format(appname.RoleScheduler, "fake")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, accounting.DefaultLockKey); err != nil {
		t.Fatal(err)
	}
}
