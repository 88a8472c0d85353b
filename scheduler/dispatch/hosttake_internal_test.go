package dispatch

import (
	"strings"
	"testing"
)

// TestHostTakeIsPreparedAgainAsFramesDouble: HostTakeSQL's text changes
// each time the committed frames double from 256, and only then, so each
// connection plans it again for the proc table as it has grown.
func TestHostTakeIsPreparedAgainAsFramesDouble(t *testing.T) {
	d := &Dispatcher{hostTakeSQL: hostTakeSQLs()}
	at := func(n int64) string {
		d.committed.Store(n)
		q := d.hostTake()
		if !strings.HasPrefix(q, HostTakeSQL) {
			t.Fatalf("text at %d frames is not HostTakeSQL: %q", n, q)
		}
		return q
	}
	same := [][2]int64{{0, 255}, {256, 511}, {512, 1023}, {1 << 20, 1<<21 - 1}, {1 << 60, 1 << 62}}
	for _, p := range same {
		if at(p[0]) != at(p[1]) {
			t.Errorf("%d and %d frames: different texts, want one", p[0], p[1])
		}
	}
	seen := map[string]int64{}
	for _, n := range []int64{0, 256, 512, 1024, 1 << 20, 1 << 21} {
		q := at(n)
		if m, ok := seen[q]; ok {
			t.Errorf("%d and %d frames share a text, want a new one at each doubling", m, n)
		}
		seen[q] = n
	}
}
