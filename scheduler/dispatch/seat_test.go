package dispatch_test

import (
	"context"
	"testing"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/dispatch"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// A node-locked limit of 2 seats counts hosts, not frames: two hosts run
// 6 frames each (far past the max of 2 as a frame count), a third host is
// refused (Stop LimitReached with the SeatError, nothing booked or
// claimed); when the first host's procs are released its seat goes to the
// third. Turned off, the same limit counts frames again.
func TestDispatchNodeLockedLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHarness(t, nil)
	var hosts []sizing.Host
	for i := 0; i < 3; i++ {
		hosts = append(hosts, h.host(farmseed.HostSpec{Cores: 6}))
	}
	lim := h.must(h.seed.Limit(ctx, "houdini", 2))
	if err := h.seed.LimitPerHost(ctx, lim, true); err != nil {
		t.Fatal(err)
	}
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{{Frames: 30, NotThreadable: true, Limits: []string{lim}}}})
	l := h.layers(j)[0]
	if len(l.SeatLimits) != 1 || l.SeatLimits[0].ID != lim || l.SeatLimits[0].Max != 2 {
		t.Fatalf("layer's node-locked limits = %+v", l.SeatLimits)
	}
	frames := l.Frames
	for i := 0; i < 2; i++ {
		res := h.d.Dispatch(ctx, l, frames, hosts[i])
		if len(res.Dispatched) != 6 {
			t.Fatalf("host %d: %+v, want 6 frames on one seat", i, res)
		}
		frames = frames[6:]
	}
	res := h.d.Dispatch(ctx, l, frames, hosts[2])
	if res.Stop != dispatch.LimitReached || res.Seat == nil || res.Seat.Limit != lim || len(res.Dispatched) != 0 || len(res.Claimed) != 0 {
		t.Fatalf("third host = %+v, want limit_reached by the seat", res)
	}
	h.checkBooked(12)
	if n := h.count(`SELECT count(*) FROM frame WHERE pk_layer = $1 AND str_state = 'RUNNING'`, l.ID); n != 12 {
		t.Fatalf("running frames = %d, want 12", n)
	}
	// The first host's frames end (Cuebot's completion deletes the procs;
	// the sidecar's release gives the seat back).
	var procs []string
	rows, err := h.pool.Query(ctx, `SELECT pk_proc FROM proc WHERE pk_host = $1`, hosts[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p string
		_ = rows.Scan(&p)
		procs = append(procs, p)
	}
	rows.Close()
	h.exec(`UPDATE frame SET str_state = 'SUCCEEDED' WHERE pk_frame IN (SELECT pk_frame FROM proc WHERE pk_host = $1)`, hosts[0].ID)
	h.exec(`DELETE FROM proc WHERE pk_host = $1`, hosts[0].ID)
	h.exec(`UPDATE host SET int_cores_idle = int_cores, int_mem_idle = int_mem WHERE pk_host = $1`, hosts[0].ID)
	if _, err := h.pub.Release(ctx, procs[:5]...); err != nil {
		t.Fatal(err)
	}
	if res := h.d.Dispatch(ctx, l, frames, h.load(hosts[2].ID)); res.Seat == nil || len(res.Dispatched) != 0 {
		t.Fatalf("seat still held by one proc: %+v", res)
	}
	if _, err := h.pub.Release(ctx, procs[5:]...); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.pub.SeatHosts(ctx, lim); len(got) != 1 || got[0] != hosts[1].ID {
		t.Fatalf("seats %v, want only host 2's", got)
	}
	if res := h.d.Dispatch(ctx, l, frames, h.load(hosts[2].ID)); len(res.Dispatched) != 6 {
		t.Fatalf("third host after the first's seat was freed = %+v", res)
	}
	if n := h.redisInt(publisher.SeatKey(lim), hosts[2].ID); n != 6 {
		t.Fatalf("third host's procs under the limit = %d", n)
	}
	// Off: Cuebot's per-frame meaning (12 running, max 2: nothing more).
	if err := h.seed.LimitPerHost(ctx, lim, false); err != nil {
		t.Fatal(err)
	}
	l = h.layers(j)[0]
	if len(l.SeatLimits) != 0 {
		t.Fatalf("per-frame limit read as node-locked: %+v", l.SeatLimits)
	}
	if res := h.d.Dispatch(ctx, l, l.Frames, h.load(hosts[0].ID)); res.Stop != dispatch.LimitReached || len(res.Dispatched) != 0 {
		t.Fatalf("per-frame again = %+v, want nothing past the frame count", res)
	}
}
