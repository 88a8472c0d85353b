package clusters

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/cuesched/cuesched/shared/replication"
)

// Change is what the WAL said about the cluster set, for Feed.Notify.
type Change struct {
	// Reload: the set may have changed (a show's flags, a subscription
	// added, removed or moved, an allocation, a facility, a host tag, a
	// host's allocation), or the stream started over from a new snapshot.
	Reload bool
	// Shows whose clusters get a pass at once (their sleeps end).
	Shows []string
	// CapShows are shows whose subscription caps (size, burst) changed;
	// Folders and Jobs are folders and jobs whose caps (max cores, max
	// GPUs) changed. Their shows' caps are copied to the accounting store
	// (FeedOptions.CapsChanged) before their clusters are woken.
	CapShows      []string
	Folders, Jobs []string
	// XIDs are the transactions that made the change. The feed acts on it
	// (reads the set, the caps, the awake scan) once PostgreSQL shows
	// them: the stream can deliver a commit before it is visible.
	XIDs []uint32
}

func (c Change) empty() bool {
	return !c.Reload && len(c.Shows)+len(c.CapShows)+len(c.Folders)+len(c.Jobs) == 0
}

// Follower turns the host cache's replication stream into Changes for a
// Feed (it implements hostcache.Tap). It keeps just enough of the rows to
// tell a change that matters from the many that do not: Cuebot updates
// subscription, host, folder_resource and job_resource rows at every
// booking, release or memory report, and only a show's flags, a
// subscription's show, allocation, size and burst, a host's allocation and
// the caps matter here. Every change of alloc, facility and host_tag
// matters (those rows are not updated in the course of dispatch).
//
// Rows it does not know are handled conservatively: an update of an
// unknown show, subscription or host is a change; an unknown folder or job
// cap row is only recorded (the snapshot reads the caps of every folder
// and of the PENDING jobs; a job that becomes PENDING again later and has
// its cap raised before any other update of its row is seen when its
// cluster's sleep ends).
//
// Its methods are called by the stream's goroutine, one at a time.
type Follower struct {
	feed Notifier
	log  hclog.Logger

	tables  replication.Tables
	ignored replication.Ignored
	shows   map[string]showFlags
	subs    map[string]subRow
	hosts   map[string]string // pk_host -> pk_alloc (interned)
	allocs  map[string]string // intern table of allocation ids
	folders map[string]caps   // pk_folder_resource
	jobs    map[string]caps   // pk_job_resource
}

type showFlags struct{ active, managed bool }

type subRow struct {
	show, alloc string
	size, burst int64
}

type caps struct{ cores, gpus int64 }

// followedTables are the tables a Follower reads.
var followedTables = []string{"show", "subscription", "alloc", "facility", "host_tag", "host", "folder_resource", "job_resource"}

// The rows the Follower keeps, read in the stream's snapshot.
var followSnapshot = []struct{ table, sql string }{
	{"show", `SELECT pk_show, b_active, b_scheduler_managed FROM show`},
	{"subscription", `SELECT pk_subscription, pk_show, pk_alloc, int_size, int_burst FROM subscription`},
	{"host", `SELECT pk_host, pk_alloc FROM host`},
	{"folder_resource", `SELECT pk_folder_resource, pk_folder, int_max_cores, int_max_gpus FROM folder_resource`},
	{"job_resource", `SELECT jr.pk_job_resource, jr.pk_job, jr.int_max_cores, jr.int_max_gpus
		FROM job_resource jr JOIN job j ON j.pk_job = jr.pk_job WHERE j.str_state = 'PENDING'`},
}

// Notifier receives a Follower's Changes (a Feed).
type Notifier interface {
	Notify(Change)
}

// NewFollower returns a Follower notifying feed.
func NewFollower(feed Notifier, logger hclog.Logger) *Follower {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Follower{feed: feed, log: logger.Named("clusters.wal")}
}

