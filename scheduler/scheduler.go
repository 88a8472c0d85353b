package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cuesched/cuesched/scheduler/loop"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/accounting"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/scheduler/explain"
	"github.com/cuesched/cuesched/scheduler/failfast"
	"github.com/cuesched/cuesched/scheduler/gpuguard"
	"github.com/cuesched/cuesched/scheduler/hostcache"
	"github.com/cuesched/cuesched/scheduler/hostcache/matcherhosts"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/memsize"
	"github.com/cuesched/cuesched/scheduler/releases"
	"github.com/cuesched/cuesched/scheduler/reservations"
	"github.com/cuesched/cuesched/scheduler/rqdclient"
	"github.com/cuesched/cuesched/scheduler/shard"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/scheduler/tiers"
	"github.com/cuesched/cuesched/shared/config"
	sharedmetrics "github.com/cuesched/cuesched/shared/metrics"

	"github.com/cuesched/cuesched/shared/redact"
)

// Deps supplies what the configuration cannot: shared connections (nil:
// opened from the config), the host cache, the accounting gate and loops,
// and test hooks.
type Deps struct {
	Pool  *pgxpool.Pool
	Redis redis.UniversalClient
	// Hosts is the host cache the matcher checks hosts out of. Nil: the
	// replication-fed hostcache built from the configuration (its stream
	// runs as one of the scheduler's loops and passes wait for its first
	// snapshot).
	Hosts matcher.Hosts
	// Gate is waited on before every pass. Nil: the accounting service's
	// readiness (booking paused until Redis is bootstrapped).
	Gate loop.Gate
	// NoAccounting skips the accounting service (bootstrap, reseed and
	// recompute loops). For tests that seed Redis themselves; a production
	// scheduler always runs it (only the elected leader runs the loops).
	NoAccounting bool
	// Loops run next to the pipeline for the scheduler's lifetime (host
	// cache stream, accounting loops); an error from one stops the
	// scheduler.
	Loops []func(ctx context.Context) error
	// RQDResolve maps a host name to the address dialed (tests aim it at a
	// fake RQD); nil dials "<name>:<rqd.grpc_port>".
	RQDResolve     func(host string) string
	RQDDialOptions []grpc.DialOption
	Logger         hclog.Logger
	Registerer     prometheus.Registerer
	Health         *sharedmetrics.Health
}

// Scheduler is one assembled scheduler instance.
type Scheduler struct {
	Feed    *clusters.Feed
	Loop    *loop.Loop
	Matcher *matcher.Matcher
	// Backoff is the matcher's per-(cluster, layer) backoff.
	Backoff    *jobs.Backoff
	Dispatcher *dispatch.Dispatcher
	Publisher  *publisher.Publisher
	// Accounting is nil with Deps.NoAccounting.
	Accounting *accounting.Service
	// HostCache is nil when Deps.Hosts was given.
	HostCache *hostcache.Cache
	// Shard is the work split (scheduler.work_split); nil with none.
	Shard *shard.Shard
	// Reservations honours, sweeps and (queue.reservations.enabled)
	// grants firm host reservations.
	Reservations *reservations.Manager

	pool      *pgxpool.Pool
	rdb       redis.UniversalClient
	rqd       *rqdclient.Pool
	ownPool   bool
	ownRedis  bool
	loops     []func(context.Context) error
	log       hclog.Logger
	closeOnce sync.Once
}

func kb(s config.Size) int64 { return int64(s) / 1024 }

// PoolConfig is the scheduler's pool configuration: database.url with
// pool_size, connect_timeout, and the statement_timeout and lock_timeout
// every connection sets (config.Database.SessionParams), so no read of the
// job, layer, cluster, recompute, reseed or reservation paths can wait
// forever on a lock or a dead connection. The replication streams and the
// leader's lock session dial their own connections from the URL.
func PoolConfig(db config.Database) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return nil, fmt.Errorf("database.url: %w", redact.Error(err, db.URL))
	}
	if db.PoolSize > 0 {
		pc.MaxConns = int32(db.PoolSize)
	}
	if t := db.ConnectTimeout.D(); t > 0 {
		pc.ConnConfig.ConnectTimeout = t
	}
	for k, v := range db.SessionParams() {
		pc.ConnConfig.RuntimeParams[k] = v
	}
	return pc, nil
}

