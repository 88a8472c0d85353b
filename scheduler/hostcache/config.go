package hostcache

import "github.com/cuesched/cuesched/shared/config"

// ConfigFrom maps cuesched's configuration file onto a Config: the database
// URL, the host_cache section and queue.host_booking_strategy. AssumeTTL,
// LeaseTimeout and the slot name keep their defaults.
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
	return cfg
}
