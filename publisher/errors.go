package publisher

import (
	"errors"
	"fmt"
	"time"
)

// ErrShowNotSeeded is matched (errors.Is) by a *NotSeededError.
var ErrShowNotSeeded = errors.New("show not seeded")

// ErrEpochSuperseded: a seeding write (marker or epoch) named a bootstrap
// epoch that is no longer the current one (another leader bootstrapped
// since, or Redis was emptied): nothing was written.
var ErrEpochSuperseded = errors.New("bootstrap epoch superseded")

// ErrAlreadyReleased is returned by Book for a proc id whose release has
// already been applied (a tombstone exists): booking it again would charge a
// proc that is gone.
var ErrAlreadyReleased = errors.New("proc already released")

// ErrSeqRolledBack is returned by Reconcile when acct:seq is below the
// mark read before its snapshot: Redis lost acknowledged writes since
// (rolled back). Nothing was changed; the caller treats Redis as rolled back.
var ErrSeqRolledBack = errors.New("acct:seq went back below the mark: Redis rolled back")

// ErrSnapshotTooOld is returned by Reconcile when the snapshot was taken
// longer ago than the request's MaxAge; nothing was changed.
var ErrSnapshotTooOld = errors.New("snapshot too old")

// NotSeededError: the show's caps and booked counters are not in Redis yet
// (just flipped to managed, or Redis was restarted and the bootstrap has not
// finished). Nothing was charged. This is a reason to wait, not a rejection.
type NotSeededError struct{ ShowID string }

func (e *NotSeededError) Error() string {
	return fmt.Sprintf("show %s not seeded: its caps and booked counters are not in Redis yet (managed flip or Redis restart in progress)", e.ShowID)
}

// Is makes errors.Is(err, ErrShowNotSeeded) true.
func (e *NotSeededError) Is(target error) bool { return target == ErrShowNotSeeded }

// Tables named by LimitError.Table (the script's table names).
const (
	TableSubscription = "subscription"
	TableFolder       = "folder"
	TableJob          = "job"
	TableFolderGPUs   = "folder_gpus"
	TableJobGPUs      = "job_gpus"
)

// LimitError: booking would exceed a cap; nothing was charged.
type LimitError struct {
	Table   string // subscription, folder, job, folder_gpus, job_gpus
	ShowID  string
	AllocID string
	Folder  string
	Job     string
	Current int64 // booked before this booking (cores or GPUs)
	Delta   int64 // what this booking asked for
	Limit   int64 // the cap
	// Missing: the cap is not in Redis at all: the show has no subscription
	// on this allocation, or (folder and job tables) the cap field was never
	// written (no limit reseed and no SeedCaps since the folder or job
	// appeared). Nothing books against a cap nobody wrote.
	Missing bool
}

func (e *LimitError) Error() string {
	var what, id, unit string
	switch e.Table {
	case TableSubscription:
		if e.Missing {
			return fmt.Sprintf("no subscription: show %s has no subscription on alloc %s, so it cannot book there", e.ShowID, e.AllocID)
		}
		return fmt.Sprintf("subscription burst exceeded: show %s alloc %s: %d + %d > %d cores", e.ShowID, e.AllocID, e.Current, e.Delta, e.Limit)
	case TableFolder:
		what, id, unit = "folder max cores", "folder "+e.Folder, "cores"
	case TableJob:
		what, id, unit = "job max cores", "job "+e.Job, "cores"
	case TableFolderGPUs:
		what, id, unit = "folder max GPUs", "folder "+e.Folder, "GPUs"
	case TableJobGPUs:
		what, id, unit = "job max GPUs", "job "+e.Job, "GPUs"
	default:
		return fmt.Sprintf("%s limit exceeded: %d + %d > %d", e.Table, e.Current, e.Delta, e.Limit)
	}
	if e.Missing {
		return fmt.Sprintf("%s: %s not in Redis (never seeded): refused until the limit reseed writes it", id, what)
	}
	return fmt.Sprintf("%s exceeded: %s: %d + %d > %d %s", what, id, e.Current, e.Delta, e.Limit, unit)
}

// TableReservation is the table name the booking script gives a refusal by
// a host reservation (ReservedError).
const TableReservation = "reservation"

// ReservedError: the host holds a firm reservation for another layer
// (scheduler/reservations) and the booking was neither its owner's nor an
// admissible backfill; nothing was charged. Another host may take it.
type ReservedError struct {
	Host       string
	OwnerLayer string
	OwnerJob   string
	// ReadyAt is the reservation's projected ready time.
	ReadyAt time.Time
	// Until is the booking's backfill-until (zero: it claimed none).
	Until time.Time
	// Backfill: the booking claimed a backfill that would end after
	// ReadyAt; otherwise it claimed none (its layer has no runtime history).
	Backfill bool
}

func (e *ReservedError) Error() string {
	if e.Backfill {
		return fmt.Sprintf("host %s is reserved for layer %s (job %s): a backfill ending %s would end after its ready time %s",
			e.Host, e.OwnerLayer, e.OwnerJob, e.Until.UTC().Format(time.RFC3339Nano), e.ReadyAt.UTC().Format(time.RFC3339Nano))
	}
	return fmt.Sprintf("host %s is reserved for layer %s (job %s) until it is ready at %s; this booking claims no backfill (no runtime history)",
		e.Host, e.OwnerLayer, e.OwnerJob, e.ReadyAt.UTC().Format(time.RFC3339Nano))
}

// TableSeat is the table name the booking script gives a refusal by a
// node-locked limit (SeatError).
const TableSeat = "seat"

// SeatError: every seat of a node-locked limit is held by other hosts and
// the booking's host holds none; nothing was charged. A host that already
// holds a seat may still take the frame.
type SeatError struct {
	Limit string // limit_record id
	Host  string
	Held  int64 // hosts holding a seat
	Max   int64 // the limit's max
}

func (e *SeatError) Error() string {
	return fmt.Sprintf("node-locked limit %s: all %d seats held by other hosts (%d held), host %s holds none", e.Limit, e.Max, e.Held, e.Host)
}
