package hostcache

import (
	"context"
	"slices"
	"testing"
)

// Serving lists every host that could serve a layer at all, idle or busy,
// checked out or not, with the cache's gates (facility, subscription, tag,
// lock and hardware state, OS list, thread mode).
func TestServing(t *testing.T) {
	t.Parallel()
	f := newFarm(t, Config{}, Options{})
	f.addHosts(
		hostSpec{id: "busy", cores: 64, idleCores: 0, memGB: 256, idleMemGB: 0},
		hostSpec{id: "idle", cores: 128, idleCores: 128, memGB: 512, idleMemGB: 512},
		hostSpec{id: "out", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256},
		hostSpec{id: "all", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256, threadMode: 1},
		hostSpec{id: "rocky", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256, os: "rocky9"},
		hostSpec{id: "locked", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256, lock: "LOCKED"},
		hostSpec{id: "down", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256, state: "DOWN"},
		hostSpec{id: "gpu-tag", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256, tags: []string{"gpu"}},
		hostSpec{id: "unsubscribed", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256, alloc: allocB},
		hostSpec{id: "other-facility", cores: 64, idleCores: 64, memGB: 256, idleMemGB: 256, alloc: allocC},
	)
	r := req()
	r.Accept = func(h Host) bool { return h.ID == "out" }
	if h, err := f.c.Checkout(context.Background(), r); err != nil || h.ID != "out" {
		t.Fatalf("checkout = %v, %v", h.ID, err)
	}
	ids := func(hs []Host) []string {
		var out []string
		for _, h := range hs {
			out = append(out, h.ID)
		}
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		name       string
		os         string
		threadable bool
		want       []string
	}{
		{"threadable, any OS", "", true, []string{"all", "busy", "idle", "out", "rocky"}},
		{"not threadable", "", false, []string{"busy", "idle", "out", "rocky"}},
		{"OS", "rocky9", true, []string{"rocky"}},
	} {
		if got := ids(f.c.Serving(facA, showS, []string{"general"}, c.os, c.threadable)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	hs := f.c.Serving(facA, showS, []string{"general", "gpu"}, "", false)
	if got := ids(hs); !slices.Equal(got, []string{"busy", "gpu-tag", "idle", "out", "rocky"}) {
		t.Errorf("two tags: %v", got)
	}
	for _, h := range hs {
		if h.ID == "idle" && (h.TotalCores != 12800 || h.IdleCores != 12800 || h.TotalMemKB != 512*gib) {
			t.Errorf("idle host as served: %+v", h)
		}
	}
	f.c.Release("out")
	f.checkInvariants()
}
