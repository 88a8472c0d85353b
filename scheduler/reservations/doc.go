// Package reservations keeps wide frames from starving: a layer whose
// frames have found no fitting host for long enough may hold a firm
// reservation on one host, which then drains until the layer's frame fits,
// while other work may use it only as an EASY backfill. Reservations live
// in Redis, so every scheduler instance honours them and a failover keeps
// them.
//
// # Who may reserve
//
// A layer may reserve when all of these hold:
//
//   - Its leaky bucket of net blocked time is full: the level grows while
//     the layer's last outcome in a cluster pass was "blocked" (the matcher
//     found no host a frame fits on) and drains while it was "placed"
//     (frames dispatched), between 0 and queue.reservations.blocked_for
//     (300 s), and the layer is blocked now. The matcher reports every
//     worked layer's outcome (matcher.Reservations.Observe). Buckets are in
//     memory, per instance: each instance grants to the layers its own
//     passes find blocked.
//   - It is wide: one frame needs at least MinWidth (half) of the cores of
//     the largest host that serves it (its tags, show, facility, OS,
//     thread mode). Only threadable layers without GPUs are tracked: a
//     non-threadable frame books one core, and the hosts' GPU totals are
//     not known here.
//   - It wins the lottery among the candidates of the round (weighted by
//     job priority, floored at 1, as the pass lottery), while at most
//     queue.reservations.max_grants (8) reservations are held overall and
//     at most queue.reservations.max_fraction (0.5, at least one host) of
//     the hosts of the allocation that would fit the frame when idle are
//     reserved; a layer holds at most one reservation at a time. Its job
//     must still be PENDING and unpaused with waiting frames.
//
// # Which host
//
// Among the hosts that serve the layer and would fit one frame when idle
// (sizing.Policy.FitsIdle), not reserved already: the one that
// drains soonest, fewest running procs first, then the earliest projected
// ready time. A host's ready time is when enough of its procs should have
// ended for the frame to fit, each proc projected to end at its layer's
// average successful runtime (layer_usage) after it started; a proc past
// its average, or of a layer with no history, is projected to end now, so
// the ready time errs early (fewer backfills), never late.
//
// # Firm, and EASY backfill
//
// Only the owner layer books a reserved host. The booking script enforces
// it atomically (lua/book.lua): every booking names its host, and on a
// host with a live reservation of another layer it is refused
// (publisher.ReservedError, dispatch Stop "reserved") unless it is a
// backfill: its backfill-until (now + the layer's worst-case runtime,
// layer_usage.int_clock_time_high plus a second; jobs.Layer.WorstCase) is
// no later than the reservation's ready time. A layer with no runtime
// history never backfills. The matcher applies the same test to its local
// snapshot (Admit) so it does not pick hosts the script would refuse.
//
// # How a reservation ends
//
//   - booked: the owner started a frame on the host (the dispatcher calls
//     OwnerBooked once the proc is committed and launched);
//   - paused, job_ended (killed or finished), satisfied (no waiting frame
//     left), gone (layer deleted): the loop's sweep, any instance;
//   - timeout: held for queue.reservations.timeout (30 m). This is also
//     how a reservation ends whose host went down, or whose owner cannot
//     book for a reason the sweep does not read (a job or folder cap, a
//     limit).
//
// Cuebot's own dispatcher (shows not managed by cuesched, on the same
// hosts) knows nothing of reservations.
//
// # Shared state
//
// Redis holds acct:resv:host:{host} (a hash: owner layer and job, show,
// allocation, the frame's cores and memory, ready_at, expires_at,
// granted_at, granted_by, backfills) and the set acct:resv:index. Grants
// (lua/resv_grant.lua, through publisher.Reservations) are atomic: two instances racing for one host, or
// for the last of the caps, cannot both win. Each instance keeps a snapshot
// of the live reservations (Board), refreshed every
// queue.reservations.refresh_interval and updated at once by its own grants
// and ends; the matcher reads it lock-free, so checking a host costs one
// map lookup, never a scan. After a failover the survivor reads the
// reservations from Redis at its next refresh; until then the booking
// script still refuses its non-owner bookings. Blocked-time buckets are not
// shared: they restart empty on the survivor.
//
// cuesched status lists the reservations; the metrics are
// scheduler_reservations_* (held, candidates, backfills, granted_total,
// refused_total{reason}, ended_total{reason}, held_seconds{reason}).
package reservations
