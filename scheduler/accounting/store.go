package accounting

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/cuesched/cuesched/migrations"
	"github.com/cuesched/cuesched/shared/appname"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/replication"
)

// store holds the Postgres side of the loops: which shows are managed, the
// snapshot of their procs and caps, and the dual write of booked totals to
// the accounting tables.
type store struct {
	pool *pgxpool.Pool
	// visibleWait bounds how long a snapshot waits for transactions that
	// committed before its WAL position to become visible (beginVisible).
	visibleWait time.Duration
	// vis waits for those transactions.
	vis *replication.Visibility
	// blind makes the warning that this role cannot see other roles'
	// transactions once; log is where it goes.
	blind *sync.Once
	log   hclog.Logger
}

// defaultVisibleWait is store.visibleWait's default: far above a
// synchronous standby's confirmation, and short enough that one that never
// confirms fails the snapshot with an error naming the transactions
// rather than stalling the loop.
const defaultVisibleWait = 2 * time.Second

// newStore returns the store of pool; waits (may be nil) counts the
// snapshots that waited for a synchronous standby's transactions.
func newStore(pool *pgxpool.Pool, log hclog.Logger, waits prometheus.Counter) *store {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &store{pool: pool, log: log, blind: new(sync.Once), visibleWait: defaultVisibleWait,
		vis: replication.NewVisibility(pool, replication.VisibilityOptions{Logger: log, Waits: waits, What: "the accounting snapshot"})}
}

// managedShows lists show.b_scheduler_managed = true, sorted.
func (s *store) managedShows(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT pk_show FROM show WHERE b_scheduler_managed ORDER BY pk_show`)
	if err != nil {
		return nil, fmt.Errorf("managed shows: %w", err)
	}
	shows, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("managed shows: %w", err)
	}
	return shows, nil
}

// activeSidecarSlots counts this database's active replication slots named
// with the sidecar prefix: the sidecars streaming releases into Redis.
func (s *store) activeSidecarSlots(ctx context.Context) (int, error) {
	var n int
	// Named like a sidecar's, or streamed by a cuesched sidecar whatever its
	// name (sidecar.slot_name is free).
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots s
		LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.active AND s.database = current_database()
		  AND (left(s.slot_name, length($1)) = $1 OR left(COALESCE(a.application_name, ''), length($2)) = $2)`,
		migrations.SidecarSlotPrefix, appname.Sidecar).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("sidecar slots: %w", err)
	}
	return n, nil
}

// snapshot is one consistent read of the shows' procs, caps and keys.
type snapshot struct {
	shows  []string
	procs  map[string][]publisher.ProcCharge // by show
	limits map[string]*publisher.Limits      // by show
	// baseline: every accounting key of the show that exists in Postgres
	// (subscriptions, folders, non-FINISHED jobs and their layers, points),
	// zeroed by the repair unless a record charges it.
	baseline map[string][]string
	// skipped counts procs that cannot be charged (no job row).
	skipped int
	// lsn is the WAL position read just before the snapshot was taken: its
	// caps are written to Redis stamped with it (publisher.Limits.LSN), so
	// they never revert a cap change committed after it that the sidecar
	// already wrote. A transaction whose commit precedes lsn and that waits
	// for a synchronous standby is waited for (beginVisible), so the caps
	// do not revert it either; one caught in the instant between its
	// commit's flush and its end, when it does not wait, still can.
	lsn uint64
	// live are the pids of every backend of the primary, read after the
	// caller's Mark and just before the snapshot (liveKnown false on a
	// standby or when the read failed): a record booked on a backend not
	// among them is orphaned (publisher.ReconcileRequest.LiveBackends).
	live      []uint32
	liveKnown bool
}

func newSnapshot(shows []string) *snapshot {
	sn := &snapshot{shows: shows, procs: map[string][]publisher.ProcCharge{},
		limits: map[string]*publisher.Limits{}, baseline: map[string][]string{}}
	for _, s := range shows {
		sn.limits[s] = &publisher.Limits{}
	}
	return sn
}

