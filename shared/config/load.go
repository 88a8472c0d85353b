package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cuesched/cuesched/shared/redact"
)

// Error is a configuration error that names where it came from.
type Error struct {
	File string // file path, or "environment"
	Line int    // 0 when unknown
	Key  string // dotted key, e.g. queue.cluster_empty_sleep
	Msg  string
}

// Error never quotes a password: a value that was a URL or DSN is redacted.
func (e *Error) Error() string {
	msg := redact.URL(e.Msg)
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Key == "" {
		return fmt.Sprintf("config %s: %s", loc, msg)
	}
	return fmt.Sprintf("config %s: key %q: %s", loc, e.Key, msg)
}

// Load reads the file at path (if path is non-empty) over the defaults, then
// applies environment overrides from getenv (nil means os.Getenv), then
// validates. A missing file named explicitly is an error.
func Load(path string, getenv func(string) string) (Config, error) {
	cfg := Default()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return cfg, &Error{File: path, Msg: "file does not exist"}
			}
			return cfg, &Error{File: path, Msg: err.Error()}
		}
		if err := Parse(data, path, &cfg); err != nil {
			return cfg, err
		}
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	if err := applyEnv(reflect.ValueOf(&cfg).Elem(), "CUESCHED", getenv); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		if ce, ok := err.(*Error); ok && ce.File == "" {
			ce.File = path
			if path == "" {
				ce.File = "(defaults and environment)"
			}
		}
		return cfg, err
	}
	return cfg, nil
}

// Parse decodes YAML data (from file, for messages) strictly into cfg.
func Parse(data []byte, file string, cfg *Config) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return &Error{File: file, Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if len(root.Content) == 0 {
		return nil // empty file: all defaults
	}
	return decodeInto(root.Content[0], reflect.ValueOf(cfg).Elem(), "", file)
}

// decodeInto walks the YAML mapping against the struct so that unknown keys
// and bad values are reported with their full dotted key and line.
func decodeInto(n *yaml.Node, v reflect.Value, prefix, file string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if v.Kind() == reflect.Struct && !implementsUnmarshaler(v) {
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.MappingNode {
			return &Error{File: file, Line: n.Line, Key: prefix, Msg: "expected a mapping of keys"}
		}
		fields := structFields(v.Type())
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			key := join(prefix, k.Value)
			idx, ok := fields[k.Value]
			if !ok {
				return &Error{File: file, Line: k.Line, Key: key, Msg: "unknown key (valid keys here: " + strings.Join(sortedKeys(fields), ", ") + ")"}
			}
			if seen[k.Value] {
				return &Error{File: file, Line: k.Line, Key: key, Msg: "key given twice"}
			}
			seen[k.Value] = true
			if err := decodeInto(val, v.Field(idx), key, file); err != nil {
				return err
			}
		}
		return nil
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		msg := err.Error()
		msg = strings.TrimPrefix(msg, "yaml: ")
		if te, ok := err.(*yaml.TypeError); ok && len(te.Errors) > 0 {
			msg = te.Errors[0]
			if i := strings.Index(msg, ": "); i >= 0 && strings.HasPrefix(msg, "line ") {
				msg = msg[i+2:]
			}
		}
		return &Error{File: file, Line: n.Line, Key: prefix, Msg: msg}
	}
	return nil
}

var unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()

func implementsUnmarshaler(v reflect.Value) bool {
	return v.CanAddr() && v.Addr().Type().Implements(unmarshalerType)
}

func structFields(t reflect.Type) map[string]int {
	m := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("yaml")
		name := strings.Split(tag, ",")[0]
		if name == "" || name == "-" {
			continue
		}
		m[name] = i
	}
	return m
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func join(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// EnvName is the environment variable that overrides a dotted key.
func EnvName(key string) string {
	return "CUESCHED_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

func applyEnv(v reflect.Value, prefix string, getenv func(string) string) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if name == "" || name == "-" {
			continue
		}
		env := prefix + "_" + strings.ToUpper(name)
		f := v.Field(i)
		if f.Kind() == reflect.Struct && !implementsUnmarshaler(f) {
			if err := applyEnv(f, env, getenv); err != nil {
				return err
			}
			continue
		}
		raw := getenv(env)
		if raw == "" {
			continue
		}
		if err := setFromString(f, raw); err != nil {
			return &Error{File: "environment", Key: env, Msg: err.Error()}
		}
	}
	return nil
}

