package publisher

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// WatchReleases calls fn with the show id of every notice release.lua
// publishes on ReleasedChannel (a show had procs released), until ctx ends.
// Notices are hints: while Redis is unreachable none arrive and none are
// replayed (the subscription reconnects by itself), so a caller never
// relies on them for state. fn runs on one goroutine and should not block.
// It returns an error when Redis refuses the subscription (an ACL user
// without the channel).
func (p *Publisher) WatchReleases(ctx context.Context, fn func(show string)) error {
	sub := p.rdb.Subscribe(ctx, ReleasedChannel)
	defer sub.Close()
	// The confirmation, or the refusal: a Redis 7 ACL user starts without
	// channels (resetchannels) and needs &acct:released.
	if _, err := sub.Receive(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("subscribe to %s: %w", ReleasedChannel, err)
	}
	// A notice is dropped rather than held behind a slow fn (go-redis
	// waits this long for room in its channel, then drops the message).
	ch := sub.Channel(redis.WithChannelSize(1024), redis.WithChannelSendTimeout(100*time.Millisecond))
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			fn(m.Payload)
		}
	}
}
