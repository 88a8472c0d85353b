package replication

import (
	"fmt"
	"testing"
)

// TestSnapshotShows: a streamed 32-bit id is placed in the snapshot's epoch
// (also across a wraparound of the 32-bit counter) and judged against its
// horizon: finished below xmin, visible below xmax unless in progress, not
// started from xmax on.
func TestSnapshotShows(t *testing.T) {
	v, err := parseSnapshot("1000:1010:1003,1007")
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint32]bool{900: true, 1000: true, 1003: false, 1005: true, 1007: false, 1009: true, 1010: false, 1500: false} {
		if got := v.shows(xid); got != want {
			t.Errorf("snapshot 1000:1010:1003,1007 shows %d = %v, want %v", xid, got, want)
		}
	}
	// Epoch 3, the 32-bit counter wrapped just before xmax.
	base := uint64(3) << 32
	w, err := parseSnapshot(fmt.Sprintf("%d:%d:%d", base-20, base+5, base+2))
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint32]bool{^uint32(0) - 30: true, ^uint32(0) - 3: true, 1: true, 2: false, 4: true, 5: false, 6: false} {
		if got := w.shows(xid); got != want {
			t.Errorf("wrapped snapshot shows %d = %v, want %v", xid, got, want)
		}
	}
	var none snapshotView
	if none.shows(1) {
		t.Error("no snapshot read yet, yet a transaction is judged visible")
	}
	for _, bad := range []string{"", "1:2", "x:2:", "5:2:", "1:9:3,y"} {
		if _, err := parseSnapshot(bad); err == nil {
			t.Errorf("parseSnapshot(%q) accepted", bad)
		}
	}
	if v, err := parseSnapshot("7:7:"); err != nil || !v.shows(6) || v.shows(7) {
		t.Errorf("empty in-progress list: %+v, %v", v, err)
	}
}
