package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cuesched.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func noEnv(string) string { return "" }

func TestExampleEqualsDefaults(t *testing.T) {
	var cfg Config
	if err := Parse([]byte(Example()), "example.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, Default()) {
		t.Fatalf("example.yaml drifted from Default():\n got %+v\nwant %+v", cfg, Default())
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLoadOverridesDefaults(t *testing.T) {
	p := write(t, `
database:
  url: postgres://x@db/cuebot
queue:
  cluster_empty_sleep: 45
  memory_stranded_threshold: 512MiB
  host_booking_strategy:
    memory_saturation: true
scheduler:
  ignore_tags: [old, broken]
`)
	cfg, err := Load(p, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database.URL != "postgres://x@db/cuebot" || cfg.Queue.ClusterEmptySleep.D() != 45*time.Second ||
		cfg.Queue.MemoryStrandedThreshold != 512*MiB || !cfg.Queue.HostBookingStrategy.MemorySaturation ||
		!cfg.Queue.HostBookingStrategy.CoreSaturation || len(cfg.Scheduler.IgnoreTags) != 2 {
		t.Fatalf("unexpected config %+v", cfg)
	}
	if cfg.Database.PoolSize != 20 {
		t.Fatal("untouched key lost its default")
	}
}

func TestEnvOverridesFile(t *testing.T) {
	p := write(t, "database:\n  url: postgres://file/db\n")
	env := map[string]string{
		"CUESCHED_DATABASE_URL":                                "postgres://env/db",
		"CUESCHED_QUEUE_HOST_BOOKING_STRATEGY_CORE_SATURATION": "false",
		"CUESCHED_HOST_CACHE_MEMORY_KEY_DIVISOR":               "1GiB",
		"CUESCHED_ACCOUNTING_RECOMPUTE_INTERVAL":               "30s",
		"CUESCHED_SIDECAR_PUBLICATIONS":                        "a, b",
		"CUESCHED_QUEUE_RESERVATIONS_BLOCKED_FOR":              "90s",
		"CUESCHED_QUEUE_RESERVATIONS_MAX_FRACTION":             "0.25",
		"CUESCHED_QUEUE_RESERVATIONS_ENABLED":                  "false",
	}
	cfg, err := Load(p, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database.URL != "postgres://env/db" || cfg.Queue.HostBookingStrategy.CoreSaturation ||
		cfg.HostCache.MemoryKeyDivisor != GiB || cfg.Accounting.RecomputeInterval.D() != 30*time.Second ||
		!reflect.DeepEqual(cfg.Sidecar.Publications, []string{"a", "b"}) ||
		cfg.Queue.Reservations.BlockedFor.D() != 90*time.Second || cfg.Queue.Reservations.MaxFraction != 0.25 ||
		cfg.Queue.Reservations.Enabled {
		t.Fatalf("env not applied: %+v", cfg)
	}
}

func TestErrorsNameKeyAndFile(t *testing.T) {
	cases := []struct {
		name, body string
		env        map[string]string
		want       []string
	}{
		{"unknown top-level key", "databse:\n  url: x\n", nil,
			[]string{"cuesched.yaml:1", `key "databse"`, "unknown key", "database"}},
		{"unknown nested key", "queue:\n  stream:\n    cluster_bufer_size: 3\n", nil,
			[]string{"cuesched.yaml:3", `key "queue.stream.cluster_bufer_size"`, "unknown key", "cluster_buffer_size"}},
		{"bad duration", "queue:\n  cluster_empty_sleep: soon\n", nil,
			[]string{"cuesched.yaml:2", `key "queue.cluster_empty_sleep"`, `"soon" is not a duration`}},
		{"bad size", "host_cache:\n  memory_key_divisor: lots\n", nil,
			[]string{"cuesched.yaml:2", `key "host_cache.memory_key_divisor"`, `"lots" is not a size`}},
		{"bad int", "database:\n  pool_size: many\n", nil,
			[]string{"cuesched.yaml:2", `key "database.pool_size"`}},
		{"not a mapping", "queue: 5\n", nil,
			[]string{"cuesched.yaml:1", `key "queue"`, "expected a mapping"}},
		{"invalid yaml", "queue:\n  - [\n", nil,
			[]string{"cuesched.yaml", "not valid YAML"}},
		{"range check", "database:\n  pool_size: 1\n", nil,
			[]string{"cuesched.yaml", `key "database.pool_size"`, "at least 2"}},
		{"grace too short", "accounting:\n  in_flight_grace: 1s\n", nil,
			[]string{"cuesched.yaml", `key "accounting.in_flight_grace"`, "at least 4s"}},
		{"bad log level", "logging:\n  level: loud\n", nil,
			[]string{`key "logging.level"`, `"loud" is not one of`}},
		{"bad env", "", map[string]string{"CUESCHED_RQD_DRY_RUN": "maybe"},
			[]string{"config environment", `key "CUESCHED_RQD_DRY_RUN"`, "not a boolean"}},
		{"duplicate key", "rqd:\n  grpc_port: 1\n  grpc_port: 2\n", nil,
			[]string{"cuesched.yaml:3", "given twice"}},
		{"reservation fraction", "queue:\n  reservations:\n    max_fraction: 1.5\n", nil,
			[]string{`key "queue.reservations.max_fraction"`, "(0, 1]"}},
		{"reservation grants", "queue:\n  reservations:\n    max_grants: 0\n", nil,
			[]string{`key "queue.reservations.max_grants"`, "at least 1"}},
		{"sizing mode", "sizing:\n  memory: maestro\n", nil,
			[]string{"cuesched.yaml", `key "sizing.memory"`, `"history" or "request"`}},
		{"sizing threadable", "sizing:\n  threadable: probe\n", nil,
			[]string{"cuesched.yaml", `key "sizing.threadable"`}},
		{"sizing quantile", "sizing:\n  quantile: 0\n", nil,
			[]string{"cuesched.yaml", `key "sizing.quantile"`, "(0, 1]"}},
		{"sizing samples", "sizing:\n  window_frames: 8\n  min_samples: 9\n", nil,
			[]string{"cuesched.yaml", `key "sizing.min_samples"`, "window_frames"}},
		{"sizing clamps", "sizing:\n  min_memory: 4GiB\n  max_memory: 2GiB\n", nil,
			[]string{"cuesched.yaml", `key "sizing.max_memory"`}},
		{"sizing bump kills", "sizing:\n  oom_bump_kills: 0\n", nil,
			[]string{"cuesched.yaml", `key "sizing.oom_bump_kills"`}},
		{"sizing env", "", map[string]string{"CUESCHED_SIZING_MEMORY": "off"},
			[]string{`key "sizing.memory"`}},
		{"reservation timeout", "", map[string]string{"CUESCHED_QUEUE_RESERVATIONS_TIMEOUT": "0s"},
			[]string{`key "queue.reservations.timeout"`, "positive duration"}},
		{"unknown reservation key", "queue:\n  reservations:\n    blocked: 5m\n", nil,
			[]string{"cuesched.yaml:3", `key "queue.reservations.blocked"`, "blocked_for"}},
		{"bad placement", "queue:\n  placement: first_fit\n", nil,
			[]string{`key "queue.placement"`, `"epvm", "best_fit" or "worst_fit", not "first_fit"`}},
		{"unknown placement weight", "queue:\n  placement_weights:\n    disk: 1\n", nil,
			[]string{"cuesched.yaml:3", `key "queue.placement_weights.disk"`, "unknown key", "gpu_memory"}},
		{"negative weight", "", map[string]string{"CUESCHED_QUEUE_PLACEMENT_WEIGHTS_GPUS": "-1"},
			[]string{`key "queue.placement_weights.gpus"`, "between 0 and 1000"}},
		{"no weight", "queue:\n  placement_weights: {cores: 0, memory: 0, gpus: 0, gpu_memory: 0}\n", nil,
			[]string{`key "queue.placement_weights"`, "one weight must be positive"}},
		{"candidates", "queue:\n  placement_candidates: 0\n", nil,
			[]string{`key "queue.placement_candidates"`, "between 1 and 256"}},
		{"tolerance", "queue:\n  locality:\n    tolerance: 2\n", nil,
			[]string{`key "queue.locality.tolerance"`}},
		{"spread fraction", "queue:\n  layer_spread:\n    max_host_fraction: 0\n", nil,
			[]string{`key "queue.layer_spread.max_host_fraction"`}},
		{"request timeout past Cuebot's orphan check", "rqd:\n  request_timeout: 3m\n", nil,
			[]string{"cuesched.yaml", `key "rqd.request_timeout"`, "cannot be honoured", "orphaned-proc", "5m0s"}},
		{"bad work split", "scheduler:\n  work_split: show\n", nil,
			[]string{"cuesched.yaml", `key "scheduler.work_split"`, `"none", "allocation" or "cluster", not "show"`}},
		{"work split lease too short", "scheduler:\n  work_split_lease: 500ms\n", nil,
			[]string{"cuesched.yaml", `key "scheduler.work_split_lease"`, "at least 1s"}},
		{"work split renew past half the lease", "scheduler:\n  work_split_lease: 4s\n  work_split_renew: 2s\n", nil,
			[]string{"cuesched.yaml", `key "scheduler.work_split_renew"`, "below half of work_split_lease"}},
		{"grace past Cuebot's orphan check", "accounting:\n  in_flight_grace: 8m\n", nil,
			[]string{"cuesched.yaml", `key "accounting.in_flight_grace"`, "cannot be honoured"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := write(t, tc.body)
			_, err := Load(p, func(k string) string { return tc.env[k] })
			if err == nil {
				t.Fatal("expected an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestPlacementKeys(t *testing.T) {
	p := write(t, `
queue:
  placement: best_fit
  placement_weights:
    gpus: 8
  locality:
    enabled: false
  layer_spread:
    enabled: false
    max_host_fraction: 0
`)
	env := map[string]string{"CUESCHED_QUEUE_PLACEMENT_CANDIDATES": "32", "CUESCHED_QUEUE_LOCALITY_WARM_FRAMES": "4"}
	cfg, err := Load(p, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	q := cfg.Queue
	if q.Placement != PlacementBestFit || q.PlacementWeights != (PlacementWeights{Cores: 1, Memory: 1, GPUs: 8, GPUMemory: 1}) ||
		q.PlacementCandidates != 32 || q.Locality != (Locality{WarmFrames: 4, Tolerance: 0.1}) || q.LayerSpread.Enabled {
		t.Fatalf("placement keys: %+v", q)
	}
	d := Default().Queue
	if d.Placement != PlacementEPVM || !d.Locality.Enabled || !d.LayerSpread.Enabled || d.LayerSpread.MaxHostFraction != 0.25 || d.LayerSpread.MinFrames != 8 {
		t.Fatalf("defaults: %+v", d)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), noEnv)
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("got %v", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]Size{"2GiB": 2 * GiB, "250MiB": 250 * MiB, "1048576": MiB, "1.5GB": 1500000000, "4g": 4 * GiB} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1GiB", "GiB", "1.2.3MB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

// TestDispatchBudget: the post-commit deadlines and the drain follow the
// configured timeouts instead of fixed 60 s / 30 s values.
func TestDispatchBudget(t *testing.T) {
	c := Default()
	b := c.DispatchBudget()
	req := c.RQD.RequestTimeout.D()
	if b.Launch != 2*req || b.Compensate != CompensateBudget || b.PostCommit != b.Launch+b.Compensate {
		t.Errorf("budget %+v for request_timeout %s", b, req)
	}
	if b.Drain < CommitResolveBudget+b.PostCommit {
		t.Errorf("drain %s shorter than a batch's commit and post-commit work %s", b.Drain, CommitResolveBudget+b.PostCommit)
	}
	if b.ProcLifetime >= CuebotOrphanedProcInterval {
		t.Errorf("defaults cannot be honoured: %+v", b)
	}
	c.RQD.RequestTimeout = Duration(100 * time.Second)
	b2 := c.DispatchBudget()
	if b2.Launch != 200*time.Second || b2.Drain-b.Drain != 2*(100*time.Second-req) {
		t.Errorf("budget does not follow rqd.request_timeout: %+v then %+v", b, b2)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("100s request timeout fits: %v", err)
	}
	c.RQD.RequestTimeout = Duration(140 * time.Second)
	if err := c.Validate(); err == nil {
		t.Errorf("140s request timeout: a proc may live %s, past Cuebot's orphan check", c.DispatchBudget().ProcLifetime)
	}
	c.RQD.DryRun = true
	if err := c.Validate(); err != nil || c.DispatchBudget().Launch != 0 {
		t.Errorf("dry run launches nothing: %v %+v", err, c.DispatchBudget())
	}
}
