// Package accounting runs the scheduler side of cuesched's Redis accounting:
// the booking gate every instance checks, and, on one elected instance, the
// bootstrap, the managed-flip seed, the limit reseed, the booked-counter
// recompute and its dual write to the Postgres accounting tables. It also
// holds the audit behind "cuesched accounting audit".
//
// The reference design (the Redis accounting of OpenCue's Rust scheduler;
// README.md, "How the upstream failure modes are closed") is kept: the
// same keys and fields, whole cores in Redis, the booking script as the hot
// path, Postgres' proc table as the truth. Upstream retired it
// for a bug class (limit-seeding fail-closed, mass rejection,
// double-booking, CAS starvation) and for being single-instance. Each is
// closed here by construction, not by a backstop.
//
// # Per-proc records instead of one global compare-and-swap
//
// Every booking writes a record (acct:proc:{proc}: the five keys charged,
// the amounts, acct:seq and Redis time at booking) in the same script that
// charges it; releases and rollbacks are driven by the record (see packages
// lua and publisher). So for every counter, int_cores = the sum of the
// records charging it, always. Reconciling Redis with Postgres is then a
// per-proc question, answered atomically proc by proc, and needs no CAS:
//
//   - Mark: read acct:seq and TIME (seq0, t0) before the snapshot;
//   - snapshot: one REPEATABLE READ read of the managed shows' non-local
//     procs (alloc from the host, folder and dept from the job), caps and
//     keys;
//   - reconcile, per show, in batches of at most BatchSize procs: adopt a
//     proc the snapshot has and Redis does not (booked by Cuebot before the
//     flip, or a rollback whose INSERT did commit) unless a release
//     tombstone says it was released after the snapshot; retarget a record
//     whose keys or amounts differ from the snapshot (a job moved folder);
//     drop a record whose proc the snapshot lacks only if it was booked
//     before the snapshot began (seq < seq0) and either more than
//     InFlightGrace before it (ts < t0 - grace) or on a database backend
//     that is gone: the record names the backend of the one connection its
//     transaction runs on (the dispatcher holds it from before the booking
//     to the end of the transaction), and the backends alive are read
//     after seq0 and before the snapshot, so a gone backend's transaction
//     ended before the snapshot, which would hold its proc had it
//     committed. A booking whose INSERT is not committed or not visible yet
//     is therefore never erased; a leak of a dispatcher that died or was
//     cut between the script and its COMMIT, or of a primary promoted away,
//     is dropped by the next recompute or re-bootstrap, and any other leak
//     (a release that never arrived, a pooler hiding the backend) after
//     the grace. A Redis restored from an older snapshot brings back
//     records of procs released since, whose pooled backends live on: every
//     instance that sees the rollback, acct:epoch gone (to its epoch watch,
//     or to its loop leader about to re-bootstrap) or replaced by a
//     re-bootstrap, closes its pool's connections once (gate.go,
//     recycleLocked), so those
//     backends go and the re-bootstrap or its follow-up reconcile drops the
//     records, not the grace. Each batch
//     refuses to run once
//     its snapshot is older than half the tombstone TTL, so a tombstone it
//     must see cannot have expired;
//   - repair, per show, in bounded steps: rewrite every counter to the sum
//     of its records over a zero baseline of the show's keys (subscriptions,
//     folders, non-FINISHED jobs and their layers, points), so a counter
//     whose procs all drained cannot stay wedged, whatever changed it
//     outside the scripts (see package lua for the repair session that
//     keeps this exact while bookings continue);
//   - dual write: the snapshot's exact SUM(proc) in centicores to
//     subscription, folder_resource, job_resource, layer_resource and point,
//     for shows still managed at write time, changed rows only. Cuebot's
//     verify_subscription / verify_job_resources triggers fire only when the
//     cap column is unchanged, so the cap is set to its bitwise complement
//     and back in the same transaction (which, unlike +1, cannot overflow a
//     cap at the top of the integer range): a total above a cap lowered
//     after the procs booked is a fact to record, not an error.
//
// A booking between the snapshot and the write (the reference trace t0..t6)
// only adds a record the reconcile leaves alone; nothing retries, so nothing
// starves: TestRecomputeNeverStarves runs the recompute back to back under
// the highest booking rate the machine sustains and every cycle completes,
// while an acct:seq CAS would have failed essentially every one of them.
// No script runs long: reconcile batches and repair steps are bounded (a
// show with 20,000 live procs recomputes in ~0.5 s of wall time with no
// single script over ~6 ms on a 2-core VM; a one-shot repair took 170 ms).
//
// Fractional cores: a proc is charged ceil(centicores / 100) whole cores
// (publisher.ChargeCores), its record keeps the exact centicores, and the
// audit compares counters with that same per-proc sum. Postgres gets exact
// centicores.
//
// # Caps
//
// The limit reseed (LimitReseedInterval, default 300 s) copies size, burst,
// folder and job caps, priority and point minimums with plain HSETs of limit
// fields only. It never touches int_cores or int_gpus, so it cannot clobber a
// booking and needs no CAS on the counters. Caps are written in WAL order
// (publisher.Limits.LSN, lua limits.lua): the reseed stamps its writes with
// the WAL position read just before its snapshot and the sidecar with each
// change's commit, so a reseed from a snapshot older than a cap change the
// sidecar already wrote leaves that cap alone
// (TestLimitReseedKeepsNewerSidecarCaps). A transaction committed before
// that position can still be invisible to the snapshot for as long as it
// waits for a synchronous standby; every snapshot first waits for the
// transactions pg_stat_activity shows in that wait (store.beginVisible,
// TestLimitReseedWaitsForCommittedCapChanges), so it never stamps an old
// cap past its change. ReseedShowLimits is the same copy
// for a few shows on any instance: the cluster feed runs it when the WAL
// reports a cap change (a burst raised, a folder or job cap), before it
// wakes the show's clusters, so a show held at its burst books against the
// new burst at once whether or not the sidecar has forwarded it yet.
// Caps read as Cuebot reads them and convert to
// whole cores rounding down (publisher.JobCapCores, FolderCapCores, ...):
// only a folder cap of exactly -1 is unlimited; a job cap, or a folder cap
// of any other value, below one core is 0 and books nothing.
// A job created after the last reseed has no caps in Redis; the dispatcher
// passes the caps it read with the booking (publisher.Booking.Seed) and the
// script fills missing cap fields before checking, so a new job is never
// treated as uncapped.
//
// # Seeding gate, managed flips, Redis restarts
//
// A show is bookable only once its caps, records and counters are in Redis:
// the last seed step writes the marker acct:show:{show}, and the booking
// script answers "not seeded" (publisher.ErrShowNotSeeded) without it —
// never a rejection against a cap that reads 0, so there is no fail-closed
// handoff and no mass rejection. The leader checks the managed set every
// ManagedPollInterval (2 s): a newly managed show is seeded once it has been
// managed for FlipSettle (10 s), so Cuebot bookings in flight at the flip
// have committed and are adopted by the seed instead of over-booked against
// (TestManagedFlipMidLoad); each seeded show is reconciled once more
// FlipSettle after its seed. A show flipped back to Cuebot loses its marker.
// The gauge scheduler_accounting_unseeded_shows counts managed shows that are
// not bookable yet.
//
// The bootstrap seeds every managed show and then writes acct:epoch. Redis
// runs without persistence, so a restart (or FLUSHALL) empties it: every
// instance polls acct:epoch (EpochPollInterval) and closes its gate (Ready,
// WaitReady, ReadyErr for /readyz) while it is missing; the scripts refuse
// every show (their markers went with the flush); the leader re-bootstraps;
// booking resumes (TestFlushAllMidLoad). Bookings in flight across the
// flush are adopted by the bootstrap or by the follow-up reconcile.
//
// A Redis that comes back with less than it acknowledged (an older
// snapshot, a failover to a replica that missed writes) keeps its markers
// and epoch. Every instance notices from acct:seq, which only grows within
// an epoch, or from an epoch older than the one it booked under (gate.go).
// A reconcile must not run over such a rollback: adopting the lost
// bookings' procs would raise acct:seq back to what was acknowledged and
// hide the loss from every watch. So a recompute's or seed's mark is judged
// like a poll, and the reconcile script refuses when acct:seq has gone
// below that mark since (TestRecomputeAfterARollbackDoesNotHideIt).
//
// # Leader election
//
// Every instance books (the scripts are atomic, so N bookers are safe); only
// the loops run on one instance. The leader holds a PostgreSQL session
// advisory lock (pg_try_advisory_lock, LockKey) on a dedicated connection,
// not a pooled one. That gives the lock the right lifetime: it belongs to a
// session, Postgres releases it the moment the session ends (crash,
// pg_terminate_backend, a network partition the server sees), and no TTL
// has to be tuned against GC pauses as with a Redis lease.
//
// A stalled process (SIGSTOP, a frozen VM, a swap storm) does not end its
// session: its kernel keeps the TCP connection up. So every lock session
// sets idle_session_timeout (PostgreSQL 14+) to LeaderSessionTimeout,
// max(5 × LeaderPollInterval, 3 s) by default: the server ends a session
// whose client has sent nothing for that long, which releases the lock, and a
// follower takes the loops over within a poll of that. A Redis restart while
// the leader is stalled is therefore re-bootstrapped about
// LeaderSessionTimeout after the stall began, instead of pausing booking
// until the leader resumes (TestFrozenLeaderLosesLockToFollower,
// TestFrozenLeaderRedisRestart; the fault suite freezes a real process). A
// healthy session is never that idle: the leader's watchdog fences every
// LeaderPollInterval and a follower tries the lock every poll
// (TestHealthyInstancesKeepTheirSessions); a follower that stalls loses only
// its lockless session and reconnects with one Info line
// (TestFrozenFollowerReconnectsQuietly). The sessions also set the server's
// TCP keepalives (idle LeaderSessionTimeout, interval one poll, 3 probes):
// they cannot see a stopped process, but they end the session of a host
// that is gone or behind a network that drops everything, the one liveness
// check left where idle_session_timeout is missing. On PostgreSQL < 14 the
// leader warns once and runs without it: a stalled leader then keeps the
// lock until it resumes.
//
// Fencing comes from the same connection: before every write batch the loops
// run a check on it that the session is alive and still holds the lock
// (pg_locks for pg_backend_pid()); a watchdog runs the same check every
// LeaderPollInterval and cancels the loops when it fails, and a new term
// starts only after the old term's loops have returned. Followers try the
// lock every LeaderPollInterval (1 s), so failover after a clean exit or a
// dead session takes about a second (TestTwoInstancesOneLeader,
// TestLeaderStopsWhenItsSessionDies).
//
// The fence cannot recall a write a loop had already passed its fence for
// when the session ended: for a stalled leader, the write it was about to
// send when it froze, which lands when it resumes, possibly after the new
// leader re-bootstrapped an emptied Redis. The loops write one batch at a
// time and the next fence fails, so it is exactly one of these, built from
// the old term's snapshot:
//
//   - a reconcile batch: refused if its snapshot is older than half the
//     tombstone TTL. Otherwise an adopt can charge again a proc released
//     before a Redis restart took its tombstone (over-charge: fewer
//     bookings, dropped after InFlightGrace by the next recompute), and a
//     retarget can move a record back to the keys the old snapshot had (a
//     job that changed folder during the stall: its new folder is
//     under-charged until the next recompute). A drop cannot hit anything
//     booked since the snapshot (it needs ts < t0 - InFlightGrace);
//   - a repair step: a stale session's scan, fix or finish answers
//     "superseded" (the flush or the new leader's start replaced it); a stale
//     start supersedes the new leader's repair of that show, which is redone
//     next cycle, and the orphan session expires;
//   - one WriteLimits call (every chunk of it): caps as old as the stall
//     (a cap changed meanwhile is reverted in Redis) until the next limit
//     reseed;
//   - MarkSeeded of one show, or SetEpoch: refused by the seed script
//     (publisher.ErrEpochSuperseded) unless its epoch is still the current
//     one. A Redis restart or FLUSHALL forgets every old epoch, and a new
//     bootstrap begins by recording its own (acct:bootstrap), so a stalled
//     leader can neither mark a show seeded against counters that lack its
//     procs nor open the gates mid-re-bootstrap. (In steady state, with the
//     same epoch, a stale marker of a show the old leader had reconciled
//     is harmless: which shows book is decided by b_scheduler_managed in
//     Postgres.) A stale BeginBootstrap fails the new leader's bootstrap,
//     which is retried on its next cycle with a fresh epoch;
//   - Unseed of one show: closed until the next managed check seeds it
//     again (FlipSettle);
//   - the dual write: Postgres totals of the old snapshot until the next
//     recompute.
//
// Two overlapping leaders thus waste work and can leave counters off until
// the next recompute, but every reconcile and repair step still validates
// against current Redis state atomically, and the seeding state (markers,
// acct:epoch) is fenced by bootstrap epoch (TestSeedingFencedByEpoch in
// package publisher). Closing the rest of the window would need a term key
// every loop script checks; the lock is for efficiency and single-writer
// Postgres updates, and the fence keeps the overlap to that one write.
//
// # Topology
//
// The client is a redis.UniversalClient (publisher.NewClient): one config
// for a single node or Sentinel. Redis Cluster would need per-show hash tags
// on every key because the scripts touch several keys derived from ids; it
// is not supported (see package lua).
package accounting
