package replication

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// SlotKind selects a temporary or a permanent replication slot.
type SlotKind uint8

const (
	// TemporarySlot is created per connection and dropped by the server when
	// the connection ends, so it never retains WAL while the consumer is
	// down. Every session starts with a new consistent snapshot: use it for
	// caches that can be rebuilt.
	TemporarySlot SlotKind = iota
	// PermanentSlot survives disconnects and server restarts; streaming
	// resumes after the position the consumer acknowledged. Use it for
	// durable consumers.
	PermanentSlot
)

func (k SlotKind) String() string {
	if k == PermanentSlot {
		return "permanent"
	}
	return "temporary"
}

// Config configures a Stream.
type Config struct {
	// ConnString is an ordinary libpq URL or DSN; the stream adds
	// replication=database and the session settings its decoder needs.
	ConnString string
	// ApplicationName names the walsender session (pg_stat_activity and
	// pg_stat_replication) when ConnString sets no application_name;
	// default cuesched-replication.
	ApplicationName string
	// Slot is the slot name (lower-case letters, digits, underscores).
	// Temporary slot names must be unique per live session on the cluster.
	Slot string
	Kind SlotKind
	// CreateSlot lets a permanent slot be created (with a consistent
	// snapshot handed to Consumer.Snapshot) when it does not exist, and be
	// re-created when it was invalidated. Without it a missing slot makes
	// Run return ErrSlotMissing.
	CreateSlot bool
	// MayCreate, when set, is asked when a permanent slot is missing (or
	// was invalidated) and CreateSlot is false: ok creates it anyway (the
	// consumer's Snapshot runs as for a new slot), why is logged. The
	// sidecar answers yes when its Redis checkpoint proves the slot
	// existed (lost in a failover to a promoted standby).
	MayCreate func(ctx context.Context) (ok bool, why string, err error)
	// Publications are the publications to stream (at least one).
	Publications []string
	// ExplicitAck: when false, every transaction Apply returns nil for is
	// durable and acknowledged (right for caches). When true, only positions
	// the consumer passes to Stream.Ack are acknowledged.
	ExplicitAck bool
	// StatusInterval is how often a standby status update is sent (asking
	// the server for a keepalive, which the consumer sees as a Heartbeat).
	// Default 5s; it must stay well below the server's wal_sender_timeout.
	StatusInterval time.Duration
	// MinBackoff and MaxBackoff bound the reconnect delay (defaults 100ms
	// and 30s; doubled per failed attempt, with jitter).
	MinBackoff, MaxBackoff time.Duration
	// QueueSize is how many whole transactions may wait between the reader
	// and the consumer (default 64).
	QueueSize int
	Logger    hclog.Logger
	// Metrics defaults to unregistered collectors.
	Metrics *Metrics
}

// Consumer receives a consistent snapshot and then every committed
// transaction after it, in commit order. Its methods are never called
// concurrently.
type Consumer interface {
	// Snapshot loads the initial state with q, whose queries all see the
	// database exactly as of the slot's consistent point: every transaction
	// committed before it is visible, and every later one will be passed to
	// Apply. It is called at the start of every temporary-slot session (the
	// consumer must rebuild its state from scratch) and when a permanent slot
	// is created. On error the session is retried.
	Snapshot(ctx context.Context, q SnapshotQuerier) error
	// Apply applies one committed transaction. An error stops the session;
	// the transaction is delivered again after the reconnect (a permanent
	// slot) or superseded by a new snapshot (a temporary slot).
	Apply(ctx context.Context, txn *Transaction) error
}

// SnapshotQuerier runs read-only queries inside the snapshot transaction.
// Queries use the simple protocol (no parameters); values are decoded like
// streamed rows.
type SnapshotQuerier interface {
	Query(ctx context.Context, sql string, fn func(Row) error) error
	// ConsistentPoint is the slot's consistent point: streaming starts there.
	ConsistentPoint() LSN
}

// Heartbeat says the server has sent everything up to WALEnd: nothing is in
// flight, and the consumer (once it has applied every earlier transaction,
// which it has when it receives the heartbeat) is current as of ServerTime.
type Heartbeat struct {
	WALEnd     LSN
	ServerTime time.Time
}

