package cuebot

import (
	"math"
	"strings"
	"testing"
)

func TestCenticoresToCores(t *testing.T) {
	for _, tc := range []struct{ in, want int64 }{
		{0, 0}, {100, 1}, {250, 2}, {299, 2}, {50, 0}, {-250, -2}, {-50, 0},
		{Unlimited, Unlimited}, {-100, -1}, {100000, 1000},
	} {
		if got := CenticoresToCores(tc.in); got != tc.want {
			t.Errorf("CenticoresToCores(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestCoresToCenticores(t *testing.T) {
	for _, tc := range []struct{ in, want int64 }{
		{0, 0}, {1, 100}, {1000, 100000}, {Unlimited, Unlimited}, {-2, -200},
	} {
		if got := CoresToCenticores(tc.in); got != tc.want {
			t.Errorf("CoresToCenticores(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
	// Whole cores round-trip.
	for c := int64(-5); c <= 5000; c += 7 {
		if got := CenticoresToCores(CoresToCenticores(c)); got != c {
			t.Fatalf("round trip of %d cores gave %d", c, got)
		}
	}
}

func TestCoresFloatToCenticores(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want int64
	}{{0.5, 50}, {1.25, 125}, {0.1, 10}, {0.005, 1}, {0.004, 0}, {2, 200}, {-0.5, -50}} {
		got, err := CoresFloatToCenticores(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("CoresFloatToCenticores(%v) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1), 1e30} {
		if _, err := CoresFloatToCenticores(bad); err == nil {
			t.Errorf("CoresFloatToCenticores(%v) accepted", bad)
		}
	}
	if got := CenticoresToCoresFloat(250); got != 2.5 {
		t.Errorf("CenticoresToCoresFloat(250) = %v", got)
	}
}

func TestIsUnlimitedFolderCap(t *testing.T) {
	for v, want := range map[int64]bool{-1: true, 0: false, -2: false, 1: false, 100: false} {
		if got := IsUnlimitedFolderCap(v); got != want {
			t.Errorf("IsUnlimitedFolderCap(%d) = %v, want %v (only -1 is unlimited, as Cuebot reads it)", v, got, want)
		}
	}
}

func TestMemory(t *testing.T) {
	if GB != 1048576 || MB != 1024 {
		t.Fatalf("GB=%d MB=%d", GB, MB)
	}
	if MemReservedMinKB != 256*MB || DefaultLayerMemMinKB != 4*GB {
		t.Fatal("memory constants disagree with Cuebot's")
	}
	for _, tc := range []struct{ in, want int64 }{{0, 0}, {1, 1}, {1024, 1}, {1025, 2}, {1 << 30, GB}} {
		got, err := BytesToKB(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("BytesToKB(%d) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	if _, err := BytesToKB(-1); err == nil {
		t.Error("BytesToKB(-1) accepted")
	}
	if b, err := KBToBytes(GB); err != nil || b != 1<<30 {
		t.Errorf("KBToBytes(GB) = %d, %v", b, err)
	}
	if _, err := KBToBytes(math.MaxInt64 / 2); err == nil {
		t.Error("KBToBytes overflow accepted")
	}
	if _, err := KBToBytes(-1); err == nil {
		t.Error("KBToBytes(-1) accepted")
	}
}

func TestIDs(t *testing.T) {
	id := NewID()
	if len(id) != IDLength || !IsCanonicalUUID(id) || strings.ToLower(id) != id {
		t.Fatalf("NewID() = %q, want a lowercase 36-character UUID", id)
	}
	if NewID() == id {
		t.Fatal("NewID repeated itself")
	}
	if IsCanonicalUUID(SeedDeptPipeline) {
		t.Error("an uppercase seed id is not in Cuebot's canonical (Java) form")
	}
	for _, good := range []string{id, SeedDeptPipeline, "host-1"} {
		if err := CheckID("job", good); err != nil {
			t.Errorf("CheckID(%q): %v", good, err)
		}
	}
	for bad, want := range map[string]string{
		"":                      "empty job id",
		strings.Repeat("a", 37): "longer than the 36",
		"a b":                   "whitespace",
		"a\x00":                 "control",
	} {
		err := CheckID("job", bad)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckID(%q) = %v, want an error containing %q", bad, err, want)
		}
	}
}

func TestStates(t *testing.T) {
	for _, s := range FrameStates() {
		if !s.Valid() || strings.ToUpper(string(s)) != string(s) {
			t.Errorf("frame state %q", s)
		}
	}
	if got := FrameWaiting.CountColumn(); got != "int_waiting_count" {
		t.Errorf("CountColumn = %q", got)
	}
	if FrameSetup.CountColumn() != "" {
		t.Error("SETUP must have no count column")
	}
	if _, err := ParseFrameState("waiting"); err == nil || !strings.Contains(err.Error(), `"waiting"`) {
		t.Errorf("lower-case state accepted or error does not name it: %v", err)
	}
	if s, err := ParseJobState("PENDING"); err != nil || s != JobPending {
		t.Errorf("ParseJobState: %v %v", s, err)
	}
	for i, parse := range []func() error{
		func() error { _, err := ParseLockState("NIMBY_LOCKED"); return err },
		func() error { _, err := ParseHardwareState("REBOOT_WHEN_IDLE"); return err },
		func() error { _, err := ParseHostTagType("ALLOC"); return err },
		func() error { _, err := ParseCheckpointState("COPYING"); return err },
		func() error { _, err := ParseLayerType("RENDER"); return err },
		func() error { _, err := ParseDependType("LAYER_ON_SIM_FRAME"); return err },
	} {
		if err := parse(); err != nil {
			t.Errorf("parse %d: %v", i, err)
		}
	}
	if _, err := ParseHostTagType("Hardware"); err == nil {
		t.Error("the mixed-case column default is not a value Cuebot writes")
	}
	if !ThreadVariable.Valid() || ThreadMode(3).Valid() {
		t.Error("ThreadMode.Valid")
	}
	if !NoRetryCount(ExitNeverRan) || !NoRetryCount(ExitFrameCleared) || NoRetryCount(1) || NoRetryCount(ExitSuccess) {
		t.Error("NoRetryCount")
	}
	for _, s := range JobStates() {
		if !s.Valid() {
			t.Errorf("job state %q invalid", s)
		}
	}
}

func TestHostOSes(t *testing.T) {
	for in, want := range map[string][]string{
		"":                    nil,
		"rhel9":               {"rhel9"},
		"rhel7,rhel9":         {"rhel7", "rhel9"},
		" rhel7 , rocky9 ,, ": {"rhel7", "rocky9"},
		",":                   nil,
	} {
		got := HostOSes(in)
		if strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
			t.Errorf("HostOSes(%q) = %q, want %q", in, got, want)
		}
	}
	for _, tc := range []struct {
		host, job string
		want      bool
	}{
		{"rhel7,rhel9", "rhel9", true},
		{"rhel7,rhel9", "rhel7", true},
		{"rhel7, rhel9", "rhel9", true},
		{"rhel7,rhel9", "rhel8", false},
		{"rhel7,rhel9", "", true},
		{"rhel7,rhel9", "  ", true},
		{"", "", true},
		{"", "rhel9", false},
		{"rhel9", "RHEL9", false}, // exact, as Cuebot's IN compares
		{"rhel9", " rhel9 ", true},
		{"rhel79", "rhel7", false}, // whole elements, not substrings
	} {
		if got := HostServesOS(tc.host, tc.job); got != tc.want {
			t.Errorf("HostServesOS(%q, %q) = %v, want %v", tc.host, tc.job, got, tc.want)
		}
		if got := ServesOS(HostOSes(tc.host), tc.job); got != tc.want {
			t.Errorf("ServesOS(HostOSes(%q), %q) = %v, want %v", tc.host, tc.job, got, tc.want)
		}
	}
}
