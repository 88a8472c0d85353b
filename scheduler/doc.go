// Package scheduler is the front door of the standalone scheduler: New
// assembles one instance from the configuration (scheduler.go is the only
// composition root), Run runs it until its context ends, Close releases
// what New opened. `cuesched scheduler` is flag parsing around these three.
//
// # One frame's path
//
// A WAITING frame of a scheduler-managed show travels through the
// packages below in this order; each step names the package that owns it.
//
//	(1) clusters   the WAL (through the host cache's stream) or a reload
//	              makes its (facility, show, allocation tag) cluster
//	              known; the Feed hands the cluster to a loop worker
//	              (with scheduler.work_split, only the clusters of the
//	              shares this instance holds: shard).
//	(2) loop       one pass of the cluster: wait on the gates (accounting
//	              ready, host cache loaded), then ask jobs for work.
//	(3) jobs       the pending-jobs query (lottery order, caps, min cores
//	              first) and, per job, its dispatchable layers and frames;
//	              jobs.Backoff keeps layers that found no host out for a while.
//	(4) matcher    per layer: a permit, then up to N checkouts of a host
//	              from the host cache; each candidate must pass Accept.
//	              Frames one host cannot take go to further hosts in the
//	              same batch (queue.hosts_per_transaction).
//	(5) hostcache  the B-tree of idle capacity kept by logical replication;
//	              Checkout scores a bounded candidate set (E-PVM, locality)
//	              and lends the host out until check-in.
//	   policy     Accept consults the optional gates: policy of GPU hosts
//	              (gpuguard), firm reservations with EASY backfill
//	              (reservations), layer spread; tiers orders shows.
//	(6) sizing     how many cores, how much memory and how many GPUs one
//	              frame books on that host (Cuebot's rules), asked by the
//	              matcher and the dispatcher alike.
//	(7) dispatch   book in Redis (publisher, book.lua: burst and caps,
//	              atomically), claim in Postgres (frame RUNNING, proc, host
//	              in one transaction, for every host of the batch), roll
//	              back the losers, then launch.
//	(8) runframe,  the RunFrame Cuebot would send (framespec: command
//	   rqdclient  tokens, environment), over gRPC to the host's RQD.
//	(9) (sidecar)  when Cuebot deletes the proc at completion, the sidecar
//	              next to it releases the booking in Redis exactly once;
//	              the release script's notice (releases) wakes the show's
//	              clusters held back by a cap or burst, back at (1).
//
// shard, with scheduler.work_split, splits the clusters between the live
// instances on PostgreSQL advisory locks (a lease renewed every step) and
// fences every booking batch (the matcher asks it before each dispatch).
//
// accounting runs beside the loop: bootstrap of the Redis counters, the
// booking gate, and the leader-elected recompute/reseed loops that keep
// Redis equal to SUM(proc). explain answers "why is this frame waiting"
// from the same queries and gates, without booking.
//
// # Where to add a placement gate
//
// A rule that refuses a host for a layer is a matcher gate: give the
// matcher a small interface in its Options (as Guard and Reservations
// are), consult it in Accept, build it here in New, and teach explain the
// same reason so `cuesched explain` and the scheduler_waiting_frames gauge
// name it. A rule that orders work (which job or show first) belongs to
// the jobs query or to tiers. A rule on how much a frame books belongs to
// sizing. A cap that must hold across scheduler instances belongs in the
// booking script (lua/book.lua through publisher), never in Go alone.
package scheduler
