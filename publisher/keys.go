package publisher

import (
	"fmt"
	"strings"
)

// Key names (see package lua for the schema). They are exported so that the
// audit and the tests name keys exactly as the scripts do.
const (
	SeqKey       = "acct:seq"
	EpochKey     = "acct:epoch"
	BootstrapKey = "acct:bootstrap"
	ShowsKey     = "acct:shows"
	LSNKey       = "acct:sidecar:lsn"
	// SidecarShowsKey holds the sidecar's managed-show set with the LSN it
	// is valid at (see SaveSidecarState).
	SidecarShowsKey = "acct:sidecar:shows"
	procPrefix      = "acct:proc:"
	// ReleasedChannel is the Pub/Sub channel release.lua publishes each
	// show it released a proc of on (the message is the show id).
	ReleasedChannel = "acct:released"
	// ResvIndexKey is the set of host ids holding a firm reservation
	// (scheduler/reservations).
	ResvIndexKey = "acct:resv:index"
)

// ResvHostKey is a host's firm reservation, acct:resv:host:{host}.
func ResvHostKey(host string) string { return "acct:resv:host:" + host }

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

// CapCores converts a subscription size or burst, or a folder or point
// minimum, in centicores to whole cores for Redis: negative values become -1,
// 0 stays 0, and a positive value rounds down but to at least 1 core, so a
// burst below one core still books one (fractional) proc, charged as one
// whole core, as Cuebot books it (int_cores + units <= int_burst). The
// booking script has no "unlimited" reading of a burst: -1 and 0 both book
// nothing. Folder and job caps convert with FolderCapCores and JobCapCores.
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

// Unlimited is the folder cap sentinel, in Postgres (folder_resource
// int_max_cores and int_max_gpus) and in Redis alike: exactly -1, nothing
// else, as in Cuebot's dispatch query ("int_max_cores = -1 OR ...").
const Unlimited = -1

// FolderCapCores converts folder_resource.int_max_cores (centicores) to the
// whole cores the booking script enforces. Cuebot books a folder only when
// its max is -1 or the folder has room under it, so -1 stays -1 (Unlimited)
// and every other value is a cap: rounded down (never allowing more than
// Postgres does), so 0, a value below one core and any other negative value
// (-2, -100: not the sentinel, Cuebot books nothing under them) all become 0,
// which books nothing.
func FolderCapCores(centicores int64) int64 {
	switch {
	case centicores == Unlimited:
		return Unlimited
	case centicores < 100:
		return 0
	default:
		return centicores / 100
	}
}

// FolderCapGPUs converts folder_resource.int_max_gpus: -1 stays -1
// (Unlimited), any other negative value is a cap of 0, the rest verbatim.
func FolderCapGPUs(v int64) int64 {
	switch {
	case v == Unlimited:
		return Unlimited
	case v < 0:
		return 0
	default:
		return v
	}
}

// JobCapCores converts job_resource.int_max_cores (centicores) to whole
// cores. A job cap has no "unlimited" value in Cuebot (it books only while
// int_cores + need <= int_max_cores), so it is always a cap: rounded down,
// and 0, a value below one core and every negative value become 0, which
// books nothing.
func JobCapCores(centicores int64) int64 {
	if centicores < 100 {
		return 0
	}
	return centicores / 100
}

// JobCapGPUs converts job_resource.int_max_gpus: always a cap (no sentinel;
// Cuebot's isJobBookable refuses int_gpus + gpus > int_max_gpus), negative
// values become 0. It binds GPU bookings only: a proc with no GPUs is never
// checked against it.
func JobCapGPUs(v int64) int64 {
	return max(v, 0)
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

// SeatKey is a node-locked limit's seats, acct:seat:{limit}: host id -> the
// host's booked procs under the limit.
func SeatKey(limit string) string { return "acct:seat:" + limit }
