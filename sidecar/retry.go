package sidecar

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/pause"
)

type redisFailure struct {
	since time.Time
	err   error
}

// redisCall runs fn until it succeeds, retrying transport errors and
// transient server errors with exponential backoff (nothing is acknowledged
// meanwhile). Before retrying after a failure it checks whether Redis lost
// data (the checkpoint went missing or backwards). Other errors are
// returned: the session ends and the transaction is delivered again.
func (c *consumer) redisCall(ctx context.Context, what string, fn func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	failed := false
	for attempt := 1; ; attempt++ {
		var err error
		if failed {
			err = c.checkLoss(ctx)
		}
		if err == nil {
			if err = fn(ctx); err == nil {
				if failed {
					c.redisFail.Store(nil)
					c.log.Info("redis is reachable again", "operation", what, "attempts", attempt)
				}
				return nil
			}
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if !transientRedisError(err) {
			return fmt.Errorf("sidecar: %s: %w", what, err)
		}
		if !failed || attempt%20 == 0 {
			c.log.Warn("redis call failed; retrying (nothing is acknowledged meanwhile)", "operation", what, "attempt", attempt, "error", err)
		}
		if !failed {
			c.redisFail.Store(&redisFailure{since: c.now(), err: err})
		} else if f := c.redisFail.Load(); f != nil {
			c.redisFail.Store(&redisFailure{since: f.since, err: err})
		}
		failed = true
		c.m.redisErrors.Inc()
		if err := pause.For(ctx, backoff); err != nil {
			return err
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// transientRedisError: transport errors and server replies that mean "try
// again" are retried; other server errors (a script refusing its input)
// are not.
func transientRedisError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, redis.ErrClosed) || errors.Is(err, publisher.ErrIdentityMismatch) {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "READONLY", "NOREPLICAS", "CLUSTERDOWN", "NOSCRIPT"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true
}
