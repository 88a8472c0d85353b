package reservations

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
)

// Reservation is one firm host reservation as Redis holds it
// (acct:resv:host:{host}).
type Reservation struct {
	Host      string `json:"host"`
	HostName  string `json:"host_name"`
	Layer     string `json:"layer"`
	LayerName string `json:"layer_name"`
	Job       string `json:"job"`
	JobName   string `json:"job_name"`
	Show      string `json:"show"`
	Alloc     string `json:"alloc"`
	// Cores and MemKB are what one frame of the owner needs (centicores,
	// KB).
	Cores int64 `json:"cores"`
	MemKB int64 `json:"mem_kb"`
	// ReadyAt is the host's projected ready time: when enough of its
	// running frames should have ended for the owner's frame to fit. An
	// EASY backfill must end by then.
	ReadyAt   time.Time `json:"ready_at"`
	ExpiresAt time.Time `json:"expires_at"`
	GrantedAt time.Time `json:"granted_at"`
	GrantedBy string    `json:"granted_by"`
	// Backfills counts the frames the booking script admitted as
	// backfills on the host.
	Backfills int64 `json:"backfills"`
}

// Live reports whether the reservation still binds at now.
func (r Reservation) Live(now time.Time) bool { return r.ExpiresAt.After(now) }

// snapshot is an immutable view of the live reservations.
type snapshot struct {
	byHost  map[string]Reservation
	byLayer map[string]string // layer -> host
	at      time.Time
}

func newSnapshot(rs []Reservation, at time.Time) *snapshot {
	s := &snapshot{byHost: make(map[string]Reservation, len(rs)), byLayer: make(map[string]string, len(rs)), at: at}
	for _, r := range rs {
		s.byHost[r.Host] = r
		s.byLayer[r.Layer] = r.Host
	}
	return s
}

// Board is the shared reservation store in Redis plus a local snapshot of
// it: lock-free reads (Lookup, ForLayer), refreshed from Redis (Refresh)
// and updated at once by this instance's own grants and ends. Safe for
// concurrent use.
type Board struct {
	rdb      redis.UniversalClient
	scripts  *publisher.Reservations
	snap     atomic.Pointer[snapshot]
	mu       sync.Mutex // serialises snapshot writers
	instance string
}

// NewBoard returns a board over rdb; instance names this scheduler in the
// reservations it grants.
func NewBoard(rdb redis.UniversalClient, instance string) *Board {
	b := &Board{rdb: rdb, scripts: publisher.NewReservations(rdb), instance: instance}
	b.snap.Store(newSnapshot(nil, time.Time{}))
	return b
}

// Lookup returns the host's reservation in the snapshot (live or not).
func (b *Board) Lookup(host string) (Reservation, bool) {
	r, ok := b.snap.Load().byHost[host]
	return r, ok
}

// ForLayer returns the host the layer holds a reservation on, if any.
func (b *Board) ForLayer(layer string) (string, bool) {
	h, ok := b.snap.Load().byLayer[layer]
	return h, ok
}

