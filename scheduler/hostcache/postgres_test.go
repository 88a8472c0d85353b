package hostcache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/promread"
)

// Seed rows of the baseline schema (migrations/baseline/0006_seed.sql).
const (
	seedFacilityLocal = "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1"
	seedShowTesting   = "00000000-0000-0000-0000-000000000000"
	seedAllocGeneral  = "00000000-0000-0000-0000-000000000000" // local.general, subscribed
	seedAllocDesktop  = "00000000-0000-0000-0000-000000000001" // local.desktop, subscribed
	seedAllocUnassign = "00000000-0000-0000-0000-000000000002" // local.unassigned, not subscribed
)

var pgSlotSeq atomic.Int64

type pgEnv struct {
	t    testing.TB
	url  string
	pool *pgxpool.Pool
	c    *Cache
	reg  *prometheus.Registry
	slot string
	done chan error
}

// startPG creates a Cuebot database, runs setup SQL, and starts a cache on it.
func startPG(t testing.TB, cfg Config, setup func(*pgEnv)) *pgEnv {
	t.Helper()
	url := cuebotdb.Database(t)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	// Cuebot's default. The test cluster runs synchronous_commit=off, which
	// delays WAL flushes (and so what the walsender may send) by up to
	// wal_writer_delay.
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := &pgEnv{t: t, url: url, pool: pool, reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	if setup != nil {
		setup(e)
	}
	e.slot = fmt.Sprintf("hc_test_%d_%d", time.Now().UnixNano()%1e9, pgSlotSeq.Add(1))
	cfg.ConnString, cfg.SlotName = url, e.slot
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = 200 * time.Millisecond
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Warn, Output: tlogWriter{t}})
	c, err := New(cfg, Options{Registerer: e.reg, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	ctx, cancel := context.WithCancel(context.Background())
	go func() { e.done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-e.done:
		case <-time.After(10 * time.Second):
			t.Error("cache did not stop")
		}
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatalf("cache not ready: %v", err)
	}
	return e
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func (e *pgEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *pgEnv) addHost(id, alloc string, cores, memGB int64, tags ...string) {
	e.t.Helper()
	e.exec(`INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_cores_idle, int_mem, int_mem_idle, int_thread_mode)
		VALUES ($1, $2, $3, 'OPEN', $4, $4, $5, $5, 0)`, id, alloc, "name-"+id, cores*100, memGB*gib)
	e.exec(`INSERT INTO host_stat (pk_host_stat, pk_host, int_mem_total, int_mem_free, str_state, str_os)
		VALUES ($1, $2, $3, $3, 'UP', 'linux')`, "st-"+id, id, memGB*gib)
	for _, tag := range tags {
		e.exec(`INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type) VALUES ($1, $2, $3, 'MANUAL')`,
			"tag-"+id+"-"+tag, id, tag)
	}
}

func pgReq(tags ...string) Request {
	return Request{FacilityID: seedFacilityLocal, ShowID: seedShowTesting, Tags: tags, Profile: Profile{CoresMin: 100}}
}

// eventually waits (on the cache's change notifications) until cond holds.
func (e *pgEnv) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := e.c.Changed()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			e.t.Fatalf("cache did not converge: %s", what)
		}
	}
}

func (e *pgEnv) offered(r Request) map[string]bool {
	out := map[string]bool{}
	var held []string
	for {
		h, err := e.c.Checkout(context.Background(), r)
		if err != nil {
			break
		}
		out[h.ID] = true
		held = append(held, h.ID)
	}
	for _, id := range held {
		e.c.Release(id)
	}
	return out
}

func (e *pgEnv) checkInvariants() {
	e.t.Helper()
	if err := e.c.checkInvariants(); err != nil {
		e.t.Fatal(err)
	}
}

