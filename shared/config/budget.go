package config

import (
	"fmt"
	"time"
)

// What a booking may cost after its proc row exists. The dispatcher's
// fixed costs are mirrored here so the configuration can be checked (and
// the drain derived) without importing the scheduler.
const (
	// CuebotOrphanedProcInterval is Cuebot's orphaned-proc check: a proc
	// whose ts_ping is older than this is cleared by Cuebot's maintenance
	// (its frame goes back to the queue). A booking must be launched, or
	// compensated, well before that, or Cuebot clears a proc whose frame
	// may still start.
	CuebotOrphanedProcInterval = 300 * time.Second
	// CommitResolveBudget bounds what may follow the booking transaction
	// (one round trip, ended within the Book budget): the look for its
	// procs on another connection when its outcome is unknown (10 s), and
	// as much again to spare (it once also bounded a separate COMMIT).
	CommitResolveBudget = 20 * time.Second
	// CompensateBudget is the deadline of the compensations of one batch
	// (frame back to WAITING and proc deleted in Postgres, the Redis
	// release, a best-effort KillRunningFrame), started when the launches
	// have returned: it never inherits an expired launch deadline.
	CompensateBudget = 20 * time.Second
	// launchAttempts: the RQD client retries a launch once when RQD is
	// unavailable, each attempt bounded by rqd.request_timeout.
	launchAttempts = 2
	// drainMargin covers closing the pools and streams after the last batch.
	drainMargin = 5 * time.Second
)

// DispatchBudget is what one host batch may take, derived from the
// configured timeouts.
type DispatchBudget struct {
	// Book bounds the booking scripts and the transaction
	// (accounting.in_flight_grace / 2).
	Book time.Duration
	// Launch bounds the LaunchFrame calls of a batch after the commit
	// (2 x rqd.request_timeout: one retry when RQD is unavailable).
	Launch time.Duration
	// Compensate is the separate deadline of the batch's compensations.
	Compensate time.Duration
	// PostCommit is Launch + Compensate: the most a committed booking can
	// wait for its launch or its undo.
	PostCommit time.Duration
	// ProcLifetime is the most a proc can exist without its frame being
	// launched or compensated: Book + CommitResolve + PostCommit. It must
	// stay below CuebotOrphanedProcInterval.
	ProcLifetime time.Duration
	// Drain is how long a scheduler waits, after SIGTERM, for its batches
	// in flight: a cancelled batch stops booking at once but finishes its
	// commit, launches and compensations (CommitResolve + PostCommit) on
	// a detached context.
	Drain time.Duration
}

// DispatchBudget derives the dispatch deadlines from the configuration.
func (c Config) DispatchBudget() DispatchBudget {
	b := DispatchBudget{
		Book:       c.Accounting.InFlightGrace.D() / 2,
		Launch:     launchAttempts * c.RQD.RequestTimeout.D(),
		Compensate: CompensateBudget,
	}
	if c.RQD.DryRun {
		b.Launch = 0
	}
	b.PostCommit = b.Launch + b.Compensate
	b.ProcLifetime = b.Book + CommitResolveBudget + b.PostCommit
	b.Drain = CommitResolveBudget + b.PostCommit + drainMargin
	return b
}

// checkDispatchBudget rejects timeouts whose sum a booking cannot honour:
// a proc left RUNNING longer than Cuebot's orphaned-proc interval is
// cleared by Cuebot while its launch may still be in flight.
func (c Config) checkDispatchBudget() error {
	b := c.DispatchBudget()
	if b.ProcLifetime < CuebotOrphanedProcInterval {
		return nil
	}
	key, what := "rqd.request_timeout", fmt.Sprintf("%s (a launch may take %d x %s)", c.RQD.RequestTimeout.D(), launchAttempts, c.RQD.RequestTimeout.D())
	if b.Book > b.Launch {
		key, what = "accounting.in_flight_grace", fmt.Sprintf("%s (a booking may take half of it)", c.Accounting.InFlightGrace.D())
	}
	return &Error{Key: key, Msg: fmt.Sprintf("%s cannot be honoured: booking %s + commit %s + launch %s + compensation %s = %s "+
		"may pass before a committed proc is launched or undone, and Cuebot's orphaned-proc check clears procs after %s; "+
		"lower rqd.request_timeout or accounting.in_flight_grace until the sum is below it",
		what, b.Book, CommitResolveBudget, b.Launch, b.Compensate, b.ProcLifetime, CuebotOrphanedProcInterval)}
}
