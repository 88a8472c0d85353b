package shard

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/shared/testkit/promlint"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// farm is n allocation clusters of one show each, on n allocations, plus
// a tag cluster per show.
func farm(n int) []*clusters.Cluster {
	var out []*clusters.Cluster
	for i := 0; i < n; i++ {
		show := fmt.Sprintf("show%d", i)
		out = append(out, clusters.New("fac", show, []clusters.Tag{{Name: fmt.Sprintf("a%d", i), Type: clusters.Alloc, AllocID: fmt.Sprintf("alloc%d", i)}}),
			clusters.New("fac", show, []clusters.Tag{{Name: "gpu", Type: clusters.Manual}}))
	}
	return out
}

type rig struct {
	t      *testing.T
	cfg    *pgx.ConnConfig
	admin  *pgxpool.Pool
	cs     []*clusters.Cluster
	shards []*Shard
	regs   []*prometheus.Registry
}

func newRig(t *testing.T, n int, lease, renew time.Duration) *rig {
	t.Helper()
	url := testenv.NewDatabase(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	r := &rig{t: t, cfg: cfg, admin: admin, cs: farm(9)}
	for i := 0; i < n; i++ {
		r.add(lease, renew)
	}
	return r
}

func (r *rig) add(lease, renew time.Duration) *Shard {
	reg := prometheus.NewRegistry()
	s := New(r.cfg, Config{Unit: ByAllocation, Lease: lease, Renew: renew}, Options{
		Registerer: reg, Clusters: func() []*clusters.Cluster { return r.cs },
	})
	r.t.Cleanup(s.Close)
	r.shards = append(r.shards, s)
	r.regs = append(r.regs, reg)
	return s
}

// step steps the given shards once each, in order, failing on error.
func (r *rig) step(ss ...*Shard) {
	r.t.Helper()
	for _, s := range ss {
		if err := s.Step(context.Background()); err != nil {
			r.t.Fatalf("step: %v", err)
		}
	}
}

// exclusive: no cluster passes two shards' fences at once, and no cluster
// is owned by two shards.
func (r *rig) exclusive(live ...*Shard) {
	r.t.Helper()
	for _, c := range r.cs {
		fenced, owners := 0, 0
		for _, s := range live {
			if s.Fence(c) == nil {
				fenced++
			}
			if s.Owns(c) {
				owners++
			}
		}
		if fenced > 1 || owners > 1 {
			r.t.Fatalf("cluster %s: %d shards pass the fence, %d own it", c, fenced, owners)
		}
	}
}

// covered: every cluster is owned by one of live.
func (r *rig) covered(live ...*Shard) bool {
	for _, c := range r.cs {
		ok := false
		for _, s := range live {
			ok = ok || s.Owns(c)
		}
		if !ok {
			return false
		}
	}
	return true
}

// converge steps live round-robin, checking exclusivity after every step,
// until they cover every cluster and two whole rounds change no ownership
// (a joiner's first step only makes it a member);
// it returns the first round after which every cluster was covered.
func (r *rig) converge(max int, live ...*Shard) int {
	r.t.Helper()
	first, still := 0, 0
	for round := 1; round <= max+3; round++ {
		before := r.snapshot(live...)
		for _, s := range live {
			r.step(s)
			r.exclusive(live...)
		}
		if r.covered(live...) {
			if first == 0 {
				first = round
			}
			if r.snapshot(live...) != before {
				still = 0
			} else if still++; still == 2 {
				if first > max {
					r.t.Fatalf("shards covered every cluster only after %d rounds (bound %d)", first, max)
				}
				return first
			}
		}
	}
	r.t.Fatalf("shards did not settle within %d rounds (covered after %d)", max+3, first)
	return 0
}

// snapshot is who owns what.
func (r *rig) snapshot(live ...*Shard) string {
	out := ""
	for _, c := range r.cs {
		for i, s := range live {
			if s.Owns(c) {
				out += fmt.Sprint(i)
			}
		}
		out += ","
	}
	return out
}

func (r *rig) sessionPID(s *Shard) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return 0
	}
	return s.conn.PgConn().PID()
}

// gone waits until the backend pid has exited (an event, not a sleep).
func (r *rig) gone(pid uint32) {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var n int
		if err := r.admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n); err != nil {
			r.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("backend %d still there after a minute", pid)
}

