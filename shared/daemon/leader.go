package daemon

import (
	"context"
	"time"
)

// EveryWhileLeader calls step every interval while leader reports that this
// instance leads (every tick when leader is nil), each call with its own
// deadline of timeout, until ctx ends. It is how a leader-only
// housekeeping loop (one writer per facility) runs beside the scheduler;
// step logs its own errors: a failed tick is retried at the next one.
func EveryWhileLeader(ctx context.Context, interval, timeout time.Duration, leader func() bool, step func(ctx context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if leader != nil && !leader() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, timeout)
		step(sctx)
		cancel()
	}
}
