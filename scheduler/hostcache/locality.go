package hostcache

import "slices"

// Locality: which layers ran on a host lately, as the cache learns it from
// the bookings its caller reports (Booked) and the host rows the WAL
// delivers. It feeds the locality bonus of Placement, the layer's cores on
// a host (Host.LayerCores, for the matcher's per-host layer spread) and
// scheduler_placements_total{locality}.
//
// Per host the cache keeps the last few layers booked there (at most
// maxRecent), each with the cores it holds (its bookings, an estimate) and
// a warmth count. A booking of layer L adds its cores to L's entry and sets
// its warmth to WarmFrames; each frame of another layer booked on the host
// lowers every other entry's warmth by one. The proc rows are not streamed,
// so a layer's end on a host is inferred from the host row: when the
// host's busy cores (total − idle, with the pending assumptions) fall below
// the cores the entries hold, the least recently booked entries give cores
// back first; an entry that reaches zero turns warm (warmth WarmFrames). An
// entry holding cores is live, one with warmth left warm, others are
// dropped. Bookings by other schedulers or Cuebot are not seen: they only
// delay the inference (a host's busy cores stay higher).

// Locality is how a host relates to a request's layer.
type Locality int8

// Localities, in order of preference.
const (
	Cold Locality = iota // the layer did not run here lately
	Warm                 // the layer ran here recently
	Live                 // the layer runs here now
)

func (l Locality) String() string {
	switch l {
	case Live:
		return "live"
	case Warm:
		return "warm"
	}
	return "cold"
}

const (
	// maxRecent bounds the layers remembered per host.
	maxRecent = 8
	// maxLayerHosts bounds the hosts remembered per layer (the candidates
	// locality adds to a checkout).
	maxLayerHosts = 16
)

type layerUse struct {
	layer string
	cores int64 // centicores held (estimate)
	warm  int32 // frames of other layers before it cools
}

// localityOf is h's locality for layer and the cores the layer holds there.
func (h *hostRec) localityOf(layer string) (Locality, int64) {
	if layer == "" {
		return Cold, 0
	}
	for _, u := range h.recent {
		if u.layer == layer {
			switch {
			case u.cores > 0:
				return Live, u.cores
			case u.warm > 0:
				return Warm, 0
			}
			return Cold, 0
		}
	}
	return Cold, 0
}

// localityRank orders hosts for a layer (higher first): live above warm
// above cold, and among live (or warm) hosts the one where the layer's
// entry is more recent than the host's other layers' first.
func (h *hostRec) localityRank(layer string) int {
	if layer == "" {
		return 0
	}
	for i, u := range h.recent {
		if u.layer == layer {
			switch {
			case u.cores > 0:
				return 2*(maxRecent+1) + maxRecent - i
			case u.warm > 0:
				return (maxRecent + 1) + maxRecent - i
			}
			return 0
		}
	}
	return 0
}

// Booked records that frames frames of layer (cores centicores in all) were
// booked on a checked-out host; call it before the host's Checkin. It
// counts the frames in scheduler_placements_total by the host's locality
// for the layer before the booking.
func (c *Cache) Booked(hostID, layer string, frames int, cores int64) {
	if layer == "" || frames <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.st.hosts[hostID]
	if h == nil {
		return
	}
	loc, _ := h.localityOf(layer)
	c.m.placements[loc].Add(float64(frames))
	warm := int32(c.cfg.WarmFrames)
	found := -1
	for i := range h.recent {
		u := &h.recent[i]
		if u.layer == layer {
			found = i
			continue
		}
		u.warm = max(u.warm-int32(frames), 0)
	}
	var u layerUse
	if found >= 0 {
		u = h.recent[found]
		h.recent = slices.Delete(h.recent, found, found+1)
	} else {
		u = layerUse{layer: layer}
	}
	c.addLayerHostLocked(layer, h)
	u.cores += max(cores, 0)
	u.warm = warm
	h.recent = slices.Insert(h.recent, 0, u)
	c.pruneRecentLocked(h)
}

// trimRecentLocked gives back the cores the host's row says are no longer
// busy, least recently booked layer first.
func (c *Cache) trimRecentLocked(h *hostRec, v idle) {
	if len(h.recent) == 0 {
		return
	}
	var held int64
	for _, u := range h.recent {
		held += u.cores
	}
	excess := held - max(h.coresTotal-v.cores, 0)
	if excess <= 0 {
		return
	}
	for i := len(h.recent) - 1; i >= 0 && excess > 0; i-- {
		u := &h.recent[i]
		if u.cores == 0 {
			continue
		}
		take := min(excess, u.cores)
		u.cores -= take
		excess -= take
		if u.cores == 0 {
			u.warm = int32(c.cfg.WarmFrames)
		}
	}
	c.pruneRecentLocked(h)
}

// pruneRecentLocked drops cold entries and, past maxRecent, the least
// recently booked warm entries, then live ones.
func (c *Cache) pruneRecentLocked(h *hostRec) {
	keep := h.recent[:0]
	for _, u := range h.recent {
		if u.cores > 0 || u.warm > 0 {
			keep = append(keep, u)
		} else {
			c.dropLayerHostLocked(u.layer, h)
		}
	}
	for len(keep) > maxRecent {
		i := len(keep) - 1
		for j := i; j >= 0; j-- {
			if keep[j].cores == 0 {
				i = j
				break
			}
		}
		c.dropLayerHostLocked(keep[i].layer, h)
		keep = slices.Delete(keep, i, i+1)
	}
	clear(h.recent[len(keep):])
	h.recent = keep
	if len(h.recent) == 0 {
		h.recent = nil
	}
}

// addLayerHostLocked makes h the layer's most recent host.
func (c *Cache) addLayerHostLocked(layer string, h *hostRec) {
	hs := c.layerHosts[layer]
	if i := slices.Index(hs, h); i >= 0 {
		hs = slices.Delete(hs, i, i+1)
	} else if len(hs) >= maxLayerHosts {
		hs = slices.Delete(hs, 0, 1) // forget the oldest
	}
	c.layerHosts[layer] = append(hs, h)
}

func (c *Cache) dropLayerHostLocked(layer string, h *hostRec) {
	hs := c.layerHosts[layer]
	i := slices.Index(hs, h)
	if i < 0 {
		return
	}
	hs = slices.Delete(hs, i, i+1)
	if len(hs) == 0 {
		delete(c.layerHosts, layer)
		return
	}
	c.layerHosts[layer] = hs
}

// forgetRecentLocked drops a host's entries (the host is deleted).
func (c *Cache) forgetRecentLocked(h *hostRec) {
	for _, u := range h.recent {
		c.dropLayerHostLocked(u.layer, h)
	}
	h.recent = nil
}

// adoptRecentLocked carries the entries of a host's previous record over to
// its record in a new snapshot.
func (c *Cache) adoptRecentLocked(old, h *hostRec) {
	if len(old.recent) == 0 {
		return
	}
	h.recent = old.recent
	old.recent = nil
	for _, u := range h.recent {
		c.dropLayerHostLocked(u.layer, old)
		c.addLayerHostLocked(u.layer, h)
	}
}
