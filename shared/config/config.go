// Package config loads cuesched's YAML configuration.
//
// One file serves both daemons; each reads the sections it needs. Sections
// mirror the reference scheduler's (database, accounting, queue, host_cache,
// scheduler, rqd) plus ours (sidecar, logging, metrics). Loading is strict:
// an unknown key, a malformed duration or size, or a missing file is an error
// that names the key, the file and the line. Every key has a default (see
// Default and the annotated example in config/example.yaml), environment
// variables override the file (CUESCHED_<SECTION>_<KEY>, e.g.
// CUESCHED_DATABASE_URL, CUESCHED_QUEUE_HOST_BOOKING_STRATEGY_CORE_SATURATION)
// and command-line flags override both (applied by the caller).
package config

import (
	"strconv"
	"time"
)

// Config is the whole configuration.
type Config struct {
	Database   Database   `yaml:"database"`
	Accounting Accounting `yaml:"accounting"`
	Queue      Queue      `yaml:"queue"`
	Sizing     Sizing     `yaml:"sizing"`
	HostCache  HostCache  `yaml:"host_cache"`
	Scheduler  Scheduler  `yaml:"scheduler"`
	RQD        RQD        `yaml:"rqd"`
	Sidecar    Sidecar    `yaml:"sidecar"`
	Logging    Logging    `yaml:"logging"`
	Metrics    Metrics    `yaml:"metrics"`
}

// Database is the Cuebot PostgreSQL database.
type Database struct {
	// URL is a libpq-style URL or DSN, e.g. postgres://cuebot@db:5432/cuebot.
	URL string `yaml:"url"`
	// PoolSize bounds the connection pool of one process.
	PoolSize int `yaml:"pool_size"`
	// ConnectTimeout bounds each connection attempt.
	ConnectTimeout Duration `yaml:"connect_timeout"`
	// StatementTimeout and LockTimeout are set on every connection of the
	// scheduler's pool (PostgreSQL statement_timeout and lock_timeout; 0
	// leaves the server's setting): a query waiting on a lock or on a
	// black-holed connection fails instead of hanging a worker.
	StatementTimeout Duration `yaml:"statement_timeout"`
	LockTimeout      Duration `yaml:"lock_timeout"`
}

// SessionParams are the run-time parameters the scheduler's pool sets on
// its connections (milliseconds, as PostgreSQL reads a bare number).
func (d Database) SessionParams() map[string]string {
	out := map[string]string{}
	if t := d.StatementTimeout.D(); t > 0 {
		out["statement_timeout"] = strconv.FormatInt(max(t.Milliseconds(), 1), 10)
	}
	if t := d.LockTimeout.D(); t > 0 {
		out["lock_timeout"] = strconv.FormatInt(max(t.Milliseconds(), 1), 10)
	}
	return out
}

// Accounting is the Redis accounting store and its loops.
type Accounting struct {
	// RedisURL is redis://[user:pass@]host:port/db for a single node.
	RedisURL string `yaml:"redis_url"`
	// SentinelMaster and SentinelAddrs select Sentinel-managed Redis instead
	// of RedisURL (the same universal client serves both).
	SentinelMaster string   `yaml:"sentinel_master"`
	SentinelAddrs  []string `yaml:"sentinel_addrs"`
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// themselves (Sentinel's requirepass / ACL user), apart from the
	// primary's credentials in redis_url.
	SentinelUsername string `yaml:"sentinel_username"`
	SentinelPassword string `yaml:"sentinel_password"`
	// RedisTLS is TLS to Redis (and its Sentinels): a custom CA, a client
	// certificate for mutual TLS. A rediss:// URL turns TLS on as well.
	RedisTLS      TLS `yaml:"redis_tls"`
	RedisPoolSize int `yaml:"redis_pool_size"`
	// RecomputeInterval rebuilds booked counters from SUM(proc).
	RecomputeInterval Duration `yaml:"recompute_interval"`
	// LimitReseedInterval copies caps (size, burst, max cores) PG -> Redis.
	LimitReseedInterval Duration `yaml:"limit_reseed_interval"`
	// LeaderPollInterval is how often a follower tries to take the loop lock.
	LeaderPollInterval Duration `yaml:"leader_poll_interval"`
	// InFlightGrace: a booking whose proc row never appeared (its scheduler
	// died between the booking script and the INSERT) is dropped from Redis
	// this long after it was booked. Each dispatcher gives up on a booking
	// after half of it. Set the same on every instance.
	InFlightGrace Duration `yaml:"in_flight_grace"`
}

