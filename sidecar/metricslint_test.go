package sidecar_test

import (
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/promlint"
)

// TestMetricsPassPromtool: the registry a running sidecar fills is clean
// under `promtool check metrics` (issue #26).
func TestMetricsPassPromtool(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	ip := h.start(true)
	ip.waitActive(t, 10*time.Second)
	promlint.Check(t, ip.reg)
}
