package testenv

import (
	"os"
	"strconv"
	"time"
)

// MinPatience is the shortest deadline Patience gives a wait.
const MinPatience = 30 * time.Second

// Patience stretches the deadline of a test's wait for an event, so that a
// machine busy with other work turns a slow event into a longer wait, never
// into a failure: d times CUESCHED_TEST_PATIENCE (default 4), and at least
// MinPatience. A passing test does not wait longer; only a failing one
// takes longer to say so.
//
// Use it for "the event must happen" deadlines only. Observation windows
// ("nothing bad happens for a while") and lower bounds ("not before its
// sleep ended") keep their own durations.
func Patience(d time.Duration) time.Duration {
	d = time.Duration(float64(d) * PatienceFactor())
	return max(d, MinPatience)
}

// PatienceFactor is Patience's factor: CUESCHED_TEST_PATIENCE (default 4,
// at least 1), for code that stretches its own deadlines (the simulator's
// scenarios under `go test`).
func PatienceFactor() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("CUESCHED_TEST_PATIENCE"), 64); err == nil && v >= 1 {
		return v
	}
	return 4
}
