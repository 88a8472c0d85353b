package accounting

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
)

// ErrNotLeader is returned by a fence check when this instance no longer
// holds the loop lock: the loop must stop before its next write.
var ErrNotLeader = errors.New("accounting: not the loop leader (advisory lock lost)")

// DefaultLockKey is the advisory lock of the accounting loops ("cueschac").
const DefaultLockKey int64 = 0x6375657363686163

// leader elects one instance to run the loops with a PostgreSQL session
// advisory lock held on a dedicated connection (not a pooled one: a pool
// would hand the session, and the lock, to someone else).
type leader struct {
	cfg  *pgx.ConnConfig
	key  int64
	poll time.Duration
	log  hclog.Logger

	mu   sync.Mutex // guards conn (pgx.Conn is not safe for concurrent use)
	conn *pgx.Conn
	held bool
}

// campaign blocks until ctx is done. Whenever it acquires the lock it calls
// lead with a context that is cancelled as soon as the lock is lost (the
// session died, or a fence check failed), and waits for lead to return
// before campaigning again.
func (l *leader) campaign(ctx context.Context, lead func(ctx context.Context)) {
	defer l.close()
	for ctx.Err() == nil {
		ok, err := l.tryAcquire(ctx)
		if err != nil {
			l.log.Warn("loop lock: attempt failed", "error", err)
		}
		if !ok {
			sleep(ctx, l.poll)
			continue
		}
		l.log.Info("loop lock acquired: this instance runs recompute and limit reseed")
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			lead(lctx)
		}()
		// Watchdog: the session must stay alive and keep the lock.
		t := time.NewTicker(l.poll)
	watch:
		for {
			select {
			case <-done:
				break watch
			case <-t.C:
				if err := l.fence(lctx); err != nil {
					l.log.Warn("loop lock lost: stopping the loops", "error", err)
					cancel()
				}
			}
		}
		t.Stop()
		cancel()
		l.release(ctx)
	}
}

func (l *leader) tryAcquire(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil || l.conn.IsClosed() {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.ConnectConfig(cctx, l.cfg)
		cancel()
		if err != nil {
			return false, fmt.Errorf("connect: %w", err)
		}
		l.conn = conn
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var ok bool
	if err := l.conn.QueryRow(qctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&ok); err != nil {
		_ = l.conn.Close(context.Background())
		l.conn = nil
		return false, err
	}
	l.held = ok
	return ok, nil
}

// fence checks, on the lock's own connection, that its session is alive and
// still holds the lock. Every write batch of the loops is preceded by one:
// if the session died, Postgres has already released the lock and another
// instance may be leading.
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

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
