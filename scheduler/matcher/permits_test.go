package matcher

import (
	"testing"
	"time"
)

func TestPermits(t *testing.T) {
	now := time.Unix(100, 0)
	p := NewPermits()
	p.now = func() time.Time { return now }
	if !p.Acquire("l1", time.Second) {
		t.Fatal("first acquire refused")
	}
	if p.Acquire("l1", time.Second) {
		t.Fatal("a held permit was granted twice")
	}
	if !p.Acquire("l2", time.Second) {
		t.Fatal("another layer refused")
	}
	now = now.Add(2 * time.Second)
	if !p.Acquire("l1", time.Second) {
		t.Fatal("an expired permit was not granted again")
	}
	p.Release("l1")
	if !p.Acquire("l1", time.Second) {
		t.Fatal("a released permit was not granted again")
	}
	p.Release("l1")
	p.Release("l2")
	if p.Len() != 0 {
		t.Fatalf("%d permits left", p.Len())
	}
}