// BookingStrategy chooses Best-Fit (true) or Worst-Fit (false) per dimension.
type BookingStrategy struct {
	CoreSaturation   bool `yaml:"core_saturation"`
	MemorySaturation bool `yaml:"memory_saturation"`
}

// Placement strategies (queue.placement).
const (
	PlacementEPVM     = "epvm"
	PlacementBestFit  = "best_fit"
	PlacementWorstFit = "worst_fit"
)

// PlacementWeights weigh each resource in the E-PVM cost.
type PlacementWeights struct {
	Cores     float64 `yaml:"cores"`
	Memory    float64 `yaml:"memory"`
	GPUs      float64 `yaml:"gpus"`
	GPUMemory float64 `yaml:"gpu_memory"`
}

// Locality is the bonus for a host that runs or just ran the same layer.
type Locality struct {
	// Enabled applies the bonus (epvm placement only).
	Enabled bool `yaml:"enabled"`
	// WarmFrames: a host stays warm for a layer until this many frames of
	// other layers were booked on it since the layer last booked or ran
	// there.
	WarmFrames int `yaml:"warm_frames"`
	// Tolerance is the near-tie band: a live or warm host wins over the
	// cheapest candidate when its cost is within this fraction of it.
	Tolerance float64 `yaml:"tolerance"`
}

// LayerSpread caps one layer's share of a host.
type LayerSpread struct {
	Enabled bool `yaml:"enabled"`
	// MaxHostFraction of a host's cores one layer may hold...
	MaxHostFraction float64 `yaml:"max_host_fraction"`
	// ...but never fewer than MinFrames of its frames.
	MinFrames int `yaml:"min_frames"`
}

// Stream sizes the pipeline's concurrency.
type Stream struct {
	ClusterBufferSize int `yaml:"cluster_buffer_size"`
	JobBufferSize     int `yaml:"job_buffer_size"`
	// PassesPerCluster: passes of one cluster in flight at once, on
	// disjoint jobs, while it has more work than one pass holds (1: one
	// pass per cluster, round 1).
	PassesPerCluster int `yaml:"passes_per_cluster"`
}

// Job orders of a cluster pass (queue.job_order).
const (
	JobOrderLottery = "lottery"
	JobOrderStrict  = "strict"
)

