package accounting

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cuesched/cuesched/shared/pause"
)

// ErrNotLeader is returned by a fence check when this instance no longer
// holds the loop lock: the loop must stop before its next write.
var ErrNotLeader = errors.New("accounting: not the loop leader (advisory lock lost)")

// DefaultLockKey is the advisory lock of the accounting loops ("cueschac").
const DefaultLockKey int64 = 0x6375657363686163

// idleSessionTimeoutParam is the server setting (PostgreSQL 14+) that ends a
// session idle for longer than its value.
const idleSessionTimeoutParam = "idle_session_timeout"

// SQLSTATEs the lock session handles.
const (
	sqlstateUndefinedObject    = "42704" // unrecognized configuration parameter
	sqlstateIdleSessionTimeout = "57P05"
)

// sessionTimeout is LeaderSessionTimeout's default for a poll interval:
// max(5 × poll, 3 s), and never below 3 × poll.
func sessionTimeout(poll, configured time.Duration) time.Duration {
	d := configured
	if d <= 0 {
		d = max(5*poll, 3*time.Second)
	}
	return max(d, 3*poll)
}

// leader elects one instance to run the loops with a PostgreSQL session
// advisory lock held on a dedicated connection (not a pooled one: a pool
// would hand the session, and the lock, to someone else).
//
// The lock session carries idle_session_timeout (idle): the server ends it,
// and so releases the lock, once the client has sent nothing for that long. A
// healthy instance never leaves it that idle (a follower tries the lock and
// the leader's watchdog fences every poll), so only a stalled process
// (SIGSTOP, a frozen VM, a swap storm) or a silent network loses it.
type leader struct {
	cfg  *pgx.ConnConfig
	key  int64
	poll time.Duration
	idle time.Duration
	log  hclog.Logger
	// param is the server setting given idle; idleSessionTimeoutParam
	// (tests name an unknown one to play a server older than 14).
	param string

	mu         sync.Mutex // guards the fields below (pgx.Conn is not safe for concurrent use)
	conn       *pgx.Conn
	held       bool
	warnedIdle bool // the server lacks param: warned once
}

func newLeader(cfg *pgx.ConnConfig, key int64, poll, idle time.Duration, log hclog.Logger) *leader {
	return &leader{cfg: cfg, key: key, poll: poll, idle: idle, log: log, param: idleSessionTimeoutParam}
}

// campaign blocks until ctx is done. Whenever it acquires the lock it calls
// lead with a context that is cancelled as soon as the lock is lost (the
// session died, or a fence check failed), and waits for lead to return
// before campaigning again.
func (l *leader) campaign(ctx context.Context, lead func(ctx context.Context)) {
	defer l.close()
	for ctx.Err() == nil {
		ok, err := l.tryAcquire(ctx)
		if err != nil && ctx.Err() == nil {
			l.log.Warn("loop lock: attempt failed", "error", err)
		}
		if !ok {
			_ = pause.For(ctx, l.poll)
			continue
		}
		l.log.Info("loop lock acquired: this instance runs recompute and limit reseed")
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			lead(lctx)
		}()
		// Watchdog: the session must stay alive and keep the lock. Its
		// fences are also what keeps the session from reaching its idle
		// timeout while the loops have nothing to write.
		t := time.NewTicker(l.poll)
	watch:
		for {
			select {
			case <-done:
				break watch
			case <-t.C:
				if lctx.Err() != nil {
					continue // lost: waiting for the loops to return
				}
				if err := l.fence(lctx); err != nil {
					if ctx.Err() == nil {
						l.log.Warn("loop lock lost: stopping the loops", "error", err)
					}
					cancel()
				}
			}
		}
		t.Stop()
		cancel()
		l.release(ctx)
	}
}

// tryAcquire tries the lock once. A reused connection that turns out dead
// (the server ended it: this process was stalled past the idle timeout, or
// the server restarted) is replaced at once and the attempt made on the new
// one, so that event costs one Info line, not a warning per poll.
func (l *leader) tryAcquire(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for retried := false; ; retried = true {
		fresh := false
		if l.conn == nil || l.conn.IsClosed() {
			if err := l.connect(ctx); err != nil {
				return false, err
			}
			fresh = true
		}
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var ok bool
		err := l.conn.QueryRow(qctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&ok)
		cancel()
		if err == nil {
			l.held = ok
			return ok, nil
		}
		_ = l.conn.Close(context.Background())
		l.conn = nil
		if fresh || retried || ctx.Err() != nil {
			return false, err
		}
		if isIdleTimeout(err) {
			l.log.Info("loop lock: the server ended the idle lock session (this process stalled?); reconnecting", "idle_session_timeout", l.idle)
		} else {
			l.log.Debug("loop lock: the lock session is gone; reconnecting", "error", err)
		}
	}
}