// Heartbeater is optionally implemented by a Consumer that wants to know
// when it is caught up (freshness), or, with ExplicitAck, to record an idle
// position and Ack it so an idle slot does not pin WAL.
type Heartbeater interface {
	Heartbeat(ctx context.Context, hb Heartbeat) error
}

// Resumer is optionally implemented by a Consumer of a permanent slot. It is
// called before streaming resumes from an existing slot, with the slot's
// state, so the consumer can check its own checkpoint against
// ConfirmedFlushLSN; return an error wrapping ErrResync to rebuild from a new
// snapshot.
type Resumer interface {
	Resume(ctx context.Context, slot SlotInfo) error
}

// Status is a point-in-time view of a stream, for health checks and tests.
type Status struct {
	Streaming bool
	// Applied is the end of the last applied transaction or heartbeat;
	// Durable the position acknowledged as flushed; ServerWALEnd the latest
	// server position seen.
	Applied, Durable, ServerWALEnd LSN
	Sessions                       int64
	LastError                      error
}

// Stream runs one logical replication consumer: it manages the slot, takes
// the initial snapshot, decodes pgoutput, hands whole transactions to the
// consumer, acknowledges what is durable and reconnects on failure.
type Stream struct {
	cfg      Config
	consumer Consumer
	log      hclog.Logger
	m        *Metrics
	connCfg  *pgconn.Config
	pubArg   string

	durable   atomic.Uint64 // acknowledged (sent as flush) position
	ackLimit  atomic.Uint64 // highest position delivered to the consumer
	applied   atomic.Uint64
	serverEnd atomic.Uint64
	streaming atomic.Bool
	sessions  atomic.Int64

	errMu   sync.Mutex
	lastErr error

	running atomic.Bool
	resync  bool // session goroutine only
}

// New validates cfg and returns a stream; call Run to start it.
func New(cfg Config, consumer Consumer) (*Stream, error) {
	if consumer == nil {
		return nil, fmt.Errorf("%w: nil consumer", errConfig)
	}
	if !ValidSlotName(cfg.Slot) {
		return nil, fmt.Errorf("%w: slot name %q must be 1-63 lower-case letters, digits or underscores", errConfig, cfg.Slot)
	}
	if len(cfg.Publications) == 0 {
		return nil, fmt.Errorf("%w: no publication", errConfig)
	}
	quoted := make([]string, len(cfg.Publications))
	for i, p := range cfg.Publications {
		if !identRE.MatchString(p) {
			return nil, fmt.Errorf("%w: publication name %q is not a plain identifier", errConfig, p)
		}
		quoted[i] = `"` + p + `"`
	}
	connCfg, err := replicationConfig(cfg.ConnString, cfg.ApplicationName)
	if err != nil {
		return nil, err
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(30*time.Second, cfg.MinBackoff)
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil, "replication_")
	}
	return &Stream{
		cfg: cfg, consumer: consumer, connCfg: connCfg, m: cfg.Metrics,
		log:    cfg.Logger.Named("replication").With("slot", cfg.Slot),
		pubArg: strings.Join(quoted, ","),
	}, nil
}

// Ack declares everything up to lsn durable (ExplicitAck). Pass the EndLSN of
// the last transaction made durable, or a Heartbeat's WALEnd. Positions past
// what was delivered are clamped; positions never go backwards.
func (s *Stream) Ack(lsn LSN) {
	if limit := LSN(s.ackLimit.Load()); lsn > limit {
		lsn = limit
	}
	s.advanceDurable(lsn)
}

func (s *Stream) advanceDurable(lsn LSN) {
	for {
		cur := s.durable.Load()
		if uint64(lsn) <= cur || s.durable.CompareAndSwap(cur, uint64(lsn)) {
			break
		}
	}
	s.m.durableLSN.Set(float64(s.durable.Load()))
}

func storeMax(a *atomic.Uint64, v LSN) {
	for {
		cur := a.Load()
		if uint64(v) <= cur || a.CompareAndSwap(cur, uint64(v)) {
			return
		}
	}
}