// Queue is the dispatch pipeline.
type Queue struct {
	DispatchFramesPerLayerLimit int `yaml:"dispatch_frames_per_layer_limit"`
	// DispatchFramesPerJobLimit caps the frames one job books in one pass,
	// over all its layers, so a job's share of a pass does not grow with
	// its layer count (0: no cap, round 1).
	DispatchFramesPerJobLimit int `yaml:"dispatch_frames_per_job_limit"`
	// HostsPerTransaction is how many hosts one booking transaction may
	// span: a layer's frames that do not fit on one host go to the next
	// hosts in the same transaction (1: one host per transaction, round 1).
	HostsPerTransaction     int      `yaml:"hosts_per_transaction"`
	CoreMultiplier          int      `yaml:"core_multiplier"`
	MemoryStrandedThreshold Size     `yaml:"memory_stranded_threshold"`
	ClusterEmptySleep       Duration `yaml:"cluster_empty_sleep"`
	ClusterSaturatedSleep   Duration `yaml:"cluster_saturated_sleep"`
	// ClusterReleaseWakeMin: a cluster sleeping because its work is held
	// back by a cap or burst wakes at the next release of its show's procs
	// (the sidecar's notice), but no sooner than this after its pass
	// (scheduler/releases). 0: no release wake-ups (the saturated sleep).
	ClusterReleaseWakeMin Duration `yaml:"cluster_release_wake_min"`
	// PassTimeout bounds one pass of a cluster (its job query, its jobs'
	// layer queries and batches): a pass stuck on the database ends, and
	// its worker takes the next cluster.
	PassTimeout Duration `yaml:"pass_timeout"`
	// ClusterErrorBackoffMin and Max bound the retry of a cluster whose
	// pass failed on a database, Redis or host-cache error (doubling per
	// consecutive failure, with jitter): an error is not an empty cluster.
	ClusterErrorBackoffMin        Duration        `yaml:"cluster_error_backoff_min"`
	ClusterErrorBackoffMax        Duration        `yaml:"cluster_error_backoff_max"`
	ClusterReloadInterval         Duration        `yaml:"cluster_reload_interval"`
	ActiveScanInterval            Duration        `yaml:"active_scan_interval"`
	Stream                        Stream          `yaml:"stream"`
	MaxJobsPerClusterPass         int             `yaml:"max_jobs_per_cluster_pass"`
	ManualTagsChunkSize           int             `yaml:"manual_tags_chunk_size"`
	HostnameTagsChunkSize         int             `yaml:"hostname_tags_chunk_size"`
	HostCandidateAttemptsPerLayer int             `yaml:"host_candidate_attempts_per_layer"`
	MemReservedMin                Size            `yaml:"mem_reserved_min"`
	SelfishServices               []string        `yaml:"selfish_services"`
	HostBookingStrategy           BookingStrategy `yaml:"host_booking_strategy"`
	FrameMemorySoftLimit          float64         `yaml:"frame_memory_soft_limit"`
	FrameMemoryHardLimit          float64         `yaml:"frame_memory_hard_limit"`
	// PriorityAgeRelief raises a waiting job's effective priority by one
	// point per this much waiting time, so old low-priority work is not
	// starved. Zero disables it.
	PriorityAgeRelief Duration `yaml:"priority_age_relief"`
	// JobOrder is how a cluster pass picks its jobs: "lottery" (default)
	// draws them weighted by effective priority, so priority is a rate of
	// bookings and every job keeps a chance; "strict" takes them in
	// effective-priority order (round 1, Cuebot-like).
	JobOrder string `yaml:"job_order"`
	// LotterySeed seeds the draws (0: a random seed per process). A fixed
	// seed makes one instance's sequence of draws reproducible.
	LotterySeed int64 `yaml:"lottery_seed"`
	// ShowTiers ranks the shows sharing an allocation by subscription tier
	// (cores in use ÷ subscription size, from the accounting store): the
	// lowest tier's pass goes first and the passes of one allocation take
	// turns. false: round 1's round-robin over clusters.
	ShowTiers bool `yaml:"show_tiers"`
	// ShowTierRefresh is how often the whole tier snapshot is re-read.
	ShowTierRefresh Duration `yaml:"show_tier_refresh"`
	// GPUProtection: while GPU frames of managed shows wait, CPU frames
	// leave one GPU frame's cores and memory free per idle GPU on a host
	// (the smallest per-GPU share of the waiting GPU layers). false: CPU
	// work may take every idle core of a GPU host (round 1).
	GPUProtection bool `yaml:"gpu_protection"`
	// GPUProtectionRefresh is how often the waiting GPU layers are re-read.
	GPUProtectionRefresh Duration `yaml:"gpu_protection_refresh"`
	// SeatPacking: a layer under a node-locked limit (cuesched limit
	// set-per-host) is placed on hosts that already hold a seat first, and
	// on another host only while a seat is free; its frames are not spread
	// (queue.layer_spread) over seat hosts. false: hosts in the cache's
	// order, the booking script refusing hosts without a seat.
	SeatPacking bool `yaml:"seat_packing"`
	// WaitingStatsInterval is how often the loop leader counts waiting
	// frames by reason for scheduler_waiting_frames (0 disables it).
	WaitingStatsInterval Duration `yaml:"waiting_stats_interval"`
	// LayerBackoffMin/Max bound the schedule-after backoff of a layer that
	// found no host (doubling between the two).
	LayerBackoffMin Duration `yaml:"layer_backoff_min"`
	LayerBackoffMax Duration `yaml:"layer_backoff_max"`
	// FailFast backs off a layer whose frames keep failing fast: the loop
	// leader checks every pending layer of the managed shows each
	// FailFastInterval, and a layer with at least FailFastFailures failed
	// runs since it last succeeded (or was last judged), averaging at most
	// FailFastRunTime each, is held out of the lottery and of every pass
	// for FailFastBackoffMin, doubling up to FailFastBackoffMax while it
	// goes on; a success ends it. FailFastBackoffMin 0 disables it.
	// FailFastProbe is the size of a held layer's retry window: released
	// from a hold, it is judged again only once at least that many runs
	// have failed since, so every retry window is a probe of a fixed number
	// of frames, not however many the passes book in one judgement
	// interval (which scales with the machine's speed).
	FailFastInterval   Duration `yaml:"fail_fast_interval"`
	FailFastFailures   int      `yaml:"fail_fast_failures"`
	FailFastProbe      int      `yaml:"fail_fast_probe"`
	FailFastRunTime    Duration `yaml:"fail_fast_run_time"`
	FailFastBackoffMin Duration `yaml:"fail_fast_backoff_min"`
	FailFastBackoffMax Duration `yaml:"fail_fast_backoff_max"`
	// HostQuarantine keeps a host whose RQD refused a launch or could not
	// be reached out of this instance's checkouts for this long.
	HostQuarantine Duration `yaml:"host_quarantine"`
	// Placement chooses a host among those that fit: "epvm" (default)
	// scores a bounded candidate set drawn from the index walk by the
	// marginal E-PVM cost; "best_fit" takes the first host of the walk in
	// host_booking_strategy's order (round 1); "worst_fit" the first host
	// walking both dimensions Worst-Fit.
	Placement string `yaml:"placement"`
	// PlacementWeights weigh cores, memory, GPUs and GPU memory in the
	// E-PVM cost.
	PlacementWeights PlacementWeights `yaml:"placement_weights"`
	// PlacementCandidates is how many fitting hosts E-PVM scores from the
	// index walk (plus a quarter as many from its other end).
	PlacementCandidates int         `yaml:"placement_candidates"`
	Locality            Locality    `yaml:"locality"`
	LayerSpread         LayerSpread `yaml:"layer_spread"`
	// Reservations are firm host reservations with EASY backfill for wide
	// frames (scheduler/reservations).
	Reservations Reservations `yaml:"reservations"`
}