func TestAssignBoundedAndDeterministic(t *testing.T) {
	t.Parallel()
	var shares []int32
	for i := 0; i < 30; i++ {
		shares = append(shares, ID(fmt.Sprint("s", i)))
	}
	for _, members := range [][]int32{{0}, {0, 1}, {0, 1, 2}, {3, 7, 9}, {0, 1, 2, 3, 4, 5, 6}} {
		a := Assign(shares, members)
		b := Assign(append([]int32(nil), shares...), []int32{members[len(members)-1]})
		_ = b
		seen := map[int32]int32{}
		limit := (len(shares) + len(members) - 1) / len(members)
		for m, ss := range a {
			if len(ss) > limit {
				t.Fatalf("members %v: %d holds %d shares, limit %d", members, m, len(ss), limit)
			}
			for _, s := range ss {
				if o, dup := seen[s]; dup {
					t.Fatalf("share %d assigned to %d and %d", s, o, m)
				}
				seen[s] = m
			}
		}
		if len(seen) != len(shares) {
			t.Fatalf("members %v: %d of %d shares assigned", members, len(seen), len(shares))
		}
		// Same inputs in another order: the same answer.
		rev := append([]int32(nil), members...)
		for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
			rev[i], rev[j] = rev[j], rev[i]
		}
		again := Assign(shares, rev)
		for m, ss := range a {
			if fmt.Sprint(again[m]) != fmt.Sprint(ss) {
				t.Fatalf("members %v: not deterministic for %d: %v vs %v", members, m, ss, again[m])
			}
		}
	}
}

// TestSplitBalancesAndRebalances: three instances split 18 clusters (9
// allocation shares, 9 show shares) into thirds; a fourth joining takes a
// share of the work; every step keeps each cluster with at most one
// instance that passes the fence.
func TestSplitBalancesAndRebalances(t *testing.T) {
	t.Parallel()
	r := newRig(t, 3, 10*time.Second, 2*time.Second)
	a, b, c := r.shards[0], r.shards[1], r.shards[2]
	r.step(a)
	if a.Owned() != 18 {
		t.Fatalf("a lone instance owns %d of 18 shares", a.Owned())
	}
	rounds := r.converge(5, a, b, c)
	for i, s := range []*Shard{a, b, c} {
		if s.Owned() != 6 {
			t.Fatalf("instance %d owns %d shares after %d rounds, want 6 (18 over 3)", i, s.Owned(), rounds)
		}
		if got := gauge(t, r.regs[i], "scheduler_work_split_owned_clusters"); got != 6 {
			t.Fatalf("instance %d: owned_clusters %v, want 6", i, got)
		}
		if got := gauge(t, r.regs[i], "scheduler_work_split_members"); got != 3 {
			t.Fatalf("instance %d: members %v, want 3", i, got)
		}
	}
	d := r.add(10*time.Second, 2*time.Second)
	r.converge(5, a, b, c, d)
	// Stepping until nobody moves: each holds its bounded share.
	for i := 0; i < 3; i++ {
		r.step(a, b, c, d)
		r.exclusive(a, b, c, d)
	}
	total := 0
	for i, s := range []*Shard{a, b, c, d} {
		if s.Owned() > 5 || s.Owned() < 1 {
			t.Fatalf("instance %d owns %d shares with 4 members (limit 5)", i, s.Owned())
		}
		total += s.Owned()
	}
	if total != 18 {
		t.Fatalf("%d shares owned in all, want 18", total)
	}
	promlint.Check(t, r.regs[0])
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// TestKilledInstanceHandsOver: an instance killed -9 style (its session
// ends, it never steps again) hands its shares to the survivors at their
// next steps, without a cluster ever passing two live fences.
func TestKilledInstanceHandsOver(t *testing.T) {
	t.Parallel()
	r := newRig(t, 3, 10*time.Second, 2*time.Second)
	a, b, c := r.shards[0], r.shards[1], r.shards[2]
	r.converge(5, a, b, c)
	// kill -9: the process is gone, the server drops its session.
	pid := r.sessionPID(c)
	if _, err := r.admin.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, int32(pid)); err != nil {
		t.Fatal(err)
	}
	r.gone(pid)
	// The bound: within two renews (rounds of steps) of the session's end.
	if rounds := r.converge(2, a, b); rounds > 2 {
		t.Fatalf("survivors took %d rounds", rounds)
	}
	if a.Owned()+b.Owned() != 18 || a.Owned() != 9 {
		t.Fatalf("survivors own %d + %d shares, want 9 + 9", a.Owned(), b.Owned())
	}
	if len(a.Members()) != 2 {
		t.Fatalf("a sees members %v", a.Members())
	}
}

