package sidecar_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/metrics"
	"github.com/cuesched/cuesched/shared/replication"
	"github.com/cuesched/cuesched/sidecar"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// TestReleasesEachManagedDeleteOnce: deletes of every shape (one proc, many,
// mixed shows, local procs, unmanaged shows, transactions with no proc at
// all) are applied once, unmanaged shows are not touched, and a restarted
// sidecar applies nothing twice.
func TestReleasesEachManagedDeleteOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	pa := h.book(h.a, 20)
	pb := h.book(h.b, 20)
	pu := h.book(h.u, 10)

	ip := h.start(true)
	ip.waitActive(t, 10*time.Second)
	// Creating the slot requests a re-bootstrap: WAL before it was never
	// streamed.
	if n := ip.metric(t, "sidecar_rebootstrap_requests_total", map[string]string{"reason": "new_slot"}); n != 1 {
		t.Fatalf("rebootstrap requests on slot creation = %v, want 1", n)
	}

	h.del(pa[0])               // one managed proc
	h.del(pa[1], pa[2], pb[0]) // several, two shows
	h.del(pu[0], pa[3])        // mixed managed and unmanaged
	h.del(pu[1], pu[2])        // unmanaged only
	h.del(pb[1:6]...)          // a batch
	if _, err := h.pool.Exec(h.ctx, `UPDATE host SET int_mem_idle = int_mem_idle - 1 WHERE pk_host = $1`, h.a.host); err != nil {
		t.Fatal(err) // a transaction with nothing for Redis
	}
	// A local (desktop) proc of a managed show: Cuebot's own accounting.
	if _, err := h.pool.Exec(h.ctx, `INSERT INTO proc (pk_proc, pk_host, pk_show, pk_job, pk_layer, int_cores_reserved, int_mem_reserved, b_local)
		VALUES ('local-proc-1', $1, $2, $3, $4, 100, 1024, true)`, h.a.host, h.a.rows.ShowID, h.a.job, h.a.layer); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(h.ctx, `DELETE FROM proc WHERE pk_proc = 'local-proc-1'`); err != nil {
		t.Fatal(err)
	}
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	h.assertExact()

	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "applied"}, 10)
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "unmanaged"}, 3)
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "local"}, 1)
	ip.waitMetric(t, "sidecar_release_key_mismatch_total", nil, 0)
	ip.waitMetric(t, "sidecar_commit_to_redis_seconds", nil, 4)
	st := ip.sc.Status()
	if !st.Active || st.ManagedShows < 2 || st.Checkpoint == 0 {
		t.Errorf("status = %+v", st)
	}

	// Restart: the slot resumes; nothing is applied twice, new deletes are.
	ip.stop(t)
	h.del(pa[4], pb[6])
	ip2 := h.start(false)
	ip2.waitActive(t, 10*time.Second)
	h.del(pa[5])
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	h.assertExact()
	ip2.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "applied"}, 3)
	ip2.waitMetric(t, "sidecar_rebootstrap_requests_total", nil, 0)
}