// TestConvergesWithPostgres changes hosts with plain SQL and watches the
// cache follow: insert, idle values, lock, down, re-tag, move, delete, plus
// ALTER TABLE ADD COLUMN and TRUNCATE. After the initial snapshot the cache
// issues no query except the one re-snapshot the TRUNCATE asks for.
func TestConvergesWithPostgres(t *testing.T) {
	t.Parallel()
	e := startPG(t, Config{}, func(e *pgEnv) {
		e.addHost("h1", seedAllocGeneral, 8, 16, "general")
		e.addHost("h2", seedAllocGeneral, 16, 32, "general", "fx")
	})
	general := pgReq("general")
	has := func(r Request, ids ...string) func() bool {
		return func() bool {
			got := e.offered(r)
			if len(got) != len(ids) {
				return false
			}
			for _, id := range ids {
				if !got[id] {
					return false
				}
			}
			return true
		}
	}
	e.eventually("snapshot hosts", has(general, "h1", "h2"))

	e.addHost("h3", seedAllocGeneral, 4, 8, "general")
	e.eventually("inserted host appears", has(general, "h1", "h2", "h3"))

	e.exec(`UPDATE host SET int_cores_idle = 250, int_mem_idle = $1 WHERE pk_host = 'h1'`, 3*gib)
	e.eventually("idle values", func() bool {
		h, indexed, _ := e.c.Lookup("h1", seedShowTesting)
		return indexed && h.IdleCores == 250 && h.IdleMemKB == 3*gib
	})
	big := pgReq("general")
	big.CoresMin = 300
	e.eventually("a 2.5-core host no longer fits 3 cores", has(big, "h2", "h3"))
	e.exec(`UPDATE host_stat SET int_mem_free = $1 WHERE pk_host = 'h2'`, 1*gib)
	e.eventually("idle memory is least(host, host_stat)", func() bool {
		h, _, _ := e.c.Lookup("h2", seedShowTesting)
		return h.IdleMemKB == 1*gib
	})

	e.exec(`UPDATE host SET str_lock_state = 'LOCKED' WHERE pk_host = 'h1'`)
	e.eventually("locked host vanishes", has(general, "h2", "h3"))
	e.exec(`UPDATE host SET str_lock_state = 'OPEN' WHERE pk_host = 'h1'`)
	e.eventually("unlocked host is back", has(general, "h1", "h2", "h3"))

	e.exec(`UPDATE host_stat SET str_state = 'DOWN' WHERE pk_host = 'h3'`)
	e.eventually("down host vanishes", has(general, "h1", "h2"))
	e.exec(`UPDATE host_stat SET str_state = 'UP' WHERE pk_host = 'h3'`)
	e.eventually("up host is back", has(general, "h1", "h2", "h3"))

	e.exec(`DELETE FROM host_tag WHERE pk_host = 'h2' AND str_tag = 'general'`)
	e.eventually("re-tagged host leaves the old tag", has(general, "h1", "h3"))
	e.eventually("and stays in its other tag", has(pgReq("fx"), "h2"))
	e.exec(`UPDATE host_tag SET str_tag = 'comp' WHERE pk_host = 'h2' AND str_tag = 'fx'`)
	e.eventually("renamed tag", has(pgReq("comp"), "h2"))
	e.eventually("old tag empty", has(pgReq("fx")))

	e.exec(`UPDATE host SET pk_alloc = $1 WHERE pk_host = 'h3'`, seedAllocDesktop)
	e.eventually("moved to another subscribed alloc", has(general, "h1", "h3"))
	e.exec(`UPDATE host SET pk_alloc = $1 WHERE pk_host = 'h3'`, seedAllocUnassign)
	e.eventually("moved to an unsubscribed alloc", has(general, "h1"))
	e.exec(`INSERT INTO subscription (pk_subscription, pk_alloc, pk_show, int_size, int_burst) VALUES ('sub-new', $1, $2, 100, 100)`,
		seedAllocUnassign, seedShowTesting)
	e.eventually("alloc subscribed", has(general, "h1", "h3"))
	e.exec(`DELETE FROM subscription WHERE pk_subscription = 'sub-new'`)
	e.eventually("subscription dropped", has(general, "h1"))

	e.exec(`DELETE FROM host WHERE pk_host = 'h3'`) // the trigger deletes its host_stat and host_tag rows
	e.eventually("deleted host", func() bool { _, _, found := e.c.Lookup("h3", seedShowTesting); return !found })

	e.exec(`ALTER TABLE host ADD COLUMN x_extra int DEFAULT 5`)
	e.exec(`UPDATE host SET int_cores_idle = 700 WHERE pk_host = 'h1'`)
	e.eventually("updates after ALTER TABLE ADD COLUMN", func() bool {
		h, _, _ := e.c.Lookup("h1", seedShowTesting)
		return h.IdleCores == 700
	})
	if n := promread.Value(t, e.reg, "scheduler_host_cache_snapshots_total"); n != 1 {
		t.Fatalf("%v snapshots before the truncate: the cache queried again", n)
	}

	e.exec(`TRUNCATE host_tag`)
	e.eventually("TRUNCATE host_tag empties the groups", has(general))
	e.exec(`INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type) VALUES ('t1', 'h1', 'general', 'MANUAL')`)
	e.eventually("streaming continues after the resync", has(general, "h1"))
	if n := promread.Value(t, e.reg, "scheduler_host_cache_snapshots_total"); n != 2 {
		t.Fatalf("snapshots = %v, want 2 (initial + truncate)", n)
	}
	e.checkInvariants()
	if st := promread.Value(t, e.reg, "scheduler_host_cache_staleness_seconds"); st > 5 {
		t.Fatalf("staleness %v s", st)
	}
	if v := promread.Value(t, e.reg, "scheduler_replication_transactions_applied_total"); v < 10 {
		t.Fatalf("replication metrics not registered under scheduler_replication_: %v", v)
	}
}

