package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/promlint"
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

type splitInstance struct {
	s      *scheduler.Scheduler
	reg    *prometheus.Registry
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan error
}

// TestWorkSplitHandsOverWhenAnInstanceDies: two schedulers splitting by
// allocation (scheduler.work_split) each own one of two allocations, book
// their frames without losing a race to each other, and when the owner of
// one dies (its sessions end, as with kill -9) the survivor takes its
// allocation at its next lease step and books the new work there; no frame
// is launched twice and no host is booked past its cores.
func TestWorkSplitHandsOverWhenAnInstanceDies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, 2) // allocation "general": hosts ha, hb (4 cores)
	other, err := w.seed.Alloc(ctx, w.facility, "spi.other", "other")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Subscribe(ctx, w.show, other, 100, 100); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"oa", "ob"} {
		if _, err := w.seed.Host(ctx, farmseed.HostSpec{Name: n, Alloc: other, AllocTag: "other", Cores: 4}); err != nil {
			t.Fatal(err)
		}
	}
	job := func(name, tag string, frames int) string {
		t.Helper()
		j, err := w.seed.Job(ctx, farmseed.JobSpec{Name: name, Show: w.show, Facility: w.facility,
			Layers: []farmseed.LayerSpec{{Tags: []string{tag}, Frames: frames, NotThreadable: true}}})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	fake, err := fakerqd.Start(fakerqd.Config{Default: fakerqd.Behavior{RunTime: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()

	cfg := testConfig(w)
	cfg.RQD.DryRun = false
	cfg.Queue.ActiveScanInterval = config.Duration(20 * time.Millisecond)
	cfg.Accounting.LeaderPollInterval = config.Duration(50 * time.Millisecond)
	cfg.Scheduler.WorkSplit = config.WorkSplitAllocation
	// Two shares, one per allocation (no HOSTNAME cluster of the show).
	cfg.Scheduler.IgnoreTags = []string{"ha", "hb", "oa", "ob"}
	cfg.Scheduler.WorkSplitLease = config.Duration(3 * time.Second)
	cfg.Scheduler.WorkSplitRenew = config.Duration(100 * time.Millisecond)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	start := func() *splitInstance {
		t.Helper()
		pool, err := pgxpool.New(ctx, w.pool.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		in := &splitInstance{reg: prometheus.NewRegistry(), pool: pool, done: make(chan error, 1)}
		in.s, err = scheduler.New(ctx, cfg, scheduler.Deps{Pool: pool, RQDResolve: fake.Resolve, Registerer: in.reg})
		if err != nil {
			pool.Close()
			t.Fatal(err)
		}
		if in.s.Shard == nil {
			t.Fatal("work_split allocation built no shard")
		}
		rctx, cancel := context.WithCancel(ctx)
		in.cancel = cancel
		go func() { in.done <- in.s.Run(rctx) }()
		return in
	}
	kill := func(in *splitInstance) {
		in.cancel()
		<-in.done
		in.s.Close()
		in.pool.Close()
	}
	a, b := start(), start()
	defer func() {
		for _, in := range []*splitInstance{a, b} {
			if in.pool != nil {
				kill(in)
				in.pool = nil
			}
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(testenv.Patience(10 * time.Second))
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (clusters %v; owned %d, %d; members %v, %v)", what, a.s.Feed.Clusters(),
					a.s.Shard.Owned(), b.s.Shard.Owned(), a.s.Shard.Members(), b.s.Shard.Members())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	general := clusters.New(w.facility, w.show.ID, []clusters.Tag{{Name: "general", Type: clusters.Alloc, AllocID: w.alloc}})
	otherC := clusters.New(w.facility, w.show.ID, []clusters.Tag{{Name: "other", Type: clusters.Alloc, AllocID: other}})
	waitFor("each instance to own one allocation", func() bool {
		return a.s.Shard.Owned() == 1 && b.s.Shard.Owned() == 1 && len(a.s.Shard.Members()) == 2 && len(b.s.Shard.Members()) == 2
	})
	if a.s.Shard.Owns(general) == b.s.Shard.Owns(general) || a.s.Shard.Owns(otherC) == b.s.Shard.Owns(otherC) {
		t.Fatal("the two allocations are not split between the instances")
	}

	job("x", "general", 4)
	job("y", "other", 4)
	waitFor("8 frames running", func() bool { return len(fake.Launches()) == 8 })
	// The fake RQD records a launch before the dispatcher counts it.
	waitFor("8 frames counted", func() bool {
		return promread.ValueOr0(t, a.reg, "scheduler_frames_dispatched_total")+promread.ValueOr0(t, b.reg, "scheduler_frames_dispatched_total") == 8
	})
	for _, in := range []*splitInstance{a, b} {
		if got := promread.Value(t, in.reg, "scheduler_frames_dispatched_total"); got != 4 {
			t.Fatalf("an instance dispatched %v frames, want 4 (its allocation's)", got)
		}
		if lost := promread.Value(t, in.reg, "scheduler_bookings_lost_total"); lost != 0 {
			t.Fatalf("an instance lost %v races with the work split", lost)
		}
	}

	// The owner of "other" dies; its lock session ends with it.
	victim, survivor := a, b
	if b.s.Shard.Owns(otherC) {
		victim, survivor = b, a
	}
	kill(victim)
	victim.pool = nil
	waitFor("the dead instance's member lock to go", func() bool {
		var n int
		_ = w.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
			AND (classid::bigint >> 16) = $1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
			int64(0x6373)).Scan(&n)
		return n == 1
	})
	renewed := promread.Value(t, survivor.reg, "scheduler_work_split_lease_renewals_total")
	waitFor("the survivor to own both allocations", func() bool { return survivor.s.Shard.Owns(otherC) && survivor.s.Shard.Owns(general) })
	// The bound, in lease steps (not wall time): the first step after the
	// dead session ended takes its share.
	if steps := promread.Value(t, survivor.reg, "scheduler_work_split_lease_renewals_total") - renewed; steps > 2 {
		t.Fatalf("the survivor took %v lease steps to take the dead instance's allocation, want <= 2", steps)
	}
	z := job("z", "other", 4)
	waitFor("the new work on the dead instance's allocation to run", func() bool {
		n := 0
		for _, l := range fake.Launches() {
			if l.RunFrame.GetJobId() == z {
				n++
			}
		}
		return n == 4
	})

	seen := map[string]int{}
	for _, l := range fake.Launches() {
		seen[l.RunFrame.GetFrameId()]++
		if seen[l.RunFrame.GetFrameId()] > 1 {
			t.Fatalf("frame %s launched twice", l.RunFrame.GetFrameId())
		}
	}
	var over int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM host h WHERE h.int_cores < (SELECT COALESCE(sum(p.int_cores_reserved), 0) FROM proc p WHERE p.pk_host = h.pk_host)`).Scan(&over); err != nil {
		t.Fatal(err)
	}
	if over != 0 {
		t.Fatalf("%d hosts booked past their cores", over)
	}
	promlint.Check(t, survivor.reg)
}
