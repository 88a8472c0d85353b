// Package matcherhosts adapts the replication-fed host cache
// (scheduler/hostcache) to the matcher's Hosts interface, so the pipeline
// wires it with one line: scheduler.Deps{Hosts: matcherhosts.New(cache)}.
//
// It only translates types: cluster tags become group tags (by name, in the
// matcher's probe order), the layer's floors and gates become a
// hostcache.Profile, the matcher's Accept sees a sizing.Host (with the
// layer's cores on the host), the batches booked are reported to
// Cache.Booked (locality), and hostcache.ErrNoCandidate becomes
// matcher.ErrNoCandidate (keeping the miss's capacity watch, so the
// matcher's backoff is released when the missed groups gain capacity). A
// check-in passes the idle values the dispatcher carries back (Postgres' RETURNING after a
// booking, or the checked-out values when nothing was booked) to
// Cache.Checkin, which applies the assume/confirm ordering rule against the
// WAL.
package matcherhosts

import (
	"context"
	"errors"

	"github.com/cuesched/cuesched/scheduler/hostcache"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
)

// Hosts implements matcher.Hosts over a hostcache.Cache.
type Hosts struct{ c *hostcache.Cache }

// New returns the adapter.
func New(c *hostcache.Cache) *Hosts { return &Hosts{c: c} }

var _ matcher.Hosts = (*Hosts)(nil)

// Checkout implements matcher.Hosts.
func (a *Hosts) Checkout(ctx context.Context, req matcher.HostRequest) (sizing.Host, error) {
	tags := make([]string, 0, len(req.Tags))
	for _, t := range req.Tags {
		tags = append(tags, t.Name)
	}
	r := hostcache.Request{
		FacilityID: req.FacilityID, ShowID: req.ShowID, Tags: tags,
		Profile: hostcache.Profile{
			CoresMin: req.Floor.Cores, MemMinKB: req.Floor.MemKB, GPUsMin: req.Floor.GPUs, GPUMemMinKB: req.Floor.GPUMemKB,
			OS: req.OS, Threadable: req.Threadable,
		},
		LayerID: req.LayerID,
	}
	if req.Accept != nil {
		r.Accept = func(h hostcache.Host) bool { return req.Accept(h.Host) }
	}
	h, err := a.c.Checkout(ctx, r)
	if errors.Is(err, hostcache.ErrNoCandidate) {
		var nc *hostcache.NoCandidateError
		if errors.As(err, &nc) {
			return sizing.Host{}, &matcher.NoCandidateError{Watch: nc.Watch}
		}
		return sizing.Host{}, matcher.ErrNoCandidate
	}
	if err != nil {
		return sizing.Host{}, err
	}
	return h.Host, nil
}

// Booked implements matcher.BookingObserver: the cache learns which layer
// ran where (locality, the layer's cores on the host).
func (a *Hosts) Booked(h sizing.Host, layerID string, frames int, cores int64) {
	a.c.Booked(h.ID, layerID, frames, cores)
}

var _ matcher.BookingObserver = (*Hosts)(nil)

// Checkin implements matcher.Hosts.
func (a *Hosts) Checkin(h sizing.Host) {
	a.c.Checkin(h)
}