func setFromString(f reflect.Value, raw string) error {
	if implementsUnmarshaler(f) {
		n := &yaml.Node{Kind: yaml.ScalarNode, Value: raw, Tag: "!!str"}
		if _, err := strconv.ParseFloat(raw, 64); err == nil {
			n.Tag = "!!int"
		}
		return f.Addr().Interface().(yaml.Unmarshaler).UnmarshalYAML(n)
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString(raw)
	case reflect.Int, reflect.Int64, reflect.Int32:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not an integer", raw)
		}
		f.SetInt(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return fmt.Errorf("%q is not a boolean (true/false)", raw)
		}
		f.SetBool(b)
	case reflect.Float64:
		x, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", raw)
		}
		f.SetFloat(x)
	case reflect.Slice:
		var items []string
		for _, s := range strings.Split(raw, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
		f.Set(reflect.ValueOf(items))
	default:
		return fmt.Errorf("cannot be set from the environment")
	}
	return nil
}

// Validate checks ranges and enumerations.
func (c Config) Validate() error {
	bad := func(key, msg string) error { return &Error{Key: key, Msg: msg} }
	if c.Database.PoolSize < 2 {
		return bad("database.pool_size", "must be at least 2")
	}
	if c.Accounting.RedisURL == "" && c.Accounting.SentinelMaster == "" {
		return bad("accounting.redis_url", "must be set (or accounting.sentinel_master with sentinel_addrs)")
	}
	if _, err := c.Accounting.RedisTLS.Client("accounting.redis_tls"); err != nil {
		return err
	}
	if _, err := c.RQD.TLS.Client("rqd.tls"); err != nil {
		return err
	}
	if c.Accounting.SentinelMaster != "" && len(c.Accounting.SentinelAddrs) == 0 {
		return bad("accounting.sentinel_addrs", "must list at least one sentinel when sentinel_master is set")
	}
	positive := map[string]Duration{
		"accounting.recompute_interval":       c.Accounting.RecomputeInterval,
		"accounting.limit_reseed_interval":    c.Accounting.LimitReseedInterval,
		"accounting.leader_poll_interval":     c.Accounting.LeaderPollInterval,
		"queue.cluster_reload_interval":       c.Queue.ClusterReloadInterval,
		"queue.active_scan_interval":          c.Queue.ActiveScanInterval,
		"queue.pass_timeout":                  c.Queue.PassTimeout,
		"queue.cluster_error_backoff_min":     c.Queue.ClusterErrorBackoffMin,
		"host_cache.group_idle_timeout":       c.HostCache.GroupIdleTimeout,
		"rqd.connect_timeout":                 c.RQD.ConnectTimeout,
		"rqd.request_timeout":                 c.RQD.RequestTimeout,
		"queue.reservations.blocked_for":      c.Queue.Reservations.BlockedFor,
		"queue.reservations.timeout":          c.Queue.Reservations.Timeout,
		"queue.reservations.refresh_interval": c.Queue.Reservations.RefreshInterval,
	}
	for _, k := range sortedDurKeys(positive) {
		if positive[k] <= 0 {
			return bad(k, "must be a positive duration")
		}
	}
	if c.Queue.ClusterReleaseWakeMin < 0 {
		return bad("queue.cluster_release_wake_min", "must not be negative (0 turns release wake-ups off)")
	}
	if c.Database.StatementTimeout < 0 {
		return bad("database.statement_timeout", "must not be negative (0 keeps the server's setting)")
	}
	if c.Database.LockTimeout < 0 {
		return bad("database.lock_timeout", "must not be negative (0 keeps the server's setting)")
	}
	if g := c.Accounting.InFlightGrace; g < Duration(4*time.Second) {
		return bad("accounting.in_flight_grace", "must be at least 4s (a dispatcher gets half of it to commit a booking)")
	}
	ints := []struct {
		key string
		v   int
	}{
		{"queue.dispatch_frames_per_layer_limit", c.Queue.DispatchFramesPerLayerLimit},
		{"queue.hosts_per_transaction", c.Queue.HostsPerTransaction},
		{"queue.core_multiplier", c.Queue.CoreMultiplier},
		{"queue.stream.cluster_buffer_size", c.Queue.Stream.ClusterBufferSize},
		{"queue.stream.job_buffer_size", c.Queue.Stream.JobBufferSize},
		{"queue.stream.passes_per_cluster", c.Queue.Stream.PassesPerCluster},
		{"queue.max_jobs_per_cluster_pass", c.Queue.MaxJobsPerClusterPass},
		{"queue.manual_tags_chunk_size", c.Queue.ManualTagsChunkSize},
		{"queue.hostname_tags_chunk_size", c.Queue.HostnameTagsChunkSize},
		{"queue.host_candidate_attempts_per_layer", c.Queue.HostCandidateAttemptsPerLayer},
		{"accounting.redis_pool_size", c.Accounting.RedisPoolSize},
		{"queue.reservations.max_grants", c.Queue.Reservations.MaxGrants},
	}
	for _, it := range ints {
		if it.v < 1 {
			return bad(it.key, "must be at least 1")
		}
	}
	if c.HostCache.MemoryKeyDivisor < MiB {
		return bad("host_cache.memory_key_divisor", "must be at least 1MiB")
	}
	if c.Queue.FrameMemorySoftLimit < 1 || c.Queue.FrameMemoryHardLimit < c.Queue.FrameMemorySoftLimit {
		return bad("queue.frame_memory_hard_limit", "need 1 <= frame_memory_soft_limit <= frame_memory_hard_limit")
	}
	if c.Queue.ClusterErrorBackoffMax < c.Queue.ClusterErrorBackoffMin {
		return bad("queue.cluster_error_backoff_max", "must not be less than cluster_error_backoff_min")
	}
	if c.Queue.LayerBackoffMax < c.Queue.LayerBackoffMin {
		return bad("queue.layer_backoff_max", "must not be less than layer_backoff_min")
	}
	if c.Queue.FailFastBackoffMax < c.Queue.FailFastBackoffMin {
		return bad("queue.fail_fast_backoff_max", "must not be less than fail_fast_backoff_min")
	}
	if c.Queue.FailFastBackoffMin > 0 && (c.Queue.FailFastFailures < 1 || c.Queue.FailFastInterval <= 0 || c.Queue.FailFastRunTime <= 0) {
		return bad("queue.fail_fast_failures", "fail_fast_failures must be at least 1 and fail_fast_interval and fail_fast_run_time positive while fail_fast_backoff_min is set")
	}
	if c.Queue.FailFastProbe < 0 {
		return bad("queue.fail_fast_probe", "must not be negative (0: a released layer is judged on fail_fast_failures runs)")
	}
	if f := c.Queue.Reservations.MaxFraction; !(f > 0 && f <= 1) {
		return bad("queue.reservations.max_fraction", fmt.Sprintf("must be in (0, 1], not %g", f))
	}
	switch c.Scheduler.WorkSplit {
	case WorkSplitNone, WorkSplitAllocation, WorkSplitCluster:
	default:
		return bad("scheduler.work_split", fmt.Sprintf("must be %q, %q or %q, not %q", WorkSplitNone, WorkSplitAllocation, WorkSplitCluster, c.Scheduler.WorkSplit))
	}
	if c.Scheduler.WorkSplitLease.D() < time.Second {
		return bad("scheduler.work_split_lease", fmt.Sprintf("must be at least 1s, not %s", c.Scheduler.WorkSplitLease.D()))
	}
	if r := c.Scheduler.WorkSplitRenew.D(); r < 0 || 2*r >= c.Scheduler.WorkSplitLease.D() {
		return bad("scheduler.work_split_renew", fmt.Sprintf("must be 0 (a tenth of work_split_lease) or positive and below half of work_split_lease (%s), not %s",
			c.Scheduler.WorkSplitLease.D(), r))
	}
	switch c.Queue.JobOrder {
	case JobOrderLottery, JobOrderStrict:
	default:
		return bad("queue.job_order", fmt.Sprintf("must be %q or %q, not %q", JobOrderLottery, JobOrderStrict, c.Queue.JobOrder))
	}
	switch c.Queue.Placement {
	case PlacementEPVM, PlacementBestFit, PlacementWorstFit:
	default:
		return bad("queue.placement", fmt.Sprintf("must be %q, %q or %q, not %q", PlacementEPVM, PlacementBestFit, PlacementWorstFit, c.Queue.Placement))
	}
	w := c.Queue.PlacementWeights
	for _, it := range []struct {
		key string
		v   float64
	}{{"cores", w.Cores}, {"memory", w.Memory}, {"gpus", w.GPUs}, {"gpu_memory", w.GPUMemory}} {
		if it.v < 0 || it.v > 1000 || it.v != it.v {
			return bad("queue.placement_weights."+it.key, "must be between 0 and 1000")
		}
	}
	if w.Cores+w.Memory+w.GPUs+w.GPUMemory <= 0 {
		return bad("queue.placement_weights", "at least one weight must be positive")
	}
	if n := c.Queue.PlacementCandidates; n < 1 || n > 256 {
		return bad("queue.placement_candidates", "must be between 1 and 256")
	}
	if c.Queue.Locality.WarmFrames < 1 {
		return bad("queue.locality.warm_frames", "must be at least 1")
	}
	if t := c.Queue.Locality.Tolerance; t < 0 || t > 1 || t != t {
		return bad("queue.locality.tolerance", "must be between 0 and 1")
	}
	if f := c.Queue.LayerSpread.MaxHostFraction; c.Queue.LayerSpread.Enabled && (f <= 0 || f > 1 || f != f) {
		return bad("queue.layer_spread.max_host_fraction", "must be above 0 and at most 1")
	}
	if c.Queue.LayerSpread.MinFrames < 1 {
		return bad("queue.layer_spread.min_frames", "must be at least 1")
	}
	if err := c.Sizing.validate(); err != nil {
		return err
	}
	if c.RQD.GRPCPort < 1 || c.RQD.GRPCPort > 65535 {
		return bad("rqd.grpc_port", "must be a TCP port (1-65535)")
	}
	switch strings.ToLower(c.Logging.Level) {
	case "trace", "debug", "info", "warn", "error":
	default:
		return bad("logging.level", fmt.Sprintf("%q is not one of trace, debug, info, warn, error", c.Logging.Level))
	}
	switch c.Logging.Format {
	case "text", "json":
	default:
		return bad("logging.format", fmt.Sprintf("%q is not text or json", c.Logging.Format))
	}
	if c.Sidecar.SlotName == "" || strings.ToLower(c.Sidecar.SlotName) != c.Sidecar.SlotName {
		return bad("sidecar.slot_name", "must be a non-empty lower-case replication slot name")
	}
	if len(c.Sidecar.Publications) == 0 {
		return bad("sidecar.publications", "must name at least one publication")
	}
	if c.Metrics.MaxConnections < 1 {
		return bad("metrics.max_connections", "must be at least 1")
	}
	return c.checkDispatchBudget()
}

