// Package tiers ranks the shows sharing an allocation by their subscription
// tier, the share of their subscription they use: cores in use ÷
// subscription size, as Cuebot's own dispatcher ranks shows. The cluster
// feed hands out the clusters of the lowest tier first (and, per
// allocation, one show's pass at a time), so on a busy allocation the next
// slot goes to the show furthest below its share; a show running nothing
// is tier 0 and goes first. The burst stays the ceiling, enforced by the
// booking script; what a low-tier show leaves idle is lent to the others,
// whose passes run after its own.
//
// The tier is read from the accounting store (acct:sub:{show}:{alloc},
// fields size and int_cores, whole cores), which every scheduler instance
// and the sidecars keep current, so instances agree on the order without
// talking to each other. A Board keeps a snapshot: refreshed in full on a
// timer (one pipelined HMGET per subscription) and, for one subscription,
// right after a pass of its show booked something there (Touch), so a
// show's own bookings lift its tier before its next pass is ranked.
package tiers

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/clusters"
)

// Sub is one subscription: a show on an allocation.
type Sub struct{ Show, Alloc string }

// Usage is a subscription's size and the cores its show uses there, in
// whole cores as the accounting store keeps them.
type Usage struct {
	Size, Cores int64
}

// Tier is Cores ÷ Size. A show using nothing is 0 whatever its size; a
// show using cores on a subscription of size 0 or less ranks after every
// show with a size (its cores over a hundredth of a core).
func (u Usage) Tier() float64 {
	if u.Cores <= 0 {
		return 0
	}
	size := float64(u.Size)
	if size <= 0 {
		size = 0.01
	}
	return float64(u.Cores) / size
}

// Options configure a Board.
type Options struct {
	// Interval between full refreshes (default 1 s).
	Interval   time.Duration
	Logger     hclog.Logger
	Registerer prometheus.Registerer
}

// Board holds the tier snapshot. Rank is lock-free.
type Board struct {
	rdb  redis.UniversalClient
	subs func() []Sub
	opts Options
	log  hclog.Logger

	snap atomic.Pointer[map[Sub]Usage]
	mu   sync.Mutex // serialises writers of snap

	refreshes *prometheus.CounterVec
}

// New returns a board over the subscriptions subs lists (called at every
// full refresh; the scheduler passes the allocation clusters' shows and
// allocations).
func New(rdb redis.UniversalClient, subs func() []Sub, o Options) *Board {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	log := o.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	b := &Board{rdb: rdb, subs: subs, opts: o, log: log.Named("tiers"),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scheduler_show_tier_refreshes_total",
			Help: "Refreshes of the show tier snapshot from the accounting store, by kind (full, touch) and outcome.",
		}, []string{"kind", "outcome"})}
	for _, k := range []string{"full", "touch"} {
		for _, r := range []string{"ok", "error"} {
			b.refreshes.WithLabelValues(k, r) // at zero from start-up (issue #26)
		}
	}
	empty := map[Sub]Usage{}
	b.snap.Store(&empty)
	if o.Registerer != nil {
		o.Registerer.MustRegister(b.refreshes)
	}
	return b
}

// SubsOf lists the subscriptions of a cluster set: one per allocation
// cluster.
func SubsOf(cs []*clusters.Cluster) []Sub {
	seen := map[Sub]struct{}{}
	var out []Sub
	for _, c := range cs {
		if a := c.AllocID(); a != "" {
			s := Sub{Show: c.ShowID, Alloc: a}
			if _, ok := seen[s]; !ok {
				seen[s] = struct{}{}
				out = append(out, s)
			}
		}
	}
	return out
}

// Usage returns the snapshot's usage of one subscription.
func (b *Board) Usage(s Sub) (Usage, bool) {
	u, ok := (*b.snap.Load())[s]
	return u, ok
}

// Rank is a cluster's tier: its subscription's for an allocation cluster;
// for a cluster of other host tags, the show's tier over every allocation
// it subscribes to in the snapshot (Σ cores ÷ Σ size). Unknown: 0.
func (b *Board) Rank(c *clusters.Cluster) float64 {
	m := *b.snap.Load()
	if a := c.AllocID(); a != "" {
		return m[Sub{Show: c.ShowID, Alloc: a}].Tier()
	}
	var sum Usage
	for s, u := range m {
		if s.Show == c.ShowID {
			sum.Size += max(u.Size, 0)
			sum.Cores += u.Cores
		}
	}
	return sum.Tier()
}

// Refresh reads every subscription's usage and replaces the snapshot.
func (b *Board) Refresh(ctx context.Context) error {
	subs := b.subs()
	got, err := b.read(ctx, subs)
	if err != nil {
		b.refreshes.WithLabelValues("full", "error").Inc()
		return err
	}
	b.mu.Lock()
	b.snap.Store(&got)
	b.mu.Unlock()
	b.refreshes.WithLabelValues("full", "ok").Inc()
	return nil
}

// Touch re-reads one subscription (after a pass of its show booked there).
// Errors only leave the snapshot older; they are counted, not returned.
func (b *Board) Touch(ctx context.Context, s Sub) {
	got, err := b.read(ctx, []Sub{s})
	if err != nil {
		b.refreshes.WithLabelValues("touch", "error").Inc()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := *b.snap.Load()
	next := make(map[Sub]Usage, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	if u, ok := got[s]; ok {
		next[s] = u
	} else {
		delete(next, s)
	}
	b.snap.Store(&next)
	b.refreshes.WithLabelValues("touch", "ok").Inc()
}

func (b *Board) read(ctx context.Context, subs []Sub) (map[Sub]Usage, error) {
	out := make(map[Sub]Usage, len(subs))
	if len(subs) == 0 {
		return out, nil
	}
	pipe := b.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(subs))
	for i, s := range subs {
		cmds[i] = pipe.HMGet(ctx, publisher.SubKey(s.Show, s.Alloc), "size", "int_cores")
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, err
	}
	for i, s := range subs {
		v, err := cmds[i].Result()
		if err != nil || len(v) != 2 || v[0] == nil {
			continue // not seeded: no tier yet (ranks as 0)
		}
		out[s] = Usage{Size: num(v[0]), Cores: num(v[1])}
	}
	return out, nil
}

func num(v any) int64 {
	s, _ := v.(string)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || math.IsNaN(f) {
			return 0
		}
		return int64(f)
	}
	return n
}

// Run refreshes the snapshot every Interval until ctx ends. Errors are
// logged (a Redis outage leaves the last snapshot in place; the booking
// script, not the order, is what enforces the caps).
func (b *Board) Run(ctx context.Context) error {
	t := time.NewTicker(b.opts.Interval)
	defer t.Stop()
	failing := false
	for {
		if err := b.Refresh(ctx); err != nil && ctx.Err() == nil {
			if !failing {
				b.log.Warn("show tier refresh failed; keeping the last snapshot", "error", err)
			}
			failing = true
		} else if failing {
			b.log.Info("show tier refresh recovered")
			failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