// Snapshot returns the reservations of the snapshot, by host id.
func (b *Board) Snapshot() []Reservation {
	s := b.snap.Load()
	out := make([]Reservation, 0, len(s.byHost))
	for _, r := range s.byHost {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

// Refresh replaces the snapshot with the live reservations in Redis.
func (b *Board) Refresh(ctx context.Context) error {
	rs, err := List(ctx, b.rdb)
	if err != nil {
		return err
	}
	b.set(rs, time.Now())
	return nil
}

// update applies f to a copy of the snapshot's reservations.
func (b *Board) update(f func(map[string]Reservation)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.snap.Load()
	m := make(map[string]Reservation, len(old.byHost)+1)
	for k, v := range old.byHost {
		m[k] = v
	}
	f(m)
	rs := make([]Reservation, 0, len(m))
	for _, r := range m {
		rs = append(rs, r)
	}
	b.snap.Store(newSnapshot(rs, old.at))
}

// List reads every reservation in Redis (live or expired but not yet
// swept), sorted by host id. Index members without a hash are skipped.
func List(ctx context.Context, rdb redis.UniversalClient) ([]Reservation, error) {
	hosts, err := rdb.SMembers(ctx, publisher.ResvIndexKey).Result()
	if err != nil {
		return nil, fmt.Errorf("reservations: list %s: %w", publisher.ResvIndexKey, err)
	}
	if len(hosts) == 0 {
		return nil, nil
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(hosts))
	for i, h := range hosts {
		cmds[i] = pipe.HGetAll(ctx, publisher.ResvHostKey(h))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("reservations: read: %w", err)
	}
	out := make([]Reservation, 0, len(hosts))
	for i, c := range cmds {
		m := c.Val()
		if len(m) == 0 || m["layer"] == "" {
			continue
		}
		out = append(out, parse(hosts[i], m))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}

func parse(host string, m map[string]string) Reservation {
	num := func(k string) int64 { v, _ := strconv.ParseInt(m[k], 10, 64); return v }
	ms := func(k string) time.Time {
		if v := num(k); v > 0 {
			return time.UnixMilli(v)
		}
		return time.Time{}
	}
	return Reservation{Host: host, HostName: m["host_name"], Layer: m["layer"], LayerName: m["layer_name"],
		Job: m["job"], JobName: m["job_name"], Show: m["show"], Alloc: m["alloc"], Cores: num("cores"), MemKB: num("mem"),
		ReadyAt: ms("ready_at"), ExpiresAt: ms("expires_at"), GrantedAt: ms("granted_at"), GrantedBy: m["granted_by"],
		Backfills: num("backfills")}
}

// GrantRequest is one reservation to grant.
type GrantRequest struct {
	Reservation
	// Timeout is how long it may be held (from the grant, Redis time).
	Timeout time.Duration
	// MaxGrants caps the live reservations overall.
	MaxGrants int
	// MaxAmong caps the live reservations among Fitting (the hosts of the
	// host's allocation that would fit the owner's frame when idle, the
	// host included).
	MaxAmong int
	Fitting  []string
}

// Refusal says why a grant was refused (the script's reasons).
type Refusal string

// Grant refusals.
const (
	HostReserved Refusal = "host_reserved"
	LayerHolds   Refusal = "layer_holds"
	MaxGrants    Refusal = "max_grants"
	MaxFraction  Refusal = "max_fraction"
)

// Grant grants the reservation atomically; the refusal is "" when it was
// granted (the snapshot then holds it at once).
func (b *Board) Grant(ctx context.Context, g GrantRequest) (Reservation, Refusal, error) {
	r := g.Reservation
	if r.Host == "" || r.Layer == "" || r.Job == "" || r.Show == "" || r.Alloc == "" {
		return r, "", errors.New("reservations: grant needs host, layer, job, show and alloc")
	}
	if g.Timeout < time.Millisecond {
		return r, "", fmt.Errorf("reservations: grant timeout %v is below 1ms", g.Timeout)
	}
	r.GrantedBy = b.instance
	rep, err := b.scripts.GrantReservation(ctx, publisher.ReservationGrant{Host: r.Host, HostName: r.HostName,
		Layer: r.Layer, LayerName: r.LayerName, Job: r.Job, JobName: r.JobName, Show: r.Show, Alloc: r.Alloc,
		Centicores: r.Cores, MemKB: r.MemKB, ReadyAt: r.ReadyAt, Timeout: g.Timeout, GrantedBy: r.GrantedBy,
		MaxGrants: g.MaxGrants, MaxAmong: g.MaxAmong, Fitting: g.Fitting})
	if err != nil {
		return r, "", fmt.Errorf("reservations: grant host %s to layer %s: %w", r.Host, r.Layer, err)
	}
	if !rep.Granted {
		return r, Refusal(rep.Refusal), nil
	}
	if !rep.GrantedAt.IsZero() {
		r.GrantedAt, r.ExpiresAt = rep.GrantedAt, rep.ExpiresAt
	}
	b.update(func(m map[string]Reservation) { m[r.Host] = r })
	return r, "", nil
}

// End ends the host's reservation if layer owns it (layer "" : whoever
// does). ended reports whether this call deleted it; owner is whose it was.
func (b *Board) End(ctx context.Context, host, layer string) (ended bool, owner string, err error) {
	rep, err := b.scripts.EndReservation(ctx, host, layer)
	if err != nil {
		return false, "", fmt.Errorf("reservations: end host %s: %w", host, err)
	}
	if rep.NotOwner {
		return false, rep.Owner, nil
	}
	// Gone from Redis (by this call or before): gone from the snapshot.
	b.update(func(m map[string]Reservation) {
		if r, ok := m[host]; ok && (layer == "" || r.Layer == layer) {
			delete(m, host)
		}
	})
	return rep.Ended, rep.Owner, nil
}