// Reservations configures firm host reservations (queue.reservations).
type Reservations struct {
	// Enabled: this instance grants reservations. Every instance honours
	// the reservations in Redis whatever its setting.
	Enabled bool `yaml:"enabled"`
	// BlockedFor is the net blocked time (a leaky bucket: grows while the
	// layer finds no host, drains while it books) a layer needs to reserve.
	BlockedFor Duration `yaml:"blocked_for"`
	// MaxGrants caps the reservations held at once (all instances).
	MaxGrants int `yaml:"max_grants"`
	// MaxFraction caps the share of an allocation's hosts that fit a
	// layer's frame which may be reserved at once (at least one host).
	MaxFraction float64 `yaml:"max_fraction"`
	// Timeout ends a reservation held this long.
	Timeout Duration `yaml:"timeout"`
	// RefreshInterval is the reservation loop's period: re-read Redis,
	// end reservations whose demand is gone, grant new ones.
	RefreshInterval Duration `yaml:"refresh_interval"`
}

// Sizing modes (sizing.memory, sizing.threadable).
const (
	// SizingHistory sizes from the RSS peaks of the layer's recent
	// successful frames (memory) or from the memory the frame will use on
	// the host it lands on (threadable cores).
	SizingHistory = "history"
	// SizingRequest books what the layer asks for: layer.int_mem_min and
	// layer.int_cores_min, as Cuebot does.
	SizingRequest = "request"
)