// Status returns the stream's current positions and last error.
func (s *Stream) Status() Status {
	s.errMu.Lock()
	err := s.lastErr
	s.errMu.Unlock()
	return Status{
		Streaming: s.streaming.Load(),
		Applied:   LSN(s.applied.Load()), Durable: LSN(s.durable.Load()),
		ServerWALEnd: LSN(s.serverEnd.Load()), Sessions: s.sessions.Load(), LastError: err,
	}
}

func (s *Stream) setErr(err error) {
	s.errMu.Lock()
	s.lastErr = err
	s.errMu.Unlock()
}

// Run streams until ctx is cancelled (it then returns ctx's error) or a
// non-retriable error occurs: a missing or lost slot without CreateSlot, or a
// server error about permissions, authentication, a missing database,
// publication or table, or a server not configured for logical decoding.
// Everything else (connection loss, a terminated walsender, a busy slot, a
// consumer error, an undecodable message) is logged and retried with
// exponential backoff. Run may be called once.
func (s *Stream) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("replication: Stream.Run called twice")
	}
	backoff := s.cfg.MinBackoff
	for {
		progressed, err := s.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.setErr(err)
		if progressed {
			backoff = s.cfg.MinBackoff
		}
		switch {
		case errors.Is(err, ErrResync):
			// Retried after the usual (reset-on-progress) backoff, so a
			// consumer that keeps asking cannot spin.
			s.log.Info("consumer asked for a resynchronisation; taking a new snapshot", "reason", err, "in", backoff)
			s.resync = true
		case isFatal(err):
			s.log.Error("replication stopped", "error", err)
			return err
		case errors.Is(err, ErrSlotBusy):
			s.m.slotBusy.Inc()
			s.log.Debug("slot busy; waiting", "error", err, "retry_in", backoff)
		default:
			s.log.Warn("replication session ended; reconnecting", "error", err, "retry_in", backoff)
		}
		s.m.reconnects.Inc()
		d := backoff/2 + rand.N(backoff/2+1)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, s.cfg.MaxBackoff)
	}
}

func isFatal(err error) bool {
	if errors.Is(err, ErrSlotBusy) {
		return false
	}
	if errors.Is(err, ErrSlotMissing) || errors.Is(err, ErrSlotLost) || errors.Is(err, errConfig) || errors.Is(err, ErrRefused) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		if pgErr.Code == "42710" {
			// duplicate_object: another session created the slot first
			// (two sidecars re-creating a lost slot); the next attempt
			// finds it.
			return false
		}
		switch pgErr.Code[:2] {
		case "28", "3D", "42": // auth, no database, undefined object / privilege / syntax
			return true
		}
		return pgErr.Code == "55000" // e.g. wal_level is not logical
	}
	return false
}

type queueItem struct {
	txn *Transaction
	hb  *Heartbeat
}

// session runs one connection: slot, snapshot, streaming. progressed reports
// whether the consumer applied anything (resets the backoff).
func (s *Stream) session(ctx context.Context) (progressed bool, err error) {
	s.sessions.Add(1)
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	conn, err := pgconn.ConnectConfig(sctx, s.connCfg)
	if err != nil {
		return false, fmt.Errorf("replication: connect: %w", err)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		ccancel()
	}()

	startLSN, err := s.prepare(sctx, conn)
	if err != nil {
		return false, err
	}
	err = pglogrepl.StartReplication(sctx, conn, s.cfg.Slot, startLSN, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + s.pubArg + "'"},
	})
	if err != nil {
		return false, fmt.Errorf("replication: START_REPLICATION from %s: %w", startLSN, classifyPG(err))
	}
	s.streaming.Store(true)
	defer s.streaming.Store(false)
	s.log.Debug("streaming", "from", startLSN, "kind", s.cfg.Kind)

	queue := make(chan queueItem, s.cfg.QueueSize)
	var applied atomic.Bool
	applyDone := make(chan error, 1)
	go func() {
		err := s.applyLoop(sctx, queue, &applied)
		if err != nil {
			cancel(err)
		}
		applyDone <- err
	}()
	readErr := s.readLoop(sctx, conn, queue, LSN(s.applied.Load()))
	close(queue)
	applyErr := <-applyDone
	for range queue {
		s.m.queued.Dec() // left unapplied by a session that ended on an error
	}
	if !conn.IsClosed() {
		// Tell the server what the drained transactions made durable (also
		// on a graceful stop, so a successor resumes exactly after it).
		_ = s.sendStatus(conn, false)
	}
	if applyErr != nil {
		return applied.Load(), applyErr
	}
	return applied.Load(), readErr
}

