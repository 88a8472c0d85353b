// Package testenv starts real, throwaway PostgreSQL and Redis servers for
// tests, benchmarks and the demo, so that nothing in this module is tested
// against a mock of either.
//
// One PostgreSQL cluster (wal_level=logical, pg_stat_statements loaded) and one
// redis-server are started lazily per test binary, the first time a test asks
// for them, and torn down by Main. Each test then gets its own database
// (NewDatabase, optionally cloned from a template such as the Cuebot baseline
// schema) and its own Redis logical DB (NewRedisDB), so tests can run in
// parallel. Set CUESCHED_TEST_PG_URL and/or CUESCHED_TEST_REDIS_URL to use
// existing servers instead.
//
// Teardown: servers are stopped on normal exit and on SIGINT/SIGTERM; their
// processes carry a parent-death signal so a killed test binary does not leave
// them behind; temp dirs left by a killed binary are swept by the next run.
package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Env is the set of servers shared by one test binary.
type Env struct {
	pgOnce  sync.Once
	pg      *Postgres
	pgErr   error
	rdOnce  sync.Once
	rd      *Redis
	rdErr   error
	dbSeq   atomic.Int64
	redisDB atomic.Int64

	tmplMu sync.Mutex
	tmpls  map[string]*templateState
}

type templateState struct {
	once sync.Once
	err  error
	name string
}

// The process-wide environment used by Main and the helpers below. It is
// process state by nature (one set of servers per test binary).
var shared = &Env{tmpls: map[string]*templateState{}}

// Main runs a package's tests with a shared environment and tears it down
// afterwards, also on SIGINT/SIGTERM. Use it as: func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		shared.Close()
		fmt.Fprintf(os.Stderr, "testenv: %v: servers stopped\n", s)
		os.Exit(130)
	}()
	code := m.Run()
	shared.Close()
	os.Exit(code)
}

// Close stops the servers this Env started.
func (e *Env) Close() {
	if e.pg != nil {
		e.pg.Stop()
	}
	if e.rd != nil {
		e.rd.Stop()
	}
}

// Shared returns the process-wide environment (for benchmarks and the demo,
// which manage their own lifetime and must call Close).
func Shared() *Env { return shared }

// NewEnv returns an empty environment whose servers start on first use (the
// demo owns one; call Close when done).
func NewEnv() *Env { return &Env{tmpls: map[string]*templateState{}} }

// Postgres returns the environment's cluster, starting it on first use.
func (e *Env) Postgres(ctx context.Context) (*Postgres, error) {
	e.pgOnce.Do(func() {
		if url := os.Getenv("CUESCHED_TEST_PG_URL"); url != "" {
			e.pg = ExternalPostgres(url)
			return
		}
		sweepStaleDirs()
		e.pg, e.pgErr = StartPostgres(ctx, PostgresOptions{})
	})
	return e.pg, e.pgErr
}

// Redis returns the environment's redis-server, starting it on first use.
func (e *Env) Redis(ctx context.Context) (*Redis, error) {
	e.rdOnce.Do(func() {
		if url := os.Getenv("CUESCHED_TEST_REDIS_URL"); url != "" {
			n, _ := strconv.Atoi(os.Getenv("CUESCHED_TEST_REDIS_DATABASES"))
			e.rd = ExternalRedis(url, n)
			return
		}
		sweepStaleDirs()
		e.rd, e.rdErr = StartRedis(ctx, RedisOptions{})
	})
	return e.rd, e.rdErr
}

