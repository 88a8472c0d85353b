package scheduler_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler"
	"github.com/cuesched/cuesched/shared/testkit/promlint"
)

// TestMetricsPassPromtool: the registry a scheduler builds (with the
// replication-fed host cache and the accounting service, as deployed) is
// clean under `promtool check metrics` (issue #26).
func TestMetricsPassPromtool(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	reg := prometheus.NewRegistry()
	w.scheduler(t, testConfig(w), scheduler.Deps{Registerer: reg}, true)
	promlint.Check(t, reg)
}
