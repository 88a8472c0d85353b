package accounting

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// The lock tests poll every 100 ms with a 1 s idle_session_timeout: ten
// polls of headroom for a healthy session on a loaded 2-core VM under -race.
const (
	testPoll = 100 * time.Millisecond
	testIdle = time.Second
)

// logBuf collects a logger's lines (and echoes them with -v).
type logBuf struct {
	t  *testing.T
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *logBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if testing.Verbose() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return w.b.Write(p)
}

// lines returns the lines at level ("WARN", "INFO") containing substr.
func (w *logBuf) lines(level, substr string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, l := range strings.Split(w.b.String(), "\n") {
		if strings.Contains(l, "["+level+"]") && strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// lockDB is a database for lock tests with a pool to look at the server.
type lockDB struct {
	t    *testing.T
	url  string
	pool *pgxpool.Pool
}

func newLockDB(t *testing.T) *lockDB {
	t.Helper()
	url := testenv.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &lockDB{t: t, url: url, pool: pool}
}

// holder is the backend pid holding the loop lock (0: nobody).
func (db *lockDB) holder() uint32 {
	db.t.Helper()
	var pid int64
	err := db.pool.QueryRow(context.Background(), `SELECT coalesce(max(pid), 0) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&pid)
	if err != nil {
		db.t.Fatal(err)
	}
	return uint32(pid)
}

// alive reports whether the server still has the backend.
func (db *lockDB) alive(pid uint32) bool {
	db.t.Helper()
	var n int64
	if err := db.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int`, int64(pid)).Scan(&n); err != nil {
		db.t.Fatal(err)
	}
	return n == 1
}

// testLeader is one campaigning instance: its leader, its log and its terms.
type testLeader struct {
	*leader
	log     *logBuf
	terms   atomic.Int64
	leading atomic.Bool
	stop    func()
}

// newTestLeader builds a leader on db with the test intervals; param
// overrides the idle-timeout setting's name when not "".
func (db *lockDB) newTestLeader(name, param string) *testLeader {
	db.t.Helper()
	cfg, err := pgx.ParseConfig(db.url)
	if err != nil {
		db.t.Fatal(err)
	}
	lb := &logBuf{t: db.t}
	log := hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug, Output: lb})
	tl := &testLeader{log: lb, leader: newLeader(cfg, DefaultLockKey, testPoll, sessionTimeout(testPoll, testIdle), log)}
	if param != "" {
		tl.param = param
	}
	return tl
}

// run campaigns until stop (or the test's end).
func (tl *testLeader) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tl.campaign(ctx, func(ctx context.Context) {
			tl.terms.Add(1)
			tl.leading.Store(true)
			<-ctx.Done()
			tl.leading.Store(false)
		})
	}()
	var once sync.Once
	tl.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(tl.stop)
}

// pid is the backend pid of the lock session (0: none).
func (tl *testLeader) pid() uint32 {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.conn == nil || tl.conn.IsClosed() {
		return 0
	}
	return tl.conn.PgConn().PID()
}

// freeze stalls everything that talks on the lock session (the watchdog,
// campaign attempts, fences): the session goes silent exactly as a
// SIGSTOPped process's does, while its TCP connection stays up. thaw undoes
// it.
func (tl *testLeader) freeze() { tl.mu.Lock() }
func (tl *testLeader) thaw()   { tl.mu.Unlock() }