// Sizing is how much memory and how many cores a frame books (section
// sizing). With memory and threadable both "request" cuesched books like
// Cuebot; the other keys then have no effect.
type Sizing struct {
	// Memory is "history" (a quantile of the RSS peaks of the layer's
	// recent succeeded frames, plus headroom, within the clamps; a layer
	// without enough history books its request) or "request"
	// (layer.int_mem_min, Cuebot's behaviour).
	Memory string `yaml:"memory"`
	// Threadable is "history" (a threadable layer's frame books
	// round(memory / host memory per core) cores on the host it lands on,
	// within the layer's min/max; a layer without history first runs
	// ProbeFrames frames at its request) or "request" (the layer's minimum
	// cores, Cuebot's behaviour).
	Threadable string `yaml:"threadable"`
	// Quantile of the RSS peaks booked (0.5 = median, 1 = the largest).
	Quantile float64 `yaml:"quantile"`
	// WindowFrames is how many of the layer's most recent succeeded frames
	// are read.
	WindowFrames int `yaml:"window_frames"`
	// MinSamples: a layer with fewer samples in the window books its
	// request.
	MinSamples int `yaml:"min_samples"`
	// MaxAge: frames that stopped longer ago than this are not samples.
	MaxAge Duration `yaml:"max_age"`
	// Headroom is added to the quantile as a fraction (0.1 = +10%).
	Headroom float64 `yaml:"headroom"`
	// MinMemory and MaxMemory clamp a history-derived size (MaxMemory 0:
	// no upper clamp). A frame's own OOM retry size is clamped by MaxMemory
	// too.
	MinMemory Size `yaml:"min_memory"`
	MaxMemory Size `yaml:"max_memory"`
	// HistoryTTL is how long a layer's history read is reused before it is
	// read again (passes in between read none).
	HistoryTTL Duration `yaml:"history_ttl"`
	// OOMRetryFactor: a frame killed for memory retries at its max RSS
	// (at least what it had booked) times this factor.
	OOMRetryFactor float64 `yaml:"oom_retry_factor"`
	// OOMBumpKills memory kills of one layer within OOMBumpWindow raise the
	// layer's size (to the largest retry size among those kills); fewer
	// raise only the killed frames.
	OOMBumpKills  int      `yaml:"oom_bump_kills"`
	OOMBumpWindow Duration `yaml:"oom_bump_window"`
	// ProbeFrames: a threadable layer with no history runs this many frames
	// at its request before its cores are derived from their RSS (0: derive
	// as soon as min_samples exist).
	ProbeFrames int `yaml:"probe_frames"`
}

// HostCache is the replication-fed host cache.
type HostCache struct {
	MemoryKeyDivisor Size     `yaml:"memory_key_divisor"`
	GroupIdleTimeout Duration `yaml:"group_idle_timeout"`
	// Publication is the logical-replication publication the cache streams.
	Publication string `yaml:"publication"`
}

// Scheduler scopes one scheduler instance.
type Scheduler struct {
	// Facility is a facility name (facility.str_name); empty means all.
	Facility   string   `yaml:"facility"`
	IgnoreTags []string `yaml:"ignore_tags"`
	// InstanceName identifies this instance in logs and status; defaults to
	// the hostname and pid.
	InstanceName string `yaml:"instance_name"`
	// WorkSplit splits the clusters between the live instances of one
	// facility scope (package scheduler/shard): "none" (default: every
	// instance plans every cluster, as a single instance does),
	// "allocation" (one share per allocation, a show's tag clusters as
	// their own share) or "cluster" (one share per cluster).
	WorkSplit string `yaml:"work_split"`
	// WorkSplitLease is the lock session's idle_session_timeout: a dead or
	// stalled instance's shares move within lease + renew (10 s).
	WorkSplitLease Duration `yaml:"work_split_lease"`
	// WorkSplitRenew is how often an instance renews its lease and
	// rebalances; 0 is a tenth of the lease. It must be below half the
	// lease.
	WorkSplitRenew Duration `yaml:"work_split_renew"`
}

// Work splits (scheduler.work_split).
const (
	WorkSplitNone       = "none"
	WorkSplitAllocation = "allocation"
	WorkSplitCluster    = "cluster"
)