// PG returns the shared cluster for a test, failing the test if it cannot start.
func PG(t testing.TB) *Postgres {
	t.Helper()
	p, err := shared.Postgres(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}

// RedisServer returns the shared redis-server for a test.
func RedisServer(t testing.TB) *Redis {
	t.Helper()
	r, err := shared.Redis(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return r
}

// DBOption configures NewDatabase.
type DBOption func(*dbOptions)

type dbOptions struct {
	template string
	setup    func(ctx context.Context, url string) error
}

// WithTemplate clones the database from a template built once per test binary
// by setup (which must close its connections before returning). Templates are
// keyed by name: use a new name when setup changes meaning.
func WithTemplate(name string, setup func(ctx context.Context, url string) error) DBOption {
	return func(o *dbOptions) { o.template, o.setup = name, setup }
}

// NewDatabase creates a database for this test and drops it at cleanup. It
// returns its connection URL.
func NewDatabase(t testing.TB, opts ...DBOption) string {
	t.Helper()
	url, err := shared.NewDatabase(context.Background(), t.Name(), opts...)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	name := databaseName(url)
	t.Cleanup(func() {
		if err := shared.pg.DropDatabase(context.Background(), name); err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
		}
	})
	return url
}

// NewDatabase creates a uniquely named database; label is folded into the
// name to make logs readable.
func (e *Env) NewDatabase(ctx context.Context, label string, opts ...DBOption) (string, error) {
	var o dbOptions
	for _, f := range opts {
		f(&o)
	}
	pg, err := e.Postgres(ctx)
	if err != nil {
		return "", err
	}
	tmpl := ""
	if o.template != "" {
		tmpl, err = e.template(ctx, pg, o.template, o.setup)
		if err != nil {
			return "", err
		}
	}
	name := fmt.Sprintf("t%d_%d_%s", os.Getpid(), e.dbSeq.Add(1), sanitize(label))
	if len(name) > 60 {
		name = name[:60]
	}
	if err := pg.CreateDatabase(ctx, name, tmpl); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return pg.URL(name), nil
}

func (e *Env) template(ctx context.Context, pg *Postgres, name string, setup func(context.Context, string) error) (string, error) {
	e.tmplMu.Lock()
	st, ok := e.tmpls[name]
	if !ok {
		st = &templateState{name: fmt.Sprintf("tmpl%d_%s", os.Getpid(), sanitize(name))}
		e.tmpls[name] = st
	}
	e.tmplMu.Unlock()
	st.once.Do(func() {
		if err := pg.CreateDatabase(ctx, st.name, ""); err != nil {
			st.err = fmt.Errorf("create template %s: %w", st.name, err)
			return
		}
		if setup != nil {
			if err := setup(ctx, pg.URL(st.name)); err != nil {
				st.err = fmt.Errorf("set up template %s: %w", name, err)
				return
			}
		}
	})
	return st.name, st.err
}

// NewRedisDB returns a redis:// URL for a logical DB of the shared server that
// no other test of this binary uses, flushed before use.
func NewRedisDB(t testing.TB) string {
	t.Helper()
	r := RedisServer(t)
	n := shared.redisDB.Add(1)
	db := int(n % int64(r.Databases()))
	if r.external {
		// Spread across binaries sharing one external server.
		db = int((int64(os.Getpid())*31 + n) % int64(r.Databases()))
	}
	url := r.URL(db)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.FlushDB(context.Background()).Err(); err != nil {
		t.Fatalf("testenv: flush redis db %d: %v", db, err)
	}
	return url
}

// FreePort asks the kernel for an unused TCP port on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

const tempPrefix = "cuesched-testenv-"

// makeTempDir creates a temp dir marked with our pid so a later run can sweep
// it if we are killed before cleanup.
func makeTempDir(kind string) (string, error) {
	dir, err := os.MkdirTemp("", tempPrefix+kind+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	// Write the pid file atomically so a concurrent sweep never reads it
	// half-written.
	tmp := filepath.Join(dir, ".owner.pid.tmp")
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "owner.pid")); err != nil {
		return "", err
	}
	return dir, nil
}

// sweepStaleDirs removes temp dirs whose owning process is gone.
func sweepStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			// Being created right now, or left by something else: only
			// remove it once it is clearly abandoned.
			if fi, err := os.Stat(d); err == nil && time.Since(fi.ModTime()) > time.Hour {
				_ = os.RemoveAll(d)
			}
			continue
		}
		if syscall.Kill(pid, 0) == nil {
			continue // owner alive
		}
		_ = os.RemoveAll(d)
	}
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

func databaseName(url string) string {
	u := url
	if i := strings.IndexByte(u, '?'); i >= 0 {
		u = u[:i]
	}
	return u[strings.LastIndexByte(u, '/')+1:]
}
