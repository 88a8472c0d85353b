// Package sidecar is cuesched's release publisher: it runs next to an
// unmodified Cuebot, reads committed proc DELETEs from PostgreSQL logical
// replication, and applies each scheduler-managed release to the Redis
// accounting store exactly once, through crashes, restarts and outages of
// either side. It also forwards cap changes (subscription size/burst,
// folder and job max cores/GPUs) of managed shows to Redis as they commit.
//
// # Stream
//
// The sidecar consumes a PERMANENT slot (Config.SlotName) on the
// publications cuesched_accounting (show, job, host, subscription,
// folder_resource, job_resource, point) and cuesched_proc (proc INSERT /
// DELETE / TRUNCATE) through shared/replication, which delivers whole
// source transactions in commit order and acknowledges only what the
// sidecar passes to Stream.Ack (ExplicitAck). proc has REPLICA IDENTITY
// FULL, so a DELETE carries the whole old row.
//
// A relation is Cuebot's table only by schema and name: at the start of
// every session (Snapshot or Resume) the sidecar resolves the schema each of
// its table names has on the connection's search_path (the tables its own
// queries read; replication.ResolveTables), and rows of any other relation,
// such as a same-named table in another schema added to a publication, are
// ignored (logged once per relation) and acknowledged like any transaction
// with nothing for Redis.
//
// # Exactly once
//
// One committed source transaction is one unit. Its proc DELETEs whose show
// is scheduler-managed at that point of the stream become one call of the
// accounting release script (lua/release.lua, through
// publisher.ReleaseBatchObserved) carrying the transaction's END LSN; the
// script applies every release and stores the LSN in acct:sidecar:lsn in the
// same atomic script, and refuses (as a whole) a batch whose LSN is not
// above the stored one. The publisher sends it in one pipelined round trip
// together with a read of the checkpoint and of the per-proc records (see
// below); transactions of more than 512 releases go through
// publisher.ReleaseBatch, which splits them into chunks and relies on the
// records for the replayed part. The sidecar acknowledges a
// position to PostgreSQL only after Redis holds a checkpoint at or beyond
// it, so at all times
//
//	slot.confirmed_flush_lsn <= Redis checkpoint
//
// After any crash PostgreSQL resends from confirmed_flush_lsn (at least
// once); every resent transaction at or below the checkpoint is refused by
// the script (the LSN is the fencing token), every later one is new. The
// per-proc records of package publisher are a second, independent guard: a
// release without a record is a counted no-op. Transactions that carry
// nothing for Redis (host reports, unmanaged shows) write nothing; the
// position they reach is made durable by an empty ReleaseBatch (which only
// advances the checkpoint) at most every Config.CheckpointInterval and on
// every keepalive, so an idle or unmanaged-only stream does not pin WAL.
//
// Several sidecars may run against one database: the slot admits one
// consumer (a second START_REPLICATION fails with SQLSTATE 55006), so one
// streams and the others retry every Config.StandbyRetry as hot standbys,
// taking over when the active one's connection dies. A former owner that
// still applies transactions it had buffered is fenced by the LSN check:
// whichever applies a transaction first wins, the other's call is refused.
//
// # A release waits until PostgreSQL shows its DELETE
//
// The walsender ships a transaction once its commit record is flushed,
// which can be before the committing backend has left the in-progress list
// that snapshots are built from: microseconds as a rule, longer on a loaded
// machine, and as long as a synchronous standby takes to confirm. A release
// applied in that window frees room under a cap in Redis while every new
// snapshot still shows the proc; a booking into that room then commits
// beside it, and a reader of Postgres sees the job above its cap. So the
// releases and cap changes of a transaction are written to Redis only once
// a snapshot read by the sidecar (txid_current_snapshot) shows the
// transaction (replication.Visibility): Redis then charges at least what any
// snapshot shows, as on the booking side, where the record is written
// before the proc is inserted. The last snapshot read is kept; it answers
// for every transaction that ended before it, so a backlog costs one read.
// sidecar_visibility_waits_total counts the transactions held back, and a
// wait over 5 s is logged once.
//
// # Redis outages and Redis data loss
//
// A Redis error never acknowledges anything: the transaction is retried
// with exponential backoff (the replication package keeps the walsender
// alive meanwhile) and streaming resumes where it stopped. Every write that
// moves the checkpoint is preceded by a read of it (in the same pipelined
// round trip as the per-proc records, or just before an empty batch), and
// so is every retry after a failure: if it is missing or lower than what
// this sidecar wrote, Redis lost acknowledged writes (restart without
// persistence, failover to a lagging replica, FLUSHALL). The same check runs
// whenever a session resumes an existing slot (checkpoint missing, or below
// confirmed_flush_lsn, or beyond the database's WAL: another timeline), and
// when the slot is created (WAL before the new slot's consistent point was
// never streamed). In all those cases the sidecar does not silently
// continue: it asks the
// scheduler's accounting to re-bootstrap by deleting acct:epoch (the
// marker package publisher defines: absent = Redis must be rebuilt; the
// scheduler pauses booking, rebuilds caps, records and counters from
// Postgres, and sets it again), counts sidecar_rebootstrap_requests_total
// and logs a WARN. Streaming continues meanwhile: a release that reaches
// Redis before the rebuild adopts its proc leaves a tombstone that keeps
// the rebuild from charging it, and one that arrives after finds the
// adopted record, so no release is lost or counted twice. A TRUNCATE of
// proc (no per-row events) also requests a re-bootstrap.
//
// # Which shows are managed: tracked from the stream
//
// The managed set is state derived from the stream, not a cache with a
// TTL: every UPDATE/INSERT/DELETE of show is applied in commit order, and
// inside a transaction in statement order, so a DELETE is judged by the
// flag as of its own position: from exactly the transaction (and statement)
// that flipped a show to unmanaged, its DELETEs are sent only for procs that
// have a booking record (booked by cuesched before the flip: their charge
// must still be given back; counted as after_flip), read in the same round
// trip as the records of DELETEs without pk_show. Cuebot's own procs of the
// show have none and are not sent (unmanaged). An after_flip release is
// applied from its record like any other, so it gives back exactly what
// was booked; its cores and GPUs are compared with the record's (key
// mismatch check), its keys are not resolved.
//
// It is seeded consistently with the stream position:
//
//   - When the sidecar creates the slot (Config.CreateSlot, or
//     Config.RecreateLostSlot when the slot vanished while Redis holds a
//     sidecar checkpoint: a failover to a promoted standby that lacks it),
//     the slot's own exported snapshot seeds it (Consumer.Snapshot), exactly
//     at the consistent point, and a re-bootstrap of the Redis accounting is
//     requested for whatever no slot streamed before that point.
//   - The set is then persisted in Redis next to the checkpoint
//     (acct:sidecar:shows: the LSN it is valid at and the managed show ids),
//     written after the release batch of every transaction that flips a show
//     and before that transaction is acknowledged, with its own fenced
//     (monotonic LSN) script (lua/sidecar_state.lua, through
//     publisher.SaveSidecarState). On resume, the persisted set is valid at its
//     LSN S; flips are re-applied only for transactions ending after S, and
//     releases of transactions at or below the checkpoint are refused
//     anyway, so every release decision after a restart uses the flag as of
//     its transaction. The in-memory set is replaced only when a whole
//     transaction has been applied, so a retried transaction is judged
//     again from the same starting state.
//   - Only when no persisted set exists (the slot was created by `cuesched
//     migrate up` and this is the first sidecar start, or Redis lost it) is
//     it seeded by a plain query; a flip committed between confirmed_flush
//     and that query can then be judged with the newer flag for the
//     transactions in between. Those are exactly the cases that also request
//     a re-bootstrap, which re-derives Redis from Postgres.
//
// # Resolving a release to its accounting keys
//
// From the DELETE's old row: show (pk_show), job, layer, the cores
// (int_cores_reserved, centicores; Redis charges publisher.ChargeCores of
// it, whole cores rounded up) and GPUs; the allocation through host.pk_alloc
// and folder and dept through job.pk_folder/pk_dept, from caches kept fresh
// by the same stream (host and job are in cuesched_accounting), loaded from
// the slot snapshot or a query at start and filled by a query on a miss.
// The release script itself is driven by the per-proc record the booking
// wrote (acct:proc:{id}), which is authoritative for what is decremented.
// The batch's pipeline reads those records just before the script deletes
// them, and the sidecar compares them with its resolution; differences are counted in
// sidecar_release_key_mismatch_total{key} and logged at debug. A DELETE
// whose old row lacks pk_show (REPLICA IDENTITY not FULL) is resolved from
// the record's show instead.
//
// What happens when a job changed folder, or a host changed allocation,
// while the proc lived: the release decrements the keys the record names,
// i.e. the folder and allocation charged at booking (or the ones the
// scheduler's reconcile retargeted the record to since), so every counter
// stays equal to the sum of the records charging it and nothing goes
// negative. Cuebot does differently for the shows it manages (it decrements
// the job's current folder and relies on its after_job_moved trigger to
// move the job's cores between folder_resource rows). The stream-resolved
// keys then name the new folder / allocation, the difference is counted as
// a mismatch (key "folder" or "sub"), and the old folder keeps no residue
// because the record moved nothing there that is not taken back.
//
// # Cap changes
//
// UPDATEs (and INSERTs) of subscription (int_size, int_burst),
// folder_resource (min/max cores and GPUs) and job_resource (max cores,
// max GPUs, priority) of managed shows are written to Redis with
// publisher.WriteLimits as soon as their transaction is applied, closing
// the reference design's five-minute stale-cap window; the scheduler's
// limit reseed remains the backstop. Only values that differ from the last
// ones the sidecar wrote (or saw first) are written, so the recompute's
// dual writes of int_cores do not cause Redis traffic.
//
// # Observability
//
// Metrics (prefix sidecar_): releases by result (applied, already_released,
// unknown_proc, skipped_replay, unmanaged, local), transactions,
// commit→Redis latency (histogram, and exact per-instance quantiles: the
// commit time is the server's, so the two clocks must agree), key
// mismatches, cap writes, flips, re-bootstrap
// requests, Redis errors, active/standby, slot lag (bytes and seconds),
// retained WAL and whether it exceeds Config.MaxRetainedWAL (with a loud
// WARN), plus the replication package's sidecar_replication_* series.
// Readiness (shared/metrics Health, check "sidecar") fails while Redis
// errors are being retried, while PostgreSQL cannot be reached, and before
// the first session.
package sidecar