// RQD is how the dispatcher reaches render nodes.
type RQD struct {
	GRPCPort       int      `yaml:"grpc_port"`
	DryRun         bool     `yaml:"dry_run"`
	ConnectTimeout Duration `yaml:"connect_timeout"`
	RequestTimeout Duration `yaml:"request_timeout"`
	// AddressOverride dials every host at this host:port instead of
	// "<host name>:<grpc_port>", sending the host name in the gRPC metadata
	// key x-cuesched-host. For demos and tests against one fake RQD; leave
	// empty in production.
	AddressOverride string `yaml:"address_override"`
	// TLS to RQD, off by default (upstream RQD serves plaintext gRPC): turn
	// it on when the render nodes' RQD listens behind TLS.
	TLS TLS `yaml:"tls"`
}

// Sidecar is the release publisher.
type Sidecar struct {
	// SlotName is the permanent replication slot; one sidecar streams it at a
	// time and the others wait as hot standbys.
	SlotName string `yaml:"slot_name"`
	// Publications the slot streams.
	Publications []string `yaml:"publications"`
	// CreateSlot creates the slot if it does not exist.
	CreateSlot bool `yaml:"create_slot"`
	// RecreateLostSlot re-creates the slot when it is missing or
	// invalidated but Redis holds a sidecar checkpoint, which proves it
	// existed (a failover promoted a standby that lacks it), and requests
	// the re-bootstrap that covers the releases it never streamed.
	RecreateLostSlot bool `yaml:"recreate_lost_slot"`
	// MaxRetainedWAL warns loudly when the slot holds more WAL than this.
	MaxRetainedWAL Size `yaml:"max_retained_wal"`
	// StandbyRetry is how often a standby retries the busy slot.
	StandbyRetry Duration `yaml:"standby_retry"`
}

// Logging configures hclog.
type Logging struct {
	// Level is trace, debug, info, warn or error. SIGUSR1 toggles debug.
	Level string `yaml:"level"`
	// Format is text or json.
	Format string `yaml:"format"`
}

// Metrics is the HTTP endpoint for /metrics, /healthz and /readyz.
type Metrics struct {
	// Listen is host:port; empty disables the endpoint. The default,
	// :9090, is every interface, for a Prometheus on another host: secure
	// it with WebConfigFile or a firewall, or bind 127.0.0.1.
	Listen string `yaml:"listen"`
	// WebConfigFile is a Prometheus exporter-toolkit web configuration
	// file (tls_server_config, basic_auth_users); empty: plain HTTP
	// without authentication.
	WebConfigFile string `yaml:"web_config_file"`
	// MaxConnections caps the connections served at once.
	MaxConnections int `yaml:"max_connections"`
}