// dbState reads every host the cache should hold for the seed show, as
// (idle centicores, least(idle mem, free mem), eligible).
func (e *pgEnv) dbState() map[string][3]int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `
		SELECT h.pk_host, h.int_cores_idle, LEAST(h.int_mem_idle, hs.int_mem_free),
		       (h.str_lock_state = 'OPEN' AND hs.str_state = 'UP')::int
		FROM host h JOIN host_stat hs ON hs.pk_host = h.pk_host`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][3]int64{}
	for rows.Next() {
		var id string
		var v [3]int64
		if err := rows.Scan(&id, &v[0], &v[1], &v[2]); err != nil {
			e.t.Fatal(err)
		}
		out[id] = v
	}
	return out
}

func (e *pgEnv) cacheMatchesDB(db map[string][3]int64) bool {
	for id, v := range db {
		h, indexed, found := e.c.Lookup(id, seedShowTesting)
		if !found || h.IdleCores != v[0] || h.IdleMemKB != v[1] || indexed != (v[2] == 1) {
			return false
		}
	}
	return e.c.Stats().Hosts == len(db)
}

// TestResnapshotsAfterWalsenderTerminate kills the replication connection
// while updates keep committing: the temporary slot is gone, the cache
// re-snapshots and converges to exactly the database's state.
func TestResnapshotsAfterWalsenderTerminate(t *testing.T) {
	t.Parallel()
	const n = 40
	e := startPG(t, Config{}, func(e *pgEnv) {
		for i := range n {
			e.addHost(fmt.Sprintf("h%02d", i), seedAllocGeneral, 16, 64, "general")
		}
	})
	e.offered(pgReq("general")) // build the group
	ctx, cancel := context.WithCancel(context.Background())
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		rng := rand.New(rand.NewPCG(1, 2))
		for ctx.Err() == nil {
			id := fmt.Sprintf("h%02d", rng.IntN(n))
			var err error
			if rng.IntN(5) == 0 {
				_, err = e.pool.Exec(context.Background(), `UPDATE host SET str_lock_state = $1 WHERE pk_host = $2`,
					[]string{"OPEN", "LOCKED"}[rng.IntN(2)], id)
			} else {
				_, err = e.pool.Exec(context.Background(), `UPDATE host SET int_cores_idle = $1, int_mem_idle = $2 WHERE pk_host = $3`,
					rng.Int64N(17)*100, rng.Int64N(65)*gib, id)
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for kills := 0; kills < 3; {
		// Kill a session that is streaming (not one still creating its slot).
		e.eventually("a streaming session", func() bool {
			return promread.Value(t, e.reg, "scheduler_host_cache_snapshots_total") >= float64(kills+1)
		})
		time.Sleep(150 * time.Millisecond)
		var k int
		if err := e.pool.QueryRow(context.Background(),
			`SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1 AND active`, e.slot).Scan(&k); err != nil {
			t.Fatal(err)
		}
		kills += k
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-writerDone
	db := e.dbState()
	e.eventually("cache equals the database after the reconnects", func() bool { return e.cacheMatchesDB(db) })
	if n := promread.Value(t, e.reg, "scheduler_host_cache_snapshots_total"); n < 4 {
		t.Fatalf("snapshots = %v after 3 terminations", n)
	}
	if n := promread.Value(t, e.reg, "scheduler_replication_reconnects_total"); n < 3 {
		t.Fatalf("reconnects = %v", n)
	}
	e.checkInvariants()
}

// Many goroutines check out and in against a real stream of UPDATEs.
func TestConcurrentCheckoutsWithPostgres(t *testing.T) {
	t.Parallel()
	const n = 100
	e := startPG(t, Config{}, func(e *pgEnv) {
		for i := range n {
			e.addHost(fmt.Sprintf("h%03d", i), seedAllocGeneral, 16, 64, "general", []string{"fx", "comp"}[i%2])
		}
	})
	holders := map[string]*atomic.Int32{}
	for i := range n {
		holders[fmt.Sprintf("h%03d", i)] = new(atomic.Int32)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var checkouts, violations, walTxns atomic.Int64
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for ctx.Err() == nil {
				r := pgReq([]string{"general", "fx", "comp"}[rng.IntN(3)])
				r.CoresMin = rng.Int64N(8)*100 + 100
				h, err := e.c.Checkout(context.Background(), r)
				if errors.Is(err, ErrNoCandidate) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				checkouts.Add(1)
				if holders[h.ID].Add(1) != 1 {
					violations.Add(1)
				}
				time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
				holders[h.ID].Add(-1)
				e.c.Release(h.ID)
			}
		}()
	}
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for ctx.Err() == nil {
				id := fmt.Sprintf("h%03d", rng.IntN(n))
				if _, err := e.pool.Exec(context.Background(), `UPDATE host SET int_cores_idle = $1, int_mem_idle = $2,
					str_lock_state = $3 WHERE pk_host = $4`, rng.Int64N(17)*100, rng.Int64N(65)*gib,
					[]string{"OPEN", "OPEN", "OPEN", "LOCKED"}[rng.IntN(4)], id); err != nil && ctx.Err() == nil {
					t.Error(err)
					return
				}
				walTxns.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if err := e.c.checkInvariants(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	wg.Wait()
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d times a host was held by two callers", v)
	}
	if checkouts.Load() < 200 || walTxns.Load() < 100 {
		t.Fatalf("too little load: %d checkouts, %d updates", checkouts.Load(), walTxns.Load())
	}
	db := e.dbState()
	e.eventually("cache equals the database", func() bool { return e.cacheMatchesDB(db) })
	e.checkInvariants()
	t.Logf("%d checkouts against %d committed updates", checkouts.Load(), walTxns.Load())
}

// TestIgnoresSameNamedTablesInAnotherSchema: tables named like the mirrored
// ones in another schema (shadow.host, shadow.host_stat, shadow.host_tag,
// shadow.subscription), added to the publication and written with poisoned
// copies of the real rows, change nothing in the cache (no host locked,
// filled, downed, untagged, unsubscribed or invented, no re-snapshot for
// their TRUNCATE), while the real tables' writes still arrive.
func TestIgnoresSameNamedTablesInAnotherSchema(t *testing.T) {
	t.Parallel()
	shadowed := []string{"host", "host_stat", "host_tag", "subscription"}
	e := startPG(t, Config{}, func(e *pgEnv) {
		e.addHost("h1", seedAllocGeneral, 8, 16, "general")
		e.addHost("h2", seedAllocGeneral, 16, 32, "general")
		e.exec(`CREATE SCHEMA shadow`)
		for _, tb := range shadowed {
			e.exec(fmt.Sprintf(`CREATE TABLE shadow.%[1]s (LIKE public.%[1]s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)`, tb))
			e.exec(fmt.Sprintf(`ALTER TABLE shadow.%s REPLICA IDENTITY FULL`, tb))
			e.exec(fmt.Sprintf(`ALTER PUBLICATION cuesched_hostcache ADD TABLE shadow.%s`, tb))
			e.exec(fmt.Sprintf(`INSERT INTO shadow.%[1]s SELECT * FROM public.%[1]s`, tb))
		}
	})
	general := pgReq("general")
	both := func() bool { got := e.offered(general); return len(got) == 2 && got["h1"] && got["h2"] }
	e.eventually("snapshot hosts", both)

	// barrier commits a real change after the shadow writes: once the cache
	// shows it, every shadow write before it has been through Apply (commit
	// order).
	barrier := func(cores int64) {
		t.Helper()
		e.exec(`UPDATE host SET int_cores_idle = $1 WHERE pk_host = 'h1'`, cores)
		e.eventually("the real table's update", func() bool {
			h, _, _ := e.c.Lookup("h1", seedShowTesting)
			return h.IdleCores == cores
		})
	}
	check := func(phase string) {
		t.Helper()
		if got := e.offered(general); len(got) != 2 || !got["h1"] || !got["h2"] {
			t.Fatalf("%s: offered %v, want h1 and h2: shadow rows reached the cache", phase, got)
		}
		h2, indexed, _ := e.c.Lookup("h2", seedShowTesting)
		if !indexed || h2.IdleCores != 1600 || h2.IdleMemKB != 32*gib {
			t.Errorf("%s: h2 = %+v (indexed %v), want 16 idle cores and 32 GiB", phase, h2, indexed)
		}
		if _, _, found := e.c.Lookup("ghost", seedShowTesting); found {
			t.Errorf("%s: a host inserted into shadow.host is in the cache", phase)
		}
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM public.host`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if got := e.c.Stats().Hosts; got != n {
			t.Errorf("%s: cache holds %d hosts, public.host %d", phase, got, n)
		}
		if s := promread.Value(t, e.reg, "scheduler_host_cache_snapshots_total"); s != 1 {
			t.Errorf("%s: snapshots = %v: a shadow TRUNCATE made the cache re-snapshot", phase, s)
		}
		if r := promread.Value(t, e.reg, "scheduler_replication_reconnects_total"); r != 0 {
			t.Errorf("%s: the stream reconnected %v times", phase, r)
		}
	}

	for _, sql := range []string{
		`UPDATE shadow.host SET int_cores_idle = 0, int_mem_idle = 0, str_lock_state = 'LOCKED'`,
		`UPDATE shadow.host_stat SET str_state = 'DOWN', int_mem_free = 0`,
		`DELETE FROM shadow.host_tag WHERE pk_host = 'h1'`,
		`DELETE FROM shadow.subscription`,
		`INSERT INTO shadow.host (pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_cores_idle, int_mem, int_mem_idle, int_thread_mode)
			VALUES ('ghost', '` + seedAllocGeneral + `', 'ghost', 'OPEN', 6400, 6400, 1048576, 1048576, 0)`,
		`INSERT INTO shadow.host_stat (pk_host_stat, pk_host, int_mem_total, int_mem_free, str_state, str_os)
			VALUES ('st-ghost', 'ghost', 1048576, 1048576, 'UP', 'linux')`,
		`INSERT INTO shadow.host_tag (pk_host_tag, pk_host, str_tag, str_tag_type) VALUES ('tag-ghost', 'ghost', 'general', 'MANUAL')`,
	} {
		e.exec(sql)
	}
	barrier(250)
	check("updates, deletes and inserts")

	// TRUNCATE and DELETE of the look-alikes: no re-snapshot, no host gone.
	e.exec(`TRUNCATE shadow.host_stat`)
	e.exec(`TRUNCATE shadow.host_tag, shadow.subscription`)
	e.exec(`DELETE FROM shadow.host`)
	barrier(300)
	check("truncates")

	// And the real tables still drive it.
	e.exec(`UPDATE host SET str_lock_state = 'LOCKED' WHERE pk_host = 'h2'`)
	e.eventually("a real lock", func() bool { got := e.offered(general); return len(got) == 1 && got["h1"] })
	e.exec(`TRUNCATE host_tag`)
	e.eventually("a real TRUNCATE re-snapshots", func() bool {
		return promread.Value(t, e.reg, "scheduler_host_cache_snapshots_total") == 2 && len(e.offered(general)) == 0
	})
	e.checkInvariants()
}

// TestOSListsWithPostgres: host_stat.str_os is a comma-separated list, as
// Cuebot reads it. A layer whose job needs an OS may use a host listing it
// among others; a job with no OS may use any host, one reporting no OS
// included. The list is split when the row arrives (snapshot or WAL), and a
// host listing the OS a checkout missed for wakes it when it frees room.
func TestOSListsWithPostgres(t *testing.T) {
	t.Parallel()
	e := startPG(t, Config{}, func(e *pgEnv) {
		for id, os := range map[string]string{"multi": "rhel7,rhel9", "rhel9": "rhel9", "spaced": " rhel7 , centos7 ,", "none": ""} {
			e.addHost(id, seedAllocGeneral, 8, 16, "general")
			e.exec(`UPDATE host_stat SET str_os = $2 WHERE pk_host = $1`, id, os)
		}
	})
	osReq := func(os string) Request { r := pgReq("general"); r.OS = os; return r }
	expect := func(what string, os string, ids ...string) {
		t.Helper()
		e.eventually(what, func() bool {
			got := e.offered(osReq(os))
			if len(got) != len(ids) {
				return false
			}
			for _, id := range ids {
				if !got[id] {
					return false
				}
			}
			return true
		})
	}
	expect("no OS requirement takes every host", "", "multi", "rhel9", "spaced", "none")
	expect("rhel9 on the host listing it second and the rhel9 host", "rhel9", "multi", "rhel9")
	expect("rhel7 on both lists naming it, spaces trimmed", "rhel7", "multi", "spaced")
	expect("centos7 on the spaced list", "centos7", "spaced")
	expect("an OS no host lists", "rhel8", nil...)
	expect("case-sensitive, as Cuebot compares", "RHEL9", nil...)

	// A change of the list streams in and is split again.
	e.exec(`UPDATE host_stat SET str_os = 'rhel8, rhel9' WHERE pk_host = 'rhel9'`)
	expect("rhel8 after the host added it", "rhel8", "rhel9")
	expect("and it still serves rhel9", "rhel9", "multi", "rhel9")
	e.exec(`UPDATE host_stat SET str_os = 'rhel7' WHERE pk_host = 'multi'`)
	expect("multi no longer serves rhel9", "rhel9", "rhel9")

	// Capacity wake-up: a rhel7 request that misses for lack of room is
	// woken by the list host freeing room.
	e.exec(`UPDATE host SET int_cores_idle = 0 WHERE pk_host IN ('multi', 'spaced')`)
	expect("no rhel7 host with room", "rhel7", nil...)
	_, err := e.c.Checkout(context.Background(), osReq("rhel7"))
	var miss *NoCandidateError
	if !errors.As(err, &miss) {
		t.Fatalf("checkout = %v, want a miss with a watch", err)
	}
	e.exec(`UPDATE host SET int_cores_idle = 800 WHERE pk_host = 'spaced'`)
	e.eventually("the miss's watch moves when a host listing rhel7 frees room", miss.Watch.Moved)
	expect("spaced serves rhel7 again", "rhel7", "spaced")
	e.checkInvariants()
}
