package matcher_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

type flag struct{ moved atomic.Bool }

func (f *flag) Moved() bool { return f.moved.Load() }

// watchingHosts is the DB stand-in whose misses carry a watch, like the
// host cache's.
type watchingHosts struct {
	*farmseed.DBHosts
	w *flag
}

func (h watchingHosts) Checkout(ctx context.Context, req matcher.HostRequest) (sizing.Host, error) {
	host, err := h.DBHosts.Checkout(ctx, req)
	if errors.Is(err, matcher.ErrNoCandidate) {
		return host, &matcher.NoCandidateError{Watch: h.w}
	}
	return host, err
}

// The watch a miss carries reaches the backoff: the layer stays held (a
// minute) until the watch moves, then it is worked at the next pass.
func TestMissWatchReleasesTheBackoff(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(4, "linux")
	w := &flag{}
	h.m = matcher.New(h.pool, watchingHosts{h.hosts, w}, h.disp, matcher.Config{Attempts: 10, FramesPerLayer: 20, Policy: h.policy},
		matcher.Options{Backoff: h.backoff, Permits: h.permits})
	big := farmseed.LayerSpec{Tags: []string{"general"}, Frames: 2, Cores: 16, MemKB: farmseed.GB}
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{big}})
	var nc error = &matcher.NoCandidateError{}
	if !errors.Is(nc, matcher.ErrNoCandidate) {
		t.Fatal("NoCandidateError does not match ErrNoCandidate")
	}
	if out := h.process(j); out.Dispatched != 0 || out.Layers != 1 {
		t.Fatalf("outcome = %+v", out)
	}
	if out := h.process(j); out.Layers != 0 {
		t.Fatalf("backed-off layer worked again before its watch moved: %+v", out)
	}
	w.moved.Store(true)
	if out := h.process(j); out.Layers != 1 {
		t.Fatalf("layer not worked after its watch moved: %+v", out)
	}
	if h.backoff.Released() != 1 {
		t.Fatalf("Released = %d", h.backoff.Released())
	}
}
