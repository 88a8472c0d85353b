package sidecar

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/replication"
)

// execute applies a plan to Redis: the release batch (with the checkpoint
// and, in the same round trip, the loss check and the records for the
// mismatch count), the managed-set save, cap writes, re-bootstrap request.
func (c *consumer) execute(ctx context.Context, txn *replication.Transaction, p *plan) error {
	needBatch := len(p.releases) > 0 || p.flipped || p.truncate
	rels := p.releases
	if needBatch {
		// A DELETE without pk_show (REPLICA IDENTITY not FULL) is decided
		// from its record's show, and one of an unmanaged show from whether
		// it has a record: read those records first.
		var undecided []int
		for i, r := range rels {
			if r.show == "" || r.unmanagedShow {
				undecided = append(undecided, i)
			}
		}
		if len(undecided) > 0 {
			var err error
			if rels, err = c.decideFromRecords(ctx, p, rels, undecided); err != nil {
				return err
			}
		}
	}
	if len(rels) > 0 || len(p.subCaps)+len(p.foldCaps)+len(p.jobCaps) > 0 {
		// Nothing frees room in Redis before every snapshot shows it
		// freed (see the package doc). Cuebot's own procs, dropped
		// above, do not wait.
		if err := c.vis.Await(ctx, txn.XID); err != nil {
			return err
		}
	}
	if p.unmanaged > 0 {
		c.m.releases.WithLabelValues("unmanaged").Add(float64(p.unmanaged))
	}
	if p.local > 0 {
		c.m.releases.WithLabelValues("local").Add(float64(p.local))
	}

	if needBatch {
		var res publisher.ReleaseResult
		if err := c.redisCall(ctx, "release batch", func(ctx context.Context) error {
			var err error
			res, err = c.writeBatch(ctx, txn.EndLSN, rels)
			return err
		}); err != nil {
			return err
		}
		if res.Applied {
			c.setCheckpoint(max(c.checkpoint, txn.EndLSN))
			c.m.releases.WithLabelValues("applied").Add(float64(res.Released))
			c.m.releases.WithLabelValues("already_released").Add(float64(res.AlreadyReleased))
			c.m.releases.WithLabelValues("unknown_proc").Add(float64(res.NeverBooked))
			if len(rels) > 0 {
				c.m.transactions.WithLabelValues("released").Inc()
				lat := max(0, c.now().Sub(txn.CommitTime).Seconds())
				c.m.commitToRedis.Observe(lat)
				c.m.commitQuantile.Observe(lat)
			} else {
				c.m.transactions.WithLabelValues("nothing").Inc()
			}
		} else {
			// Refused: the checkpoint is at or past this transaction (a
			// replay after a restart, or another sidecar got there first).
			c.setCheckpoint(max(c.checkpoint, LSN(res.StoredLSN)))
			c.m.releases.WithLabelValues("skipped_replay").Add(float64(len(rels)))
			c.m.transactions.WithLabelValues("replayed").Inc()
			c.log.Debug("transaction already applied (LSN at or below the checkpoint)", "end_lsn", txn.EndLSN, "checkpoint", LSN(res.StoredLSN))
		}
	} else {
		c.m.transactions.WithLabelValues("nothing").Inc()
	}

	if p.flipped {
		next := managedState{lsn: txn.EndLSN, shows: p.managed}
		if err := c.redisCall(ctx, "save managed shows", func(ctx context.Context) error {
			return c.saveStateValue(ctx, next, false)
		}); err != nil {
			return err
		}
	}
	if err := c.writeCaps(ctx, txn, p); err != nil {
		return err
	}
	if p.truncate {
		c.m.truncates.Inc()
		if err := c.requestRebootstrap(ctx, "TRUNCATE of proc: releases are not streamed row by row"); err != nil {
			return err
		}
	}
	return nil
}

// decideFromRecords keeps the releases whose show was unknown only if their
// record names a managed show (no record: nothing to undo, and it cannot be
// told whether the show is managed, so Redis is not touched), and those of
// unmanaged shows only if they have a record at all.
func (c *consumer) decideFromRecords(ctx context.Context, p *plan, rels []release, undecided []int) ([]release, error) {
	shows := make([]string, len(undecided))
	if err := c.redisCall(ctx, "read per-proc records", func(ctx context.Context) error {
		pipe := c.rdb.Pipeline()
		cmds := make([]*redis.StringCmd, len(undecided))
		for i, j := range undecided {
			cmds[i] = pipe.HGet(ctx, publisher.ProcKey(rels[j].proc), "show")
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for i, cmd := range cmds {
			shows[i] = cmd.Val()
		}
		return nil
	}); err != nil {
		return nil, err
	}
	drop := map[int]bool{}
	unknown := 0
	for i, j := range undecided {
		switch {
		case rels[j].unmanagedShow && shows[i] == "":
			// Cuebot's own proc: nothing of it is in Redis.
			p.unmanaged++
			drop[j] = true
		case rels[j].unmanagedShow:
			// Booked by cuesched before a flip back to Cuebot: release it.
			c.m.releases.WithLabelValues("after_flip").Inc()
		case shows[i] == "":
			unknown++
			drop[j] = true
		case !p.isManaged(c, shows[i]):
			p.unmanaged++
			drop[j] = true
		}
	}
	if unknown > 0 {
		c.m.releases.WithLabelValues("unknown_proc").Add(float64(unknown))
	}
	out := rels[:0:0]
	for i, r := range rels {
		if !drop[i] {
			out = append(out, r)
		}
	}
	return out, nil
}

// writeBatch applies one source transaction's releases exactly once with
// publisher.ReleaseBatchObserved: the checkpoint read in the same round trip
// (on the same connection, right before the script) tells whether Redis
// lost data since this sidecar's last write, and the records read with it
// feed the mismatch count.
func (c *consumer) writeBatch(ctx context.Context, lsn LSN, rels []release) (publisher.ReleaseResult, error) {
	batch := make([]publisher.Release, len(rels))
	for i, r := range rels {
		batch[i] = publisher.Release{ProcID: r.proc}
	}
	res, err := c.pub.ReleaseBatchObserved(ctx, uint64(lsn), batch, func(stored uint64, ok bool) error {
		return c.noteCheckpoint(ctx, stored, ok)
	})
	if err != nil {
		return publisher.ReleaseResult{}, err
	}
	for i, rec := range res.Records {
		if rec != nil {
			c.compare(rels[i], rec)
		}
	}
	return res.ReleaseResult, nil
}

// compare counts differences between the stream's resolution and the
// authoritative record.
func (c *consumer) compare(r release, rec *publisher.ProcRecord) {
	names := [5]string{"sub", "folder", "job", "layer", "point"}
	for i, want := range r.keys {
		got := rec.Keys[i]
		if want != "" && got != want {
			c.m.mismatches.WithLabelValues(names[i]).Inc()
			c.log.Debug("release record names another key than the stream resolved", "proc", r.proc, "key", names[i], "record", got, "stream", want)
		}
	}
	if s := rec.Centi; s != "" && s != fmt.Sprint(r.centi) {
		c.m.mismatches.WithLabelValues("cores").Inc()
		c.log.Debug("release record charged other centicores than the deleted row held", "proc", r.proc, "record", s, "stream", r.centi)
	}
	if s := rec.GPUs; s != "" && s != fmt.Sprint(r.gpus) {
		c.m.mismatches.WithLabelValues("gpus").Inc()
	}
}
