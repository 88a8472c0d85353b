package sidecar

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/cuebot"
	"github.com/cuesched/cuesched/shared/replication"
)

// LSN is a WAL position.
type LSN = replication.LSN

// consumer is the replication.Consumer of the sidecar. The replication
// package never calls its methods concurrently; every field without an
// atomic type is owned by that one goroutine.
type consumer struct {
	log        hclog.Logger
	m          *sidecarMetrics
	pub        *publisher.Publisher
	rdb        redis.UniversalClient
	pool       *pgxpool.Pool
	ack        func(LSN)
	saveState  *redis.Script
	release    *redis.Script // lua.Release, called in the checkpoint-reading pipeline
	flushEvery time.Duration
	now        func() time.Time

	// tables are Cuebot's tables the sidecar reads, each with the schema
	// its name resolves to on the search_path (resolved at the start of
	// every session); ignored logs the other relations once each.
	tables  replication.Tables
	ignored replication.Ignored

	state        managedState // managed shows as of state.lsn (stream position)
	c            *caches
	cachesLoaded bool
	checkpoint   LSN // highest LSN the Redis checkpoint is known to hold
	pending      LSN // applied, not yet covered by the checkpoint
	pendingSince time.Time
	applied      LSN

	// For Status and health (read from other goroutines).
	redisFail    atomic.Pointer[redisFailure]
	checkpointA  atomic.Uint64
	appliedA     atomic.Uint64
	managedCount atomic.Int64
}

type redisFailure struct {
	since time.Time
	err   error
}

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

// cuebotTables are the tables whose rows the sidecar applies.
func cuebotTables() []string {
	return []string{"show", "host", "job", "proc", "subscription", "folder_resource", "job_resource"}
}

// resolveTables finds the schema of Cuebot's tables on the search_path of
// the connection q runs on (the schema the sidecar's own queries read).
func (c *consumer) resolveTables(ctx context.Context, q textQuery) error {
	t, err := replication.ResolveTables(ctx, q, cuebotTables()...)
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	c.tables = t
	return nil
}