// TestStalledInstanceFencedBeforeHandOver: an instance that stops renewing
// (SIGSTOP, a frozen VM) passes its fence no longer by the time the server
// ends its idle session and a survivor takes its shares; when it resumes,
// its first step finds the session gone, counts a loss and rejoins.
func TestStalledInstanceFencedBeforeHandOver(t *testing.T) {
	t.Parallel()
	const lease, renew = 1500 * time.Millisecond, 300 * time.Millisecond
	r := newRig(t, 2, lease, renew)
	a, c := r.shards[0], r.shards[1]
	r.converge(5, a, c)
	var theirs []*clusters.Cluster
	for _, cl := range r.cs {
		if c.Owns(cl) {
			theirs = append(theirs, cl)
		}
	}
	if len(theirs) == 0 {
		t.Fatal("the second instance owns nothing")
	}
	pid := r.sessionPID(c)
	// c stalls: it never steps; a keeps renewing until the server ends c's
	// idle session (idle_session_timeout = lease), then takes c's shares.
	deadline := time.Now().Add(time.Minute)
	for !a.Owns(theirs[0]) {
		if time.Now().After(deadline) {
			t.Fatal("the survivor did not take the stalled instance's shares within a minute")
		}
		r.step(a)
		time.Sleep(renew)
	}
	// The moment another instance holds the share, the stalled one's fence
	// has already closed.
	for _, cl := range theirs {
		if err := c.Fence(cl); !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("stalled instance's fence for %s: %v, want ErrLeaseExpired", cl, err)
		}
	}
	r.gone(pid)
	r.converge(3, a)
	// Resumed: its step fails (the session is gone) and drops everything;
	// the next one rejoins and the pair rebalances.
	if err := c.Step(context.Background()); err == nil {
		t.Fatal("the resumed instance's first step succeeded on a dead session")
	}
	if got := gauge(t, r.regs[1], "scheduler_work_split_owned_shares"); got != 0 {
		t.Fatalf("resumed instance still owns %v shares", got)
	}
	if n := promread.Value(t, r.regs[1], "scheduler_work_split_lease_losses_total"); n != 1 {
		t.Fatalf("lease losses %v, want 1", n)
	}
	r.converge(5, a, c)
	for i := 0; i < 2; i++ {
		r.step(a, c)
		r.exclusive(a, c)
	}
	if a.Owned() != 9 || c.Owned() != 9 {
		t.Fatalf("after rejoining: %d + %d shares, want 9 + 9", a.Owned(), c.Owned())
	}
}

// TestBusyShareReleasedAfterItsPass: a share that moves to a joining
// instance is not released while a pass of it is in flight; the releasing
// instance stops handing it out at once but passes its fence until then.
func TestBusyShareReleasedAfterItsPass(t *testing.T) {
	t.Parallel()
	r := newRig(t, 1, 10*time.Second, 2*time.Second)
	a := r.shards[0]
	var inflight []*clusters.Cluster
	a.o.InFlight = func() []*clusters.Cluster { return inflight }
	r.step(a)
	inflight = append([]*clusters.Cluster(nil), r.cs...) // every cluster mid-pass
	b := r.add(10*time.Second, 2*time.Second)
	r.step(b, a, b)
	if b.Owned() != 0 {
		t.Fatalf("the joiner took %d shares still in flight at the old owner", b.Owned())
	}
	moving := 0
	for _, cl := range r.cs {
		if !a.Owns(cl) {
			moving++
			if err := a.Fence(cl); err != nil {
				t.Fatalf("a pass in flight of a releasing share lost its fence: %v", err)
			}
		}
	}
	if moving == 0 {
		t.Fatal("nothing moves to the joiner")
	}
	inflight = nil // the passes end
	r.converge(3, a, b)
	if a.Owned() != 9 || b.Owned() != 9 {
		t.Fatalf("%d + %d shares, want 9 + 9", a.Owned(), b.Owned())
	}
}
