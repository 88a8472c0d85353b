package matcher

import (
	"time"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
)

// Reservations is the matcher's view of firm host reservations
// (scheduler/reservations): it honours them when choosing hosts and
// reports how each layer fared, which is what decides who may reserve.
type Reservations interface {
	// Admit reports whether a frame of l may book on host hostID now: the
	// host holds no live reservation, l owns it, or the frame is an EASY
	// backfill that ends (now + l.WorstCase()) by the host's ready time.
	// It runs inside the host cache's Accept, under the cache's mutex: it
	// must be quick and must not call into the cache.
	Admit(hostID string, l *jobs.Layer, now time.Time) bool
	// Observe records a layer's outcome in a pass of cluster c.
	Observe(c *clusters.Cluster, l *jobs.Layer, o LayerOutcome, now time.Time)
}

// LayerOutcome is how one layer fared in one cluster pass.
type LayerOutcome int

const (
	// OutcomeOther: neither blocked nor placed (a cap, a limit, a stop).
	OutcomeOther LayerOutcome = iota
	// OutcomeBlocked: no host fitted a frame (or none that was checked
	// out took one); nothing was dispatched.
	OutcomeBlocked
	// OutcomePlaced: frames were dispatched.
	OutcomePlaced
)

func (o LayerOutcome) String() string {
	switch o {
	case OutcomeBlocked:
		return "blocked"
	case OutcomePlaced:
		return "placed"
	}
	return "other"
}
