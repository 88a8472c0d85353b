// Package lua holds the Redis Lua scripts of cuesched's accounting store and
// embeds them in the binary. The typed Go API over them is package publisher;
// the loops that reseed and reconcile them are in scheduler/accounting.
//
// # Key schema
//
// The five accounting hashes and the sequence are exactly those of the
// reference design, the Redis accounting of OpenCue's Rust scheduler that
// upstream retired (README.md, "How the upstream failure modes are closed"):
//
//	acct:sub:{show}:{alloc}     size, burst, int_cores, int_gpus
//	acct:folder:{folder}        int_min_cores, int_max_cores, int_min_gpus, int_max_gpus, int_cores, int_gpus, show_id
//	acct:job:{job}              int_max_cores, int_max_gpus, int_priority, int_cores, int_gpus
//	acct:layer:{layer}          int_cores, int_gpus
//	acct:point:{dept}:{show}    int_min_cores, int_min_gpus, int_cores, int_gpus
//	acct:seq                    global mutation sequence (INCR by every mutating script)
//
// (sub, folder, job and point also carry cap_lsn, the WAL position their
// caps were read at; see Limits.)
//
// Cores are whole cores, GPUs are device counts; no centicore arithmetic
// happens in Lua (conversion is the publisher's job). Caps read as Cuebot
// reads them: a folder int_max_cores / int_max_gpus of exactly -1 is
// unlimited and any other value is a cap (0 books nothing); a job's
// int_max_cores / int_max_gpus and a subscription burst have no unlimited
// value (0 or a negative value books nothing). A cap field that is missing
// refuses the booking. cuesched adds:
//
//	acct:proc:{proc}    HASH  per-proc booking record: the five keys charged
//	                          (sub, folder, job, layer, point), cores (whole,
//	                          as charged), centi (exact centicores), gpus,
//	                          show, seq (acct:seq at booking), ts (Redis ms),
//	                          origin (check | force | adopt)
//	acct:procs:{show}   SET   proc ids holding a record for the show
//	acct:tomb:{proc}    STRING release tombstone, expires (PX)
//	acct:show:{show}    HASH  seeding marker: seeded = bootstrap epoch
//	acct:shows          SET   shows with a marker
//	acct:epoch          STRING bootstrap marker; absent = Redis is empty
//	acct:bootstrap      STRING epoch of the bootstrap under way (or last begun)
//	acct:sidecar:lsn    STRING last applied source-transaction LSN, %016X
//	acct:sidecar:shows  STRING the sidecar's managed-show set: its LSN
//	                          (%016X), then one show id a line
//	acct:rep:{show}     HASH  open repair session of the show (gen), with
//	acct:repc:{show}    HASH  its sums: cores per accounting key, and
//	acct:repg:{show}    HASH  GPUs per accounting key (all with a TTL)
//	acct:resv:host:{host} HASH firm host reservation (scheduler/reservations):
//	                          host, host_name, layer, job, show, alloc,
//	                          layer_name, job_name, cores (centicores one
//	                          frame needs), mem (KB), ready_at and
//	                          expires_at (unix ms), granted_at, granted_by,
//	                          backfills (EASY backfills admitted)
//	acct:resv:index     SET   host ids holding a reservation
//	acct:seat:{limit}   HASH  node-locked limit's seats: host id -> its booked
//	                          procs under the limit (a field per host holding
//	                          a seat; HLEN = seats in use). Written by
//	                          book.lua, given back by release.lua and
//	                          reconcile.lua from the record's host and seats
//
// # Scripts
//
// Book (book.lua) checks and charges one proc: subscription burst (a
// missing or zero burst cannot book, as in Cuebot), folder and job max
// cores, folder and job max GPUs (GPU caps only for a proc that takes GPUs).
// Every check is current + charge <= cap; only a folder cap of -1 skips it,
// and a missing cap refuses with "missing" (the reference design's "> 0"
// guard read 0, -1 and missing as unlimited for folders and jobs alike,
// which Cuebot never does for a job and only does for -1 on a folder);
// on success ten HINCRBY (int_cores and int_gpus of the five
// hashes), INCR acct:seq, the per-proc record, and {1, seq}; on failure
// {0, table, current, limit} and no write. "force" mode skips the checks and
// the seeding gate. A record that already exists makes the call a no-op
// ({2, seq}), so a retried booking is never counted twice; a tombstone
// ({4}) refuses a booking whose proc was already released. An unseeded show
// answers {3}, never a rejection against a cap of 0.
//
// Book also honours firm host reservations when the caller names the host
// (KEYS[14], ARGV[11..13]): after the caps pass, a live reservation on the
// host (expires_at after Redis' TIME) lets only its owner layer book, or a
// backfill whose backfill-until (the frame's worst-case end) is no later
// than the reservation's ready_at; anything else is refused with {0,
// "reservation", until, ready_at, why, owner_layer, owner_job} and no
// write. A booking by the owner answers {1, seq, "owner"} (the caller ends
// the reservation once the proc is committed), an admitted backfill {1,
// seq, "backfill"} (counted in the reservation's backfills). Without
// KEYS[14] nothing about reservations is read.
//
// ResvGrant (resv_grant.lua) grants one reservation atomically: refused if
// the host holds a live reservation, the layer holds one elsewhere, or the
// live reservations reach the caller's maximum, overall or among the hosts
// the caller lists (the hosts of the allocation that would fit the layer's
// frame when idle); index members whose hash expired are dropped first. The
// expiry is set from Redis' TIME plus the caller's timeout. ResvEnd
// (resv_end.lua) deletes one, optionally only if a given layer owns it.
// Neither touches acct:seq: reservations are not accounting.
//
// Release (release.lua) is record-driven: it subtracts exactly what the
// record charged, from the keys the record names (so a proc is released
// against what it was booked against even if its job changed folder
// meanwhile), deletes the record and INCRs acct:seq per proc. A proc without
// a record is a counted no-op. The same script is the rollback: mode
// "rollback" skips the tombstone, so a booking whose proc INSERT failed
// ambiguously (committed after all) is adopted by the next reconcile instead
// of being lost. The reference design's "force mode with negated deltas" is
// therefore not a separate path: negated deltas come from the record, never
// from the caller. With an LSN argument the whole batch (one source
// transaction of the sidecar) is applied only if the LSN is greater than the
// stored checkpoint, which it then replaces, atomically. It publishes each
// show it released a proc of, once, on the channel acct:released (a wake-up
// hint for schedulers, not state: see scheduler/releases).
//
// Reconcile (reconcile.lua) aligns a bounded batch of one show's records with
// a Postgres snapshot: it adopts procs the snapshot has and Redis does not
// (unless a tombstone says they were released after the snapshot), retargets
// records whose keys or amounts differ from the snapshot, and drops records
// absent from the snapshot only when they were booked before the snapshot
// began (seq < seq0) and either longer than the in-flight grace before it
// (ts < t0 - grace) or on a PostgreSQL connection that no longer exists
// (the record's "pid", written by the booking, is not among the live
// backends the caller read after seq0 and before its snapshot: the
// booking's transaction ran on that one connection, so it is over and its
// proc would be in the snapshot had it committed). A booking whose INSERT
// is not yet visible is never erased.
//
// Repair (repair.lua) rewrites every counter of one show to the sum of its
// records over a zero baseline of the show's keys, in bounded steps: a
// session (start), an SSCAN of the show's records in batches (scan), then
// compare-and-rewrite of batches of keys (fix), then finish. While the
// session is open, book, release and reconcile mirror their changes to
// records the session already counted into its sums (one HGET of the
// session per booking when none is open), so the sums equal the sum of the
// records at every instant and any key can be fixed at any time. Doing it in
// one script would block Redis for O(records of the show): ~170 ms for a
// show with 20,000 live procs on the development machine.
//
// Limits (limits.lua) writes cap fields in WAL order: each hash keeps the
// position its caps are valid at (cap_lsn, the sidecar's commit end LSN or
// the position read just before a reseed's snapshot) and a write stamped
// earlier is skipped, so a reseed whose snapshot predates a cap change the
// sidecar already wrote cannot put the old cap back.
//
// Seed (seed.lua) fences the seeding state by bootstrap epoch: "begin"
// records the epoch of a bootstrap under way (acct:bootstrap); "mark" writes
// a show's marker only if its epoch is acct:epoch, or acct:epoch is absent
// and it is acct:bootstrap; "finish" writes acct:epoch only if it is
// acct:bootstrap. A loop leader that stalled past its lock and resumes with
// one write in flight thus cannot mark a show seeded, nor open the gates,
// in a Redis another leader has (re-)bootstrapped: after a restart or a
// FLUSHALL its epoch is unknown.
//
// SidecarState (sidecar_state.lua) saves the sidecar's managed-show set
// unless the stored one is valid at the same or a later LSN (or
// overwrites it in "force" mode: a new slot).
//
// The typed Go API over every script is package publisher, the only
// package that loads or runs them (cmd/cuesched's import rules test it).
//
// Every script validates all of its arguments before its first write (Redis
// does not roll a script back on error).
//
// # Topology
//
// Release, reconcile and repair build record keys inside Lua from ids and
// from record fields, and a release batch spans shows. That is fine on a
// single node and under Sentinel (one primary holds every key). Redis Cluster
// requires every key of a script to be declared in KEYS and to hash to one
// slot: it would need per-show hash tags on every key (acct:{show}:sub:…,
// acct:{show}:proc:…), a per-show LSN checkpoint, and the sidecar splitting a
// source transaction per show. That is left for later.
package lua