// connect opens the lock session and gives it its liveness settings.
// Called with mu held.
func (l *leader) connect(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, l.cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if err := l.configure(cctx, conn); err != nil {
		_ = conn.Close(context.Background())
		return err
	}
	l.conn = conn
	return nil
}

// configure sets idle_session_timeout on the lock session; on a server that
// does not know it (PostgreSQL < 14) it warns once and carries on without:
// the lock then outlives a stalled process as long as its TCP session. It
// also sets the server's TCP keepalives on the session, which end it when
// the client's host is gone or the network drops everything (they cannot
// see a stopped process, whose kernel still answers): that is the only
// liveness check left without idle_session_timeout, and a harmless second
// one with it (keepalives only probe a session that is silent, and an idle
// lock session has already been ended by then).
func (l *leader) configure(ctx context.Context, conn *pgx.Conn) error {
	ms := strconv.FormatInt(l.idle.Milliseconds(), 10)
	if _, err := conn.Exec(ctx, `SELECT set_config($1, $2, false)`, l.param, ms); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != sqlstateUndefinedObject {
			return fmt.Errorf("set %s: %w", l.param, err)
		}
		if !l.warnedIdle {
			l.warnedIdle = true
			l.log.Warn("loop lock: the server has no "+l.param+" (PostgreSQL < 14): a stalled leader (SIGSTOP, frozen VM) "+
				"keeps the lock until it resumes, and a Redis restart meanwhile pauses booking until then; upgrade to PostgreSQL 14+",
				"server_version", conn.PgConn().ParameterStatus("server_version"))
		}
	}
	secs := func(d time.Duration) string { return strconv.FormatInt(max(int64(math.Ceil(d.Seconds())), 1), 10) }
	if _, err := conn.Exec(ctx, `SELECT set_config('tcp_keepalives_idle', $1, false),
		set_config('tcp_keepalives_interval', $2, false), set_config('tcp_keepalives_count', '3', false)`,
		secs(l.idle), secs(l.poll)); err != nil {
		l.log.Debug("loop lock: could not set TCP keepalives on the lock session", "error", err)
		if conn.IsClosed() {
			return fmt.Errorf("set tcp_keepalives: %w", err)
		}
	}
	return nil
}

func isIdleTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlstateIdleSessionTimeout
}

// fence checks, on the lock's own connection, that its session is alive and
// still holds the lock. Every write batch of the loops is preceded by one:
// if the session died (killed, or ended by the server after idle_session_
// timeout because this process stalled), Postgres has already released the
// lock and another instance may be leading.
func (l *leader) fence(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held || l.conn == nil || l.conn.IsClosed() {
		return ErrNotLeader
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var n int
	err := l.conn.QueryRow(qctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
		  AND classid = (($1::bigint >> 32) & 4294967295)::bigint::oid AND objid = ($1::bigint & 4294967295)::bigint::oid AND objsubid = 1`, l.key).Scan(&n)
	if err != nil {
		l.held = false
		_ = l.conn.Close(context.Background())
		l.conn = nil
		if isIdleTimeout(err) {
			return fmt.Errorf("%w: the server ended the lock session after %s idle (this process stalled?): %v", ErrNotLeader, l.idle, err)
		}
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	if n == 0 {
		l.held = false
		return ErrNotLeader
	}
	return nil
}

// release gives the lock up if the session is still alive.
func (l *leader) release(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return
	}
	l.held = false
	if l.conn == nil || l.conn.IsClosed() {
		return
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, err := l.conn.Exec(qctx, `SELECT pg_advisory_unlock($1)`, l.key); err != nil {
		_ = l.conn.Close(context.Background())
		l.conn = nil
	}
}

func (l *leader) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = false
	if l.conn != nil {
		// Closing the session releases the lock at once.
		_ = l.conn.Close(context.Background())
		l.conn = nil
	}
}