// Default returns the configuration with every default filled in.
func Default() Config {
	return Config{
		Database: Database{
			URL:              "postgres://cuebot@localhost:5432/cuebot?sslmode=disable",
			PoolSize:         20,
			ConnectTimeout:   Duration(10 * time.Second),
			StatementTimeout: Duration(30 * time.Second),
			LockTimeout:      Duration(10 * time.Second),
		},
		Accounting: Accounting{
			RedisURL:            "redis://localhost:6379/0",
			SentinelAddrs:       []string{},
			RedisPoolSize:       20,
			RecomputeInterval:   Duration(120 * time.Second),
			LimitReseedInterval: Duration(300 * time.Second),
			LeaderPollInterval:  Duration(time.Second),
			InFlightGrace:       Duration(60 * time.Second),
		},
		Queue: Queue{
			DispatchFramesPerLayerLimit:   20,
			HostsPerTransaction:           8,
			DispatchFramesPerJobLimit:     20,
			CoreMultiplier:                100,
			MemoryStrandedThreshold:       2 * GiB,
			ClusterEmptySleep:             Duration(30 * time.Second),
			ClusterSaturatedSleep:         Duration(5 * time.Second),
			ClusterReleaseWakeMin:         Duration(250 * time.Millisecond),
			PassTimeout:                   Duration(2 * time.Minute),
			ClusterErrorBackoffMin:        Duration(200 * time.Millisecond),
			ClusterErrorBackoffMax:        Duration(time.Second),
			ClusterReloadInterval:         Duration(120 * time.Second),
			ActiveScanInterval:            Duration(2 * time.Second),
			Stream:                        Stream{ClusterBufferSize: 3, JobBufferSize: 3, PassesPerCluster: 3},
			MaxJobsPerClusterPass:         20,
			ManualTagsChunkSize:           50,
			HostnameTagsChunkSize:         50,
			HostCandidateAttemptsPerLayer: 10,
			MemReservedMin:                250 * MiB,
			SelfishServices:               []string{},
			HostBookingStrategy:           BookingStrategy{CoreSaturation: true, MemorySaturation: false},
			Placement:                     PlacementEPVM,
			PlacementWeights:              PlacementWeights{Cores: 1, Memory: 1, GPUs: 4, GPUMemory: 1},
			PlacementCandidates:           24,
			Locality:                      Locality{Enabled: true, WarmFrames: 8, Tolerance: 0.1},
			LayerSpread:                   LayerSpread{Enabled: true, MaxHostFraction: 0.25, MinFrames: 8},
			FrameMemorySoftLimit:          1.6,
			FrameMemoryHardLimit:          2.0,
			PriorityAgeRelief:             Duration(10 * time.Minute),
			JobOrder:                      JobOrderLottery,
			ShowTiers:                     true,
			ShowTierRefresh:               Duration(time.Second),
			GPUProtection:                 true,
			SeatPacking:                   true,
			GPUProtectionRefresh:          Duration(time.Second),
			WaitingStatsInterval:          Duration(30 * time.Second),
			LayerBackoffMin:               Duration(time.Second),
			LayerBackoffMax:               Duration(30 * time.Second),
			FailFastInterval:              Duration(2 * time.Second),
			FailFastFailures:              5,
			FailFastProbe:                 20,
			FailFastRunTime:               Duration(10 * time.Second),
			FailFastBackoffMin:            Duration(30 * time.Second),
			FailFastBackoffMax:            Duration(30 * time.Minute),
			HostQuarantine:                Duration(30 * time.Second),
			Reservations: Reservations{
				Enabled:         true,
				BlockedFor:      Duration(300 * time.Second),
				MaxGrants:       8,
				MaxFraction:     0.5,
				Timeout:         Duration(30 * time.Minute),
				RefreshInterval: Duration(time.Second),
			},
		},
		Sizing: Sizing{
			Memory:         SizingHistory,
			Threadable:     SizingRequest,
			Quantile:       0.95,
			WindowFrames:   32,
			MinSamples:     4,
			MaxAge:         Duration(12 * time.Hour),
			Headroom:       0.1,
			MinMemory:      256 * MiB,
			MaxMemory:      0,
			HistoryTTL:     Duration(30 * time.Second),
			OOMRetryFactor: 1.5,
			OOMBumpKills:   2,
			OOMBumpWindow:  Duration(time.Hour),
			ProbeFrames:    3,
		},
		HostCache: HostCache{
			MemoryKeyDivisor: 2 * GiB,
			GroupIdleTimeout: Duration(3 * time.Hour),
			Publication:      "cuesched_hostcache",
		},
		Scheduler: Scheduler{IgnoreTags: []string{}, WorkSplit: WorkSplitNone, WorkSplitLease: Duration(10 * time.Second)},
		RQD: RQD{
			GRPCPort:       8444,
			ConnectTimeout: Duration(10 * time.Second),
			RequestTimeout: Duration(30 * time.Second),
		},
		Sidecar: Sidecar{
			SlotName:         "cuesched_sidecar",
			Publications:     []string{"cuesched_accounting", "cuesched_proc"},
			MaxRetainedWAL:   4 * GiB,
			StandbyRetry:     Duration(time.Second),
			RecreateLostSlot: true,
		},
		Logging: Logging{Level: "info", Format: "text"},
		Metrics: Metrics{Listen: ":9090", MaxConnections: 64},
	}
}