// New assembles a scheduler from cfg: it resolves the facility,
// loads the cluster set and wires the feed, matcher, dispatcher and RQD
// client. It does not book anything until Run.
func New(ctx context.Context, cfg config.Config, d Deps) (_ *Scheduler, err error) {
	log := d.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	s := &Scheduler{pool: d.Pool, rdb: d.Redis, loops: append([]func(context.Context) error(nil), d.Loops...), log: log}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.pool == nil {
		pc, err := PoolConfig(cfg.Database)
		if err != nil {
			return nil, err
		}
		s.pool, err = pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("database: %w", redact.Error(err, cfg.Database.URL))
		}
		s.ownPool = true
	}
	// A database without the rollout (version table, publications) is
	// refused now, with what to run, instead of at the first change the
	// host cache's stream decodes.
	var pubs []string
	if d.Hosts == nil {
		pubs = append(pubs, hostcache.ConfigFrom(cfg).Publication)
	}
	if err := migrations.CheckApplied(ctx, s.pool, pubs...); err != nil {
		return nil, err
	}
	if s.rdb == nil {
		cc, err := publisher.ClientConfigFrom(cfg.Accounting)
		if err != nil {
			return nil, err
		}
		s.rdb, err = publisher.NewClient(cc)
		if err != nil {
			return nil, fmt.Errorf("accounting: %w", err)
		}
		s.ownRedis = true
	}
	// A wrong Redis password never heals: stop now rather than retry it
	// forever.
	if err := publisher.CheckAuth(ctx, s.rdb); err != nil {
		return nil, fmt.Errorf("accounting: %w", err)
	}
	s.Publisher, err = publisher.New(s.rdb, publisher.Options{Logger: log, Registerer: d.Registerer})
	if err != nil {
		return nil, err
	}

	q := cfg.Queue
	facilityID := ""
	if cfg.Scheduler.Facility != "" {
		facilityID, err = clusters.ResolveFacility(ctx, s.pool, cfg.Scheduler.Facility)
		if err != nil {
			return nil, fmt.Errorf("scheduler.facility: %w", err)
		}
	}
	feedOpts := clusters.FeedOptions{
		Load: clusters.LoadOptions{FacilityID: facilityID, IgnoreTags: cfg.Scheduler.IgnoreTags,
			ManualChunkSize: q.ManualTagsChunkSize, HostnameChunkSize: q.HostnameTagsChunkSize},
		ReloadInterval: q.ClusterReloadInterval.D(), ScanInterval: q.ActiveScanInterval.D(),
		Logger: log, Registerer: d.Registerer,
		PassesPerCluster: q.Stream.PassesPerCluster,
		// A cap the WAL says changed is copied to Redis before the show's
		// clusters are woken (s.Accounting is set below, before Run).
		CapsChanged: func(ctx context.Context, shows []string) error {
			if s.Accounting == nil {
				return nil
			}
			return s.Accounting.ReseedShowLimits(ctx, shows)
		},
	}
	// scheduler.work_split: the feed hands out only the clusters of the
	// shares this instance holds (s.Shard is set below, before Run).
	if cfg.Scheduler.WorkSplit != "" && cfg.Scheduler.WorkSplit != config.WorkSplitNone {
		feedOpts.Owns = func(c *clusters.Cluster) bool { return s.Shard != nil && s.Shard.Owns(c) }
	}
	var board *tiers.Board
	if q.ShowTiers {
		board = tiers.New(s.rdb, func() []tiers.Sub { return tiers.SubsOf(s.Feed.Clusters()) },
			tiers.Options{Interval: q.ShowTierRefresh.D(), Logger: log, Registerer: d.Registerer})
		feedOpts.Rank, feedOpts.OnePerAlloc = board.Rank, true
	}
	s.Feed, err = clusters.NewFeed(ctx, s.pool, feedOpts)
	if err != nil {
		return nil, err
	}
	var fence func(*clusters.Cluster) error
	if feedOpts.Owns != nil {
		s.Shard = shard.New(s.pool.Config().ConnConfig, shard.Config{
			Unit: shard.Unit(cfg.Scheduler.WorkSplit), Lease: cfg.Scheduler.WorkSplitLease.D(), Renew: cfg.Scheduler.WorkSplitRenew.D(),
			Scope: facilityID,
		}, shard.Options{Logger: log, Registerer: d.Registerer, Clusters: s.Feed.Clusters, InFlight: s.Feed.InFlight, Changed: s.Feed.Poke})
		s.loops = append(s.loops, s.Shard.Run)
		fence = s.Shard.Fence
	}
	var booked func(context.Context, *clusters.Cluster)
	if board != nil {
		if err := board.Refresh(ctx); err != nil {
			log.Warn("show tiers: first refresh failed; ranking every show 0 until one succeeds", "error", err)
		}
		s.loops = append(s.loops, board.Run)
		booked = func(ctx context.Context, c *clusters.Cluster) {
			if a := c.AllocID(); a != "" {
				board.Touch(ctx, tiers.Sub{Show: c.ShowID, Alloc: a})
			}
		}
	}

	schema, err := jobs.DetectSchema(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	if !schema.StartAfter || !schema.FrameEligible {
		log.Warn("older Cuebot schema: deferred layers (V47) or frame eligibility times (V41) missing; queries adapted",
			"ts_start_after", schema.StartAfter, "ts_eligible", schema.FrameEligible)
	}

	// The one sizing policy: the matcher's Accept, the dispatcher's plan
	// and the reservation loop all size frames with this value.
	policy := sizing.Policy{CoreUnit: int64(q.CoreMultiplier), StrandedMemKB: kb(q.MemoryStrandedThreshold),
		MinMemKB: kb(q.MemReservedMin), SelfishServices: q.SelfishServices, History: memsize.FromConfig(cfg.Sizing)}
	var sizer matcher.Sizer
	if policy.History.Enabled() {
		if schema.MemorySizing {
			sizer = memsize.New(s.pool, policy.History, memsize.Options{Logger: log, Registerer: d.Registerer, TTL: cfg.Sizing.HistoryTTL.D()})
		} else {
			log.Warn("memory sizing is on but rollout 0009 (cuesched_frame_oom, cuesched_layer_oom) is not applied: frames book their requests; run `cuesched migrate up`")
			policy.History = sizing.History{}
		}
	}
	unit := policy.Unit()
	if !cfg.RQD.DryRun {
		resolve := d.RQDResolve
		if resolve == nil && cfg.RQD.AddressOverride != "" {
			// Demos and fault tests: one fake RQD answers for every host
			// (the host name travels in the x-cuesched-host metadata).
			override := cfg.RQD.AddressOverride
			resolve = func(string) string { return override }
		}
		rqdTLS, err := cfg.RQD.TLS.Client("rqd.tls")
		if err != nil {
			return nil, err
		}
		s.rqd = rqdclient.New(rqdclient.Options{Port: cfg.RQD.GRPCPort, Resolve: resolve, DialOptions: d.RQDDialOptions, TLS: rqdTLS,
			ConnectTimeout: cfg.RQD.ConnectTimeout.D(), RequestTimeout: cfg.RQD.RequestTimeout.D(), Logger: log})
	}
	var launcher dispatch.Launcher
	if s.rqd != nil {
		launcher = s.rqd
	}
	budget := cfg.DispatchBudget()
	resvHosts := &servingHosts{}
	s.Reservations = newReservations(cfg, s.pool, s.rdb, resvHosts, policy, log, d.Registerer)
	s.loops = append(s.loops, s.Reservations.Run)
	s.Dispatcher = dispatch.New(s.pool, s.Publisher, launcher, dispatch.Config{
		Policy: policy, SoftLimit: q.FrameMemorySoftLimit, HardLimit: q.FrameMemoryHardLimit,
		DryRun: cfg.RQD.DryRun, Schema: &schema,
		LaunchTimeout: budget.Launch, CompensateTimeout: budget.Compensate,
		// Well inside the grace after which the accounting loop drops a
		// booking whose proc never appeared.
		BookTimeout: cfg.Accounting.InFlightGrace.D() / 2,
	}, dispatch.Options{Logger: log, Registerer: d.Registerer, Reservations: s.Reservations})
	// Settles booking transactions whose outcome stayed unknown.
	s.loops = append(s.loops, s.Dispatcher.Run)

	hosts := d.Hosts
	var gates []loop.Gate
	var capacity loop.Capacity
	if hosts == nil {
		hc := hostcache.ConfigFrom(cfg)
		hc.ConnString = s.pool.Config().ConnString()
		// The cluster feed follows the host cache's stream: shows,
		// subscriptions, allocations, host tags and caps reach it from the
		// WAL (the safety reload stays as a backstop).
		s.HostCache, err = hostcache.New(hc, hostcache.Options{Logger: log, Registerer: d.Registerer,
			Tap: clusters.NewFollower(s.Feed, log)})
		if err != nil {
			return nil, err
		}
		hosts = matcherhosts.New(s.HostCache)
		resvHosts.set(s.HostCache)
		capacity = cacheCapacity{s.HostCache}
		s.loops = append(s.loops, s.HostCache.Run)
		gates = append(gates, loop.GateFunc(s.HostCache.WaitReady))
		if d.Health != nil {
			d.Health.SetCheck("hostcache", func() error {
				if !s.HostCache.Ready() {
					return errors.New("host cache: initial snapshot not loaded yet")
				}
				return nil
			})
		}
	}

	if sv, ok := hosts.(reservations.Hosts); ok && s.HostCache == nil {
		resvHosts.set(sv) // a host source of the caller's that can list serving hosts
	}

	var guard matcher.Guard
	if q.GPUProtection {
		g := gpuguard.New(s.pool, gpuguard.Options{Interval: q.GPUProtectionRefresh.D(), Logger: log, Registerer: d.Registerer})
		s.loops = append(s.loops, g.Run)
		guard = g
	}

	var spread matcher.Spread
	if q.LayerSpread.Enabled {
		spread = matcher.Spread{Fraction: q.LayerSpread.MaxHostFraction, MinFrames: q.LayerSpread.MinFrames}
	}
	s.Backoff = jobs.NewBackoff(q.LayerBackoffMin.D(), q.LayerBackoffMax.D())
	maxLayers := cfg.Database.PoolSize - 1
	if d.Pool != nil {
		maxLayers = int(d.Pool.Config().MaxConns) - 1
	}
	s.Matcher = matcher.New(s.pool, hosts, s.Dispatcher, matcher.Config{
		Attempts: q.HostCandidateAttemptsPerLayer, FramesPerLayer: q.DispatchFramesPerLayerLimit, FramesPerJob: q.DispatchFramesPerJobLimit,
		MaxConcurrentLayers: max(maxLayers, 1), Policy: policy, Schema: &schema,
		HostQuarantine: q.HostQuarantine.D(), Spread: spread, SeatPacking: q.SeatPacking, HostsPerBatch: q.HostsPerTransaction,
	}, matcher.Options{Logger: log, Registerer: d.Registerer, Backoff: s.Backoff, Guard: guard, Reservations: s.Reservations,
		Sizer: sizer, Fence: fence, Seats: s.Publisher})

	if d.Gate != nil {
		gates = append(gates, d.Gate)
	}
	if !d.NoAccounting {
		s.Accounting, err = accounting.New(s.pool, s.Publisher, accounting.Config{
			RecomputeInterval:   cfg.Accounting.RecomputeInterval.D(),
			LimitReseedInterval: cfg.Accounting.LimitReseedInterval.D(),
			LeaderPollInterval:  cfg.Accounting.LeaderPollInterval.D(),
			InFlightGrace:       cfg.Accounting.InFlightGrace.D(),
		}, log, d.Registerer)
		if err != nil {
			return nil, err
		}
		// A Redis that accounts for another database is refused at start
		// (Run keeps checking; an unreachable Redis only pauses booking).
		ictx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = s.Accounting.CheckIdentity(ictx)
		cancel()
		if errors.Is(err, publisher.ErrIdentityMismatch) {
			return nil, err
		}
		err = nil
		s.loops = append(s.loops, s.Accounting.Run)
		if d.Gate == nil {
			gates = append(gates, loop.GateFunc(s.Accounting.WaitReady))
		}
		if d.Health != nil {
			d.Health.SetCheck("accounting", s.Accounting.ReadyErr)
		}
	}

	if schema.LimitSettings {
		// Frames Cuebot marked DEAD for a licence denial go back to WAITING
		// (package dispatch, ReviveDeniedSQL); the leader does it.
		rv := dispatch.DenialReviver{Pool: s.pool, Log: log.Named("denials")}
		if s.Accounting != nil {
			rv.Leader = s.Accounting.IsLeader
		}
		s.loops = append(s.loops, rv.Run)
	}

	if schema.LayerBackoff && q.FailFastBackoffMin.D() > 0 {
		// Layers whose frames keep failing fast are held out of the
		// lottery and the passes (package failfast); the leader judges.
		ff := failfast.Loop{Pool: s.pool, Log: log.Named("failfast"), Config: failfast.Config{
			Interval: q.FailFastInterval.D(), Failures: q.FailFastFailures, Probe: q.FailFastProbe, RunTime: q.FailFastRunTime.D(),
			BackoffMin: q.FailFastBackoffMin.D(), BackoffMax: q.FailFastBackoffMax.D(),
		}}
		if s.Accounting != nil {
			ff.Leader = s.Accounting.IsLeader
		}
		held := s.Matcher
		ff.Held = func(failfast.Held) { held.Held() }
		s.loops = append(s.loops, ff.Run)
	}

	if iv := q.WaitingStatsInterval.D(); iv > 0 {
		var leader func() bool
		if s.Accounting != nil {
			leader = s.Accounting.IsLeader
		}
		g, err := explain.NewGauge(s.pool, iv, leader, log, d.Registerer)
		if err != nil {
			return nil, err
		}
		g.GPUProtection = q.GPUProtection
		s.loops = append(s.loops, g.Run)
	}

	var released loop.Releases
	if iv := q.ClusterReleaseWakeMin.D(); iv > 0 {
		// Work held back by a cap or burst is looked at again when the
		// sidecar releases the show's procs (package releases).
		b := releases.New(iv, d.Registerer)
		b.Log = log.Named("releases")
		pub := s.Publisher
		s.loops = append(s.loops, func(ctx context.Context) error { return b.Run(ctx, pub.WatchReleases) })
		released = b
	}

	s.Loop = loop.New(s.pool, s.Feed, s.Matcher, loop.Config{
		ClusterBuffer: q.Stream.ClusterBufferSize, JobBuffer: q.Stream.JobBufferSize, MaxJobsPerPass: q.MaxJobsPerClusterPass,
		CoreUnit: int(unit), AgeRelief: q.PriorityAgeRelief.D(),
		Lottery: q.JobOrder != config.JobOrderStrict, LotterySeed: q.LotterySeed, FramesPerJob: q.DispatchFramesPerJobLimit,
		EmptySleep: q.ClusterEmptySleep.D(), SaturatedSleep: q.ClusterSaturatedSleep.D(), Schema: &schema,
		Live:            accounting.Live{RDB: s.rdb},
		PassTimeout:     q.PassTimeout.D(),
		ErrorBackoffMin: q.ClusterErrorBackoffMin.D(), ErrorBackoffMax: q.ClusterErrorBackoffMax.D(),
	}, loop.Options{Logger: log, Registerer: d.Registerer, Gate: loop.AllGates(gates), Capacity: capacity, Releases: released, Booked: booked})

	if d.Health != nil {
		d.Health.SetCheck("scheduler", func() error {
			if len(s.Feed.Clusters()) == 0 {
				return errors.New("no clusters: no active scheduler-managed show with subscriptions and tagged hosts")
			}
			return nil
		})
	}
	log.Info("scheduler assembled", "facility", cfg.Scheduler.Facility, "clusters", len(s.Feed.Clusters()),
		"dry_run", cfg.RQD.DryRun)
	return s, nil
}

// Run runs the loop and the background loops until ctx ends or a loop fails.
func (s *Scheduler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(s.loops)+1)
	var wg sync.WaitGroup
	for _, run := range s.loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil && ctx.Err() == nil {
				errs <- err
				cancel()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = s.Loop.Run(ctx)
	}()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// cacheCapacity adapts the host cache to Capacity.
type cacheCapacity struct{ c *hostcache.Cache }

func (a cacheCapacity) Watch(c *clusters.Cluster) clusters.Watch {
	return a.c.Watch(c.FacilityID, c.ShowID, c.TagNames())
}

func (a cacheCapacity) Changed() <-chan struct{} { return a.c.CapacityChanged() }

// Close releases what New opened.
func (s *Scheduler) Close() {
	s.closeOnce.Do(func() {
		if s.rqd != nil {
			_ = s.rqd.Close()
		}
		if s.ownRedis && s.rdb != nil {
			_ = s.rdb.Close()
		}
		if s.ownPool && s.pool != nil {
			s.pool.Close()
		}
	})
}
