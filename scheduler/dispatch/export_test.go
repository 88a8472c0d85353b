package dispatch

import "time"

// SetAfterCommit installs a function run between the booking commit and
// the launches (a scheduler stalled there), given the anchored launch deadline.
func SetAfterCommit(d *Dispatcher, f func(launchBy time.Time)) { d.afterCommit = f }

// SetCommitted sets the count of frames the dispatcher's transactions
// started (HostTakeSQL's generation follows it).
func SetCommitted(d *Dispatcher, n int64) { d.committed.Store(n) }
