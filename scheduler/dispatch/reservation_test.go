package dispatch_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/scheduler/rqdclient"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

type ownerRecorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *ownerRecorder) OwnerBooked(_ context.Context, host, layer string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, host+"/"+layer)
}

// reserve writes a live reservation of host for layer (the hash
// scheduler/reservations grants).
func (h *harness) reserve(host, layer string, ready time.Time) {
	h.t.Helper()
	err := h.rdb.HSet(context.Background(), publisher.ResvHostKey(host), "host", host, "layer", layer, "job", "JW",
		"ready_at", strconv.FormatInt(ready.UnixMilli(), 10),
		"expires_at", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)).Err()
	if err != nil {
		h.t.Fatal(err)
	}
}

// The dispatcher names the host in every booking: a host reserved for
// another layer refuses the batch (Stop Reserved, nothing charged or
// started) unless the frames are EASY backfills that end before its ready
// time; the owner's frames start and end the reservation.
func TestDispatchHonoursReservations(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rqd := rqdclient.New(rqdclient.Options{Resolve: h.fake.Resolve, RequestTimeout: 5 * time.Second})
	t.Cleanup(func() { rqd.Close() })
	rec := &ownerRecorder{}
	d := dispatch.New(h.pool, h.pub, rqd, dispatch.Config{Policy: sizing.Policy{CoreUnit: 100, MinMemKB: 262144, StrandedMemKB: 2 * farmseed.GB}},
		dispatch.Options{Registerer: prometheus.NewRegistry(), Reservations: rec})
	host := h.host(farmseed.HostSpec{Cores: 8, MemKB: 32 * farmseed.GB})
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Name: "render", Frames: 6, NotThreadable: true, MemKB: farmseed.GB}}})
	l := h.layers(j)[0]
	ctx := context.Background()

	// Reserved for another layer; this one has no runtime history.
	h.reserve(host.ID, "other-layer", time.Now().Add(time.Hour))
	res := d.Dispatch(ctx, l, l.Frames[:2], host)
	if res.Stop != dispatch.Reserved || res.Reserved == nil || res.Reserved.OwnerLayer != "other-layer" || len(res.Dispatched) != 0 {
		t.Fatalf("non-owner batch: %+v, want Stop reserved", res)
	}
	h.checkBooked(0)
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'RUNNING'`, l.ID); n != 0 {
		t.Fatalf("%d frames started on a host reserved for another layer", n)
	}

	// With history (10 s at worst) it backfills before a ready time an
	// hour away...
	h.exec(`UPDATE layer_usage SET int_clock_time_high = 10 WHERE pk_layer = $1`, l.ID)
	l = h.layers(j)[0]
	if l.RuntimeHigh != 10*time.Second || l.WorstCase() != 11*time.Second {
		t.Fatalf("RuntimeHigh %v, WorstCase %v; want 10s, 11s", l.RuntimeHigh, l.WorstCase())
	}
	res = d.Dispatch(ctx, l, l.Frames[:2], host)
	if res.Stop != dispatch.Done || len(res.Dispatched) != 2 || res.Backfilled != 2 {
		t.Fatalf("backfill batch: %+v, want 2 frames backfilled", res)
	}
	host = res.Host
	if n := h.redisInt(publisher.ResvHostKey(host.ID), "backfills"); n != 2 {
		t.Errorf("reservation backfills = %d, want 2", n)
	}
	// ...but not before one 5 s away.
	h.reserve(host.ID, "other-layer", time.Now().Add(5*time.Second))
	l = h.layers(j)[0]
	res = d.Dispatch(ctx, l, l.Frames[:1], host)
	if res.Stop != dispatch.Reserved || !res.Reserved.Backfill || len(res.Dispatched) != 0 {
		t.Fatalf("late backfill: %+v, want refused", res)
	}
	h.checkBooked(2)
	if len(rec.calls) != 0 {
		t.Fatalf("owner hook called for non-owners: %v", rec.calls)
	}

	// The owner's frames start, and the hook hears it.
	h.reserve(host.ID, l.ID, time.Now().Add(time.Hour))
	res = d.Dispatch(ctx, l, l.Frames[:1], host)
	if res.Stop != dispatch.Done || len(res.Dispatched) != 1 || res.Backfilled != 0 {
		t.Fatalf("owner batch: %+v", res)
	}
	if len(rec.calls) != 1 || rec.calls[0] != host.ID+"/"+l.ID {
		t.Fatalf("owner hook calls = %v, want one for %s/%s", rec.calls, host.ID, l.ID)
	}
	h.checkBooked(3)
}