// TapSnapshot rebuilds the kept rows from the stream's snapshot and asks
// the feed for a reload: whatever changed while the stream was away was
// not seen.
func (w *Follower) TapSnapshot(ctx context.Context, q replication.SnapshotQuerier) error {
	tables, err := replication.ResolveTables(ctx, replication.SnapshotText(q), followedTables...)
	if err != nil {
		return fmt.Errorf("clusters: %w", err)
	}
	n := &Follower{feed: w.feed, log: w.log, tables: tables}
	n.reset()
	for _, sq := range followSnapshot {
		rel := replication.NewRelation(0, "", sq.table, nil)
		err := q.Query(ctx, sq.sql, func(r replication.Row) error {
			var ev Change
			return n.apply(&replication.Change{Op: replication.Insert, Relation: rel, New: r}, &ev)
		})
		if err != nil {
			return fmt.Errorf("clusters: snapshot of %s: %w", sq.table, err)
		}
	}
	w.tables, w.ignored = n.tables, replication.Ignored{}
	w.shows, w.subs, w.hosts, w.allocs, w.folders, w.jobs = n.shows, n.subs, n.hosts, n.allocs, n.folders, n.jobs
	w.log.Debug("following the cluster tables", "shows", len(w.shows), "subscriptions", len(w.subs),
		"hosts", len(w.hosts), "folders", len(w.folders), "pending_jobs", len(w.jobs))
	w.feed.Notify(Change{Reload: true})
	return nil
}

func (w *Follower) reset() {
	w.shows, w.subs, w.hosts = map[string]showFlags{}, map[string]subRow{}, map[string]string{}
	w.allocs, w.folders, w.jobs = map[string]string{}, map[string]caps{}, map[string]caps{}
}

// TapApply notifies the feed of what a transaction changed, if anything.
func (w *Follower) TapApply(txn *replication.Transaction) {
	if w.tables == nil {
		return // no snapshot yet
	}
	var ev Change
	for i := range txn.Changes {
		ch := &txn.Changes[i]
		if ch.Relation == nil {
			continue
		}
		if _, ours := w.tables[ch.Relation.Table]; !ours {
			continue // host_stat and the like: the bulk of the stream
		}
		if !w.tables.Admit(ch, &w.ignored, w.log) {
			continue
		}
		if err := w.apply(ch, &ev); err != nil {
			// A row it cannot read: assume the worst of it.
			w.log.Warn("unreadable change of a cluster table; reloading the cluster set", "table", ch.Relation.Table,
				"op", ch.Op, "lsn", ch.LSN, "error", err)
			ev.Reload = true
		}
	}
	if !ev.empty() {
		ev.XIDs = []uint32{txn.XID}
		w.feed.Notify(ev)
	}
}