// table names a change's relation when it is one of Cuebot's tables, and
// returns "" for any other relation, including a table of the same name in
// another schema that a publication also carries (its rows are not
// Cuebot's: applying them would release running procs, flip shows or
// write caps). Ignored relations are logged once each; their transactions
// are acknowledged like any other.
func (c *consumer) table(ch *replication.Change) string {
	if c.tables.Admit(ch, &c.ignored, c.log) {
		return ch.Relation.Table
	}
	return ""
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

// Snapshot seeds the state from the new slot's exported snapshot (the slot
// was just created): exact at the consistent point.
func (c *consumer) Snapshot(ctx context.Context, q replication.SnapshotQuerier) error {
	cp := q.ConsistentPoint()
	tq := replication.SnapshotText(q)
	if err := c.resolveTables(ctx, tq); err != nil {
		return err
	}
	shows, err := seedManaged(ctx, tq)
	if err != nil {
		return err
	}
	cs, err := seedCaches(ctx, tq)
	if err != nil {
		return err
	}
	var stored uint64
	var ok bool
	if err := c.redisCall(ctx, "read checkpoint", func(ctx context.Context) error {
		var err error
		stored, ok, err = c.pub.Checkpoint(ctx)
		return err
	}); err != nil {
		return err
	}
	reason := "new replication slot: WAL before its consistent point was never streamed to Redis"
	if !ok {
		reason = "new replication slot and no checkpoint in Redis"
	}
	if ok && LSN(stored) > cp {
		// A checkpoint from another slot or timeline would refuse every
		// release of this one.
		reason = "new replication slot behind the Redis checkpoint (another slot or database timeline)"
		if err := c.redisCall(ctx, "reset checkpoint", func(ctx context.Context) error {
			return c.rdb.Set(ctx, publisher.LSNKey, publisher.FormatLSN(uint64(cp)), 0).Err()
		}); err != nil {
			return err
		}
	}
	if err := c.requestRebootstrap(ctx, reason); err != nil {
		return err
	}
	if err := c.redisCall(ctx, "checkpoint at consistent point", func(ctx context.Context) error {
		_, err := c.pub.ReleaseBatch(ctx, uint64(cp), nil)
		return err
	}); err != nil {
		return err
	}
	c.state = managedState{lsn: cp, shows: shows}
	if err := c.persistState(ctx, true); err != nil {
		return err
	}
	c.c, c.cachesLoaded = cs, true
	c.setCheckpoint(cp)
	c.applied, c.pending = cp, 0
	c.appliedA.Store(uint64(cp))
	c.managedCount.Store(int64(len(shows)))
	c.m.managedShows.Set(float64(len(shows)))
	c.log.Info("replication slot created; state seeded from its snapshot", "consistent_point", cp, "managed_shows", len(shows))
	c.ack(cp)
	return nil
}

// Resume checks Redis against the slot before streaming resumes and loads
// the persisted managed set.
func (c *consumer) Resume(ctx context.Context, slot replication.SlotInfo) error {
	f := slot.ConfirmedFlushLSN
	if err := c.resolveTables(ctx, replication.QueryText(c.pool)); err != nil {
		return err
	}
	var walText string
	if err := c.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&walText); err != nil {
		return fmt.Errorf("sidecar: read current WAL position: %w", err)
	}
	walNow, err := pglogrepl.ParseLSN(walText)
	if err != nil {
		return fmt.Errorf("sidecar: current WAL position %q: %w", walText, err)
	}
	var stored uint64
	var ok bool
	if err := c.redisCall(ctx, "read checkpoint", func(ctx context.Context) error {
		var err error
		stored, ok, err = c.pub.Checkpoint(ctx)
		return err
	}); err != nil {
		return err
	}
	reset := false
	switch {
	case ok && LSN(stored) > walNow:
		reset = true
		if err := c.redisCall(ctx, "reset checkpoint", func(ctx context.Context) error {
			return c.rdb.Set(ctx, publisher.LSNKey, publisher.FormatLSN(uint64(f)), 0).Err()
		}); err != nil {
			return err
		}
		c.setCheckpoint(f)
		if err := c.requestRebootstrap(ctx, fmt.Sprintf("Redis checkpoint %s is ahead of the database's WAL %s (another database, or a restored one)", LSN(stored), walNow)); err != nil {
			return err
		}
	case !ok:
		c.setCheckpoint(0)
		if err := c.requestRebootstrap(ctx, "no checkpoint in Redis (new or emptied Redis)"); err != nil {
			return err
		}
	case LSN(stored) < f:
		c.setCheckpoint(LSN(stored))
		if err := c.requestRebootstrap(ctx, fmt.Sprintf("Redis checkpoint %s is behind the slot's confirmed_flush_lsn %s: Redis lost acknowledged releases", LSN(stored), f)); err != nil {
			return err
		}
	default:
		c.setCheckpoint(LSN(stored))
	}

	var st managedState
	var found bool
	if err := c.redisCall(ctx, "read managed shows", func(ctx context.Context) error {
		var err error
		st, found, err = loadState(ctx, c.rdb)
		return err
	}); err != nil {
		return err
	}
	force := reset || (found && st.lsn > walNow)
	if !found || force {
		shows, err := seedManaged(ctx, replication.QueryText(c.pool))
		if err != nil {
			return err
		}
		st = managedState{lsn: f, shows: shows}
		c.state = st
		if err := c.persistState(ctx, force); err != nil {
			return err
		}
		c.log.Warn("no persisted managed-show set matches this slot; seeded it by a query (flips committed since the slot's confirmed position are re-applied from the stream)",
			"confirmed_flush_lsn", f, "managed_shows", len(shows))
	} else {
		c.state = st
	}
	if !c.cachesLoaded || f > c.applied {
		cs, err := seedCaches(ctx, replication.QueryText(c.pool))
		if err != nil {
			return err
		}
		c.c, c.cachesLoaded = cs, true
	}
	c.applied, c.pending = f, 0
	c.appliedA.Store(uint64(f))
	c.managedCount.Store(int64(len(c.state.shows)))
	c.m.managedShows.Set(float64(len(c.state.shows)))
	c.log.Info("resuming the replication slot", "confirmed_flush_lsn", f, "redis_checkpoint", c.checkpoint,
		"managed_shows", len(c.state.shows), "managed_set_lsn", c.state.lsn)
	return nil
}

