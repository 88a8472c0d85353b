package testenv

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { Main(m) }

func TestPostgresIsLogicalAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := NewDatabase(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var walLevel, preload string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		t.Fatal(err)
	}
	if walLevel != "logical" {
		t.Fatalf("wal_level = %q, want logical", walLevel)
	}
	if err := conn.QueryRow(ctx, "SHOW shared_preload_libraries").Scan(&preload); err != nil {
		t.Fatal(err)
	}
	if preload != "pg_stat_statements" {
		t.Fatalf("shared_preload_libraries = %q", preload)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE only_here (id int)"); err != nil {
		t.Fatal(err)
	}
	// A second database does not see the table.
	other := NewDatabase(t)
	c2, err := pgx.Connect(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	var n int
	if err := c2.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_here'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("databases are not isolated")
	}
	// Replication connections are allowed.
	rc, err := pgx.Connect(ctx, url+"&replication=database")
	if err == nil {
		rc.Close(ctx)
	}
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
}

func TestTemplateIsClonedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := 0
	setup := func(ctx context.Context, url string) error {
		calls++
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, "CREATE TABLE seeded (v int); INSERT INTO seeded VALUES (42)")
		return err
	}
	for i := 0; i < 2; i++ {
		url := NewDatabase(t, WithTemplate("seeded-test", setup))
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		var v int
		err = c.QueryRow(ctx, "SELECT v FROM seeded").Scan(&v)
		c.Close(ctx)
		if err != nil || v != 42 {
			t.Fatalf("clone %d: v=%d err=%v", i, v, err)
		}
	}
	if calls != 1 {
		t.Fatalf("template setup ran %d times, want 1", calls)
	}
}

func TestRedisDBsAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := NewRedisDB(t), NewRedisDB(t)
	if a == b {
		t.Fatalf("two tests got the same redis db %s", a)
	}
	oa, _ := redis.ParseURL(a)
	ob, _ := redis.ParseURL(b)
	ca, cb := redis.NewClient(oa), redis.NewClient(ob)
	defer ca.Close()
	defer cb.Close()
	if err := ca.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := cb.Exists(ctx, "k").Result(); n != 0 {
		t.Fatal("redis dbs are not isolated")
	}
}

func TestRestartsAndTeardown(t *testing.T) {
	ctx := context.Background()
	pg, err := StartPostgres(ctx, PostgresOptions{WALLevel: "replica"})
	if err != nil {
		t.Fatal(err)
	}
	dir := pg.Dir()
	if err := pg.Restart(ctx, "kill"); err != nil {
		t.Fatalf("restart after kill: %v", err)
	}
	c, err := pgx.Connect(ctx, pg.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	var lvl string
	_ = c.QueryRow(ctx, "SHOW wal_level").Scan(&lvl)
	c.Close(ctx)
	if lvl != "replica" {
		t.Fatalf("wal_level %q", lvl)
	}
	pg.Stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("temp dir %s not removed", dir)
	}

	rd, err := StartRedis(ctx, RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	opt, _ := redis.ParseURL(rd.URL(0))
	rc := redis.NewClient(opt)
	defer rc.Close()
	rc.Set(ctx, "x", "1", 0)
	if err := rd.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := rc.Exists(ctx, "x").Result(); err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d err=%v (want an empty store)", n, err)
	}
	rdir := rd.dir
	rd.Stop()
	if _, err := os.Stat(filepath.Join(rdir, "owner.pid")); !os.IsNotExist(err) {
		t.Fatal("redis temp dir not removed")
	}
}

func TestProxyCutAndRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := RedisServer(t)
	px, err := StartProxy(r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	c := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("through proxy: %v", err)
	}
	px.Cut()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded through a cut proxy")
	}
	px.Restore()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("after restore: %v", err)
	}
}

func TestPatience(t *testing.T) {
	t.Setenv("CUESCHED_TEST_PATIENCE", "")
	if got := Patience(time.Second); got != MinPatience {
		t.Errorf("Patience(1s) = %v, want the floor %v", got, MinPatience)
	}
	if got := Patience(time.Minute); got != 4*time.Minute {
		t.Errorf("Patience(1m) = %v, want 4m", got)
	}
	t.Setenv("CUESCHED_TEST_PATIENCE", "10")
	if got := Patience(time.Minute); got != 10*time.Minute {
		t.Errorf("with CUESCHED_TEST_PATIENCE=10, Patience(1m) = %v, want 10m", got)
	}
	t.Setenv("CUESCHED_TEST_PATIENCE", "0.5")
	if got := Patience(time.Minute); got != 4*time.Minute {
		t.Errorf("a factor below 1 must be ignored: Patience(1m) = %v", got)
	}
}

// A port another process bound between FreePort and the server's own bind is
// given up for another: whether the clash shows as our server failing to
// bind, or as the other server answering on it, never as a test connected
// to someone else's server.
func TestPortTakenIsRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	other := RedisServer(t)
	r, err := StartRedis(ctx, RedisOptions{Databases: 16, takenPorts: []int{other.Port(), other.Port()}})
	if err != nil {
		t.Fatalf("redis: %v", err)
	}
	defer r.Stop()
	if r.Port() == other.Port() {
		t.Fatalf("redis started on the taken port %d", r.Port())
	}
	if pid, err := redisPID(r.Addr()); err != nil || pid != r.cmd.Process.Pid {
		t.Fatalf("redis on %s answers for pid %d (%v), want ours %d", r.Addr(), pid, err, r.cmd.Process.Pid)
	}

	otherPG := PG(t)
	p, err := StartPostgres(ctx, PostgresOptions{takenPorts: []int{otherPG.Port(), otherPG.Port()}})
	if err != nil {
		t.Fatalf("postgres: %v", err)
	}
	defer p.Stop()
	if p.Port() == otherPG.Port() {
		t.Fatalf("postgres started on the taken port %d", p.Port())
	}
	conn, err := pgx.Connect(ctx, p.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		t.Fatal(err)
	}
	if dataDir != p.dataDir() {
		t.Fatalf("postgres on %d is %s, want ours %s", p.Port(), dataDir, p.dataDir())
	}
}

// The same for a Sentinel: a port held by a listener that is not a server
// (the Sentinel fails to bind) and one held by another Redis (which would
// answer in its place) are given up for a free one.
func TestSentinelPortTakenIsRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	other := RedisServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := ln.Addr().(*net.TCPAddr).Port
	s, err := StartSentinel(ctx, SentinelProcOptions{Dir: filepath.Join(t.TempDir(), "s"), Conf: "requirepass pw\n", Password: "pw",
		takenPorts: []int{held, other.Port()}})
	if err != nil {
		t.Fatalf("sentinel: %v", err)
	}
	defer s.Stop()
	if s.Port() == held || s.Port() == other.Port() {
		t.Fatalf("sentinel started on a taken port %d", s.Port())
	}
	if pid, err := s.pid(ctx, "pw"); err != nil || pid != s.cmd.Process.Pid {
		t.Fatalf("sentinel on %s answers for pid %d (%v), want ours %d", s.Addr(), pid, err, s.cmd.Process.Pid)
	}
}
