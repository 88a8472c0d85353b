// Package publisher is the Go side of cuesched's Redis accounting scripts
// (package lua): booking, rollback, release (single and LSN-checkpointed
// batches, and the sidecar's pipelined ReleaseBatchObserved), and the
// primitives the scheduler's reseed loops use (Mark, Reconcile, Repair,
// WriteLimits, seeding markers, the bootstrap epoch), the sidecar's
// managed-show set (SaveSidecarState), and the firm host reservation
// scripts (Reservations). It is the only package that loads or runs a
// script: no other production package imports package lua or calls
// redis.NewScript or EVAL (a test in cmd/cuesched enforces it), so each
// script's calling convention and reply are parsed in one place.
//
// # Hot path
//
//	pub, _ := publisher.New(client, publisher.Options{Registerer: reg, Logger: log})
//	res, err := pub.Book(ctx, publisher.Booking{ProcID: p, ShowID: s, AllocID: a, FolderID: f,
//	        JobID: j, LayerID: l, DeptID: d, Centicores: 150, GPUs: 0})
//	switch {
//	case err == nil:                                // charged (res.Duplicate: by an earlier call)
//	case errors.As(err, &limitErr):                 // a cap; names table and numbers
//	case errors.Is(err, publisher.ErrShowNotSeeded): // wait: flip or restart in progress
//	default:                                        // Redis error: outcome unknown, Rollback is safe
//	}
//	// INSERT proc ... ; on failure:
//	pub.Rollback(ctx, p)
//
// BookAll books a batch in one round trip (the script once per booking,
// pipelined in order) and answers each booking as Book would; the
// dispatcher books every frame of a batch with it.
//
// The dispatcher must commit its proc INSERT within the accounting loops'
// in-flight grace (scheduler/accounting Config.InFlightGrace, 60 s) of Book
// returning, or roll back: a record whose proc is still invisible after the
// grace is treated as a leak and dropped by the next recompute (and adopted
// again if the INSERT commits later). A caller that sets Booking.BackendPID
// must run the transaction on that backend's connection, held from before
// Book to the end of the transaction: once the backend is gone, a record
// whose proc is not in a reconcile's snapshot is dropped at once
// (ReconcileRequest.LiveBackends). Book does not consult the instance's
// booking gate; the caller checks it (accounting.Service.Ready) and the
// script refuses unseeded shows either way.
//
// The Cuebot side (or cuesched's sidecar, from the WAL) releases with
// Release(ctx, procIDs...) or, exactly once per source transaction,
// ReleaseBatch(ctx, commitLSN, []Release{{ProcID: p}}).
//
// # Idempotency
//
// The reference design had none: a retried booking double-counted until the
// next recompute. Here every booking writes a per-proc record
// (acct:proc:{proc}) in the same script that charges it, and the record is
// the unit of everything else:
//
//   - booking a proc that has a record is a no-op (Result.Duplicate);
//   - release and rollback undo exactly what the record charged, on the keys
//     it names, and delete it; without a record they are counted no-ops;
//   - release leaves a tombstone (acct:tomb:{proc}, TombstoneTTL) so neither
//     a late retried booking nor a recompute whose snapshot predates the
//     release can charge the proc again; rollback leaves none, so a proc
//     whose INSERT "failed" but actually committed is re-adopted;
//   - ReleaseBatch additionally stores the source LSN in the same script
//     (acct:sidecar:lsn, %016X) and refuses LSNs not above it, so a WAL
//     replay is a no-op as a whole.
//
// Invariant: for every counter, int_cores (int_gpus) equals the sum of the
// records charging it. Every script preserves it; Repair re-establishes it.
//
// # Units
//
// Postgres holds centicores, Redis whole cores; the conversion happens here
// and nowhere else. A booking is charged ChargeCores(centicores) = ceil(c /
// 100): Cuebot books fractions (50 centicores = half a core) and a rounded-
// down charge of 0 would lose the booking. The record keeps the exact
// centicores. Caps round down (never allow more than Postgres does) and keep
// Cuebot's reading of each table:
//
//   - subscription size and burst (CapCores): a positive value stays at
//     least 1 core, so a burst below one core still books one fractional
//     proc; a burst of 0 or below books nothing (no "unlimited" burst);
//   - folder max cores and GPUs (FolderCapCores, FolderCapGPUs): exactly -1
//     is unlimited (Cuebot's "int_max_cores = -1 OR ..."); any other value
//     is a cap, so 0, a fraction of a core and other negatives book nothing;
//   - job max cores and GPUs (JobCapCores, JobCapGPUs): no unlimited value
//     (Cuebot books while int_cores + need <= int_max_cores), so 0 and
//     negatives book nothing; a GPU cap binds only procs that take GPUs.
//
// A cap field missing from Redis refuses the booking (LimitError.Missing),
// never reads as unlimited or as some default. Priority passes through
// verbatim. The consequence, by design, is that Redis may under-book by less
// than one core per proc against Postgres, never over-book.
//
// # Redis topology
//
// Connect through redis.UniversalClient (NewClient): one config serves a
// single node or Sentinel. Redis Cluster is not supported: the scripts reach
// keys they derive from ids and records (not declared in KEYS) and a release
// batch spans shows; Cluster would need per-show hash tags on every key and
// per-show checkpoints. Scripts run through go-redis redis.Script (EVALSHA,
// falling back to EVAL on NOSCRIPT, so a restarted or failed-over Redis
// needs no reload step).
package publisher
