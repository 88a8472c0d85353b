//go:build race

package sim

// raceEnabled: the test binary runs under the race detector, so the child
// scheduler is built with -race too (its packages are then in the build
// cache already, and the child is checked for data races as well).
const raceEnabled = true