// syncRepSQL lists the transactions of this database that have committed
// and wait for a synchronous standby's confirmation: flushed and streamed,
// but not visible to other sessions until the standby confirms (or the
// wait is cancelled). hidden counts the sessions of this database whose
// activity this role may not see (another role's, without
// pg_read_all_stats: their backend_type and wait_event read as NULL).
const syncRepSQL = `
SELECT COALESCE(array_agg(backend_xid::text::bigint) FILTER (WHERE wait_event = 'SyncRep' AND backend_xid IS NOT NULL), '{}'),
       count(*) FILTER (WHERE backend_type IS NULL)
  FROM pg_stat_activity
 WHERE datname = current_database()`

// beginVisible opens the snapshot's REPEATABLE READ, READ ONLY
// transaction, the caller having read the WAL position it stamps the caps
// with (snapshot.lsn) just before. A transaction whose commit record
// precedes that position but which the snapshot does not show yet would
// otherwise be reverted in Redis: its caps read as before it, stamped
// past its commit, so the sidecar's copy of them is refused as older.
//
// A committing backend leaves the in-progress list that snapshots are
// built from a moment after its commit is flushed: a few instructions as
// a rule, and with a synchronous standby not until the standby confirms.
// That wait is what makes the window last, and it shows in
// pg_stat_activity (wait_event SyncRep): the transactions found waiting
// are waited for (visibleWait at most; past it the snapshot fails and
// names them) before the snapshot is taken. Instants between a flush and
// the end of a transaction that does not wait are the window left.
func (s *store) beginVisible(ctx context.Context) (pgx.Tx, error) {
	var waiting []int64
	var hidden int
	if err := s.pool.QueryRow(ctx, syncRepSQL).Scan(&waiting, &hidden); err != nil {
		return nil, fmt.Errorf("snapshot: transactions waiting for a synchronous standby: %w", err)
	}
	if hidden > 0 {
		s.blind.Do(func() {
			s.log.Warn("pg_stat_activity hides other roles' sessions from this role: a cap change committed while a reseed runs, "+
				"and waiting for a synchronous standby, can be put back until the next reseed; grant pg_read_all_stats to this role",
				"hidden_sessions", hidden)
		})
	}
	if len(waiting) > 0 {
		patience := s.visibleWait
		xids := make([]uint32, len(waiting))
		for i, x := range waiting {
			xids[i] = uint32(x)
		}
		wctx, cancel := context.WithTimeout(ctx, patience)
		err := s.vis.Await(wctx, xids...)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("snapshot: transaction(s) %v committed before it and waiting for a synchronous standby "+
				"still not visible after %s; nothing read: %w", xids, patience, err)
		}
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("snapshot: begin: %w", err)
	}
	return tx, nil
}

// The proc set of the snapshot: non-local procs of the shows. The alloc is
// the host's, folder and dept the job's (as Cuebot charges them).
const snapshotProcsSQL = `
SELECT p.pk_proc, p.pk_show, h.pk_alloc, j.pk_folder, p.pk_job, p.pk_layer, j.pk_dept,
       p.int_cores_reserved, p.int_gpus_reserved
  FROM proc p
  JOIN host h ON h.pk_host = p.pk_host
  JOIN job j ON j.pk_job = p.pk_job
 WHERE p.pk_show = ANY($1) AND NOT p.b_local AND p.pk_layer IS NOT NULL`

