package rollout_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/cuesched/cuesched/rollout"
	"github.com/cuesched/cuesched/scheduler/reservations"
)

// cuesched status lists the host reservations held in Redis.
func TestStatusListsReservations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFarm(t)
	tl := f.tool(t, true)
	_, out := statusOf(t, tl, false)
	contains(t, "status", out, "reservations: none held")

	b := reservations.NewBoard(f.rdb, "sched-a")
	_, why, err := b.Grant(ctx, reservations.GrantRequest{
		Reservation: reservations.Reservation{Host: "H1", HostName: "render-042", Layer: "L1", LayerName: "sim", Job: "J1",
			JobName: "shot010_fx", Show: "S", Alloc: "A", Cores: 6400, MemKB: 1 << 20, ReadyAt: time.Now().Add(90 * time.Second)},
		Timeout: 30 * time.Minute, MaxGrants: 8, MaxAmong: 1, Fitting: []string{"H1"},
	})
	if err != nil || why != "" {
		t.Fatalf("grant: %v %q", err, why)
	}
	rep, out := statusOf(t, tl, false)
	if len(rep.Reservations) != 1 || rep.Reservations[0].HostName != "render-042" || rep.Reservations[0].GrantedBy != "sched-a" {
		t.Fatalf("reservations %+v", rep.Reservations)
	}
	contains(t, "status", out, "reservations: 1 held", "render-042", "shot010_fx", "sim", "64", "sched-a", "READY IN")
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back rollout.StatusReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Reservations) != 1 || back.Reservations[0].Cores != 6400 {
		t.Errorf("JSON round trip: %v %+v", err, back.Reservations)
	}

	_, out = statusOf(t, f.unreachableTool(t), false)
	contains(t, "status", out, "reservations: not read (Redis unreachable)")
}
