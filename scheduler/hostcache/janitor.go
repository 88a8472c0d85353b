package hostcache

import (
	"context"
	"slices"
	"time"
)

func (c *Cache) janitor(ctx context.Context) {
	every := min(max(c.cfg.AssumeTTL/4, 50*time.Millisecond), time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.sweep(c.now())
		}
	}
}

// sweep forgets expired assumptions, returns leaked checkouts and evicts
// idle groups.
func (c *Cache) sweep(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	for i := 0; i < len(c.assumedList); {
		h := c.assumedList[i]
		if h.assumed.until.After(now) {
			i++
			continue
		}
		c.clearAssumptionLocked(h)
		c.reindexLocked(h)
		c.m.assumptions.WithLabelValues("expired").Inc()
		changed = true
	}
	for id, l := range c.leases {
		if now.Sub(l.at) < c.cfg.LeaseTimeout {
			continue
		}
		c.log.Warn("host checked out for longer than the lease timeout; returning it to the cache", "host", id, "since", l.at)
		delete(c.leases, id)
		if h := c.st.hosts[id]; h != nil && h.out == l {
			h.out = nil
			c.reindexLocked(h)
		}
		c.m.leaseExpired.Inc()
		changed = true
	}
	for key, g := range c.groups {
		if now.Sub(g.lastQueried) < c.cfg.GroupIdleTimeout {
			continue
		}
		g.each(func(_ uint32, it memItem) bool {
			it.h.groups = slices.DeleteFunc(it.h.groups, func(x *group) bool { return x == g })
			return true
		})
		delete(c.groups, key)
		c.bumpGroupLocked(g) // its watchers retry (and rebuild it) rather than wait
		c.m.groupEvictions.Inc()
		changed = true
	}
	if changed {
		c.bumpLocked()
	}
}
