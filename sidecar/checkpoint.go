package sidecar

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cuesched/cuesched/publisher"
)

// flush advances the Redis checkpoint to lsn (an empty release batch) and
// acknowledges it.
// positions are the stream positions the sidecar tracks: what Redis'
// checkpoint is known to hold and what was applied. The plain fields are
// owned by the Apply goroutine; the atomic copies are for Status and health.
type positions struct {
	checkpoint   LSN // highest LSN the Redis checkpoint is known to hold
	pending      LSN // applied, not yet covered by the checkpoint
	pendingSince time.Time
	applied      LSN

	checkpointA atomic.Uint64
	appliedA    atomic.Uint64
}

func (c *consumer) flush(ctx context.Context, lsn LSN) error {
	if lsn > c.checkpoint {
		if err := c.redisCall(ctx, "advance checkpoint", func(ctx context.Context) error {
			res, err := c.writeBatch(ctx, lsn, nil)
			if err == nil {
				c.setCheckpoint(max(lsn, LSN(res.StoredLSN)))
			}
			return err
		}); err != nil {
			return err
		}
		c.m.checkpointFlush.Inc()
	}
	c.pending = 0
	c.ack(lsn)
	return nil
}

func (c *consumer) setCheckpoint(lsn LSN) {
	c.checkpoint = lsn
	c.checkpointA.Store(uint64(lsn))
	c.m.checkpointLSN.Set(float64(lsn))
}

// requestRebootstrap deletes acct:epoch, which tells the scheduler's
// accounting to rebuild Redis from Postgres.
func (c *consumer) requestRebootstrap(ctx context.Context, reason string) error {
	if err := c.redisCall(ctx, "request re-bootstrap", func(ctx context.Context) error {
		return c.rdb.Del(ctx, publisher.EpochKey).Err()
	}); err != nil {
		return err
	}
	c.m.rebootstraps.WithLabelValues(reasonLabel(reason)).Inc()
	c.log.Warn("requested a re-bootstrap of the Redis accounting (deleted "+publisher.EpochKey+")", "reason", reason)
	return nil
}

func reasonLabel(reason string) string {
	switch {
	case strings.HasPrefix(reason, "new replication slot"):
		return "new_slot"
	case strings.HasPrefix(reason, "no checkpoint"):
		return "no_checkpoint"
	case strings.Contains(reason, "is behind"):
		return "checkpoint_behind"
	case strings.Contains(reason, "is ahead"):
		return "checkpoint_ahead"
	case strings.HasPrefix(reason, "TRUNCATE"):
		return "truncate"
	case strings.HasPrefix(reason, "Redis lost"):
		return "redis_lost_data"
	}
	return "other"
}

// checkLoss reads the Redis checkpoint after a failed call (see
// noteCheckpoint).
func (c *consumer) checkLoss(ctx context.Context) error {
	stored, ok, err := c.pub.Checkpoint(ctx)
	if err != nil {
		return err
	}
	return c.noteCheckpoint(ctx, stored, ok)
}

// noteCheckpoint compares the Redis checkpoint, read just before a write,
// with what this sidecar knows it holds. Missing or lower: Redis lost data
// (restart without persistence, failover to a lagging replica, flush), so
// the sidecar requests a re-bootstrap and puts the managed-show set back
// before it writes anything else.
func (c *consumer) noteCheckpoint(ctx context.Context, stored uint64, ok bool) error {
	if (ok && LSN(stored) >= c.checkpoint) || (!ok && c.checkpoint == 0) {
		return nil
	}
	reason := fmt.Sprintf("Redis lost data: checkpoint %s is below the %s this sidecar wrote", LSN(stored), c.checkpoint)
	if !ok {
		reason = fmt.Sprintf("Redis lost data: checkpoint missing (this sidecar wrote %s)", c.checkpoint)
	}
	if err := c.rdb.Del(ctx, publisher.EpochKey).Err(); err != nil {
		return err
	}
	c.m.rebootstraps.WithLabelValues("redis_lost_data").Inc()
	c.log.Warn("requested a re-bootstrap of the Redis accounting (deleted "+publisher.EpochKey+")", "reason", reason)
	c.setCheckpoint(LSN(stored))
	return c.saveStateValue(ctx, c.state, false)
}
