package matcher_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/jobs"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// fakeResv refuses the hosts in reserved (for everyone) and records the
// outcomes.
type fakeResv struct {
	mu       sync.Mutex
	reserved map[string]bool
	outcomes []matcher.LayerOutcome
	asked    int
}

func (f *fakeResv) Admit(host string, _ *jobs.Layer, _ time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return !f.reserved[host]
}

func (f *fakeResv) Observe(_ *clusters.Cluster, _ *jobs.Layer, o matcher.LayerOutcome, _ time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outcomes = append(f.outcomes, o)
}

func (f *fakeResv) last() matcher.LayerOutcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.outcomes[len(f.outcomes)-1]
}

// The matcher keeps layers off hosts its Reservations refuses, reports
// blocked and placed outcomes, and moves on to another host when the
// booking script refuses a host reserved since the checkout.
func TestMatcherHonoursReservations(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	fr := &fakeResv{reserved: map[string]bool{}}
	m := matcher.New(h.pool, h.hosts, h.disp, matcher.Config{Attempts: 10, FramesPerLayer: 20, Policy: h.policy},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: jobs.NewBackoff(time.Millisecond, time.Millisecond),
			Permits: matcher.NewPermits(), Reservations: fr})
	ctx := context.Background()
	process := func(j jobs.Job) matcher.Outcome {
		t.Helper()
		time.Sleep(5 * time.Millisecond) // past the backoff
		out, err := m.Process(ctx, h.cluster, j)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	small := h.str(h.seed.Host(ctx, farmseed.HostSpec{Name: "small", Alloc: h.alloc, AllocTag: "general", Cores: 4}))
	fr.reserved[small] = true
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(2)}})
	if out := process(j); out.Dispatched != 0 || fr.asked == 0 {
		t.Fatalf("outcome %+v on the only host, reserved (asked %d)", out, fr.asked)
	}
	if fr.last() != matcher.OutcomeBlocked {
		t.Fatalf("outcome reported %v, want blocked", fr.last())
	}

	// Reserved in Redis since (the script's view), not in the matcher's:
	// the batch is refused there and the frames go to the other host.
	big := h.str(h.seed.Host(ctx, farmseed.HostSpec{Name: "big", Alloc: h.alloc, AllocTag: "general", Cores: 8}))
	fr.reserved[small] = false
	if err := h.pub.Client().HSet(ctx, publisher.ResvHostKey(small), "host", small, "layer", "another-layer", "job", "J",
		"ready_at", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10),
		"expires_at", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if out := process(j); out.Dispatched != 2 {
		t.Fatalf("outcome %+v, want both frames on the unreserved host", out)
	}
	if fr.last() != matcher.OutcomePlaced {
		t.Fatalf("outcome reported %v, want placed", fr.last())
	}
	var onBig int64
	if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM proc WHERE pk_host = $1`, big).Scan(&onBig); err != nil || onBig != 2 {
		t.Fatalf("%d procs on the unreserved host (%v), want 2", onBig, err)
	}
	if n := h.hosts.Out(); n != 0 {
		t.Fatalf("%d hosts left checked out", n)
	}
}