// Apply handles one committed source transaction.
func (c *consumer) Apply(ctx context.Context, txn *replication.Transaction) error {
	p, err := c.plan(ctx, txn)
	if err != nil {
		return err
	}
	if err := c.execute(ctx, txn, p); err != nil {
		return err
	}
	// Commit the transaction's effect on the in-memory state only now: a
	// retried transaction starts again from the same state.
	if p.managed != nil {
		c.state.shows = p.managed
		c.managedCount.Store(int64(len(p.managed)))
		c.m.managedShows.Set(float64(len(p.managed)))
	}
	if txn.EndLSN > c.state.lsn {
		c.state.lsn = txn.EndLSN
	}
	c.applied = txn.EndLSN
	c.appliedA.Store(uint64(txn.EndLSN))
	c.m.lagSeconds.Set(max(0, c.now().Sub(txn.CommitTime).Seconds()))
	if c.checkpoint >= txn.EndLSN {
		c.pending = 0
		c.ack(txn.EndLSN)
		return nil
	}
	if c.pending == 0 {
		c.pendingSince = c.now()
	}
	c.pending = txn.EndLSN
	if c.now().Sub(c.pendingSince) >= c.flushEvery {
		return c.flush(ctx, c.pending)
	}
	return nil
}

// Heartbeat makes an idle (or unmanaged-only) stream durable up to the
// server's position.
func (c *consumer) Heartbeat(ctx context.Context, hb replication.Heartbeat) error {
	c.m.lagSeconds.Set(0)
	target := max(hb.WALEnd, c.pending)
	if target == 0 {
		return nil
	}
	return c.flush(ctx, target)
}

