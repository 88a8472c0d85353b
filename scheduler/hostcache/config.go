package hostcache

import "github.com/cuesched/cuesched/shared/config"

// ConfigFrom maps cuesched's configuration file onto a Config: the database
// URL, the host_cache section, queue.host_booking_strategy and the
// placement keys (queue.placement, placement_weights, placement_candidates,
// locality). AssumeTTL, LeaseTimeout and the slot name keep their defaults.
//
// queue.placement best_fit is round 1 exactly: the first fitting host of the
// walk in host_booking_strategy's order; worst_fit the first walking both
// dimensions Worst-Fit; epvm scores candidates drawn from the walk in
// host_booking_strategy's order.
func ConfigFrom(c config.Config) Config {
	cfg := DefaultConfig(c.Database.URL)
	if c.HostCache.Publication != "" {
		cfg.Publication = c.HostCache.Publication
	}
	if c.HostCache.MemoryKeyDivisor > 0 {
		cfg.MemoryKeyDivisor = c.HostCache.MemoryKeyDivisor.Bytes()
	}
	if c.HostCache.GroupIdleTimeout > 0 {
		cfg.GroupIdleTimeout = c.HostCache.GroupIdleTimeout.D()
	}
	cfg.Strategy = &HostBookingStrategy{
		CoreSaturation:   c.Queue.HostBookingStrategy.CoreSaturation,
		MemorySaturation: c.Queue.HostBookingStrategy.MemorySaturation,
	}
	cfg.WarmFrames = c.Queue.Locality.WarmFrames
	switch c.Queue.Placement {
	case config.PlacementBestFit:
		cfg.Placement = nil
	case config.PlacementWorstFit:
		cfg.Placement = nil
		cfg.Strategy = &HostBookingStrategy{}
	default:
		w := c.Queue.PlacementWeights
		cfg.Placement = &Placement{
			Weights:    Weights{Cores: w.Cores, Memory: w.Memory, GPUs: w.GPUs, GPUMemory: w.GPUMemory},
			Candidates: c.Queue.PlacementCandidates, Locality: c.Queue.Locality.Enabled, Tolerance: c.Queue.Locality.Tolerance,
		}
	}
	return cfg
}
