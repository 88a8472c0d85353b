package matcher

import (
	"context"

	"github.com/cuesched/cuesched/scheduler/jobs"
)

// Seats reads the hosts holding a seat of a node-locked limit
// (publisher.Publisher.SeatHosts).
type Seats interface {
	SeatHosts(ctx context.Context, limit string) ([]string, error)
}

// packs reports whether l is placed by seat packing: it has node-locked
// limits (jobs.Layer.SeatLimits) and queue.seat_packing is on.
func (m *Matcher) packs(l *jobs.Layer) bool {
	return m.cfg.SeatPacking && m.seats != nil && len(l.SeatLimits) > 0
}

// seatView is one attempt's view of a layer's node-locked limits: the hosts
// holding a seat of every one of them, and whether each still has a free
// seat. The booking script decides; this only orders the hosts, so a stale
// view costs an attempt, never a seat past the max.
type seatView struct {
	held map[string]bool
	free bool // every node-locked limit has a free seat
	wide bool // accept any host (after no seat host took a frame)
	err  bool // the seats could not be read: no preference
}

func (m *Matcher) seatView(ctx context.Context, l *jobs.Layer) seatView {
	v := seatView{free: true}
	for i, sl := range l.SeatLimits {
		hs, err := m.seats.SeatHosts(ctx, sl.ID)
		if err != nil {
			m.log.Debug("seat hosts unreadable; placing without packing", "layer", l.Name, "error", err)
			return seatView{err: true, wide: true, free: true}
		}
		if int64(len(hs)) >= sl.Max {
			v.free = false
		}
		set := make(map[string]bool, len(hs))
		for _, h := range hs {
			if i == 0 || v.held[h] {
				set[h] = true
			}
		}
		v.held = set
	}
	return v
}

// admits reports whether host h may be offered in this phase: a seat host,
// or any host once widened.
func (v *seatView) admits(h string) bool { return v.wide || v.held[h] }

// widen moves to the second phase (any host) when a seat is free; false
// when there is nothing more to try.
func (v *seatView) widen() bool {
	if v.wide || !v.free {
		return false
	}
	v.wide = true
	return true
}

// full reports whether the attempt found every seat held (by hosts without
// room): the layer waits for its limit.
func (v *seatView) full() bool { return !v.err && !v.free }