// prepare sets up the slot (and the snapshot when there is one) and returns
// the position to start streaming from.
func (s *Stream) prepare(ctx context.Context, conn *pgconn.PgConn) (LSN, error) {
	if s.cfg.Kind == TemporarySlot {
		s.resync = false
		return s.createWithSnapshot(ctx, conn, true)
	}
	info, currentDB, found, err := readSlot(ctx, conn, s.cfg.Slot)
	if err != nil {
		return 0, fmt.Errorf("replication: read slot: %w", err)
	}
	if found {
		switch {
		case info.Type != "logical" || info.Plugin != "pgoutput" || info.Database != currentDB:
			return 0, fmt.Errorf("%w: slot %q is a %s slot for plugin %q in database %q, want a logical pgoutput slot in %q",
				errConfig, s.cfg.Slot, info.Type, info.Plugin, info.Database, currentDB)
		case info.Active:
			return 0, fmt.Errorf("%w: slot %q is active for PID %d", ErrSlotBusy, s.cfg.Slot, info.ActivePID)
		case info.WALStatus == "lost" && !s.cfg.CreateSlot && !s.mayCreate(ctx, "invalidated (wal_status lost)"):
			return 0, fmt.Errorf("%w: slot %q", ErrSlotLost, s.cfg.Slot)
		case info.WALStatus == "lost" || s.resync:
			s.log.Warn("dropping the slot to re-create it with a new snapshot", "wal_status", info.WALStatus, "resync", s.resync)
			if err := dropSlotSQL(ctx, conn, s.cfg.Slot); err != nil {
				return 0, fmt.Errorf("replication: drop slot for resync: %w", err)
			}
			found = false
		}
	}
	if !found {
		if !s.cfg.CreateSlot && !s.resync && !s.mayCreate(ctx, "missing") {
			return 0, fmt.Errorf("%w: %q", ErrSlotMissing, s.cfg.Slot)
		}
		lsn, err := s.createWithSnapshot(ctx, conn, false)
		if err == nil {
			s.resync = false
		}
		return lsn, err
	}
	if r, ok := s.consumer.(Resumer); ok {
		if err := r.Resume(ctx, info); err != nil {
			return 0, err
		}
	}
	// Never acknowledge below what the server already has.
	s.advanceDurable(info.ConfirmedFlushLSN)
	storeMax(&s.ackLimit, info.ConfirmedFlushLSN)
	storeMax(&s.applied, info.ConfirmedFlushLSN)
	return LSN(s.durable.Load()), nil
}

// mayCreate asks Config.MayCreate whether a missing or invalidated slot
// may be created.
func (s *Stream) mayCreate(ctx context.Context, state string) bool {
	if s.cfg.MayCreate == nil {
		return false
	}
	ok, why, err := s.cfg.MayCreate(ctx)
	if err != nil {
		s.log.Warn("could not decide whether to re-create the slot", "slot_state", state, "error", err)
		return false
	}
	if ok {
		s.log.Warn("re-creating the replication slot", "slot_state", state, "why", why)
	}
	return ok
}

