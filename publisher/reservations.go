package publisher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/lua"
)

// Reservations is the typed API over the firm host reservation scripts
// (resv_grant.lua, resv_end.lua) for scheduler/reservations. Reservations
// are not accounting: neither script touches acct:seq. Safe for concurrent
// use.
type Reservations struct {
	rdb   redis.UniversalClient
	grant *redis.Script
	end   *redis.Script
}

// NewReservations returns the reservation scripts over rdb.
func NewReservations(rdb redis.UniversalClient) *Reservations {
	return &Reservations{rdb: rdb, grant: redis.NewScript(lua.ResvGrant()), end: redis.NewScript(lua.ResvEnd())}
}

// ReservationGrant is one reservation to grant (acct:resv:host:{Host}).
type ReservationGrant struct {
	Host, HostName   string
	Layer, LayerName string
	Job, JobName     string
	Show, Alloc      string
	// Centicores and MemKB are what one frame of the owner needs
	// (negative values are sent as 0).
	Centicores, MemKB int64
	// ReadyAt is the host's projected ready time (before 1970: 0).
	ReadyAt time.Time
	// Timeout is how long it may be held, from the grant (Redis time).
	Timeout   time.Duration
	GrantedBy string
	// MaxGrants caps the live reservations overall, MaxAmong those among
	// Fitting (negative values are sent as 0).
	MaxGrants, MaxAmong int
	Fitting             []string
}

// GrantReply is the grant script's answer.
type GrantReply struct {
	Granted bool
	// Refusal is the script's reason when not granted (host_reserved,
	// layer_holds, max_grants, max_fraction).
	Refusal string
	// GrantedAt and ExpiresAt are set when granted (Redis time).
	GrantedAt, ExpiresAt time.Time
}

// GrantReservation grants g atomically unless the host holds a live
// reservation, the layer holds one elsewhere, or a cap is reached (see
// package lua). The error is a Redis/transport error or a refused argument.
func (r *Reservations) GrantReservation(ctx context.Context, g ReservationGrant) (GrantReply, error) {
	args := []any{g.Host, g.HostName, g.Layer, g.Job, g.Show, g.Alloc, max(g.Centicores, 0), max(g.MemKB, 0),
		max(g.ReadyAt.UnixMilli(), 0), g.Timeout.Milliseconds(), g.GrantedBy, max(g.MaxGrants, 0), max(g.MaxAmong, 0),
		g.LayerName, g.JobName}
	for _, h := range g.Fitting {
		args = append(args, h)
	}
	v, err := r.grant.Run(ctx, r.rdb, []string{ResvHostKey(g.Host), ResvIndexKey}, args...).Slice()
	if err != nil {
		return GrantReply{}, err
	}
	if len(v) == 0 {
		return GrantReply{}, errors.New("empty reply")
	}
	if code, _ := v[0].(int64); code != 1 {
		why := ""
		if len(v) > 1 {
			why, _ = v[1].(string)
		}
		return GrantReply{Refusal: why}, nil
	}
	out := GrantReply{Granted: true}
	if len(v) >= 3 {
		now, _ := v[1].(int64)
		exp, _ := v[2].(int64)
		out.GrantedAt, out.ExpiresAt = time.UnixMilli(now), time.UnixMilli(exp)
	}
	return out, nil
}

// EndReply is the end script's answer.
type EndReply struct {
	// Ended: this call deleted the reservation.
	Ended bool
	// NotOwner: it is held by another layer than the one named, and kept.
	NotOwner bool
	// Owner is the layer whose reservation it was ("" if none).
	Owner string
}

// EndReservation deletes the host's reservation if layer owns it (layer "":
// whoever does).
func (r *Reservations) EndReservation(ctx context.Context, host, layer string) (EndReply, error) {
	v, err := r.end.Run(ctx, r.rdb, []string{ResvHostKey(host), ResvIndexKey}, host, layer).Slice()
	if err != nil {
		return EndReply{}, err
	}
	var out EndReply
	var code int64
	if len(v) > 0 {
		code, _ = v[0].(int64)
	}
	if len(v) > 1 {
		out.Owner, _ = v[1].(string)
	}
	out.Ended, out.NotOwner = code == 1, code == 2
	return out, nil
}

// SeatHosts returns the hosts holding a seat of node-locked limit now (the
// fields of acct:seat:{limit}), for placement: a host in it takes the
// limit's frames without using another seat.
func (p *Publisher) SeatHosts(ctx context.Context, limit string) ([]string, error) {
	hs, err := p.rdb.HKeys(ctx, SeatKey(limit)).Result()
	if err != nil {
		return nil, fmt.Errorf("accounting seats of limit %s: %w", limit, err)
	}
	return hs, nil
}
