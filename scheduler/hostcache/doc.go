// Package hostcache is the scheduler's in-memory view of bookable hosts,
// kept fresh by logical replication instead of polling, and indexed so a
// layer's host is found in O(log n).
//
// # Source of truth: a mirror fed by the WAL
//
// The cache streams the publication cuesched_hostcache (host, host_stat,
// host_tag, alloc, subscription, show, facility) through
// shared/replication on a temporary slot: the slot disappears when the
// scheduler does, so a stopped scheduler never makes Postgres retain WAL,
// and every (re)connection starts from a consistent snapshot (the seven
// SELECTs in mirror.go, run inside the slot's snapshot). After that the
// cache issues no query at all: every change reaches it as a committed
// transaction, in commit order, and is applied in place under one mutex.
// A TRUNCATE of any of those tables asks the stream for a new snapshot
// (replication.ErrResync); the cache keeps serving its previous state until
// the new one is swapped in.
//
// "Those tables" means schema and name: each snapshot first resolves the
// schema the seven names have on the connection's search_path (the tables
// its SELECTs read; replication.ResolveTables), and only changes of exactly
// those relations are applied. A same-named table in another schema that
// the publication also carries (shadow.host) is ignored, TRUNCATE included,
// like any other table the cache does not mirror (logged once per relation).
//
// The publication also carries folder_resource and job_resource (rollout
// 0006), which the cache does not mirror: with Options.Tap, whatever the
// stream carries is shown to a tap too (the snapshot, then every applied
// transaction), which is how the cluster feed follows shows,
// subscriptions, allocations, host tags and caps without a stream of its
// own.
//
// The mirror keeps the columns the reference host query reads. A host is
// bookable in group (facility F, show S, tag T), exactly like that query's
// joins and WHERE clause, when: its lock state is OPEN; it has a host_stat
// row in state UP; its allocation exists and belongs to F; S has a
// subscription on that allocation; and it has a host_tag named T. Idle
// memory is least(host.int_mem_idle, host_stat.int_mem_free) and idle GPU
// memory least(host.int_gpu_mem_idle, host_stat.int_gpu_mem_free). Host
// records are shared: a host is one record, indexed in every group it
// belongs to.
//
// # The index
//
// Each group (ClusterKey) is a google/btree of core buckets (idle whole
// cores) each holding a btree of (memory bucket, host) entries (idle bytes /
// memory_key_divisor, 2 GiB by default). Groups are built on first use from
// the mirror — no query — and evicted after group_idle_timeout without a
// checkout. HostBookingStrategy orders the walk per dimension: saturation
// true walks upward from the request's bucket (Best-Fit: fill hosts up),
// false walks down from the largest (Worst-Fit: spread). The default is
// Best-Fit cores, Worst-Fit memory. Every candidate must pass Fits (OS,
// thread mode ALL only for threadable layers, floors on cores, memory, GPUs
// and GPU memory) and the request's Accept. The OS gate reads
// host_stat.str_os as Cuebot does, as a comma-separated list of the OS
// values the host serves: a job with no OS takes any host, a job with an
// OS any host listing it. The list is split once, when the host_stat row
// arrives, and shared by every host reporting the same str_os.
//
// # Placement and locality
//
// With a Placement (the default configuration's queue.placement epvm) a
// checkout does not take the first host of the walk: it collects the first
// Candidates hosts that fit in the walk's order, a quarter as many from the
// walk's other end, and the hosts the request's layer is live or warm on,
// and takes the one with the lowest E-PVM cost, the marginal rise of
// Σ_r w_r·e^(used_r/total_r) over cores, memory, GPUs and GPU memory that
// one frame causes (EPVMCost; a GPU host's GPUs count as used at least in
// the share its cores are). With locality, a live or warm host within
// Tolerance of the cheapest wins instead (Choose). The cost stays
// O(log n + K). Without a Placement (best_fit, worst_fit) the first fit
// wins, exactly as in round 1, and there is no locality bonus.
//
// Locality is learnt from the bookings the caller reports (Booked, before
// the check-in) and the host rows of the WAL: see locality.go. Every
// checkout's host view carries the host's Locality for the request's layer
// and the centicores the layer holds there (LayerCores), which the matcher
// uses to cap one layer's share of a host.
//
// # Checkout, check-in, and the WAL: assume / confirm / forget
//
// Checkout removes the chosen host from every group before it returns, under
// the cache's mutex, so no two callers can ever hold it. While it is out,
// the WAL keeps updating its record (a checked-out host that is locked,
// downed, re-tagged or deleted is not resurrected by the check-in), and the
// host-row idle values the WAL applies are remembered on the lease.
//
// Checkin(host) re-indexes the host (its id and idle values: the sizing.Host
// the dispatcher carries back). The ordering rule is "the newest
// committed state wins":
//
//   - values equal to what Checkout returned mean nothing was booked: the
//     WAL's state stands;
//   - values the WAL already applied since the checkout (the caller's own
//     booking arrived first, possibly followed by newer changes such as a
//     release) are not newer than the mirror and are ignored;
//   - otherwise the caller's values come from a commit the WAL has not
//     delivered yet. They are assumed: the index uses min(assumed, WAL row)
//     per dimension, so neither an older transaction still in flight nor the
//     check-in can over-report idle resources. The assumption is confirmed
//     (dropped) when the WAL delivers a host row equal to it, and forgotten
//     after assume_ttl (10 s) if that never happens.
//
// Each host records the commit LSN of its last WAL change and a version
// bumped by every change, exposed on Host. A checkout never checked in
// (a leaked lease) is returned to the index after LeaseTimeout (10 min).
// Check-ins are keyed by host id (the matcher's interface carries no lease
// token), so LeaseTimeout must exceed the longest dispatch: a holder that
// outlives it has lost exclusivity, and its late check-in would end the next
// holder's lease early (the database's guarded UPDATE still prevents an
// over-booking).
//
// A check-in's memory is matched loosely. The dispatcher reports memory as
// min(the row it committed, the checked-out view minus what it took), and
// the view is lowered by host_stat's free memory and by pending
// assumptions, so its report is often below the row it committed. The WAL
// row confirms (and a row seen while out supersedes) a check-in when cores,
// GPUs and GPU memory are equal and its memory is at least the reported
// memory. (With exact equality such check-ins were never confirmed: the
// host looked busier than it was for AssumeTTL after every booking, hiding
// every release meanwhile — on the demo farm half the GPU hosts sat idle
// with GPU frames waiting.)
//
// # Capacity wake-ups
//
// The cache knows within milliseconds when a host gains idle resources,
// and passes that on to those waiting for them, per group rather than as
// one "something changed" signal:
//
//   - Each group has a capacity generation (an atomic counter) and the
//     floors (cores, memory, GPUs, GPU memory) of the checkouts that missed
//     there since its last bump, at most eight, kept minimal (floors implied
//     by a weaker one are dropped; past eight they collapse into their
//     per-dimension minimum, still a necessary condition for any of them).
//   - Re-indexing a host (a WAL change, a check-in, an expired assumption,
//     a returned lease) bumps a group that waits for floors the host now
//     fits and did not fit before, or that it just joined (checked in,
//     unlocked, up, re-tagged, newly subscribed). A bump forgets the floors:
//     their waiters retry, and register again if they miss again. A host
//     that already fitted when the waiter missed (refused by Accept) does
//     not wake it, so host_stat pings moving free memory stay silent, and
//     capacity nobody missed wakes nobody: a busy farm keeps its sleeps and
//     backoffs. A re-snapshot and an eviction bump their groups too.
//   - Checkout's miss returns a *NoCandidateError (errors.Is ErrNoCandidate)
//     carrying a Watch of the probed groups taken atomically with the miss:
//     Watch.Moved (a sum of atomic loads, no lock) turns true at the first
//     bump after it. The matcher hands it to its backoff, which releases the
//     layer as soon as it moves.
//   - Cache.Watch(facility, show, tags) is a cluster's watch, taken before a
//     pass; it also moves when any group is built, since a checkout after it
//     may build one of its groups and miss there. CapacityChanged is closed
//     at every bump; the pipeline forwards it to the cluster feed, which then
//     checks the watches of its sleeping clusters.
//
// None of this issues a query. The sleeps and backoffs stay the upper bounds
// for whatever the watches cannot see (a host Postgres refused, caps).
//
// The subpackage matcherhosts adapts Cache to the matcher's Hosts
// interface; ConfigFrom maps the configuration file onto Config.
//
// # Metrics
//
// scheduler_host_cache_size (hosts in the mirror), _hits_total (checkouts
// that returned a host), _misses_total (checkouts that found none),
// _staleness_seconds (now − the time the cache is known current as of: the
// last applied commit, or the last keepalive received with nothing in
// flight, so an idle database does not look stale: a keepalive is asked
// for every Config.StatusInterval, 500 ms, the gauge's floor while nothing
// the cache mirrors changes), _snapshots_total,
// _group_builds_total, _group_evictions_total, _lease_expired_total,
// _capacity_wakeups_total (group bumps) and _assumptions_total{outcome};
// scheduler_placements_total{locality} counts the frames booked by the
// host's locality for their layer (live, warm, cold); the stream's own
// metrics are prefixed scheduler_replication_.
//
// Accept runs under the cache's mutex: it must not call back into the cache.
package hostcache