// createWithSnapshot creates the slot inside a REPEATABLE READ transaction
// with SNAPSHOT 'use', lets the consumer load its snapshot in that
// transaction, and returns the consistent point.
func (s *Stream) createWithSnapshot(ctx context.Context, conn *pgconn.PgConn, temporary bool) (LSN, error) {
	if _, err := conn.Exec(ctx, "BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ").ReadAll(); err != nil {
		return 0, fmt.Errorf("replication: begin snapshot transaction: %w", err)
	}
	temp := ""
	if temporary {
		temp = "TEMPORARY "
	}
	res, err := pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx,
		fmt.Sprintf("CREATE_REPLICATION_SLOT %s %sLOGICAL pgoutput (SNAPSHOT 'use')", s.cfg.Slot, temp)))
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" {
			// The name is taken: a permanent slot created concurrently by
			// another consumer, or our previous temporary session's slot
			// whose walsender has not exited yet.
			return 0, fmt.Errorf("%w: create slot: %w", ErrSlotBusy, err)
		}
		return 0, fmt.Errorf("replication: create %sslot: %w", strings.ToLower(temp), classifyPG(err))
	}
	cp, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("replication: consistent point %q: %w", res.ConsistentPoint, err)
	}
	// Positions restart at the consistent point: the snapshot covers
	// everything before it.
	s.applied.Store(uint64(cp))
	s.ackLimit.Store(uint64(cp))
	if temporary || !s.cfg.ExplicitAck {
		s.durable.Store(uint64(cp))
	} else {
		// A new slot: acknowledge nothing until the consumer declares its
		// snapshot (or a later position) durable. A position from an older
		// incarnation of the slot must never be sent to this one.
		s.durable.Store(0)
	}
	start := time.Now()
	err = s.consumer.Snapshot(ctx, &snapshotQuerier{conn: conn, cp: cp})
	if err == nil {
		_, err = conn.Exec(ctx, "COMMIT").ReadAll()
	}
	if err != nil {
		if !temporary {
			// The slot must not outlive a snapshot the consumer did not load,
			// or a later session would resume without it.
			_, _ = conn.Exec(ctx, "ROLLBACK").ReadAll()
			if derr := dropSlotSQL(ctx, conn, s.cfg.Slot); derr != nil {
				s.log.Error("could not drop the new slot after a failed snapshot; the next attempt will resynchronise", "error", derr)
				s.resync = true
			}
		}
		return 0, fmt.Errorf("replication: snapshot: %w", err)
	}
	s.m.snapshots.Inc()
	s.m.snapshotSeconds.Observe(time.Since(start).Seconds())
	s.m.lastAppliedLSN.Set(float64(cp))
	s.log.Debug("snapshot loaded", "consistent_point", cp, "took", time.Since(start))
	return cp, nil
}

type snapshotQuerier struct {
	conn *pgconn.PgConn
	cp   LSN
}

func (q *snapshotQuerier) Query(ctx context.Context, sql string, fn func(Row) error) error {
	return simpleQuery(ctx, q.conn, sql, fn)
}

func (q *snapshotQuerier) ConsistentPoint() LSN { return q.cp }

// readLoop owns the connection: it receives messages, answers keepalives,
// sends periodic status updates and queues whole transactions. skipUpTo is
// the position already applied by earlier sessions (transactions ending at or
// before it are not delivered again).
func (s *Stream) readLoop(ctx context.Context, conn *pgconn.PgConn, queue chan<- queueItem, skipUpTo LSN) error {
	dec := newDecoder()
	nextStatus := time.Now()
	sendStatus := func(reply bool) error {
		nextStatus = time.Now().Add(s.cfg.StatusInterval)
		return s.sendStatus(conn, reply)
	}
	var lastSentFlush LSN
	for {
		if !time.Now().Before(nextStatus) {
			lastSentFlush = LSN(s.durable.Load())
			if err := sendStatus(true); err != nil {
				return err
			}
		}
		rctx, rcancel := context.WithDeadline(ctx, nextStatus)
		raw, err := conn.ReceiveMessage(rctx)
		rcancel()
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("replication: receive: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				return errors.New("replication: empty CopyData message")
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("replication: keepalive: %w", err)
				}
				s.m.messages.WithLabelValues("keepalive").Inc()
				s.observeServerEnd(pkm.ServerWALEnd)
				if !dec.inTxn() {
					select {
					case queue <- queueItem{hb: &Heartbeat{WALEnd: pkm.ServerWALEnd, ServerTime: pkm.ServerTime}}:
					default: // the consumer is busy; a later keepalive will do
					}
				}
				if d := LSN(s.durable.Load()); pkm.ReplyRequested || d > lastSentFlush {
					lastSentFlush = d
					if err := sendStatus(false); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("replication: XLogData: %w", err)
				}
				s.observeServerEnd(xld.ServerWALEnd)
				if len(xld.WALData) > 0 {
					s.m.messages.WithLabelValues(messageTypeLabel(xld.WALData[0])).Inc()
				}
				txn, err := dec.handle(xld.WALStart, xld.WALData)
				if err != nil {
					s.log.Error("undecodable replication message; not acknowledging past it", "lsn", xld.WALStart, "error", err)
					return err
				}
				if txn == nil {
					continue
				}
				if txn.EndLSN <= skipUpTo {
					s.log.Trace("skipping a transaction already applied", "end_lsn", txn.EndLSN)
					continue
				}
				if err := s.enqueue(ctx, queue, queueItem{txn: txn}, &nextStatus, conn); err != nil {
					return err
				}
			default:
				return fmt.Errorf("replication: unknown CopyData message type %q", msg.Data[0])
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication: server error: %w", classifyPG(pgconn.ErrorResponseToPgError(msg)))
		case *pgproto3.CopyDone:
			return errors.New("replication: server ended the replication stream")
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus:
		default:
			return fmt.Errorf("replication: unexpected message %T", raw)
		}
	}
}