// load reads the snapshot in one REPEATABLE READ, READ ONLY transaction:
// caps and keys always, the procs if withProcs (the limit reseed needs no
// procs).
func (s *store) load(ctx context.Context, shows []string, withProcs bool) (*snapshot, error) {
	sn := newSnapshot(shows)
	if len(shows) == 0 {
		return sn, nil
	}
	var lsnText string
	if err := s.pool.QueryRow(ctx, `SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
		ELSE pg_current_wal_lsn() END)::text`).Scan(&lsnText); err != nil {
		return nil, fmt.Errorf("snapshot: WAL position: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		return nil, fmt.Errorf("snapshot: WAL position %q: %w", lsnText, err)
	}
	sn.lsn = uint64(lsn)
	if withProcs {
		// Its own statement, so pg_stat_activity is read now (a
		// transaction would keep its first read of it).
		var recovery bool
		var pids []int32
		err := s.pool.QueryRow(ctx, `SELECT pg_is_in_recovery(), COALESCE(array_agg(pid), '{}') FROM pg_stat_activity`).Scan(&recovery, &pids)
		if err != nil {
			return nil, fmt.Errorf("snapshot: live backends: %w", err)
		}
		if !recovery {
			sn.liveKnown = true
			sn.live = make([]uint32, 0, len(pids))
			for _, p := range pids {
				sn.live = append(sn.live, uint32(p))
			}
		}
	}
	tx, err := s.beginVisible(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if withProcs {
		rows, err := tx.Query(ctx, snapshotProcsSQL, shows)
		if err != nil {
			return nil, fmt.Errorf("snapshot procs: %w", err)
		}
		for rows.Next() {
			var c publisher.ProcCharge
			if err := rows.Scan(&c.ProcID, &c.ShowID, &c.AllocID, &c.FolderID, &c.JobID, &c.LayerID, &c.DeptID, &c.Centicores, &c.GPUs); err != nil {
				rows.Close()
				return nil, fmt.Errorf("snapshot procs: %w", err)
			}
			sn.procs[c.ShowID] = append(sn.procs[c.ShowID], c)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("snapshot procs: %w", err)
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM proc p WHERE p.pk_show = ANY($1) AND NOT p.b_local
			AND (p.pk_layer IS NULL OR NOT EXISTS (SELECT 1 FROM job j WHERE j.pk_job = p.pk_job))`, shows).Scan(&sn.skipped); err != nil {
			return nil, fmt.Errorf("snapshot orphan procs: %w", err)
		}
	}

	add := func(show, key string) { sn.baseline[show] = append(sn.baseline[show], key) }

	// Subscriptions.
	rows, err := tx.Query(ctx, `SELECT pk_show, pk_alloc, int_size, int_burst FROM subscription WHERE pk_show = ANY($1)`, shows)
	if err != nil {
		return nil, fmt.Errorf("snapshot subscriptions: %w", err)
	}
	for rows.Next() {
		var l publisher.SubLimits
		if err := rows.Scan(&l.ShowID, &l.AllocID, &l.Size, &l.Burst); err != nil {
			rows.Close()
			return nil, fmt.Errorf("snapshot subscriptions: %w", err)
		}
		add(l.ShowID, publisher.SubKey(l.ShowID, l.AllocID))
		sn.limits[l.ShowID].Subs = append(sn.limits[l.ShowID].Subs, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot subscriptions: %w", err)
	}

	// Folders (folder_resource has no unique pk_folder: take one row).
	rows, err = tx.Query(ctx, `
SELECT DISTINCT ON (f.pk_folder) f.pk_folder, f.pk_show,
       fr.int_min_cores, fr.int_max_cores, fr.int_min_gpus, fr.int_max_gpus
  FROM folder f JOIN folder_resource fr ON fr.pk_folder = f.pk_folder
 WHERE f.pk_show = ANY($1)
 ORDER BY f.pk_folder, fr.pk_folder_resource`, shows)
	if err != nil {
		return nil, fmt.Errorf("snapshot folders: %w", err)
	}
	for rows.Next() {
		var l publisher.FolderLimits
		if err := rows.Scan(&l.FolderID, &l.ShowID, &l.MinCores, &l.MaxCores, &l.MinGPUs, &l.MaxGPUs); err != nil {
			rows.Close()
			return nil, fmt.Errorf("snapshot folders: %w", err)
		}
		add(l.ShowID, publisher.FolderKey(l.FolderID))
		sn.limits[l.ShowID].Folders = append(sn.limits[l.ShowID].Folders, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot folders: %w", err)
	}

	// Jobs that are not FINISHED.
	rows, err = tx.Query(ctx, `
SELECT j.pk_job, j.pk_show, jr.int_max_cores, jr.int_max_gpus, jr.int_priority
  FROM job j JOIN job_resource jr ON jr.pk_job = j.pk_job
 WHERE j.pk_show = ANY($1) AND j.str_state <> 'FINISHED'`, shows)
	if err != nil {
		return nil, fmt.Errorf("snapshot jobs: %w", err)
	}
	for rows.Next() {
		var l publisher.JobLimits
		var show string
		if err := rows.Scan(&l.JobID, &show, &l.MaxCores, &l.MaxGPUs, &l.Priority); err != nil {
			rows.Close()
			return nil, fmt.Errorf("snapshot jobs: %w", err)
		}
		add(show, publisher.JobKey(l.JobID))
		sn.limits[show].Jobs = append(sn.limits[show].Jobs, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot jobs: %w", err)
	}

	// Layers of those jobs.
	rows, err = tx.Query(ctx, `
SELECT l.pk_layer, j.pk_show FROM layer l JOIN job j ON j.pk_job = l.pk_job
 WHERE j.pk_show = ANY($1) AND j.str_state <> 'FINISHED'`, shows)
	if err != nil {
		return nil, fmt.Errorf("snapshot layers: %w", err)
	}
	for rows.Next() {
		var layer, show string
		if err := rows.Scan(&layer, &show); err != nil {
			rows.Close()
			return nil, fmt.Errorf("snapshot layers: %w", err)
		}
		add(show, publisher.LayerKey(layer))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot layers: %w", err)
	}

	// Points.
	rows, err = tx.Query(ctx, `SELECT pk_dept, pk_show, int_min_cores, int_min_gpus FROM point WHERE pk_show = ANY($1)`, shows)
	if err != nil {
		return nil, fmt.Errorf("snapshot points: %w", err)
	}
	for rows.Next() {
		var l publisher.PointLimits
		if err := rows.Scan(&l.DeptID, &l.ShowID, &l.MinCores, &l.MinGPUs); err != nil {
			rows.Close()
			return nil, fmt.Errorf("snapshot points: %w", err)
		}
		add(l.ShowID, publisher.PointKey(l.DeptID, l.ShowID))
		sn.limits[l.ShowID].Points = append(sn.limits[l.ShowID].Points, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot points: %w", err)
	}
	return sn, tx.Commit(ctx)
}

// totals are exact booked sums in Postgres units, per accounting row.
type totals struct {
	subs    map[[2]string][2]int64 // (show, alloc) -> centicores, gpus
	folders map[string][2]int64
	jobs    map[string][2]int64
	layers  map[string][2]int64
	points  map[[2]string][2]int64 // (dept, show)
}

// sums folds the snapshot's procs over a zero baseline of every row the
// snapshot enumerated (so drained rows are reset to 0).
func (sn *snapshot) sums() totals {
	t := totals{subs: map[[2]string][2]int64{}, folders: map[string][2]int64{}, jobs: map[string][2]int64{},
		layers: map[string][2]int64{}, points: map[[2]string][2]int64{}}
	for _, l := range sn.limits {
		for _, s := range l.Subs {
			t.subs[[2]string{s.ShowID, s.AllocID}] = [2]int64{}
		}
		for _, f := range l.Folders {
			t.folders[f.FolderID] = [2]int64{}
		}
		for _, j := range l.Jobs {
			t.jobs[j.JobID] = [2]int64{}
		}
		for _, p := range l.Points {
			t.points[[2]string{p.DeptID, p.ShowID}] = [2]int64{}
		}
	}
	for _, keys := range sn.baseline {
		for _, k := range keys {
			const lp = "acct:layer:"
			if len(k) > len(lp) && k[:len(lp)] == lp {
				t.layers[k[len(lp):]] = [2]int64{}
			}
		}
	}
	add := func(v [2]int64, c, g int64) [2]int64 { return [2]int64{v[0] + c, v[1] + g} }
	for _, procs := range sn.procs {
		for _, p := range procs {
			t.subs[[2]string{p.ShowID, p.AllocID}] = add(t.subs[[2]string{p.ShowID, p.AllocID}], p.Centicores, p.GPUs)
			t.folders[p.FolderID] = add(t.folders[p.FolderID], p.Centicores, p.GPUs)
			t.jobs[p.JobID] = add(t.jobs[p.JobID], p.Centicores, p.GPUs)
			t.layers[p.LayerID] = add(t.layers[p.LayerID], p.Centicores, p.GPUs)
			t.points[[2]string{p.DeptID, p.ShowID}] = add(t.points[[2]string{p.DeptID, p.ShowID}], p.Centicores, p.GPUs)
		}
	}
	return t
}

// pgWriteCounts is how many rows of each table the dual write changed.
type pgWriteCounts struct {
	Subs, Folders, Jobs, Layers, Points int64
}

// writeTotals writes the booked totals of the snapshot (exact centicores)
// to the five accounting tables, only for shows that are still managed at
// write time (a show flipped back to Cuebot meanwhile belongs to Cuebot) and
// only rows whose value changes. verify_subscription and
// verify_job_resources fire only when the cap column is unchanged, so the
// update moves the cap and a second statement moves it back, in the same
// transaction (rows stay locked in between): a recompute must be able to
// write a total above a cap that was lowered after the procs booked. The
// move is the bitwise complement (~cap = -cap - 1), which differs from every
// value and, unlike cap + 1, cannot overflow at the top of the column's
// range (a job max of 2147483647, a burst of 2^63 - 1); applied twice it
// restores the cap exactly, 0 and -1 included.
func (s *store) writeTotals(ctx context.Context, sn *snapshot) (pgWriteCounts, error) {
	var n pgWriteCounts
	if len(sn.shows) == 0 {
		return n, nil
	}
	t := sn.sums()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return n, fmt.Errorf("write totals: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// subscription
	{
		var shows, allocs []string
		var cores, gpus []int64
		for _, k := range sortedPairs(t.subs) {
			v := t.subs[k]
			shows, allocs, cores, gpus = append(shows, k[0]), append(allocs, k[1]), append(cores, v[0]), append(gpus, v[1])
		}
		rows, err := tx.Query(ctx, `
UPDATE subscription s SET int_cores = v.cores::int, int_gpus = v.gpus::int, int_burst = ~s.int_burst
  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS v(show, alloc, cores, gpus), show sh
 WHERE s.pk_show = v.show AND s.pk_alloc = v.alloc AND sh.pk_show = s.pk_show AND sh.b_scheduler_managed
   AND (s.int_cores, s.int_gpus) IS DISTINCT FROM (v.cores::int, v.gpus::int)
RETURNING s.pk_subscription`, shows, allocs, cores, gpus)
		if err != nil {
			return n, fmt.Errorf("write subscription totals: %w", err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return n, fmt.Errorf("write subscription totals: %w", err)
		}
		if len(ids) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE subscription SET int_burst = ~int_burst WHERE pk_subscription = ANY($1)`, ids); err != nil {
				return n, fmt.Errorf("restore subscription burst: %w", err)
			}
		}
		n.Subs = int64(len(ids))
	}
	// job_resource
	{
		ids, cores, gpus := flat(t.jobs)
		rows, err := tx.Query(ctx, `
UPDATE job_resource jr SET int_cores = v.cores, int_gpus = v.gpus::int,
       int_max_cores = ~jr.int_max_cores, int_max_gpus = ~jr.int_max_gpus
  FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS v(job, cores, gpus), job j, show sh
 WHERE jr.pk_job = v.job AND j.pk_job = jr.pk_job AND sh.pk_show = j.pk_show AND sh.b_scheduler_managed
   AND (jr.int_cores, jr.int_gpus) IS DISTINCT FROM (v.cores, v.gpus::int)
RETURNING jr.pk_job_resource`, ids, cores, gpus)
		if err != nil {
			return n, fmt.Errorf("write job_resource totals: %w", err)
		}
		changed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return n, fmt.Errorf("write job_resource totals: %w", err)
		}
		if len(changed) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE job_resource SET int_max_cores = ~int_max_cores, int_max_gpus = ~int_max_gpus
				WHERE pk_job_resource = ANY($1)`, changed); err != nil {
				return n, fmt.Errorf("restore job_resource caps: %w", err)
			}
		}
		n.Jobs = int64(len(changed))
	}
	// folder_resource (no cap trigger)
	{
		ids, cores, gpus := flat(t.folders)
		tag, err := tx.Exec(ctx, `
UPDATE folder_resource fr SET int_cores = v.cores::int, int_gpus = v.gpus::int
  FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS v(folder, cores, gpus), folder f, show sh
 WHERE fr.pk_folder = v.folder AND f.pk_folder = fr.pk_folder AND sh.pk_show = f.pk_show AND sh.b_scheduler_managed
   AND (fr.int_cores, fr.int_gpus) IS DISTINCT FROM (v.cores::int, v.gpus::int)`, ids, cores, gpus)
		if err != nil {
			return n, fmt.Errorf("write folder_resource totals: %w", err)
		}
		n.Folders = tag.RowsAffected()
	}
	// layer_resource (no trigger)
	{
		ids, cores, gpus := flat(t.layers)
		tag, err := tx.Exec(ctx, `
UPDATE layer_resource lr SET int_cores = v.cores, int_gpus = v.gpus::int
  FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS v(layer, cores, gpus), job j, show sh
 WHERE lr.pk_layer = v.layer AND j.pk_job = lr.pk_job AND sh.pk_show = j.pk_show AND sh.b_scheduler_managed
   AND (lr.int_cores, lr.int_gpus) IS DISTINCT FROM (v.cores, v.gpus::int)`, ids, cores, gpus)
		if err != nil {
			return n, fmt.Errorf("write layer_resource totals: %w", err)
		}
		n.Layers = tag.RowsAffected()
	}
	// point
	{
		var depts, shows []string
		var cores, gpus []int64
		for _, k := range sortedPairs(t.points) {
			v := t.points[k]
			depts, shows, cores, gpus = append(depts, k[0]), append(shows, k[1]), append(cores, v[0]), append(gpus, v[1])
		}
		tag, err := tx.Exec(ctx, `
UPDATE point p SET int_cores = v.cores::int, int_gpus = v.gpus::int
  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS v(dept, show, cores, gpus), show sh
 WHERE p.pk_dept = v.dept AND p.pk_show = v.show AND sh.pk_show = p.pk_show AND sh.b_scheduler_managed
   AND (p.int_cores, p.int_gpus) IS DISTINCT FROM (v.cores::int, v.gpus::int)`, depts, shows, cores, gpus)
		if err != nil {
			return n, fmt.Errorf("write point totals: %w", err)
		}
		n.Points = tag.RowsAffected()
	}
	if err := tx.Commit(ctx); err != nil {
		return n, fmt.Errorf("write totals: commit: %w", err)
	}
	return n, nil
}

// flat returns ids and values in id order (a stable lock order for
// concurrent writers of the same rows).
func flat(m map[string][2]int64) ([]string, []int64, []int64) {
	ids := make([]string, 0, len(m))
	for k := range m {
		ids = append(ids, k)
	}
	sort.Strings(ids)
	cores, gpus := make([]int64, len(ids)), make([]int64, len(ids))
	for i, id := range ids {
		cores[i], gpus[i] = m[id][0], m[id][1]
	}
	return ids, cores, gpus
}

func sortedPairs(m map[[2]string][2]int64) [][2]string {
	keys := make([][2]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	return keys
}
