package publisher

import (
	"fmt"
	"strings"
)

// Key names (see package lua for the schema). They are exported so that the
// audit and the tests name keys exactly as the scripts do.
const (
	SeqKey     = "acct:seq"
	EpochKey   = "acct:epoch"
	ShowsKey   = "acct:shows"
	LSNKey     = "acct:sidecar:lsn"
	procPrefix = "acct:proc:"
)

// SubKey is acct:sub:{show}:{alloc}.
func SubKey(show, alloc string) string { return "acct:sub:" + show + ":" + alloc }

// FolderKey is acct:folder:{folder}.
func FolderKey(folder string) string { return "acct:folder:" + folder }

// JobKey is acct:job:{job}.
func JobKey(job string) string { return "acct:job:" + job }

// LayerKey is acct:layer:{layer}.
func LayerKey(layer string) string { return "acct:layer:" + layer }

// PointKey is acct:point:{dept}:{show}.
func PointKey(dept, show string) string { return "acct:point:" + dept + ":" + show }

// ProcKey is the per-proc booking record acct:proc:{proc}.
func ProcKey(proc string) string { return procPrefix + proc }

// ShowProcsKey is the set of a show's recorded procs, acct:procs:{show}.
func ShowProcsKey(show string) string { return "acct:procs:" + show }

// ShowKey is the seeding marker of a show, acct:show:{show}.
func ShowKey(show string) string { return "acct:show:" + show }

// TombKey is the release tombstone acct:tomb:{proc}.
func TombKey(proc string) string { return "acct:tomb:" + proc }

// RepairKeys are a show's repair session keys: the session (acct:rep), its
// core sums (acct:repc) and its GPU sums (acct:repg).
func RepairKeys(show string) [3]string {
	return [3]string{"acct:rep:" + show, "acct:repc:" + show, "acct:repg:" + show}
}

// ChargeCores converts a proc's reservation in centicores to the whole cores
// it is charged in Redis: rounded up, so a fractional booking (Cuebot books
// e.g. 50 centicores = half a core) is never charged as zero and never lost.
// The exact centicores are kept in the per-proc record.
func ChargeCores(centicores int64) int64 {
	if centicores <= 0 {
		return 0
	}
	return (centicores + 99) / 100
}

// CapCores converts a cap or size in centicores to whole cores for Redis:
// negative values become -1 (unlimited, kept verbatim in meaning), 0 stays 0,
// and a positive cap rounds down (never allowing more than Postgres does)
// but to at least 1 core, because 0 would read as "unlimited" under the
// folder/job "> 0" guard.
func CapCores(centicores int64) int64 {
	switch {
	case centicores < 0:
		return -1
	case centicores == 0:
		return 0
	case centicores < 100:
		return 1
	default:
		return centicores / 100
	}
}

// FormatLSN renders an LSN as the fixed-width upper-case hex the release
// script compares as a string (Lua numbers are doubles; strings are exact).
func FormatLSN(lsn uint64) string { return fmt.Sprintf("%016X", lsn) }

// ParseLSN is the inverse of FormatLSN.
func ParseLSN(s string) (uint64, error) {
	var v uint64
	if len(s) != 16 {
		return 0, fmt.Errorf("LSN %q: want 16 hex digits", s)
	}
	if _, err := fmt.Sscanf(s, "%016X", &v); err != nil {
		return 0, fmt.Errorf("LSN %q: %v", s, err)
	}
	return v, nil
}

// checkID rejects ids that cannot name a key.
func checkID(what, id string) error {
	if id == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(id) > 255 {
		return fmt.Errorf("%s %.40q... is longer than 255 bytes", what, id)
	}
	if strings.ContainsAny(id, " \t\r\n") {
		return fmt.Errorf("%s %q contains whitespace", what, id)
	}
	return nil
}
