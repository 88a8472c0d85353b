// Package faults is cuesched's fault and bad-input suite. It has no
// production code: everything is in its tests, which run the real
// `cuesched scheduler` and `cuesched sidecar` binaries as child processes
// against a private PostgreSQL cluster and a private Redis per test, kill,
// freeze and partition them, restart the servers under them, feed them bad
// data, and check after each fault that every guarantee of the system held.
//
// # Running it
//
//	make test     the default part: one representative run of each fault and
//	              each bad-input case, on a small farm (20 hosts, 200 frames
//	              of 200-700 ms, one fixed farm shape), about a minute in all
//	make faults   CUESCHED_FAULTS=full: every fault randomized and repeated
//	              (3 rounds, a new random farm each, 500 frames, tens of
//	              kills), the chaos run, and every bad-input case; about 12
//	              minutes on 2 cores
//
// Environment: CUESCHED_FAULTS_LOG=debug sets the children's log level;
// CUESCHED_FAULTS_KEEP_LOGS=DIR keeps every process log and timeline;
// CUESCHED_FAULTS_PROGRESS=1 adds progress samples to the timelines (the
// full suite always does). With -v
// (or on failure) each test prints its timeline: every fault injected, with
// its time, and what the final checks found.
//
// # What runs where
//
// The binary is built once per test binary (with -race when the tests run
// with -race, so the children are checked for data races too) into a
// directory testenv's sweep removes on a later run. Each test (env) gets:
//
//   - its own PostgreSQL cluster (synchronous_commit on, as Cuebot's database
//     has it: the harness default, off, would make a crash lose acknowledged
//     commits) with the Cuebot baseline schema and the rollout, and its own
//     redis-server, so restarting either disturbs no other test;
//   - a farm: shared/testkit/farm (several shows, one left to Cuebot,
//     bursts, folder and job caps that bind, a limit_record, GPU hosts), or
//     an exact shared/testkit/farmseed fixture for the bad-input cases;
//   - the fake RQD (shared/testkit/fakerqd) in the test process; every
//     scheduler dials it through rqd.address_override. Frame completions go
//     to the Cuebot emulator (shared/testkit/cuebotemu) and are
//     retried until processed, as RQD resends a FrameCompleteReport Cuebot
//     could not take (Postgres restarting or cut);
//   - Cuebot's orphaned-proc check (reaper): a proc whose frame its host does
//     not run, seen so in two passes, is cleared as Cuebot clears it
//     (FRAME_CLEARED; the proc judged, never its frame's next one). A
//     scheduler killed between its COMMIT and LaunchFrame leaves exactly
//     that; without the check the frame would stay RUNNING forever, in
//     production as here. Cuebot waits 300 s, longer than a scheduler may
//     take to launch what it booked (the launch deadline is anchored at the
//     booking: about a minute with these settings); the reaper waits 3 s
//     for a proc booked before a scheduler was killed (its launch can
//     never come), and for any other until that launch deadline has passed
//     (a launch slowed past 3 s on a loaded machine is not an orphan), and
//     pauses while a scheduler is frozen and until that scheduler's launch
//     deadline has passed;
//   - for every process, a TCP proxy in front of Postgres and one in front
//     of Redis (testenv.StartProxy), so one process can be partitioned alone,
//     and a per-process config file (short loop intervals: recompute 2 s,
//     leader poll 200 ms, reseed 3 s);
//   - supervision as systemd with Restart=always would do it: a process the
//     test kills is restarted by the test; one that exits on its own is
//     restarted too, so the run can finish, but that exit fails the test
//     ("every process recovers without a restart by hand"). At the end each
//     process gets SIGTERM and must drain cleanly (exit 0); a log with a
//     panic, a fatal error or a data race fails the test.
//
// # What is checked
//
// Continuously, from the start of a run to quiescence (sampler):
//
//   - Postgres, in one snapshot (violationsSQL): no managed show's procs above
//     a subscription burst or on an allocation it does not subscribe to, no
//     folder or job above its core or GPU cap, no limit_record over its max,
//     no host idle value below zero or above its total, no proc with a
//     negative reservation, nothing of a Cuebot show dispatched;
//   - Redis: every booked counter of the managed shows (subscriptions,
//     folders, jobs, layers, points) within its cap and never negative, and
//     every cap field equal to Postgres' cap (caps are static in these runs);
//   - for runs without faults (StrictRecords): no booking lost at any
//     instant: every proc of a managed show that Postgres shows before and
//     after a read of Redis has its booking record in that read, with no
//     grace (the sidecar releases a proc only once its DELETE is visible).
//
// At quiescence (env.finish): the queue drained (every managed frame done,
// no proc); no frame was started while another run of it was live
// (fakerqd DoubleLaunches), and a frame was started again only after a run
// that failed or was killed; every host is whole again; accounting.Audit
// reports no drift, every booked counter in Redis (also of finished jobs)
// equals SUM(proc), no booking record is left, the Cuebot show has no key;
// every process is up, a sidecar streams the slot, one scheduler leads the
// accounting loops, and the sidecar's checkpoint has caught up with the WAL.
//
// Two differences are by design and tolerated, each only when proven to be
// what it is: a booking charged by a scheduler that was killed or cut between
// the booking script and the end of its transaction (its rollback never ran
// or never reached Redis), and the record of a proc that finished while its
// show was Cuebot's (no release is due then). The accounting recompute drops
// the first as soon as the killed or cut process's database connection is
// gone (the record names its backend), and any other once the in-flight
// grace (accounting.in_flight_grace, 60 s by default) has passed. The
// default part accepts such a record when it was booked
// (by Redis's clock) within BookTimeout before a kill or cut of a scheduler,
// was never launched and has no proc, or when its proc's completion fell in
// an unmanaged window of its show, and the counters differ by exactly their
// charges; the full suite waits for the grace and requires zero drift.
//
// # Coverage matrix
//
// Faults (real processes; the default part runs each once, the full suite
// three rounds with random timings):
//
//	kill -9 scheduler, random points, restart   TestFaultKillScheduler (full: 2 instances, 20 kills/round)
//	kill -9 sidecar, random points, restart     TestFaultKillSidecar (full: active + standby, 20 kills/round)
//	Redis restarted empty mid-run               TestFaultRedisRestart (full: 4 restarts/round, 2 schedulers)
//	Postgres restart, "immediate" and "fast"    TestFaultPostgresRestart (full: 6 restarts/round, random mode)
//	cut/restore scheduler's PG+Redis (leader)   TestFaultPartition (full: 12 random cuts of any process,
//	cut/restore sidecar's PG+Redis                PG, Redis or both, 0.2-6 s)
//	SIGSTOP loop leader past the lock's poll    TestFaultFreeze (full: 2-12 s)
//	SIGSTOP sidecar past standby takeover       TestFaultFreeze (wal_sender_timeout=2s; standby takes the slot)
//	all of the above, at random, in sequence    TestFaultChaos (full only)
//	frozen leader while Redis restarts          TestFaultFrozenLeaderRedisRestart (the other scheduler
//	                                              takes the loops over and re-bootstraps)
//	every process cut from Postgres for 3 s,    TestFaultPostgresOutageBookingGap (measures the booking
//	  production queue pacing                     gap; fails if a failed pass slept cluster_empty_sleep)
//	Redis restarted from an older RDB under     TestFaultRedisOlderSnapshot (sidecar cut off: the scheduler
//	  load                                        alone closes every show within 1 s, watched from Redis;
//	                                              no booking against the stale state after that)
//	PostgreSQL promotion of a streaming         TestFaultPostgresPromotion (the sidecar re-creates its slot,
//	  replica behind a moved address              no process exits; booking gap printed)
//	Redis Sentinel failover: kill -9 of the     TestFaultSentinelFailover (primary, replica, 3 Sentinels;
//	  primary (full: then SIGSTOP of the new      booking gap per failover printed, bound 20 s; the killed
//	  one past down-after, SIGCONT)               primary restarts empty and is made a replica)
//
// Redis restarted empty also measures its booking gap (bound 15 s), and
// the 3 s Postgres outage its gap against the acceptance of issue #27
// (at most 5 s).
//
// The same faults in narrower set-ups elsewhere: sidecar TestKill9FiftyTimes,
// TestStandbyTakesOver, TestFrozenOwnerIsFenced, TestRedisRestartedDuringStream,
// TestRedisDownNothingAcknowledged, TestPostgresRestarted; accounting
// TestFlushAllMidLoad, TestTwoInstancesOneLeader,
// TestLeaderStopsWhenItsSessionDies; replication
// TestPermanentSlotResumesAfterTerminateWithoutLossOrDuplicates,
// TestBusySlotHotStandbyTakesOver; hostcache
// TestResnapshotsAfterWalsenderTerminate; e2e TestEndToEndUnreachableHosts.
//
// Bad input:
//
//	malformed config, CLI exits non-zero naming   TestBadConfigNamesKeyAndFile (scheduler and sidecar
//	  the key, the line and the file                binaries; loader rules: config TestErrorsNameKeyAndFile,
//	                                                TestMissingFile; in-process CLI: cuesched
//	                                                TestSchedulerCLIUsageAndErrors, TestSidecarCLIUsageAndErrors)
//	unknown facility (--facility nope)            cuesched TestSchedulerCLIUnknownFacility (not repeated here)
//	unknown show (show set-managed nope on)       rollout TestFlipUnknownShowSuggests, cuesched TestShowSetManagedCLI
//	show flipped off and on, Cuebot show flipped  TestBadShowFlipMidRun (real `cuesched show set-managed`);
//	  on, while their jobs run                      the sidecar at stream level: sidecar TestShowFlipMidStream;
//	                                                the accounting seed: accounting TestManagedFlipMidLoad
//	negative/zero/huge bursts, no subscription,   TestBadLimits
//	  huge job caps, a layer that fits no host
//	job or folder max cores = 0, job max GPUs = 0 TestBadZeroCaps
//	negative layer memory                         TestBadNegativeLayerMemory
//	hosts with no OS, zero memory, zero cores,    TestBadHosts (negative idle values cannot be written: Cuebot's
//	  no host_stat row                              host trigger refuses them); cache gates: hostcache TestGates
//	WAL for a table we do not know                TestBadWALUnexpectedRelations; a new column on a known table:
//	                                                replication TestTruncateAndAddColumnKeepStreaming;
//	                                                malformed messages: replication TestDecoderRejectsMalformedMessages
//	WAL for tables named like ours in another     TestBadWALLookAlikeRelations (default: proc, host; full:
//	  schema                                        also show, subscription)
//	RQD answering garbage / refusing launches     TestBadRQDGarbage; unreachable RQD: e2e TestEndToEndUnreachableHosts,
//	                                                matcher TestProcessQuarantinesUnreachableHosts
//
// # Bugs found
//
// The suite found four bugs in other packages, each fixed with a unit test
// where it lives and kept here as a regression test:
//
//   - TestBadZeroCaps: a job_resource.int_max_cores of 0, an int_max_gpus of
//     0 (GPU layer) or a folder_resource.int_max_cores of 0 booked without
//     any cap (the job query's "<= 0 OR" and the booking script's "> 0"
//     guard); Cuebot books nothing under such a cap, and only a folder max
//     of -1 is unlimited.
//   - TestBadNegativeLayerMemory: a negative layer.int_mem_min was booked as
//     a negative reservation (the host gained memory, RQD got negative
//     limits); it is now raised to queue.mem_reserved_min.
//   - TestBadWALLookAlikeRelations: the sidecar and the host cache matched
//     relations by table name only, so rows of shadow.proc, shadow.host, ...
//     were applied as Cuebot's; they now accept only the schema Cuebot's
//     table resolves to.
//   - TestFaultFrozenLeaderRedisRestart: a frozen accounting leader kept its
//     session lock, so after a Redis restart nobody re-bootstrapped and all
//     booking stopped until it thawed; the lock session now has an
//     idle_session_timeout.
//
// # Not covered
//
// Black-hole partitions (packets dropped, connections left open): the
// testenv proxy closes connections, which both sides see at once. A
// Sentinel failover to a replica that is known to lag (replication on
// loopback rarely loses a write; the older-snapshot test forces that
// loss). Clock skew between hosts. Disk full and Postgres running out of
// connections. Concurrent faults (the chaos run injects them in sequence).
package faults