// apply records one change and adds what it means to ev.
func (w *Follower) apply(ch *replication.Change, ev *Change) error {
	table := ch.Relation.Table
	if ch.Op == replication.Truncate {
		switch table {
		case "show":
			clear(w.shows)
		case "subscription":
			clear(w.subs)
		case "host":
			clear(w.hosts)
		case "folder_resource":
			clear(w.folders)
		case "job_resource":
			clear(w.jobs)
		}
		ev.Reload = true
		return nil
	}
	switch table {
	case "alloc", "facility", "host_tag":
		ev.Reload = true
		return nil
	}
	pk := keyColumn(table)
	if pk == "" {
		return nil
	}
	old, err := oldKeyOf(ch, pk)
	if err != nil {
		return err
	}
	if ch.Op == replication.Delete {
		w.forget(table, old, ev)
		return nil
	}
	id, err := text(ch.New, pk)
	if err != nil {
		return err
	}
	if old != id {
		w.forget(table, old, ev) // the key changed: the old row is gone
	}
	r := replication.Reader{Row: ch.New, Table: table}
	switch table {
	case "show":
		prev, known := w.shows[id]
		cur := prev
		r.Bool("b_active", &cur.active)
		r.Bool("b_scheduler_managed", &cur.managed)
		if r.Err != nil {
			return r.Err
		}
		w.shows[id] = cur
		if !known || cur != prev {
			ev.Reload = true
			ev.Shows = append(ev.Shows, id)
		}
	case "subscription":
		prev, known := w.subs[id]
		cur := prev
		r.Str("pk_show", &cur.show)
		r.Str("pk_alloc", &cur.alloc)
		r.Int64("int_size", &cur.size)
		r.Int64("int_burst", &cur.burst)
		if r.Err != nil {
			return r.Err
		}
		w.subs[id] = cur
		if known && cur == prev {
			return nil
		}
		if !known || cur.show != prev.show || cur.alloc != prev.alloc {
			ev.Reload = true
		}
		// Bursts also gate the awake scan (a burst of 0 hides the show).
		ev.Shows = append(ev.Shows, cur.show)
		ev.CapShows = append(ev.CapShows, cur.show)
		if known && prev.show != cur.show {
			ev.Shows = append(ev.Shows, prev.show)
			ev.CapShows = append(ev.CapShows, prev.show)
		}
	case "host":
		prev, known := w.hosts[id]
		cur := prev
		r.Str("pk_alloc", &cur)
		if r.Err != nil {
			return r.Err
		}
		cur = w.intern(cur)
		w.hosts[id] = cur
		if !known || cur != prev {
			ev.Reload = true
		}
	case "folder_resource", "job_resource":
		m, owner := w.folders, "pk_folder"
		if table == "job_resource" {
			m, owner = w.jobs, "pk_job"
		}
		prev, known := m[id]
		cur := prev
		r.Int64("int_max_cores", &cur.cores)
		r.Int64("int_max_gpus", &cur.gpus)
		var ownerID string
		r.Str(owner, &ownerID)
		if r.Err != nil {
			return r.Err
		}
		m[id] = cur
		if known && cur != prev && ownerID != "" {
			if table == "job_resource" {
				ev.Jobs = append(ev.Jobs, ownerID)
			} else {
				ev.Folders = append(ev.Folders, ownerID)
			}
		}
	}
	return nil
}

// keyColumn is the primary key of a kept table ("" for the others).
func keyColumn(table string) string {
	switch table {
	case "show":
		return "pk_show"
	case "subscription":
		return "pk_subscription"
	case "host":
		return "pk_host"
	case "folder_resource":
		return "pk_folder_resource"
	case "job_resource":
		return "pk_job_resource"
	}
	return ""
}

// forget drops a deleted row and notes what its absence means.
func (w *Follower) forget(table, id string, ev *Change) {
	switch table {
	case "show":
		delete(w.shows, id)
		ev.Reload = true
	case "subscription":
		if s, ok := w.subs[id]; ok {
			ev.Shows = append(ev.Shows, s.show)
			ev.CapShows = append(ev.CapShows, s.show)
		}
		delete(w.subs, id)
		ev.Reload = true
	case "host":
		delete(w.hosts, id)
		ev.Reload = true
	case "folder_resource":
		delete(w.folders, id)
	case "job_resource":
		delete(w.jobs, id)
	}
}

func (w *Follower) intern(s string) string {
	if v, ok := w.allocs[s]; ok {
		return v
	}
	w.allocs[s] = s
	return s
}

// oldKeyOf is the key of the row a change replaces: the old key if one was
// sent (the key changed, or a delete), else the new row's.
func oldKeyOf(ch *replication.Change, col string) (string, error) {
	if !ch.Old.IsZero() {
		return text(ch.Old, col)
	}
	return text(ch.New, col)
}

// text reads a present text or uuid column.
func text(r replication.Row, col string) (string, error) {
	d, ok := r.Get(col)
	if !ok || d.State != replication.Present {
		return "", fmt.Errorf("column %s missing or not sent", col)
	}
	switch v := d.Value.(type) {
	case string:
		return v, nil
	case uuid.UUID:
		return v.String(), nil
	}
	return "", fmt.Errorf("column %s: %w: %T", col, replication.ErrType, d.Value)
}
