package publisher_test

import (
	"errors"
	"testing"

	"github.com/cuesched/cuesched/publisher"
)

// A booking acknowledged with an acct:seq at or below one acknowledged
// before it was sent proves Redis lost acknowledged writes: it fails
// (ErrSeqWentBack, its charge to be rolled back), every later booking is
// refused without reaching Redis, SeqWentBack gives the evidence, and a
// new epoch's mark lifts the fence. Without the check, the second booking
// on the rolled-back counters would pass (acct:seq only goes back).
func TestBookingFindsSeqWentBack(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	for _, p := range []string{"a", "b", "c"} {
		if _, err := f.pub.Book(f.ctx, booking(p, 100)); err != nil {
			t.Fatal(err)
		}
	}
	hw := f.pub.SeqHighWater()
	if _, _, ok := f.pub.SeqWentBack(); ok || hw < 3 {
		t.Fatalf("after three bookings: high water %d, went back %v", hw, ok)
	}
	// Redis comes back with less: acct:seq as it was before two of them.
	if err := f.rdb.Set(f.ctx, publisher.SeqKey, hw-2, 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := f.pub.Book(f.ctx, booking("d", 100))
	if !errors.Is(err, publisher.ErrSeqWentBack) {
		t.Fatalf("booking on the rolled-back Redis: %v, want ErrSeqWentBack", err)
	}
	seq, mark, ok := f.pub.SeqWentBack()
	if !ok || seq != hw-1 || mark != hw {
		t.Fatalf("SeqWentBack = %d, %d, %v; want %d, %d, true", seq, mark, ok, hw-1, hw)
	}
	// Fenced: refused before Redis (acct:seq does not move).
	before, _ := f.rdb.Get(f.ctx, publisher.SeqKey).Int64()
	if _, err := f.pub.Book(f.ctx, booking("e", 100)); !errors.Is(err, publisher.ErrSeqWentBack) {
		t.Fatalf("booking after the finding: %v, want ErrSeqWentBack", err)
	}
	_, errs := f.pub.BookAll(f.ctx, []publisher.Booking{booking("f", 100), booking("g", 100)})
	for i, err := range errs {
		if !errors.Is(err, publisher.ErrSeqWentBack) {
			t.Fatalf("BookAll booking %d after the finding: %v, want ErrSeqWentBack", i, err)
		}
	}
	if after, _ := f.rdb.Get(f.ctx, publisher.SeqKey).Int64(); after != before {
		t.Fatalf("acct:seq moved from %d to %d: a fenced booking reached Redis", before, after)
	}
	// A new epoch adopted (ResetSeqHighWater): booking resumes.
	f.pub.ResetSeqHighWater(before)
	if _, _, ok := f.pub.SeqWentBack(); ok {
		t.Fatal("the finding outlived the new epoch's mark")
	}
	if _, err := f.pub.Book(f.ctx, booking("h", 100)); err != nil {
		t.Fatalf("booking under the new mark: %v", err)
	}
	// A duplicate's seq is its original's: never a finding.
	if r, err := f.pub.Book(f.ctx, booking("h", 100)); err != nil || !r.Duplicate {
		t.Fatalf("duplicate = %+v, %v", r, err)
	}
}