func sortedDurKeys(m map[string]Duration) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (s Sizing) validate() error {
	bad := func(key, msg string) error { return &Error{Key: "sizing." + key, Msg: msg} }
	for _, m := range []struct{ key, v string }{{"memory", s.Memory}, {"threadable", s.Threadable}} {
		if m.v != SizingHistory && m.v != SizingRequest {
			return bad(m.key, fmt.Sprintf("must be %q or %q, not %q", SizingHistory, SizingRequest, m.v))
		}
	}
	if q := s.Quantile; !(q > 0 && q <= 1) {
		return bad("quantile", fmt.Sprintf("must be in (0, 1], not %g", q))
	}
	if s.WindowFrames < 1 || s.WindowFrames > 1000 {
		return bad("window_frames", "must be between 1 and 1000")
	}
	if s.MinSamples < 1 || s.MinSamples > s.WindowFrames {
		return bad("min_samples", "must be at least 1 and at most window_frames")
	}
	if h := s.Headroom; !(h >= 0 && h <= 10) {
		return bad("headroom", "must be between 0 and 10 (a fraction: 0.1 = +10%)")
	}
	if s.MaxMemory != 0 && s.MaxMemory < s.MinMemory {
		return bad("max_memory", "must be 0 (no clamp) or at least min_memory")
	}
	if f := s.OOMRetryFactor; !(f >= 1 && f <= 10) {
		return bad("oom_retry_factor", "must be between 1 and 10")
	}
	if s.OOMBumpKills < 1 {
		return bad("oom_bump_kills", "must be at least 1")
	}
	if s.ProbeFrames < 0 {
		return bad("probe_frames", "must not be negative")
	}
	for _, d := range []struct {
		key string
		v   Duration
	}{{"max_age", s.MaxAge}, {"oom_bump_window", s.OOMBumpWindow}} {
		if d.v <= 0 {
			return bad(d.key, "must be a positive duration")
		}
	}
	if s.HistoryTTL < 0 {
		return bad("history_ttl", "must not be negative (0 reads the history every pass)")
	}
	return nil
}
