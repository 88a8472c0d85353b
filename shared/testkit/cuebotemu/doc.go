// Package cuebotemu is a TEST DOUBLE: it emulates what an unmodified Cuebot
// does in PostgreSQL when a frame finishes on a render node, so tests,
// `cuesched-lab demo` and benchmarks can run the scheduler, the sidecar and a
// fake RQD end to end without a Java Cuebot. It is not production code and
// must only be used by tests, test tools and the demo.
//
// Everything here is written from the facts of Cuebot's completion path
// (frame, proc, host and stat tables as migrations/baseline holds them; no
// Cuebot code or SQL is copied). One completion report is handled the way Cuebot's
// FrameCompleteHandler handles it:
//
//  1. Load the proc named by the report's resource id, with its host,
//     host_stat, allocation and job (a proc whose host has no host_stat row
//     counts as missing, as in Cuebot). No proc: the orphan path, which only
//     finalizes the frame if it is still RUNNING and no proc references it.
//     A proc that now runs another frame: the report is a stale duplicate
//     and is dropped. A proc with no frame: it is released.
//  2. Transaction "stopFrame" (one statement, stopFrameSQL): choose the new
//     state (SUCCEEDED on exit 0; otherwise WAITING while retries remain,
//     DEAD when they are used up or the frame timed out, EATEN with
//     auto-eat; the special exit statuses and signals Cuebot knows), UPDATE
//     the frame guarded by state RUNNING and its version (exit status,
//     ts_stopped = now + 1 s, max RSS, version + 1, past core and GPU
//     time), raise layer_mem/job_mem max RSS, and detach the proc from the
//     frame (proc.pk_frame = NULL). The frame triggers of
//     the baseline do the rest (layer_stat/job_stat counts, frame_history,
//     DEPEND/CHECKPOINT rewrites). Zero rows updated: the stale-report path
//     releases the proc.
//  3. Post-completion, autocommit statements (the counters sent in one
//     round trip): show_stats, job_usage and layer_usage counters from the
//     database clock (now − ts_started, at least 1 s), and the job →
//     FINISHED shutdown when nothing is left to run.
//  4. Transaction "unbook" (deleteVirtualProc), opened by one statement
//     (unbookSQL): DELETE the proc RETURNING its reservation, give the host
//     its idle cores, memory, GPUs and GPU memory back, then
//     - local (desktop) proc: layer_resource, job_resource local counters and
//     host_local, and nothing else;
//     - scheduler-managed show (show.b_scheduler_managed read in this
//     transaction; Cuebot caches it for up to 30 s, the emulator does not):
//     nothing more, except Cuebot's pg_notify('acct_release')
//     when Options.NotifyRelease is set (the release reaches Redis through
//     our sidecar, which reads the DELETE from the WAL);
//     - Cuebot-managed show: decrement subscription (show, the host's
//     allocation as loaded in step 1), layer_resource, job_resource,
//     folder_resource (the job's current folder) and point (the job's
//     current dept and show), in that order.
//
// Where Cuebot sends several statements of one transaction the emulator may
// send one statement with the same effects: the rows the frame triggers
// and the unbook lock are then held for that statement alone, not across
// client round trips, as Cuebot's JDBC transactions hold them. The lab
// measures the scheduler beside this emulator on one machine, so the
// emulator keeps its own lock holds short (`make bench`'s end-to-end phase
// drained in a median 30.0 s against 34.2 s with one statement a round
// trip, 3 runs each).
//
// The emulator always unbooks after a completion. Cuebot may instead keep a
// proc of a Cuebot-managed show and run the next frame of the same job on it;
// the emulator does not dispatch, so it never does. It also leaves out what
// the fact sheet does not describe or what no test observes: dependency
// satisfaction, layer-delay rules, raising a layer's memory after an OOM,
// redirects, Kafka events.
//
// Helpers for tests:
//   - Book does what a dispatcher does in Postgres to start one frame on a
//     host (Cuebot's startFrameAndProc): frame WAITING → RUNNING guarded by
//     version, INSERT proc, host idle decreased, and for Cuebot-managed shows
//     the five accounting tables incremented (with Cuebot's trigger checks).
//     For scheduler-managed shows it writes what cuesched's dispatcher writes
//     in Postgres (no accounting tables; the Redis booking is separate).
//   - Release is the unbook transaction alone (Cuebot unbookProc).
//   - KillFrame is Cuebot clearing a running frame (the lost-proc path with
//     exit status 299, FRAME_CLEARED): release the proc, then the frame back
//     to WAITING. ClearProc does the same for the frame of a given proc.
//   - HostDown is Cuebot losing a host: host_stat DOWN, then every proc of
//     the host released and its frame returned to WAITING with exit status
//     399 (DOWN_HOST).
//   - MarkMemoryKill is Cuebot's memory guard marking a frame it is about
//     to kill for memory (exit status 33, version + 1); the completion that
//     follows (RQD's ordinary kill, status 1 / signal 9) is then a memory
//     failure: retried past the frame's retries, 33 kept.
//   - FakeRQDCallback adapts the emulator to fakerqd.Config.OnComplete.
//   - Succeeded returns the statements Complete sends for a frame that
//     succeeded on a managed show's proc (SucceededPath), so a benchmark
//     can replay Cuebot's side of the loop in pgbench with the emulator's
//     own SQL (lab/e2e's phase 5).
//
// Every transaction is retried a few times on deadlock or serialization
// failure (as RQD resends a report Cuebot could not process); any other
// error is returned and changes nothing.
package cuebotemu