// flush advances the Redis checkpoint to lsn (an empty release batch) and
// acknowledges it.
func (c *consumer) flush(ctx context.Context, lsn LSN) error {
	if lsn > c.checkpoint {
		if err := c.redisCall(ctx, "advance checkpoint", func(ctx context.Context) error {
			res, err := c.writeBatch(ctx, lsn, nil)
			if err == nil {
				c.setCheckpoint(max(lsn, res.stored))
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

func (c *consumer) planHost(ch *replication.Change) {
	switch ch.Op {
	case replication.Insert, replication.Update:
		id, ok1 := col(ch.New, "pk_host")
		alloc, ok2 := col(ch.New, "pk_alloc")
		if ok1 && ok2 {
			c.c.hostAlloc[id] = alloc
		}
	case replication.Delete:
		if id, ok := col(ch.Old, "pk_host"); ok {
			delete(c.c.hostAlloc, id)
		}
	}
}

// planJob keeps the job cache and prunes the job-cap cache: a job that
// finished or was deleted has no caps to compare any more (its
// job_resource row goes with it), so its entry would only grow the map
// for the life of the sidecar.
func (c *consumer) planJob(ch *replication.Change) {
	switch ch.Op {
	case replication.Insert, replication.Update:
		id, ok1 := col(ch.New, "pk_job")
		show, ok2 := col(ch.New, "pk_show")
		folder, ok3 := col(ch.New, "pk_folder")
		dept, ok4 := col(ch.New, "pk_dept")
		if ok1 && ok2 && ok3 && ok4 {
			c.c.jobs[id] = jobInfo{show: show, folder: folder, dept: dept}
		}
		if state, ok := col(ch.New, "str_state"); ok1 && ok && state == string(cuebot.JobFinished) {
			delete(c.c.jobCaps, id)
		}
	case replication.Delete:
		if id, ok := col(ch.Old, "pk_job"); ok {
			delete(c.c.jobs, id)
			delete(c.c.jobCaps, id)
		}
	case replication.Truncate:
		clear(c.c.jobCaps)
	}
}

// job returns a job's show, folder and dept (cache, else a query).
func (c *consumer) job(ctx context.Context, id string) (jobInfo, bool, error) {
	if j, ok := c.c.jobs[id]; ok {
		return j, true, nil
	}
	var j jobInfo
	err := c.pool.QueryRow(ctx, `SELECT pk_show, pk_folder, pk_dept FROM job WHERE pk_job = $1`, id).Scan(&j.show, &j.folder, &j.dept)
	if errors.Is(err, pgx.ErrNoRows) {
		return j, false, nil
	}
	if err != nil {
		return j, false, fmt.Errorf("sidecar: look up job %s: %w", id, err)
	}
	c.c.jobs[id] = j
	return j, true, nil
}

func (c *consumer) hostAlloc(ctx context.Context, id string) (string, bool, error) {
	if a, ok := c.c.hostAlloc[id]; ok {
		return a, true, nil
	}
	var a string
	err := c.pool.QueryRow(ctx, `SELECT pk_alloc FROM host WHERE pk_host = $1`, id).Scan(&a)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("sidecar: look up host %s: %w", id, err)
	}
	c.c.hostAlloc[id] = a
	return a, true, nil
}

func (c *consumer) folderShow(ctx context.Context, id string) (string, bool, error) {
	if s, ok := c.c.folderShow[id]; ok {
		return s, true, nil
	}
	var s string
	err := c.pool.QueryRow(ctx, `SELECT pk_show FROM folder WHERE pk_folder = $1`, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("sidecar: look up folder %s: %w", id, err)
	}
	c.c.folderShow[id] = s
	return s, true, nil
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
	show, hasShow := col(old, "pk_show")
	if hasShow {
		if !p.isManaged(c, show) {
			// Decided by its record (execute): a proc cuesched booked
			// before the show was flipped back to Cuebot still holds its
			// charge, and only this release gives it back.
			p.releases = append(p.releases, release{proc: id, show: show, unmanagedShow: true})
			return nil
		}
		r.show = show
	}
	// Resolve the keys the release should name (for the mismatch check).
	r.centi, _ = colInt(old, "int_cores_reserved")
	r.gpus, _ = colInt(old, "int_gpus_reserved")
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

func (c *consumer) planSub(p *plan, ch *replication.Change) {
	if ch.Op != replication.Insert && ch.Op != replication.Update {
		return
	}
	show, ok1 := col(ch.New, "pk_show")
	alloc, ok2 := col(ch.New, "pk_alloc")
	size, ok3 := colInt(ch.New, "int_size")
	burst, ok4 := colInt(ch.New, "int_burst")
	if !ok1 || !ok2 || !ok3 || !ok4 {
		c.badRow("subscription", ch, "pk_show, pk_alloc, int_size or int_burst")
		return
	}
	if !p.isManaged(c, show) {
		return
	}
	k, v := [2]string{show, alloc}, [2]int64{size, burst}
	if prev, seen := c.c.subCaps[k]; seen && prev == v {
		delete(p.subCaps, k) // a later row in this transaction put it back
		return
	}
	if p.subCaps == nil {
		p.subCaps = map[[2]string][2]int64{}
	}
	p.subCaps[k] = v
}

func (c *consumer) planFolder(ctx context.Context, p *plan, ch *replication.Change) error {
	if ch.Op != replication.Insert && ch.Op != replication.Update {
		return nil
	}
	folder, ok := col(ch.New, "pk_folder")
	var v [4]int64
	var oks [4]bool
	v[0], oks[0] = colInt(ch.New, "int_min_cores")
	v[1], oks[1] = colInt(ch.New, "int_max_cores")
	v[2], oks[2] = colInt(ch.New, "int_min_gpus")
	v[3], oks[3] = colInt(ch.New, "int_max_gpus")
	if !ok || !oks[0] || !oks[1] || !oks[2] || !oks[3] {
		c.badRow("folder_resource", ch, "pk_folder or a cap column")
		return nil
	}
	show, found, err := c.folderShow(ctx, folder)
	if err != nil || !found || !p.isManaged(c, show) {
		return err
	}
	if prev, seen := c.c.folderCaps[folder]; seen && prev == v {
		delete(p.foldCaps, folder)
		return nil
	}
	if p.foldCaps == nil {
		p.foldCaps, p.foldShow = map[string][4]int64{}, map[string]string{}
	}
	p.foldCaps[folder], p.foldShow[folder] = v, show
	return nil
}

func (c *consumer) planJobCaps(ctx context.Context, p *plan, ch *replication.Change) error {
	if ch.Op != replication.Insert && ch.Op != replication.Update {
		return nil
	}
	jobID, ok := col(ch.New, "pk_job")
	var v [3]int64
	var oks [3]bool
	v[0], oks[0] = colInt(ch.New, "int_max_cores")
	v[1], oks[1] = colInt(ch.New, "int_max_gpus")
	v[2], oks[2] = colInt(ch.New, "int_priority")
	if !ok || !oks[0] || !oks[1] || !oks[2] {
		c.badRow("job_resource", ch, "pk_job or a cap column")
		return nil
	}
	j, found, err := c.job(ctx, jobID)
	if err != nil || !found || !p.isManaged(c, j.show) {
		return err
	}
	if prev, seen := c.c.jobCaps[jobID]; seen && prev == v {
		delete(p.jobCaps, jobID)
		return nil
	}
	if p.jobCaps == nil {
		p.jobCaps = map[string][3]int64{}
	}
	p.jobCaps[jobID] = v
	return nil
}

// recordFields are read from acct:proc:{id} before a batch.
var recordFields = []string{"show", "sub", "folder", "job", "layer", "point", "centi", "gpus"}

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
	if p.unmanaged > 0 {
		c.m.releases.WithLabelValues("unmanaged").Add(float64(p.unmanaged))
	}
	if p.local > 0 {
		c.m.releases.WithLabelValues("local").Add(float64(p.local))
	}

	if needBatch {
		var res batchResult
		if err := c.redisCall(ctx, "release batch", func(ctx context.Context) error {
			var err error
			res, err = c.writeBatch(ctx, txn.EndLSN, rels)
			return err
		}); err != nil {
			return err
		}
		if res.applied {
			c.setCheckpoint(max(c.checkpoint, txn.EndLSN))
			c.m.releases.WithLabelValues("applied").Add(float64(res.released))
			c.m.releases.WithLabelValues("already_released").Add(float64(res.already))
			c.m.releases.WithLabelValues("unknown_proc").Add(float64(res.unknown))
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
			c.setCheckpoint(max(c.checkpoint, res.stored))
			c.m.releases.WithLabelValues("skipped_replay").Add(float64(len(rels)))
			c.m.transactions.WithLabelValues("replayed").Inc()
			c.log.Debug("transaction already applied (LSN at or below the checkpoint)", "end_lsn", txn.EndLSN, "checkpoint", res.stored)
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

// batchResult is what the release script reported for one batch.
type batchResult struct {
	applied                    bool
	stored                     LSN
	released, already, unknown int
}

// maxPipelinedBatch is the largest batch sent as one script call in the
// checkpoint-reading pipeline (the publisher's own chunk size); larger
// source transactions go through publisher.ReleaseBatch, which splits them.
const maxPipelinedBatch = 512

// writeBatch applies one source transaction's releases with the release
// script of package lua, in ONE pipelined round trip on one connection:
//
//	GET acct:sidecar:lsn; HMGET acct:proc:{id}...; EVALSHA release(lsn, ids)
//
// The GET tells whether Redis lost data since this sidecar's last write; as
// it runs on the same connection right before the script, a Redis restart
// hidden by the client's transparent retry (the whole pipeline is re-sent
// to the new server) is still seen. The records feed the mismatch count.
// The script's calling convention is the one documented in lua/release.lua
// (the same the publisher uses).
func (c *consumer) writeBatch(ctx context.Context, lsn LSN, rels []release) (batchResult, error) {
	ids := make([]string, len(rels))
	for i, r := range rels {
		ids[i] = r.proc
	}
	if len(ids) > maxPipelinedBatch {
		if err := c.noteCheckpoint(ctx, c.rdb.Get(ctx, publisher.LSNKey)); err != nil {
			return batchResult{}, err
		}
		res, err := c.pub.ReleaseBatch(ctx, uint64(lsn), relsOf(ids))
		if err != nil {
			return batchResult{}, err
		}
		return batchResult{applied: res.Applied, stored: LSN(res.StoredLSN), released: res.Released, already: res.AlreadyReleased, unknown: res.NeverBooked}, nil
	}
	args := make([]any, 0, 3+len(ids))
	args = append(args, "release", publisher.FormatLSN(uint64(lsn)), c.pub.TombstoneTTL().Milliseconds())
	for _, id := range ids {
		args = append(args, id)
	}
	for attempt := 0; ; attempt++ {
		pipe := c.rdb.Pipeline()
		cp := pipe.Get(ctx, publisher.LSNKey)
		recs := make([]*redis.SliceCmd, len(rels))
		for i, r := range rels {
			recs[i] = pipe.HMGet(ctx, publisher.ProcKey(r.proc), recordFields...)
		}
		ev := c.release.EvalSha(ctx, pipe, []string{publisher.SeqKey, publisher.LSNKey}, args...)
		_, _ = pipe.Exec(ctx) // errors are per command, checked below
		if err := cp.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return batchResult{}, err
		}
		if err := c.noteCheckpoint(ctx, cp); err != nil {
			return batchResult{}, err
		}
		if err := ev.Err(); err != nil {
			if attempt == 0 && isNoScript(err) {
				// A restarted or failed-over Redis has an empty script
				// cache; the GET and HMGETs changed nothing.
				if err := c.release.Load(ctx, c.rdb).Err(); err != nil {
					return batchResult{}, err
				}
				continue
			}
			return batchResult{}, err
		}
		for i, cmd := range recs {
			if v := cmd.Val(); len(v) == len(recordFields) && v[0] != nil {
				c.compare(rels[i], v)
			}
		}
		return parseRelease(ev)
	}
}

func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// parseRelease reads release.lua's reply: {1, released, already, unknown}
// or {0, stored_lsn}.
func parseRelease(ev *redis.Cmd) (batchResult, error) {
	v, err := ev.Slice()
	if err != nil {
		return batchResult{}, err
	}
	num := func(i int) (int64, bool) {
		if i >= len(v) {
			return 0, false
		}
		n, ok := v[i].(int64)
		return n, ok
	}
	code, ok := num(0)
	if !ok {
		return batchResult{}, fmt.Errorf("release script: unexpected reply %v", v)
	}
	if code == 0 {
		s, _ := v[1].(string)
		stored, err := publisher.ParseLSN(s)
		if err != nil {
			return batchResult{}, fmt.Errorf("release script: stored LSN %q: %w", s, err)
		}
		return batchResult{applied: false, stored: LSN(stored)}, nil
	}
	r, ok1 := num(1)
	d, ok2 := num(2)
	u, ok3 := num(3)
	if !ok1 || !ok2 || !ok3 {
		return batchResult{}, fmt.Errorf("release script: unexpected reply %v", v)
	}
	return batchResult{applied: true, released: int(r), already: int(d), unknown: int(u)}, nil
}

func relsOf(ids []string) []publisher.Release {
	if len(ids) == 0 {
		return nil
	}
	out := make([]publisher.Release, len(ids))
	for i, id := range ids {
		out[i] = publisher.Release{ProcID: id}
	}
	return out
}

// compare counts differences between the stream's resolution and the
// authoritative record.
func (c *consumer) compare(r release, rec []any) {
	names := [5]string{"sub", "folder", "job", "layer", "point"}
	for i, want := range r.keys {
		got, _ := rec[1+i].(string)
		if want != "" && got != want {
			c.m.mismatches.WithLabelValues(names[i]).Inc()
			c.log.Debug("release record names another key than the stream resolved", "proc", r.proc, "key", names[i], "record", got, "stream", want)
		}
	}
	if s, _ := rec[6].(string); s != "" && s != fmt.Sprint(r.centi) {
		c.m.mismatches.WithLabelValues("cores").Inc()
		c.log.Debug("release record charged other centicores than the deleted row held", "proc", r.proc, "record", s, "stream", r.centi)
	}
	if s, _ := rec[7].(string); s != "" && s != fmt.Sprint(r.gpus) {
		c.m.mismatches.WithLabelValues("gpus").Inc()
	}
}

func (c *consumer) writeCaps(ctx context.Context, txn *replication.Transaction, p *plan) error {
	// Stamped with the transaction's position: a limit reseed from an older
	// snapshot cannot put the old caps back (publisher.Limits.LSN).
	l := publisher.Limits{LSN: uint64(txn.EndLSN)}
	for k, v := range p.subCaps {
		l.Subs = append(l.Subs, publisher.SubLimits{ShowID: k[0], AllocID: k[1], Size: v[0], Burst: v[1]})
	}
	for f, v := range p.foldCaps {
		l.Folders = append(l.Folders, publisher.FolderLimits{FolderID: f, ShowID: p.foldShow[f], MinCores: v[0], MaxCores: v[1], MinGPUs: v[2], MaxGPUs: v[3]})
	}
	for j, v := range p.jobCaps {
		l.Jobs = append(l.Jobs, publisher.JobLimits{JobID: j, MaxCores: v[0], MaxGPUs: v[1], Priority: v[2]})
	}
	if l.Len() == 0 {
		return nil
	}
	if err := c.redisCall(ctx, "write caps", func(ctx context.Context) error {
		skipped, err := c.pub.WriteLimits(ctx, l, 0)
		if skipped > 0 {
			c.log.Debug("caps already written from a later position left alone", "end_lsn", txn.EndLSN, "hashes", skipped)
		}
		return err
	}); err != nil {
		return err
	}
	for k, v := range p.subCaps {
		c.c.subCaps[k] = v
	}
	for f, v := range p.foldCaps {
		c.c.folderCaps[f] = v
	}
	for j, v := range p.jobCaps {
		c.c.jobCaps[j] = v
	}
	c.m.capWrites.WithLabelValues("subscription").Add(float64(len(l.Subs)))
	c.m.capWrites.WithLabelValues("folder").Add(float64(len(l.Folders)))
	c.m.capWrites.WithLabelValues("job").Add(float64(len(l.Jobs)))
	c.log.Debug("cap changes written", "subscriptions", len(l.Subs), "folders", len(l.Folders), "jobs", len(l.Jobs))
	return nil
}

// persistState saves the in-memory managed set (force: overwrite whatever
// is stored, for a new slot or a reset).
func (c *consumer) persistState(ctx context.Context, force bool) error {
	st := c.state
	return c.redisCall(ctx, "save managed shows", func(ctx context.Context) error {
		return c.saveStateValue(ctx, st, force)
	})
}

func (c *consumer) saveStateValue(ctx context.Context, st managedState, force bool) error {
	mode := ""
	if force {
		mode = "force"
	}
	return c.saveState.Run(ctx, c.rdb, []string{StateKey}, st.encode(), mode).Err()
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
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// checkLoss reads the Redis checkpoint after a failed call (see
// noteCheckpoint).
func (c *consumer) checkLoss(ctx context.Context) error {
	return c.noteCheckpoint(ctx, c.rdb.Get(ctx, publisher.LSNKey))
}

// noteCheckpoint compares the Redis checkpoint, read just before a write,
// with what this sidecar knows it holds. Missing or lower: Redis lost data
// (restart without persistence, failover to a lagging replica, flush), so
// the sidecar requests a re-bootstrap and puts the managed-show set back
// before it writes anything else.
func (c *consumer) noteCheckpoint(ctx context.Context, cmd *redis.StringCmd) error {
	v, err := cmd.Result()
	ok := true
	if errors.Is(err, redis.Nil) {
		ok, err = false, nil
	}
	if err != nil {
		return err
	}
	var stored uint64
	if ok {
		if stored, err = publisher.ParseLSN(v); err != nil {
			return fmt.Errorf("%s holds %q: %w", publisher.LSNKey, v, err)
		}
	}
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

// transientRedisError: transport errors and server replies that mean "try
// again" are retried; other server errors (a script refusing its input)
// are not.
func transientRedisError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, redis.ErrClosed) {
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
