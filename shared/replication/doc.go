// Package replication consumes PostgreSQL logical replication (pgoutput,
// protocol version 1, no streaming of in-progress transactions) and hands
// whole committed transactions, in commit order, to a Consumer. It knows
// nothing about the tables it carries: the scheduler's host cache and the
// sidecar's release publisher are both built on it.
//
// # Slots and the initial snapshot
//
// A TemporarySlot is created per connection and vanishes with it, so a cache
// never makes the server retain WAL while it is down. A PermanentSlot
// survives; streaming resumes after the position the consumer acknowledged.
//
// Both get a consistent initial snapshot the same way. On the replication
// connection the stream runs
//
//	BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ
//	CREATE_REPLICATION_SLOT name [TEMPORARY] LOGICAL pgoutput (SNAPSHOT 'use')
//	-- Consumer.Snapshot runs its SELECTs here, on the same connection
//	COMMIT
//	START_REPLICATION SLOT name LOGICAL <consistent point>
//
// so the SELECTs see exactly the transactions committed before the slot's
// consistent point and every later one arrives through the stream: each row
// is seen once, by one path. We use SNAPSHOT 'use' rather than
// EXPORT_SNAPSHOT for permanent slots too: an exported snapshot lives only
// while the exporting connection stays idle, and importing it needs a second
// connection and SET TRANSACTION SNAPSHOT, which buys nothing for the
// consumers here and adds a lifetime to get wrong. The snapshot queries use
// the simple protocol, the only one a walsender accepts; rows are decoded
// exactly like streamed rows.
//
// A permanent slot is snapshotted only when the stream creates it (with
// Config.CreateSlot). If the consumer's Snapshot fails, the new slot is
// dropped again, so no slot outlives a snapshot nobody loaded. A consumer
// that finds its own state unusable (Resumer, or any method returning an
// error wrapping ErrResync) gets a fresh start: a temporary slot just
// reconnects; a permanent slot is dropped and re-created with a new snapshot.
//
// # Delivery and acknowledgement
//
// One goroutine owns the connection: it receives, decodes, answers keepalives
// and sends a standby status update every StatusInterval (asking for a
// keepalive back, which is how consumers learn they are current). Completed
// transactions go through a bounded queue to a second goroutine that calls
// the consumer, so a slow consumer never stops keepalives. While the queue is
// full the reader keeps sending status updates.
//
// The only position ever acknowledged is "durable": the EndLSN of a commit
// (never its CommitLSN, which would make the server resend that transaction)
// or the WAL end of a keepalive received while no transaction was in flight.
// Without ExplicitAck everything applied is durable. With ExplicitAck only
// what the consumer passes to Stream.Ack is, clamped to what was delivered.
// Nothing is acknowledged below a slot's confirmed_flush_lsn. Row LSNs are not
// monotonic across transactions, so all bookkeeping is per transaction.
//
// Within one Stream each transaction is applied at most once: after a
// reconnect the stream asks for the durable position and skips transactions
// that end at or before the last applied one. Across processes the server
// may still redeliver transactions acknowledged just before a crash, so
// durable consumers must make their apply idempotent (e.g. compare the
// transaction's EndLSN with a checkpoint stored atomically with the effect).
//
// # Failures
//
// A connection loss, a terminated walsender, a consumer error or an
// undecodable message ends the session; it is logged with its LSN and
// retried with exponential backoff and jitter, and nothing past it is
// acknowledged (the stream stops rather than skips). A slot held by another
// consumer (SQLSTATE 55006) is reported as ErrSlotBusy and retried, which is
// how a hot standby waits. Configuration problems (missing slot without
// CreateSlot, missing database, table or publication, permissions, wal_level)
// make Run return.
//
// TRUNCATE arrives as one Change per truncated table (Op Truncate); what to do
// is the consumer's choice (a cache rebuilds). ALTER TABLE makes the server
// send a new RelationMessage; later changes carry the new *Relation, earlier
// ones keep the old one, and rows are addressed by column name, so added
// columns do not disturb consumers.
//
// # Which relations are the consumer's
//
// A pgoutput RelationMessage names its table by schema and name, and a
// publication may carry same-named tables of several schemas (shadow.proc
// next to public.proc). A consumer must not identify a relation by its name
// alone: ResolveTables finds, at the start of each session (in Snapshot or
// Resume), the schema each of its table names resolves to on the
// connection's search_path, i.e. the tables its own unqualified queries
// read, and Tables.Owns accepts a Relation only when both name and schema
// match. Changes of other relations are skipped like those of any table the
// consumer does not handle, and their transactions are acknowledged as
// usual; a name that resolves to no table stops Run (configuration error).
//
// # Values
//
// Columns are decoded from pgoutput's text format by type OID into Go values
// (see Datum). SQL NULL (Null) and an unchanged TOASTed value that the server
// did not send (Unchanged) are different states: an UPDATE that leaves a large
// value alone carries Unchanged, and the consumer keeps what it had.
// Replication connections are opened with DateStyle ISO, TimeZone UTC and
// bytea_output hex so the text is unambiguous.
//
// # Metrics
//
// NewMetrics(reg, prefix) registers, under the given prefix (e.g.
// "scheduler_replication_"): lag_bytes (server WAL end − applied),
// apply_lag_seconds (now − commit time at apply), messages_total{type},
// transactions_applied_total, reconnects_total, slot_busy_total,
// snapshots_total, snapshot_duration_seconds, last_applied_lsn, durable_lsn
// and server_wal_end_lsn.
package replication
