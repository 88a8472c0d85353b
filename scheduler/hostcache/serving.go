package hostcache

import (
	"slices"

	"github.com/cuesched/cuesched/shared/cuebot"
)

// Serving lists the hosts of the groups (facilityID, showID, tag) for tags
// that could serve a layer with this OS and threadability at all, whatever
// their idle values and whether they are checked out: up and open, on an
// allocation of the facility the show subscribes to, carrying one of the
// tags, serving the OS, and not in thread mode ALL unless threadable. Each
// host appears once, as a request of showID sees it (idle values included).
//
// It walks the mirror (no query), in O(hosts of the show's allocations in
// the facility), and builds the whole list: for tests and tools. The
// reservation loop (scheduler/reservations), which picks the host to
// reserve among them, walks them with EachServing instead; the dispatch
// path never does.
func (c *Cache) Serving(facilityID, showID string, tags []string, os string, threadable bool) []Host {
	var out []Host
	c.EachServing(facilityID, showID, tags, os, threadable, func(h Host) { out = append(out, h) })
	return out
}

// EachServing calls fn with each host Serving lists, without building the
// list: a caller that keeps few of them allocates for those alone (at
// 10,000 hosts a list is megabytes, and a reservation round asks once per
// candidate layer). fn runs under the cache's lock: it must be quick and
// must not call the cache.
func (c *Cache) EachServing(facilityID, showID string, tags []string, os string, threadable bool, fn func(Host)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for allocID := range c.st.allocsByShow[showID] {
		a := c.st.allocs[allocID]
		if a == nil || a.facilityID != facilityID {
			continue
		}
		for h := range c.st.hostsByAlloc[allocID] {
			if h.lockState != string(cuebot.LockOpen) || h.stat == nil || h.stat.state != string(cuebot.HardwareUp) {
				continue
			}
			if !slices.ContainsFunc(h.tags, func(t string) bool { return slices.Contains(tags, t) }) {
				continue
			}
			if !h.servesOS(os) || (h.threadMode == int(cuebot.ThreadAll) && !threadable) {
				continue
			}
			fn(c.viewLocked(h, showID))
		}
	}
}