import _ "embed"

//go:embed book.lua
var bookSrc string

//go:embed release.lua
var releaseSrc string

//go:embed reconcile.lua
var reconcileSrc string

//go:embed repair.lua
var repairSrc string

//go:embed seed.lua
var seedSrc string

//go:embed limits.lua
var limitsSrc string

//go:embed resv_grant.lua
var resvGrantSrc string

//go:embed invalidate.lua
var invalidateSrc string

//go:embed resv_end.lua
var resvEndSrc string

//go:embed sidecar_state.lua
var sidecarStateSrc string

// SidecarState returns the source of the sidecar's managed-show set writer
// (sidecar_state.lua).
func SidecarState() string { return sidecarStateSrc }

// ResvGrant returns the source of the reservation grant script
// (resv_grant.lua).
func ResvGrant() string { return resvGrantSrc }

// ResvEnd returns the source of the reservation end script (resv_end.lua).
func ResvEnd() string { return resvEndSrc }

// Book returns the source of the booking script (book.lua).
func Book() string { return bookSrc }

// Invalidate is invalidate.lua: close every show for booking and remove
// acct:epoch when a scheduler finds the accounting state rolled back.
func Invalidate() string { return invalidateSrc }

// Release returns the source of the release / rollback script (release.lua).
func Release() string { return releaseSrc }

// Limits returns the source of the ordered cap writer (limits.lua).
func Limits() string { return limitsSrc }

// Seed returns the source of the bootstrap term fence (seed.lua): begin a
// bootstrap, mark a show seeded, finish the bootstrap, each refused unless
// its epoch is the current one.
func Seed() string { return seedSrc }

// Reconcile returns the source of the per-show record reconciliation script
// (reconcile.lua).
func Reconcile() string { return reconcileSrc }

// Repair returns the source of the per-show counter repair script (repair.lua).
func Repair() string { return repairSrc }
