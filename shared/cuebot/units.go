package cuebot

import (
	"fmt"
	"math"
)

// CenticoresPerCore is the factor between cores and the centicores
// PostgreSQL stores (Cuebot's and the reference scheduler's
// core_multiplier).
const CenticoresPerCore = 100

// Unlimited is the "no cap" sentinel of folder/folder_resource
// int_max_cores and int_max_gpus and of folder int_job_* columns. It
// survives unit conversions unchanged.
const Unlimited = -1

// IsUnlimitedFolderCap reports whether a folder or folder_resource
// int_max_cores / int_max_gpus means "no cap": exactly -1, as Cuebot reads
// it (any other value, 0 and other negatives included, is a cap that books
// nothing once reached). Job caps and subscription bursts have no unlimited
// value at all: 0 or less books nothing.
func IsUnlimitedFolderCap(limit int64) bool { return limit == Unlimited }

// CenticoresToCores converts centicores to whole cores, truncating toward
// zero (250 -> 2, 50 -> 0, -250 -> -2). Unlimited (-1) stays -1.
func CenticoresToCores(centicores int64) int64 {
	if centicores == Unlimited {
		return Unlimited
	}
	return centicores / CenticoresPerCore
}

// CoresToCenticores converts whole cores to centicores. Unlimited (-1)
// stays -1.
func CoresToCenticores(cores int64) int64 {
	if cores == Unlimited {
		return Unlimited
	}
	return cores * CenticoresPerCore
}

// CoresFloatToCenticores converts a possibly fractional core count (as an
// operator writes it: 0.5, 1.25) to centicores, rounding to the nearest
// centicore (half away from zero). It returns an error for NaN, infinities
// and values that do not fit an int64.
func CoresFloatToCenticores(cores float64) (int64, error) {
	c := math.Round(cores * CenticoresPerCore)
	if math.IsNaN(c) || math.IsInf(c, 0) || c > math.MaxInt64 || c < math.MinInt64 {
		return 0, fmt.Errorf("cuebot: core count %v is not a representable number of centicores", cores)
	}
	return int64(c), nil
}

// CenticoresToCoresFloat converts centicores to fractional cores for
// display (250 -> 2.5).
func CenticoresToCoresFloat(centicores int64) float64 {
	return float64(centicores) / CenticoresPerCore
}

// Memory sizes in the KB (KiB) unit Cuebot stores.
const (
	KB int64 = 1           // one KiB, in KB
	MB int64 = 1024        // one MiB, in KB
	GB int64 = 1024 * 1024 // one GiB, in KB (Cuebot's CueUtil.GB)

	// BytesPerKB is the size of Cuebot's memory unit in bytes.
	BytesPerKB int64 = 1024

	// MemReservedMinKB is Cuebot's dispatcher.memory.mem_reserved_min: the
	// int_mem_used a new proc is inserted with (256 MB).
	MemReservedMinKB int64 = 262144
	// MemReservedSystemKB is Cuebot's memory kept back for the host OS.
	MemReservedSystemKB int64 = 524288
	// DefaultLayerMemMinKB is layer.int_mem_min's column default (4 GB).
	DefaultLayerMemMinKB int64 = 4194304
	// DefaultMinMemoryIncreaseKB is service.int_min_memory_increase's
	// default (2 GB).
	DefaultMinMemoryIncreaseKB int64 = 2097152
)

// BytesToKB converts bytes to KB, rounding up so a reservation computed
// from bytes never shrinks below what was asked for (1 byte -> 1 KB).
// Negative input is an error.
func BytesToKB(bytes int64) (int64, error) {
	if bytes < 0 {
		return 0, fmt.Errorf("cuebot: negative byte count %d", bytes)
	}
	return (bytes + BytesPerKB - 1) / BytesPerKB, nil
}

// KBToBytes converts Cuebot KB to bytes. It returns an error on negative
// input or overflow.
func KBToBytes(kb int64) (int64, error) {
	if kb < 0 {
		return 0, fmt.Errorf("cuebot: negative KB count %d", kb)
	}
	if kb > math.MaxInt64/BytesPerKB {
		return 0, fmt.Errorf("cuebot: %d KB overflows int64 bytes", kb)
	}
	return kb * BytesPerKB, nil
}
