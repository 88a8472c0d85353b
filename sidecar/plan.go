package sidecar

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/replication"
)

// release is one proc DELETE to send, with what the stream says it charged.
type release struct {
	proc string
	show string // "" when the old row lacked it: decided from the record
	// unmanagedShow: the proc's show is not managed; released only if it
	// has a booking record (booked while the show was managed, released
	// after a flip back to Cuebot).
	unmanagedShow bool
	// keys resolved from the stream: sub, folder, job, layer, point ("" =
	// unresolved).
	keys        [5]string
	centi, gpus int64
}

// plan is what one source transaction asks of Redis.
type plan struct {
	managed   map[string]bool // new managed set; nil = unchanged
	flipped   bool
	releases  []release
	unmanaged int
	local     int
	truncate  bool
	subCaps   map[[2]string][2]int64
	foldCaps  map[string][4]int64
	foldShow  map[string]string
	jobCaps   map[string][3]int64
}

func (p *plan) isManaged(c *consumer, show string) bool {
	if p.managed != nil {
		return p.managed[show]
	}
	return c.state.shows[show]
}

func (p *plan) setManaged(c *consumer, show string, v bool) {
	if p.isManaged(c, show) == v {
		return
	}
	if p.managed == nil {
		p.managed = maps.Clone(c.state.shows)
		if p.managed == nil {
			p.managed = map[string]bool{}
		}
	}
	if v {
		p.managed[show] = true
	} else {
		delete(p.managed, show)
	}
	p.flipped = true
	c.m.flips.Inc()
}

// col reads a text column; ok is false when it is NULL, unchanged or absent.
func col(r replication.Row, name string) (string, bool) {
	d, found := r.Get(name)
	if !found || d.State != replication.Present {
		return "", false
	}
	switch v := d.Value.(type) {
	case string:
		return v, true
	default:
		return fmt.Sprint(v), true
	}
}

func colInt(r replication.Row, name string) (int64, bool) {
	v, err := r.Int64(name)
	return v, err == nil
}

// plan reads a transaction in statement order.
func (c *consumer) plan(ctx context.Context, txn *replication.Transaction) (*plan, error) {
	if c.tables == nil {
		// Snapshot or Resume resolves them before any transaction; this
		// only guards a consumer driven some other way.
		if err := c.resolveTables(ctx, replication.QueryText(c.pool)); err != nil {
			return nil, err
		}
	}
	p := &plan{}
	applyShows := txn.EndLSN > c.state.lsn
	for i := range txn.Changes {
		ch := &txn.Changes[i]
		var err error
		switch c.table(ch) {
		case "show":
			if applyShows {
				c.planShow(p, ch)
			}
		case "host":
			c.planHost(ch)
		case "job":
			c.planJob(ch)
		case "proc":
			err = c.planProc(ctx, p, ch)
		case "subscription":
			c.planSub(p, ch)
		case "folder_resource":
			err = c.planFolder(ctx, p, ch)
		case "job_resource":
			err = c.planJobCaps(ctx, p, ch)
		}
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (c *consumer) badRow(tbl string, ch *replication.Change, what string) {
	c.m.badRows.WithLabelValues(tbl).Inc()
	c.log.Warn("streamed row lacks a column the sidecar needs; skipped", "table", tbl, "op", ch.Op, "lsn", ch.LSN, "missing", what)
}

func (c *consumer) planShow(p *plan, ch *replication.Change) {
	switch ch.Op {
	case replication.Insert, replication.Update:
		id, ok1 := col(ch.New, "pk_show")
		v, err := ch.New.Bool("b_scheduler_managed")
		if !ok1 || err != nil {
			c.badRow("show", ch, "pk_show or b_scheduler_managed")
			return
		}
		p.setManaged(c, id, v)
	case replication.Delete:
		if id, ok := col(ch.Old, "pk_show"); ok {
			p.setManaged(c, id, false)
		}
	case replication.Truncate:
		cur := c.state.shows
		if p.managed != nil {
			cur = p.managed
		}
		for _, id := range slices.Collect(maps.Keys(cur)) {
			p.setManaged(c, id, false)
		}
	}
}

func (c *consumer) planProc(ctx context.Context, p *plan, ch *replication.Change) error {
	switch ch.Op {
	case replication.Truncate:
		p.truncate = true
		return nil
	case replication.Delete:
	default:
		return nil
	}
	old := ch.Old
	id, ok := col(old, "pk_proc")
	if !ok {
		c.badRow("proc", ch, "pk_proc")
		return nil
	}
	if local, err := old.Bool("b_local"); err == nil && local {
		p.local++
		return nil
	}
	r := release{proc: id}
	// What the deleted row held, compared with the booking record's charge
	// (mismatch check). Read for every release, also those of unmanaged
	// shows: a release after a flip back to Cuebot is applied from its
	// record, and leaving these at zero reported every such release as a
	// "cores" mismatch although it gave back exactly what was booked.
	r.centi, _ = colInt(old, "int_cores_reserved")
	r.gpus, _ = colInt(old, "int_gpus_reserved")
	show, hasShow := col(old, "pk_show")
	if hasShow {
		if !p.isManaged(c, show) {
			// Decided by its record (execute): a proc cuesched booked
			// before the show was flipped back to Cuebot still holds its
			// charge, and only this release gives it back. Its keys are
			// not resolved (unresolved keys are not compared): most
			// DELETEs of unmanaged shows are Cuebot's own procs, dropped
			// without a record, and must not cost cache-miss queries.
			r.show, r.unmanagedShow = show, true
			p.releases = append(p.releases, r)
			return nil
		}
		r.show = show
	}
	// Resolve the keys the release should name (for the mismatch check).
	if hasShow {
		if host, ok := col(old, "pk_host"); ok {
			alloc, found, err := c.hostAlloc(ctx, host)
			if err != nil {
				return err
			}
			if found {
				r.keys[0] = publisher.SubKey(show, alloc)
			}
		}
		if jobID, ok := col(old, "pk_job"); ok {
			r.keys[2] = publisher.JobKey(jobID)
			j, found, err := c.job(ctx, jobID)
			if err != nil {
				return err
			}
			if found {
				r.keys[1] = publisher.FolderKey(j.folder)
				r.keys[4] = publisher.PointKey(j.dept, show)
			}
		}
		if layer, ok := col(old, "pk_layer"); ok {
			r.keys[3] = publisher.LayerKey(layer)
		}
	}
	p.releases = append(p.releases, r)
	return nil
}