// TestShowFlipMidStream: a show flipped in a transaction is handled at
// exactly that transaction, and at that statement inside it, also across a
// restart (the managed set persisted next to the checkpoint).
func TestShowFlipMidStream(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	ps := h.book(h.a, 8)
	ip := h.start(true)
	ip.waitActive(t, 10*time.Second)

	flip := func(managed bool, before, after []*procFx) {
		t.Helper()
		tx, err := h.pool.Begin(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(h.ctx)
		for _, p := range before {
			if _, err := tx.Exec(h.ctx, `DELETE FROM proc WHERE pk_proc = $1`, p.id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(h.ctx, `UPDATE show SET b_scheduler_managed = $2 WHERE pk_show = $1`, h.a.rows.ShowID, managed); err != nil {
			t.Fatal(err)
		}
		for _, p := range after {
			if _, err := tx.Exec(h.ctx, `DELETE FROM proc WHERE pk_proc = $1`, p.id); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(h.ctx); err != nil {
			t.Fatal(err)
		}
	}
	released := func(ps ...*procFx) { h.forget(ps...) }

	// Every proc here was booked through Redis (it has a record), so its
	// release is applied whether or not the show is managed at that point
	// of the stream: a proc booked before a flip back to Cuebot still holds
	// its charge, and only its release gives it back. (Cuebot's own procs of
	// an unmanaged show have no record and are not sent: TestReleasesEachManagedDeleteOnce.)
	h.del(ps[0])                                    // managed: released
	flip(false, []*procFx{ps[1]}, []*procFx{ps[2]}) // before the flip and after it
	released(ps[1], ps[2])
	if _, err := h.pool.Exec(h.ctx, `DELETE FROM proc WHERE pk_proc = $1`, ps[3].id); err != nil {
		t.Fatal(err) // unmanaged now
	}
	released(ps[3])
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "after_flip"}, 2)

	// Restart while the show is unmanaged: the persisted set says so.
	ip.stop(t)
	ip = h.start(false)
	ip.waitActive(t, 10*time.Second)
	if _, err := h.pool.Exec(h.ctx, `DELETE FROM proc WHERE pk_proc = $1`, ps[4].id); err != nil {
		t.Fatal(err)
	}
	released(ps[4])
	flip(true, []*procFx{ps[5]}, []*procFx{ps[6]}) // before and after the flip back on
	released(ps[5], ps[6])
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "after_flip"}, 2)

	for _, p := range ps {
		n, err := h.rdb.Exists(h.ctx, publisher.ProcKey(p.id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n == 1, p == ps[7]; got != want {
			t.Errorf("proc %d: record present = %v, want %v", indexOf(ps, p), got, want)
		}
	}
	h.assertExact()
	ip.waitMetric(t, "sidecar_managed_shows", nil, 2)
	// Issue #26: the releases after a flip back to Cuebot give back exactly
	// what was booked (assertExact), so the comparison of the deleted row
	// with the booking record must find no difference either.
	for _, key := range []string{"cores", "gpus", "sub", "folder", "job", "layer", "point"} {
		ip.waitMetric(t, "sidecar_release_key_mismatch_total", map[string]string{"key": key}, 0)
	}
}

func indexOf(ps []*procFx, p *procFx) int {
	for i, q := range ps {
		if q == p {
			return i
		}
	}
	return -1
}

// TestCapChangesReachRedis: cap changes of managed shows are written to
// Redis at once; unmanaged shows' are not; counter-only updates write
// nothing.
func TestCapChangesReachRedis(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	ip := h.start(true)
	ip.waitActive(t, 10*time.Second)

	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := h.pool.Exec(h.ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE subscription SET int_burst = 25000, int_size = 12000 WHERE pk_show = $1`, h.a.rows.ShowID)
	exec(`UPDATE folder_resource SET int_max_cores = 5050, int_max_gpus = 3 WHERE pk_folder = $1`, h.a.rows.FolderID)
	exec(`UPDATE job_resource SET int_max_cores = 777, int_max_gpus = 2, int_priority = 9 WHERE pk_job = $1`, h.a.job)
	exec(`UPDATE subscription SET int_burst = 99900 WHERE pk_show = $1`, h.u.rows.ShowID)
	exec(`UPDATE job_resource SET int_max_cores = 500 WHERE pk_job = $1`, h.u.job)
	h.waitCheckpoint(h.walNow(), 10*time.Second)

	want := map[string]map[string]string{
		publisher.SubKey(h.a.rows.ShowID, h.a.alloc): {"size": "120", "burst": "250"},
		publisher.FolderKey(h.a.rows.FolderID):       {"int_max_cores": "50", "int_max_gpus": "3"},
		publisher.JobKey(h.a.job):                    {"int_max_cores": "7", "int_max_gpus": "2", "int_priority": "9"},
	}
	deadline := time.Now().Add(testenv.Patience(5 * time.Second))
	for key, fields := range want {
		for f, v := range fields {
			for {
				got, _ := h.rdb.HGet(h.ctx, key, f).Result()
				if got == v {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s %s = %q, want %q", key, f, got, v)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	ip.waitMetric(t, "sidecar_cap_writes_total", nil, 3)
	before := ip.metric(t, "sidecar_cap_writes_total", nil)
	// The recompute's dual write changes counters only: no cap write.
	exec(`UPDATE job_resource SET int_cores = int_cores + 100 WHERE pk_job = $1`, h.a.job)
	exec(`UPDATE subscription SET int_cores = int_cores + 100 WHERE pk_show = $1`, h.a.rows.ShowID)
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	if got := ip.metric(t, "sidecar_cap_writes_total", nil); got != before {
		t.Errorf("cap writes after counter-only updates = %v, want %v", got, before)
	}
	touched, err := scanKeys(h.ctx, h.rdb, "*"+h.u.rows.ShowID+"*")
	if err != nil || len(touched) > 0 {
		t.Errorf("unmanaged show's caps written: %v %v", touched, err)
	}
	if n, _ := h.rdb.Exists(h.ctx, publisher.JobKey(h.u.job)).Result(); n != 0 {
		t.Errorf("unmanaged job's caps written")
	}
}

// TestJobMovedFolderWhileProcLived: the release follows the record (the
// folder charged at booking); the stream's resolution (the new folder) is
// counted as a mismatch.
func TestJobMovedFolderWhileProcLived(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	ps := h.book(h.a, 2)
	ip := h.start(true)
	ip.waitActive(t, 10*time.Second)
	newFolder := "f-" + h.a.rows.ShowID[:8]
	if _, err := h.pool.Exec(h.ctx, `INSERT INTO folder (pk_folder, pk_parent_folder, pk_show, str_name, pk_dept) VALUES ($1, $2, $3, 'moved', $4)`,
		newFolder, h.a.rows.FolderID, h.a.rows.ShowID, h.a.rows.DeptID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(h.ctx, `UPDATE job SET pk_folder = $2 WHERE pk_job = $1`, h.a.job, newFolder); err != nil {
		t.Fatal(err)
	}
	h.del(ps[0])
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	h.assertExact() // the old folder's counter went back down exactly
	ip.waitMetric(t, "sidecar_release_key_mismatch_total", map[string]string{"key": "folder"}, 1)
	if v, _ := h.rdb.HGet(h.ctx, publisher.FolderKey(newFolder), "int_cores").Result(); v != "" && v != "0" {
		t.Errorf("new folder charged %s by a release", v)
	}
}

// TestTruncateRequestsRebootstrap and the retained-WAL guard.
func TestTruncateAndRetainedWAL(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	h.book(h.a, 3)
	health := metrics.NewHealth()
	ip := h.start(true, func(c *sidecar.Config) { c.MaxRetainedWAL = 1; c.Health = health })
	ip.waitActive(t, 10*time.Second)
	if err := h.pub.BeginBootstrap(h.ctx, "e1"); err != nil {
		t.Fatal(err)
	}
	if err := h.pub.SetEpoch(h.ctx, "e1"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(h.ctx, `TRUNCATE proc`); err != nil {
		t.Fatal(err)
	}
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	for deadline := time.Now().Add(testenv.Patience(5 * time.Second)); ip.metric(t, "sidecar_rebootstrap_requests_total", map[string]string{"reason": "truncate"}) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("no re-bootstrap requested for a TRUNCATE of proc")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e, _ := h.pub.Epoch(h.ctx); e != "" {
		t.Errorf("acct:epoch still %q after a TRUNCATE of proc", e)
	}
	deadline := time.Now().Add(testenv.Patience(5 * time.Second))
	for ip.metric(t, "sidecar_slot_retained_wal_exceeded", nil) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("retained WAL over the limit not flagged")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(ip.logs.String(), "REPLICATION SLOT RETAINS TOO MUCH WAL") {
		t.Error("no loud WARN for retained WAL")
	}
	if fails := health.Ready(); len(fails) != 0 {
		t.Errorf("active sidecar not ready: %v", fails)
	}
}

// TestMissingSlotIsAnError: without CreateSlot a missing slot stops Run
// with a clear error.
func TestMissingSlotIsAnError(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	sc, err := sidecar.New(childConfig(h.dbURL, h.slot, false, nil, nil), h.rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(h.ctx, 20*time.Second)
	defer cancel()
	err = sc.Run(ctx)
	if !errors.Is(err, replication.ErrSlotMissing) {
		t.Fatalf("Run = %v, want ErrSlotMissing", err)
	}
	if _, err := sidecar.New(sidecar.Config{DatabaseURL: h.dbURL, SlotName: "Bad-Name"}, h.rdb); err == nil {
		t.Error("bad slot name accepted")
	}
}

// TestLostSlotIsRecreated: the slot disappears under a sidecar that had
// streamed it (a failover promoted a standby, which has no logical slot
// before PostgreSQL 17's failover slots; here the slot is dropped, which
// is what the promoted server looks like to the sidecar). Redis holds the
// sidecar checkpoint, which proves the slot existed, so a sidecar started
// without --create-slot re-creates it and requests the re-bootstrap that
// covers the releases the lost slot never streamed, instead of exiting
// for good. With recreate_lost_slot off it stops and names the operator
// step.
func TestLostSlotIsRecreated(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	ip := h.start(true)
	ip.waitActive(t, 20*time.Second)
	h.book(h.a, 3)
	h.waitCheckpoint(h.walNow(), 20*time.Second)
	ip.stop(t)
	// The stopped sidecar's walsender goes away a moment later.
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for {
		_, err := h.pool.Exec(h.ctx, `SELECT pg_drop_replication_slot($1)`, h.slot)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	off, err := sidecar.New(childConfig(h.dbURL, h.slot, false, nil, nil), h.rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(h.ctx, testenv.Patience(20*time.Second))
	defer cancel()
	err = off.Run(ctx)
	if !errors.Is(err, replication.ErrSlotMissing) || !strings.Contains(err.Error(), "--create-slot") ||
		!strings.Contains(err.Error(), "recreate_lost_slot is false") {
		t.Fatalf("Run without recreate_lost_slot = %v, want ErrSlotMissing naming --create-slot and the setting", err)
	}

	again := h.start(false, func(c *sidecar.Config) { c.RecreateLostSlot = true })
	again.waitActive(t, 20*time.Second)
	again.waitMetric(t, "sidecar_slot_recreated_total", nil, 1)
	if !strings.Contains(again.logs.String(), "requested a re-bootstrap") {
		t.Errorf("no re-bootstrap requested after re-creating the slot; log:\n%s", again.logs.String())
	}
	// Releases stream again through the new slot.
	ps := h.book(h.b, 2)
	h.del(ps...)
	h.waitCheckpoint(h.walNow(), 20*time.Second)
}

// TestIgnoresSameNamedTablesInAnotherSchema: tables named like Cuebot's in
// another schema (shadow.proc, shadow.show, shadow.subscription, ...) added
// to the sidecar's publications and written with copies of the real rows
// are not Cuebot's: their DELETEs release nothing, their flips and cap
// changes reach nothing, their TRUNCATEs request no re-bootstrap, before
// and after a restart (the slot's snapshot and the resume each resolve the
// schema); the real tables' writes still do.
func TestIgnoresSameNamedTablesInAnotherSchema(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	pa := h.book(h.a, 6)
	pb := h.book(h.b, 4)
	pu := h.book(h.u, 2)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := h.pool.Exec(h.ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE SCHEMA shadow`)
	for tb, pub := range map[string]string{
		"proc": "cuesched_proc", "show": "cuesched_accounting", "subscription": "cuesched_accounting",
		"job_resource": "cuesched_accounting", "folder_resource": "cuesched_accounting",
		"job": "cuesched_accounting", "host": "cuesched_accounting",
	} {
		exec(fmt.Sprintf(`CREATE TABLE shadow.%[1]s (LIKE public.%[1]s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)`, tb))
		exec(fmt.Sprintf(`ALTER TABLE shadow.%s REPLICA IDENTITY FULL`, tb))
		exec(fmt.Sprintf(`ALTER PUBLICATION %s ADD TABLE shadow.%s`, pub, tb))
	}
	copyRows := func() {
		t.Helper()
		for _, tb := range []string{"proc", "show", "subscription", "job_resource", "folder_resource", "job", "host"} {
			exec(fmt.Sprintf(`DELETE FROM shadow.%s`, tb))
			exec(fmt.Sprintf(`INSERT INTO shadow.%[1]s SELECT * FROM public.%[1]s`, tb))
		}
	}
	copyRows()
	poison := func() {
		t.Helper()
		copyRows() // its DELETE of shadow.proc releases every live proc, were it Cuebot's
		exec(`UPDATE shadow.show SET b_scheduler_managed = NOT b_scheduler_managed`)
		exec(`UPDATE shadow.subscription SET int_burst = 12300, int_size = 4500`)
		exec(`UPDATE shadow.job_resource SET int_max_cores = 100, int_max_gpus = 0, int_priority = 99`)
		exec(`UPDATE shadow.folder_resource SET int_max_cores = 100`)
		exec(`UPDATE shadow.job SET pk_folder = pk_job`)
		exec(`UPDATE shadow.host SET pk_alloc = pk_host`)
		exec(`TRUNCATE shadow.proc`)
		exec(`TRUNCATE shadow.show`)
	}
	noEffect := func(ip *inProcess, phase string) {
		t.Helper()
		h.waitCheckpoint(h.walNow(), 10*time.Second)
		h.assertExact()
		for name, labels := range map[string]map[string]string{
			"sidecar_managed_flips_total":        nil,
			"sidecar_cap_writes_total":           nil,
			"sidecar_proc_truncates_total":       nil,
			"sidecar_release_key_mismatch_total": nil,
			"sidecar_rebootstrap_requests_total": {"reason": "truncate"},
		} {
			if v := ip.metric(t, name, labels); v != 0 {
				t.Errorf("%s: %s%v = %v, want 0", phase, name, labels, v)
			}
		}
		if v := ip.metric(t, "sidecar_managed_shows", nil); v != 2 {
			t.Errorf("%s: managed shows = %v, want 2", phase, v)
		}
		if e, _ := h.pub.Epoch(h.ctx); e == "" {
			t.Errorf("%s: acct:epoch deleted (a re-bootstrap was requested)", phase)
		}
		if n, _ := h.rdb.Exists(h.ctx, publisher.SubKey(h.a.rows.ShowID, h.a.alloc)).Result(); n != 0 {
			if b, _ := h.rdb.HGet(h.ctx, publisher.SubKey(h.a.rows.ShowID, h.a.alloc), "burst").Result(); b == "123" {
				t.Errorf("%s: shadow.subscription's burst written to Redis", phase)
			}
		}
		if !strings.Contains(ip.logs.String(), "ignoring changes of a table that is not Cuebot's") ||
			!strings.Contains(ip.logs.String(), "relation=shadow.proc") {
			t.Errorf("%s: ignored relations not logged", phase)
		}
	}

	ip := h.start(true)
	ip.waitActive(t, 10*time.Second)
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	if err := h.pub.BeginBootstrap(h.ctx, "e1"); err != nil {
		t.Fatal(err)
	}
	if err := h.pub.SetEpoch(h.ctx, "e1"); err != nil { // the new slot's re-bootstrap request
		t.Fatal(err)
	}
	poison()
	h.del(pa[0], pu[0]) // real: released / unmanaged
	poison()
	h.del(pb[0])
	noEffect(ip, "new slot")
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "applied"}, 2)
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "unmanaged"}, 1)

	// Resume (the schema resolved through the pool, not the snapshot).
	ip.stop(t)
	poison() // while stopped: streamed on resume
	ip = h.start(false)
	ip.waitActive(t, 10*time.Second)
	poison()
	h.del(pa[1], pa[2], pu[1])
	noEffect(ip, "resumed slot")
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "applied"}, 2)
	ip.waitMetric(t, "sidecar_releases_total", map[string]string{"result": "unmanaged"}, 1)

	// The real tables still drive flips and caps.
	exec(`UPDATE subscription SET int_burst = 25000 WHERE pk_show = $1`, h.a.rows.ShowID)
	exec(`UPDATE show SET b_scheduler_managed = false WHERE pk_show = $1`, h.b.rows.ShowID)
	h.waitCheckpoint(h.walNow(), 10*time.Second)
	ip.waitMetric(t, "sidecar_cap_writes_total", nil, 1)
	ip.waitMetric(t, "sidecar_managed_flips_total", nil, 1)
	ip.waitMetric(t, "sidecar_managed_shows", nil, 1)
	if b, _ := h.rdb.HGet(h.ctx, publisher.SubKey(h.a.rows.ShowID, h.a.alloc), "burst").Result(); b != "250" {
		t.Errorf("real subscription burst in Redis = %q, want 250", b)
	}
}

// TestUnmigratedDatabaseIsRefusedAtStart: without its publications the
// sidecar stops at start-up with what to run, not at the first decoded
// change.
func TestUnmigratedDatabaseIsRefusedAtStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOpts{})
	if _, err := h.pool.Exec(h.ctx, `DROP PUBLICATION cuesched_proc`); err != nil {
		t.Fatal(err)
	}
	sc, err := sidecar.New(childConfig(h.dbURL, h.slot, true, nil, nil), h.rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(h.ctx, testenv.Patience(20*time.Second))
	defer cancel()
	err = sc.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "cuesched_proc") || !strings.Contains(err.Error(), "cuesched migrate up") {
		t.Fatalf("Run = %v, want a refusal naming the publication and `cuesched migrate up`", err)
	}
}
