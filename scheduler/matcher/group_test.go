package matcher_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// withHostsPerBatch rebuilds the harness's matcher with
// Config.HostsPerBatch set.
func (h *harness) withHostsPerBatch(attempts, n int) {
	h.m = matcher.New(h.pool, h.hosts, h.disp, matcher.Config{Attempts: attempts, FramesPerLayer: 20, Policy: h.policy, HostsPerBatch: n},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: h.backoff, Permits: h.permits})
}

// A layer too big for one host books on as many hosts as it needs, up to
// HostsPerBatch, in one transaction and one attempt.
func TestProcessBooksALayerOnSeveralHostsInOneTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		hostsPerBatch, attempts  int
		dispatched, transactions int64
	}{
		{hostsPerBatch: 3, attempts: 1, dispatched: 10, transactions: 1},
		{hostsPerBatch: 2, attempts: 10, dispatched: 10, transactions: 2},
		{hostsPerBatch: 2, attempts: 1, dispatched: 8, transactions: 1},
		{hostsPerBatch: 1, attempts: 10, dispatched: 10, transactions: 3},
	} {
		h := newHarness(t, tc.attempts)
		h.withHostsPerBatch(tc.attempts, tc.hostsPerBatch)
		h.host(4, "")
		h.host(4, "")
		h.host(4, "")
		j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(10)}})
		out := h.process(j)
		if int64(out.Dispatched) != tc.dispatched {
			t.Fatalf("%+v: outcome = %+v", tc, out)
		}
		var n int64
		if err := h.pool.QueryRow(context.Background(), `SELECT count(DISTINCT ts_started) FROM frame WHERE pk_job = $1 AND str_state = 'RUNNING'`, j.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != tc.transactions {
			t.Fatalf("%+v: frames started in %d transactions", tc, n)
		}
		if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM host WHERE int_cores_idle < 0`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d hosts over-booked (%v)", n, err)
		}
	}
}

// The job's budget counts the frames planned on the hosts before: a job
// capped at 6 cores starts 6 frames over two hosts, not 4 on each.
func TestProcessGroupKeepsTheJobBudget(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.withHostsPerBatch(10, 4)
	h.host(4, "")
	h.host(4, "")
	h.host(4, "")
	j := h.job(farmseed.JobSpec{MaxCores: 6, Layers: []farmseed.LayerSpec{layer(10)}})
	if out := h.process(j); out.Dispatched != 6 {
		t.Fatalf("outcome = %+v, want 6 frames", out)
	}
}
