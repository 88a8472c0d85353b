//go:build race

package faults

// raceEnabled: the test binary runs under the race detector, so the child
// binary is built with -race too (its packages are then already in the
// build cache, and the children are checked for data races as well).
const raceEnabled = true