// enqueue blocks until the consumer takes the item, still sending status
// updates so the server does not time the connection out meanwhile.
func (s *Stream) enqueue(ctx context.Context, queue chan<- queueItem, it queueItem, nextStatus *time.Time, conn *pgconn.PgConn) error {
	s.m.queued.Inc() // before the send: the applier's Dec never comes first
	for {
		t := time.NewTimer(time.Until(*nextStatus))
		select {
		case queue <- it:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			s.m.queued.Dec()
			return context.Cause(ctx)
		case <-t.C:
			*nextStatus = time.Now().Add(s.cfg.StatusInterval)
			if err := s.sendStatus(conn, false); err != nil {
				s.m.queued.Dec()
				return err
			}
		}
	}
}

func (s *Stream) applyLoop(ctx context.Context, queue <-chan queueItem, progressed *atomic.Bool) error {
	hbr, _ := s.consumer.(Heartbeater)
	for it := range queue {
		s.m.queued.Dec()
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		if txn := it.txn; txn != nil {
			storeMax(&s.ackLimit, txn.EndLSN)
			if err := s.consumer.Apply(ctx, txn); err != nil {
				return fmt.Errorf("replication: apply transaction %d ending at %s: %w", txn.XID, txn.EndLSN, err)
			}
			s.applied.Store(uint64(txn.EndLSN))
			// The metrics first: whoever sees the position durable sees
			// the transaction counted.
			s.m.transactions.Inc()
			s.m.applyLagSeconds.Set(max(0, time.Since(txn.CommitTime).Seconds()))
			s.m.lastAppliedLSN.Set(float64(txn.EndLSN))
			if !s.cfg.ExplicitAck {
				s.advanceDurable(txn.EndLSN)
			}
			progressed.Store(true)
		} else if hb := it.hb; hb != nil {
			if hb.WALEnd < LSN(s.applied.Load()) {
				hb.WALEnd = LSN(s.applied.Load())
			}
			storeMax(&s.ackLimit, hb.WALEnd)
			if hbr != nil {
				if err := hbr.Heartbeat(ctx, *hb); err != nil {
					return fmt.Errorf("replication: heartbeat at %s: %w", hb.WALEnd, err)
				}
			}
			storeMax(&s.applied, hb.WALEnd)
			s.m.applyLagSeconds.Set(0)
			s.m.lastAppliedLSN.Set(float64(s.applied.Load()))
			if !s.cfg.ExplicitAck {
				s.advanceDurable(hb.WALEnd)
			}
		}
		s.updateLag()
	}
	return nil
}

func (s *Stream) observeServerEnd(lsn LSN) {
	storeMax(&s.serverEnd, lsn)
	s.m.serverWALEnd.Set(float64(s.serverEnd.Load()))
	s.updateLag()
}

func (s *Stream) updateLag() {
	end, ap := s.serverEnd.Load(), s.applied.Load()
	if end > ap {
		s.m.lagBytes.Set(float64(end - ap))
	} else {
		s.m.lagBytes.Set(0)
	}
}

// sendStatus acknowledges the durable position as written, flushed and
// applied. Nothing is acknowledged before the first durable position.
func (s *Stream) sendStatus(conn *pgconn.PgConn, reply bool) error {
	d := LSN(s.durable.Load())
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: d, WALFlushPosition: d, WALApplyPosition: d, ReplyRequested: reply,
	})
	if err != nil {
		return fmt.Errorf("replication: send standby status: %w", err)
	}
	return nil
}