// show runs SHOW on the lock session.
func (tl *testLeader) show(t *testing.T, param string) string {
	t.Helper()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.conn == nil {
		t.Fatal("no lock session")
	}
	var v string
	if err := tl.conn.QueryRow(context.Background(), "SHOW "+param).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSessionTimeoutDefaults(t *testing.T) {
	for _, c := range []struct{ poll, set, want time.Duration }{
		{time.Second, 0, 5 * time.Second},                      // 5 polls
		{200 * time.Millisecond, 0, 3 * time.Second},           // the 3 s floor
		{50 * time.Millisecond, 0, 3 * time.Second},            // the 3 s floor
		{time.Second, 10 * time.Second, 10 * time.Second},      // configured
		{time.Second, 2 * time.Second, 3 * time.Second},        // never below 3 polls
		{100 * time.Millisecond, time.Second, 1 * time.Second}, // the 3 s floor is the default's only
	} {
		if got := sessionTimeout(c.poll, c.set); got != c.want {
			t.Errorf("sessionTimeout(poll %v, configured %v) = %v, want %v", c.poll, c.set, got, c.want)
		}
	}
	cfg := Config{LeaderPollInterval: 2 * time.Second}
	cfg.defaults()
	if cfg.LeaderSessionTimeout != 10*time.Second {
		t.Errorf("Config default LeaderSessionTimeout = %v with a 2 s poll, want 10 s", cfg.LeaderSessionTimeout)
	}
}

// TestFrozenLeaderLosesLockToFollower: the leader's lock session goes
// silent (a stalled process) while its connection stays open. The server
// ends the session after idle_session_timeout, which releases the lock, and
// the follower takes it within a few polls of that. When the old leader
// resumes, its first fence fails and its term ends; it does not lead again
// while the new leader holds the lock.
func TestFrozenLeaderLosesLockToFollower(t *testing.T) {
	t.Parallel()
	db := newLockDB(t)
	l1, l2 := db.newTestLeader("one", ""), db.newTestLeader("two", "")
	l1.run(t)
	eventually(t, 5*time.Second, "first leader", l1.leading.Load)
	l2.run(t)
	eventually(t, 5*time.Second, "follower session", func() bool { return l2.pid() != 0 })
	if got := l1.show(t, "idle_session_timeout"); got != "1s" {
		t.Fatalf("lock session idle_session_timeout = %q, want 1s", got)
	}
	pid1 := l1.pid()
	if h := db.holder(); h != pid1 {
		t.Fatalf("lock held by backend %d, want the leader's %d", h, pid1)
	}
	time.Sleep(3 * testPoll)
	if l2.leading.Load() {
		t.Fatal("two leaders")
	}

	l1.freeze()
	frozen := time.Now()
	took := eventually(t, testIdle+20*testPoll, "the follower takes the lock of the frozen leader", l2.leading.Load)
	// The session was silent for at most one poll before the freeze, so the
	// server cannot have released the lock much before the timeout: it was
	// idle_session_timeout, not anything else, that freed it.
	if took < testIdle-2*testPoll {
		t.Errorf("the lock moved %v after the freeze, before the %v idle timeout could end the session", took, testIdle)
	}
	if db.alive(pid1) {
		t.Errorf("the frozen leader's backend %d is still on the server", pid1)
	}
	if h, p2 := db.holder(), l2.pid(); h != p2 || h == 0 {
		t.Errorf("lock held by backend %d, want the new leader's %d", h, p2)
	}
	t.Logf("lock moved %v after the freeze (idle_session_timeout %v, poll %v)", took.Round(time.Millisecond), testIdle, testPoll)
	if !l1.leading.Load() {
		t.Fatal("the frozen leader's term ended while it was frozen (nothing ran)")
	}

	time.Sleep(testPoll)
	l1.thaw()
	thawed := time.Now()
	// The watchdog was stuck in (or about to start) a fence; its first
	// check after the thaw fails and cancels the term.
	eventually(t, 2*time.Second, "the thawed leader's term ends", func() bool { return !l1.leading.Load() })
	t.Logf("the thawed leader's term ended %v after it resumed", time.Since(thawed).Round(time.Millisecond))
	if err := l1.fence(context.Background()); !errors.Is(err, ErrNotLeader) {
		t.Errorf("thawed leader's fence: %v, want ErrNotLeader", err)
	}
	if w := l1.log.lines("WARN", "loop lock lost"); len(w) != 1 {
		t.Errorf("thawed leader logged %d lock-lost warnings, want 1: %q", len(w), w)
	}
	// It campaigns again, as a follower.
	eventually(t, 2*time.Second, "the thawed instance campaigns again", func() bool { return l1.pid() != 0 })
	deadline := time.Now().Add(5 * testPoll)
	for time.Now().Before(deadline) {
		if l1.leading.Load() || !l2.leading.Load() {
			t.Fatalf("after the thaw: old leader leading %v, new leader leading %v", l1.leading.Load(), l2.leading.Load())
		}
		time.Sleep(testPoll / 4)
	}
	if n := l1.terms.Load(); n != 1 {
		t.Errorf("old leader ran %d terms, want 1", n)
	}
	t.Logf("frozen %v in all", thawed.Sub(frozen).Round(time.Millisecond))
}

// TestHealthyInstancesKeepTheirSessions: for five idle timeouts' worth of
// time, the leader keeps its lock on one session, and the follower's
// session is never ended by the server either (its attempts every poll
// keep it busy): no term change, no reconnect, no warning.
func TestHealthyInstancesKeepTheirSessions(t *testing.T) {
	t.Parallel()
	db := newLockDB(t)
	l1, l2 := db.newTestLeader("one", ""), db.newTestLeader("two", "")
	l1.run(t)
	eventually(t, 5*time.Second, "leader", l1.leading.Load)
	l2.run(t)
	eventually(t, 5*time.Second, "follower session", func() bool { return l2.pid() != 0 })
	for _, l := range []*testLeader{l1, l2} {
		if got := l.show(t, "idle_session_timeout"); got != "1s" {
			t.Fatalf("lock session idle_session_timeout = %q, want 1s", got)
		}
	}
	pid1, pid2 := l1.pid(), l2.pid()
	end := time.Now().Add(5 * testIdle)
	for time.Now().Before(end) {
		if h := db.holder(); h != pid1 {
			t.Fatalf("lock held by backend %d, want the leader's %d", h, pid1)
		}
		if !l1.leading.Load() || l2.leading.Load() {
			t.Fatalf("leader leading %v, follower leading %v", l1.leading.Load(), l2.leading.Load())
		}
		time.Sleep(testPoll)
	}
	if p1, p2 := l1.pid(), l2.pid(); p1 != pid1 || p2 != pid2 || !db.alive(pid1) || !db.alive(pid2) {
		t.Errorf("lock sessions changed: leader %d -> %d, follower %d -> %d", pid1, p1, pid2, p2)
	}
	if n := l1.terms.Load(); n != 1 {
		t.Errorf("leader ran %d terms, want 1", n)
	}
	for _, l := range []*testLeader{l1, l2} {
		if w := l.log.lines("WARN", ""); len(w) > 0 {
			t.Errorf("warnings: %q", w)
		}
		if w := append(l.log.lines("INFO", "reconnecting"), l.log.lines("DEBUG", "reconnecting")...); len(w) > 0 {
			t.Errorf("reconnects: %q", w)
		}
	}
}

// TestFrozenFollowerReconnectsQuietly: a follower stalled past the idle
// timeout loses its (lockless) session; when it resumes it reconnects in the
// same attempt with one Info line, no warning, and still takes the lock
// over when the leader goes.
func TestFrozenFollowerReconnectsQuietly(t *testing.T) {
	t.Parallel()
	db := newLockDB(t)
	l1, l2 := db.newTestLeader("one", ""), db.newTestLeader("two", "")
	l1.run(t)
	eventually(t, 5*time.Second, "leader", l1.leading.Load)
	l2.run(t)
	eventually(t, 5*time.Second, "follower session", func() bool { return l2.pid() != 0 })
	pid2 := l2.pid()
	l2.freeze()
	deadline := time.Now().Add(testenv.Patience(testIdle + 20*testPoll))
	for db.alive(pid2) {
		if time.Now().After(deadline) {
			l2.thaw()
			t.Fatalf("the server kept the frozen follower's idle session %d", pid2)
		}
		time.Sleep(testPoll / 2)
	}
	l2.thaw()
	eventually(t, 2*time.Second, "the follower reconnects", func() bool { p := l2.pid(); return p != 0 && p != pid2 })
	time.Sleep(5 * testPoll)
	if w := l2.log.lines("WARN", ""); len(w) > 0 {
		t.Errorf("the follower warned about its ended session: %q", w)
	}
	// Info when the driver saw the server's idle-session FATAL, Debug when
	// it only saw the closed socket: one line either way.
	if w := append(l2.log.lines("INFO", "reconnecting"), l2.log.lines("DEBUG", "reconnecting")...); len(w) != 1 {
		t.Errorf("want one line about the reconnect, got %q", w)
	}
	if l2.leading.Load() || !l1.leading.Load() {
		t.Fatal("the follower's reconnect moved the lock")
	}
	l1.stop()
	took := eventually(t, 2*time.Second, "failover to the reconnected follower", l2.leading.Load)
	t.Logf("failover %v after the leader stopped", took.Round(time.Millisecond))
}

// TestLockSessionWithoutIdleTimeout: on a server that does not know the
// setting (PostgreSQL < 14, played here by an unknown setting name) the
// leader warns once, leads without it, and keeps working across a lost
// session and a new term without warning again.
func TestLockSessionWithoutIdleTimeout(t *testing.T) {
	t.Parallel()
	db := newLockDB(t)
	l := db.newTestLeader("old-server", "cuesched_no_such_setting")
	l.run(t)
	eventually(t, 5*time.Second, "leader", l.leading.Load)
	if got := l.show(t, "idle_session_timeout"); got != "0" {
		t.Errorf("idle_session_timeout = %q on the lock session, want it left unset", got)
	}
	if got := l.show(t, "tcp_keepalives_count"); got != "3" && got != "0" { // 0: a Unix socket
		t.Errorf("tcp_keepalives_count = %q, want 3", got)
	}
	pid := l.pid()
	if _, err := db.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1::int)`, int64(pid)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a new term on a new session", func() bool {
		p := l.pid()
		return l.terms.Load() == 2 && l.leading.Load() && p != 0 && p != pid && db.holder() == p
	})
	w := l.log.lines("WARN", "cuesched_no_such_setting")
	if len(w) != 1 || !strings.Contains(w[0], "PostgreSQL < 14") {
		t.Errorf("want exactly one warning about the missing setting, got %q", w)
	}
}

// TestFrozenLeaderRedisRestart: the in-process version of the fault suite's
// frozen-leader test. The leader stalls (its lock session silent) and Redis
// loses everything meanwhile: the other instance takes the lock after the
// idle timeout and re-bootstraps, so booking resumes while the old leader is
// still frozen. The thawed leader, which had found Redis empty too and was
// held at the fence before its first bootstrap write, writes nothing: the
// new epoch stays, and the counters end exact.
func TestFrozenLeaderRedisRestart(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: -1, hosts: 1})
	for i := 0; i < 5; i++ {
		sh.mustInsertProc(fmt.Sprintf("p%d", i), 0, 100, 0)
	}
	cfg := Config{LeaderPollInterval: testPoll, LeaderSessionTimeout: testIdle, ManagedPollInterval: 50 * time.Millisecond,
		EpochPollInterval: 50 * time.Millisecond, RecomputeInterval: 200 * time.Millisecond}
	s1, _ := f.service(cfg)
	s2, _ := f.secondService(cfg)
	runService(t, s1)
	eventually(t, 5*time.Second, "first leader", s1.IsLeader)
	runService(t, s2)
	for _, s := range []*Service{s1, s2} {
		if err := s.WaitReady(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	epoch0, _ := f.pub.Epoch(f.ctx)

	s1.ld.mu.Lock() // freeze its lock session (and so its fences)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			s1.ld.mu.Unlock()
		}
	}
	defer thaw()
	if err := f.rdb.FlushDB(f.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	var epoch1 string
	eventually(t, testIdle+30*testPoll, "re-bootstrap while the old leader is frozen", func() bool {
		epoch1, _ = f.pub.Epoch(f.ctx)
		return epoch1 != ""
	})
	resumed := time.Since(flushed)
	if epoch1 == epoch0 || !s2.IsLeader() {
		t.Fatalf("epoch %q (before the flush %q), new leader %v", epoch1, epoch0, s2.IsLeader())
	}
	if _, err := f.pub.Book(f.ctx, sh.booking("after", 0, 100)); err != nil {
		t.Fatalf("booking after the re-bootstrap: %v", err)
	}
	sh.mustInsertProc("after", 0, 100, 0)
	thaw()
	eventually(t, 2*time.Second, "the thawed leader steps down", func() bool { return !s1.IsLeader() })
	time.Sleep(5 * testPoll)
	if ep, _ := f.pub.Epoch(f.ctx); ep != epoch1 {
		t.Errorf("acct:epoch changed after the thaw: %q, want the new leader's %q", ep, epoch1)
	}
	if s1.IsLeader() || !s2.IsLeader() {
		t.Errorf("after the thaw: old leader %v, new leader %v", s1.IsLeader(), s2.IsLeader())
	}
	if got := sh.subCores(); got != 6 {
		t.Errorf("subscription int_cores = %d, want 6", got)
	}
	f.requireNoDrift()
	t.Logf("booking resumed %v after the flush (idle_session_timeout %v, poll %v)", resumed.Round(time.Millisecond), testIdle, testPoll)
}
