package publisher_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

// A booking that names its host honours the host's reservation: another
// layer is refused with a *ReservedError (nothing charged), a backfill is
// admitted only if it ends by the ready time, and the owner's booking says
// so in the Result. A booking without a host id reads no reservation.
func TestBookHonoursHostReservation(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	ready := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	if err := f.rdb.HSet(f.ctx, publisher.ResvHostKey("H"), "host", "H", "layer", "LW", "job", "JW",
		"ready_at", strconv.FormatInt(ready.UnixMilli(), 10),
		"expires_at", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)).Err(); err != nil {
		t.Fatal(err)
	}
	b := booking("p1", 100)
	b.HostID = "H"
	_, err := f.pub.Book(f.ctx, b)
	var re *publisher.ReservedError
	if !errors.As(err, &re) {
		t.Fatalf("non-owner booking: err = %v, want *ReservedError", err)
	}
	if re.Host != "H" || re.OwnerLayer != "LW" || re.OwnerJob != "JW" || !re.ReadyAt.Equal(ready) || re.Backfill || !re.Until.IsZero() {
		t.Errorf("ReservedError = %+v", re)
	}
	f.expectCores(0)

	b = booking("p2", 100)
	b.HostID, b.BackfillUntil = "H", ready.Add(time.Second)
	if _, err := f.pub.Book(f.ctx, b); !errors.As(err, &re) || !re.Backfill || !re.Until.Equal(b.BackfillUntil) {
		t.Fatalf("late backfill: err = %v, want a backfill refusal", err)
	}
	f.expectCores(0)

	b = booking("p3", 100)
	b.HostID, b.BackfillUntil = "H", ready.Add(-time.Second)
	res, err := f.pub.Book(f.ctx, b)
	if err != nil || res.Reservation != publisher.ReservationBackfill {
		t.Fatalf("backfill: %+v, %v; want booked as a backfill", res, err)
	}

	b = booking("p4", 100)
	b.HostID, b.LayerID = "H", "LW"
	res, err = f.pub.Book(f.ctx, b)
	if err != nil || res.Reservation != publisher.ReservationOwner {
		t.Fatalf("owner: %+v, %v; want booked as the owner", res, err)
	}

	res, err = f.pub.Book(f.ctx, booking("p5", 100))
	if err != nil || res.Reservation != "" {
		t.Fatalf("booking without a host: %+v, %v", res, err)
	}
	if got := promread.Value(t, f.reg, "scheduler_accounting_bookings_total", "result", "reserved"); got != 2 {
		t.Errorf("reserved bookings metric = %v, want 2", got)
	}
	// An expired reservation is none.
	f.rdb.HSet(f.ctx, publisher.ResvHostKey("H"), "expires_at", strconv.FormatInt(time.Now().Add(-time.Second).UnixMilli(), 10))
	b = booking("p6", 100)
	b.HostID = "H"
	if res, err := f.pub.Book(f.ctx, b); err != nil || res.Reservation != "" {
		t.Fatalf("booking on an expired reservation: %+v, %v", res, err)
	}
}
