package dispatch

import "time"

// SetAfterCommit installs a function run between the booking commit and
// the launches (a scheduler stalled there), given the anchored launch deadline.
func SetAfterCommit(d *Dispatcher, f func(launchBy time.Time)) { d.afterCommit = f }
