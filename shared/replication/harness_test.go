package replication

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var slotSeq atomic.Int64

// uniqueSlot returns a slot name no other test of any concurrently running
// binary uses (slot names are cluster-global).
func uniqueSlot(t testing.TB) string {
	return fmt.Sprintf("t_%d_%d_%d", time.Now().UnixNano()%1e9, slotSeq.Add(1), len(t.Name()))
}

// testDB creates a fresh database, runs ddl in it and returns its URL and a pool.
func testDB(t *testing.T, ddl ...string) (string, *pgxpool.Pool) {
	t.Helper()
	url := testenv.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, q := range ddl {
		if _, err := pool.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Slots are cluster objects: drop ours so the database can be dropped.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active`)
			if err == nil {
				_, err = pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active`)
			}
			var n int
			if err == nil {
				err = pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&n)
			}
			if err == nil && n == 0 {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return url, pool
}

// recorder is a test Consumer that records everything it is given.
type recorder struct {
	snapshotSQL string

	mu         sync.Mutex
	snapshots  int
	snapRows   [][]Row // per snapshot
	snapTxnIdx []int   // len(txns) when each snapshot was taken
	txns       []*Transaction
	heartbeats []Heartbeat
	resumes    []SlotInfo
	changed    chan struct{}

	// hooks (optional)
	beforeSnapshotQuery func()
	applyHook           func(txn *Transaction) error
	resumeHook          func(SlotInfo) error
	heartbeatHook       func(Heartbeat) error
}

func newRecorder(snapshotSQL string) *recorder {
	return &recorder{snapshotSQL: snapshotSQL, changed: make(chan struct{})}
}

func (r *recorder) bump() {
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) Snapshot(ctx context.Context, q SnapshotQuerier) error {
	if r.beforeSnapshotQuery != nil {
		r.beforeSnapshotQuery()
	}
	var rows []Row
	if r.snapshotSQL != "" {
		if err := q.Query(ctx, r.snapshotSQL, func(row Row) error { rows = append(rows, row); return nil }); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snapshots++
	r.snapRows = append(r.snapRows, rows)
	r.snapTxnIdx = append(r.snapTxnIdx, len(r.txns))
	r.bump()
	return nil
}

func (r *recorder) Apply(ctx context.Context, txn *Transaction) error {
	if r.applyHook != nil {
		if err := r.applyHook(txn); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.txns = append(r.txns, txn)
	r.bump()
	return nil
}

func (r *recorder) Heartbeat(ctx context.Context, hb Heartbeat) error {
	if r.heartbeatHook != nil {
		if err := r.heartbeatHook(hb); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heartbeats = append(r.heartbeats, hb)
	r.bump()
	return nil
}

func (r *recorder) Resume(ctx context.Context, info SlotInfo) error {
	if r.resumeHook != nil {
		if err := r.resumeHook(info); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resumes = append(r.resumes, info)
	return nil
}

// waitFor polls cond (under the recorder's lock) until it holds.
func (r *recorder) waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(testenv.Patience(d))
	for {
		r.mu.Lock()
		ok := cond()
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

func (r *recorder) changes() []Change {
	var out []Change
	for _, t := range r.txns {
		out = append(out, t.Changes...)
	}
	return out
}

type running struct {
	s      *Stream
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned; err is then set
	err    error
}

func (rn *running) stop(t *testing.T) error {
	t.Helper()
	rn.cancel()
	select {
	case <-rn.done:
		return rn.err
	case <-time.After(15 * time.Second):
		t.Fatal("stream did not stop")
		return nil
	}
}

func startStream(t *testing.T, cfg Config, c Consumer) *running {
	t.Helper()
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = 200 * time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 20*time.Millisecond, 300*time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: testWriter{t}})
	}
	s, err := New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &running{s: s, cancel: cancel, done: make(chan struct{})}
	go func() { rn.err = s.Run(ctx); close(rn.done) }()
	t.Cleanup(func() {
		cancel()
		<-rn.done
	})
	return rn
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func terminateWalsender(t *testing.T, pool *pgxpool.Pool, slot string) bool {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(),
		`SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

func slotRow(t *testing.T, pool *pgxpool.Pool, slot string) (confirmed LSN, active bool, found bool) {
	t.Helper()
	var cf *string
	err := pool.QueryRow(context.Background(),
		`SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&cf, &active)
	if err == pgx.ErrNoRows {
		return 0, false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if cf != nil {
		confirmed, err = ParseLSN(*cf)
		if err != nil {
			t.Fatal(err)
		}
	}
	return confirmed, active, true
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Patience(d))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metricValue reads a counter or gauge.
func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		t.Fatal(err)
	}
	switch {
	case pb.Counter != nil:
		return pb.Counter.GetValue()
	case pb.Gauge != nil:
		return pb.Gauge.GetValue()
	}
	t.Fatalf("not a counter or gauge: %v", m.Desc())
	return 0
}
