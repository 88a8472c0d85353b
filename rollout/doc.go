// Package rollout is the logic behind the operator commands that move shows
// between Cuebot and cuesched one at a time and watch the result: "cuesched
// show list", "cuesched show set-managed <show> on|off" and "cuesched
// status". The commands in cmd/cuesched only parse flags and print.
//
// # Finding the processes: application_name
//
// cuesched has no registry of its own processes and needs none: every
// process that matters holds PostgreSQL sessions, and pg_stat_activity is
// readable by any role. Each scheduler and sidecar sets application_name
// on every connection it opens (pooled, the loop-lock connection, and
// replication connections) to appname.Format(role, instance):
//
//	cuesched-scheduler/<instance>   scheduler (appname.RoleScheduler)
//	cuesched-sidecar/<instance>     sidecar (appname.RoleSidecar)
//	cuesched-fake-rqd/<instance>    rehearsal fake RQD (appname.RoleFakeRQD)
//	cuesched-cli                    these commands (appname.RoleCLI, not listed)
//
// <instance> is scheduler.instance_name (default host name and pid) or the
// sidecar's equivalent. AppName keeps to what PostgreSQL stores (printable
// ASCII, 63 bytes) so the name set is the name shown. Status groups backends
// of this database by that name into instances; a backend that is the
// active walsender of a slot marks its instance as streaming that slot (a
// sidecar without one is a standby), and the backend holding the accounting
// loops' advisory lock marks the loop leader.
//
// # The loop leader
//
// scheduler/accounting elects its leader with pg_try_advisory_lock(LockKey)
// on a dedicated session. A bigint advisory key appears in pg_locks split in
// two: classid = the high 32 bits, objid = the low 32 bits, objsubid = 1,
// and advisory locks are per database (pg_locks.database). Status and the
// flip's wait read exactly that row (granted) joined to pg_stat_activity, so
// the leader is named by its application_name, pid and address. The key
// must match the schedulers' (Options.LockKey, default
// accounting.DefaultLockKey).
//
// # Flipping a show
//
// Flip is the whole of "set-managed": resolve the name (an alias too; an
// unknown name lists the known ones and suggests the closest), preflight,
// flip, explain, wait. The flip itself is one UPDATE of
// show.b_scheduler_managed that only touches a row whose value differs, so
// repeating it is a reported no-op and two operators racing cannot both
// "change" it.
//
// Preflight for "on" refuses (unless forced) when the rollout is
// incomplete, when Cuebot's Flyway history (read, never written) shows a
// Cuebot older than V45, which ignores the flag and would keep dispatching
// and accounting the show itself, when no sidecar streams an active slot named
// migrations.SidecarSlotPrefix* in this database, or when Redis does not
// answer. The sidecar check is the one that matters most: without a sidecar
// Cuebot's releases of the show never reach Redis, the counters only grow,
// and the show silently stops booking. Slots are cluster-wide, so a sidecar
// streaming another database on the same server does not count (the
// cluster-wide guardrail of migrations.Status is narrowed to this database
// here; "show list" and Status report the same narrowed guardrail). It
// warns, without refusing, when Redis is not bootstrapped, no
// scheduler is connected or none leads, the show has no subscription with
// burst > 0 (the booking script refuses every booking against a zero or
// missing burst, so the show could never book), or the show is inactive.
//
// A show flipped off and on again before any leader processed the "off"
// still carries its seeding marker; the scheduler would then consider it
// seeded and skip the seed that adopts the procs Cuebot booked meanwhile.
// Flip removes such a stale marker (publisher.Unseed, exactly what the
// leader does for an unmanaged show) before flipping on.
//
// The wait (WaitSeeded) does not seed anything itself: seeding belongs to
// the scheduler's leader, which waits FlipSettle after the flip so that
// Cuebot bookings in flight at the flip have committed and are adopted. The
// command only watches for the leader's marker (acct:show:{show}) with
// acct:epoch present — the same two facts the booking script and the
// booking gate check — and says, while waiting and on timeout, who leads
// and what is missing. For "off" it waits for the marker to disappear.
//
// # Status and exit codes
//
// Status is read-only and gathers: migrations.Status (reused for the
// rollout state and the guardrail, not re-queried), the instances, leader
// and slots (lag = current WAL - confirmed_flush_lsn, retained WAL = current
// WAL - restart_lsn, wal_status read through to_jsonb so older servers
// work), the managed shows and their seeding state, and a drift summary of
// accounting.Audit counted per kind and per key namespace. Everything an
// operator should act on lands in StatusReport.Attention; the command exits
// 1 when it is not empty.
package rollout
