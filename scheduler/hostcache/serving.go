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
// the facility): for the reservation loop (scheduler/reservations), which
// picks the host to reserve among them, never for the dispatch path.
func (c *Cache) Serving(facilityID, showID string, tags []string, os string, threadable bool) []Host {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Host
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
			out = append(out, c.viewLocked(h, showID))
		}
	}
	return out
}
