package hostcache

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cuesched/cuesched/shared/replication"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// farm is a test harness that feeds the cache synthetic replication
// transactions (the same code path as the WAL) without a database. It keeps
// the current rows so updates can send whole tuples like pgoutput does.

var tableCols = map[string][]string{
	"facility":     {"pk_facility", "str_name"},
	"show":         {"pk_show", "str_name"},
	"alloc":        {"pk_alloc", "str_name", "pk_facility", "str_tag"},
	"subscription": {"pk_subscription", "pk_alloc", "pk_show", "int_burst", "int_cores"},
	"host_stat":    {"pk_host_stat", "pk_host", "int_mem_total", "int_mem_free", "int_gpu_mem_free", "str_state", "str_os", "ts_ping"},
	"host_tag":     {"pk_host_tag", "pk_host", "str_tag", "str_tag_type"},
	"host": {"pk_host", "pk_alloc", "str_name", "str_lock_state", "int_cores", "int_cores_idle", "int_mem_idle",
		"int_gpus_idle", "int_gpu_mem_idle", "int_thread_mode", "int_gpus", "int_gpu_mem"},
}

var pkOf = map[string]string{
	"facility": "pk_facility", "show": "pk_show", "alloc": "pk_alloc", "subscription": "pk_subscription",
	"host_stat": "pk_host_stat", "host_tag": "pk_host_tag", "host": "pk_host",
}

type farm struct {
	t    testing.TB
	c    *Cache
	lsn  replication.LSN
	xid  uint32
	rels map[string]*replication.Relation
	bld  map[string]replication.RowBuilder
	rows map[string]map[string]map[string]any // table -> pk -> column -> value
}

const (
	facA   = "fac-a"
	facB   = "fac-b"
	showS  = "show-s"
	showT  = "show-t"
	allocA = "alloc-a" // facility A, subscribed by S
	allocB = "alloc-b" // facility A, subscribed by nobody
	allocC = "alloc-c" // facility B, subscribed by S
)

const gib = int64(1024 * 1024) // KB

func newFarm(t testing.TB, cfg Config, opts Options) *farm {
	t.Helper()
	if cfg.ConnString == "" {
		cfg.ConnString = "postgres://unused@127.0.0.1:1/none"
	}
	c, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &farm{t: t, c: c, lsn: 0x1000000, rels: map[string]*replication.Relation{}, bld: map[string]replication.RowBuilder{},
		rows: map[string]map[string]map[string]any{}}
	id := uint32(16384)
	for table, names := range tableCols {
		cols := make([]replication.Column, len(names))
		for i, n := range names {
			cols[i] = replication.Column{Name: n, Key: n == pkOf[table]}
		}
		id++
		f.rels[table] = replication.NewRelation(id, "public", table, cols)
		f.bld[table] = replication.NewRowBuilder(cols)
		f.rows[table] = map[string]map[string]any{}
	}
	// Base topology, loaded by the snapshot.
	f.put("facility", map[string]any{"pk_facility": facA, "str_name": "a"})
	f.put("facility", map[string]any{"pk_facility": facB, "str_name": "b"})
	f.put("show", map[string]any{"pk_show": showS, "str_name": "s"})
	f.put("show", map[string]any{"pk_show": showT, "str_name": "t"})
	f.put("alloc", map[string]any{"pk_alloc": allocA, "str_name": "a.a", "pk_facility": facA, "str_tag": "a"})
	f.put("alloc", map[string]any{"pk_alloc": allocB, "str_name": "a.b", "pk_facility": facA, "str_tag": "b"})
	f.put("alloc", map[string]any{"pk_alloc": allocC, "str_name": "b.c", "pk_facility": facB, "str_tag": "c"})
	f.put("subscription", map[string]any{"pk_subscription": "sub-sa", "pk_alloc": allocA, "pk_show": showS, "int_burst": int64(100000), "int_cores": int64(500)})
	f.put("subscription", map[string]any{"pk_subscription": "sub-sc", "pk_alloc": allocC, "pk_show": showS, "int_burst": int64(100000), "int_cores": int64(0)})
	f.snapshot()
	return f
}

func (f *farm) put(table string, vals map[string]any) {
	f.rows[table][vals[pkOf[table]].(string)] = maps.Clone(vals)
}

func (f *farm) row(table string, vals map[string]any) replication.Row {
	names := tableCols[table]
	ds := make([]replication.Datum, len(names))
	for i, n := range names {
		v, ok := vals[n]
		switch {
		case !ok || v == nil:
			ds[i] = replication.Datum{State: replication.Null}
		case v == unchanged:
			ds[i] = replication.Datum{State: replication.Unchanged}
		default:
			ds[i] = replication.Value(v)
		}
	}
	return f.bld[table].Row(ds...)
}

type unchangedMarker struct{}

var unchanged any = unchangedMarker{}

// fakeQuerier serves the snapshot queries from the farm's rows.
type fakeQuerier struct {
	f  *farm
	cp replication.LSN
}

func (q fakeQuerier) ConsistentPoint() replication.LSN { return q.cp }

func (q fakeQuerier) Query(ctx context.Context, sql string, fn func(replication.Row) error) error {
	if strings.Contains(sql, "to_regclass") {
		// replication.ResolveTables: every mirrored table is in public, the
		// schema of the farm's relations.
		b := replication.NewRowBuilder([]replication.Column{{Name: "name"}, {Name: "nspname"}})
		for _, t := range cachedTables() {
			if err := fn(b.Row(replication.Value(t), replication.Value("public"))); err != nil {
				return err
			}
		}
		return nil
	}
	for _, sq := range snapshotQueries {
		if sq.sql != sql {
			continue
		}
		keys := make([]string, 0, len(q.f.rows[sq.table]))
		for k := range q.f.rows[sq.table] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := fn(q.f.row(sq.table, q.f.rows[sq.table][k])); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unexpected snapshot query %q", sql)
}

func (f *farm) snapshot() {
	f.t.Helper()
	f.lsn += 0x100
	if err := f.c.Snapshot(context.Background(), fakeQuerier{f: f, cp: f.lsn}); err != nil {
		f.t.Fatal(err)
	}
}

// Change builders.

func (f *farm) ins(table string, vals map[string]any) replication.Change {
	f.put(table, vals)
	return replication.Change{Op: replication.Insert, Relation: f.rels[table], New: f.row(table, vals)}
}

// upd merges vals into the current row and sends the whole new tuple
// (columns set to `unchanged` are sent as unchanged TOAST).
func (f *farm) upd(table, pk string, vals map[string]any) replication.Change {
	cur := f.rows[table][pk]
	if cur == nil {
		f.t.Fatalf("update of missing %s %s", table, pk)
	}
	sent := maps.Clone(cur)
	for k, v := range vals {
		sent[k] = v
		if v != unchanged {
			cur[k] = v
		}
	}
	return replication.Change{Op: replication.Update, Relation: f.rels[table], New: f.row(table, sent)}
}

func (f *farm) del(table, pk string) replication.Change {
	delete(f.rows[table], pk)
	key := map[string]any{pkOf[table]: pk}
	return replication.Change{Op: replication.Delete, Relation: f.rels[table], Old: f.row(table, key), OldKind: 'K'}
}

func (f *farm) truncate(table string) replication.Change {
	f.rows[table] = map[string]map[string]any{}
	return replication.Change{Op: replication.Truncate, Relation: f.rels[table]}
}

// commit applies the changes as one transaction.
func (f *farm) commit(changes ...replication.Change) error {
	f.xid++
	f.lsn += 0x100
	txn := &replication.Transaction{XID: f.xid, BeginLSN: f.lsn - 0x80, CommitLSN: f.lsn, EndLSN: f.lsn + 0x30,
		CommitTime: time.Now(), Changes: changes}
	return f.c.Apply(context.Background(), txn)
}

func (f *farm) mustCommit(changes ...replication.Change) {
	f.t.Helper()
	if err := f.commit(changes...); err != nil {
		f.t.Fatal(err)
	}
	f.checkInvariants()
}

func (f *farm) checkInvariants() {
	f.t.Helper()
	if err := f.c.checkInvariants(); err != nil {
		f.t.Fatal(err)
	}
}

type hostSpec struct {
	id                string
	alloc             string
	cores, idleCores  int64 // whole cores
	memGB, idleMemGB  int64
	freeMemGB         int64 // host_stat free; defaults to idleMemGB
	gpus              int64
	gpuMemGB, gpuFree int64
	os                string
	threadMode        int64
	lock, state       string
	tags              []string
}

func (f *farm) hostChanges(h hostSpec) []replication.Change {
	if h.alloc == "" {
		h.alloc = allocA
	}
	if h.lock == "" {
		h.lock = "OPEN"
	}
	if h.state == "" {
		h.state = "UP"
	}
	if h.os == "" {
		h.os = "linux"
	}
	if h.freeMemGB == 0 {
		h.freeMemGB = h.idleMemGB
	}
	if h.gpuFree == 0 {
		h.gpuFree = h.gpuMemGB
	}
	if h.tags == nil {
		h.tags = []string{"general"}
	}
	cs := []replication.Change{
		f.ins("host", map[string]any{"pk_host": h.id, "pk_alloc": h.alloc, "str_name": "name-" + h.id, "str_lock_state": h.lock,
			"int_cores": h.cores * 100, "int_cores_idle": h.idleCores * 100, "int_mem_idle": h.idleMemGB * gib,
			"int_gpus_idle": h.gpus, "int_gpu_mem_idle": h.gpuMemGB * gib, "int_thread_mode": h.threadMode,
			"int_gpus": h.gpus, "int_gpu_mem": h.gpuMemGB * gib}),
		f.ins("host_stat", map[string]any{"pk_host_stat": "st-" + h.id, "pk_host": h.id, "int_mem_total": h.memGB * gib,
			"int_mem_free": h.freeMemGB * gib, "int_gpu_mem_free": h.gpuFree * gib, "str_state": h.state, "str_os": h.os,
			"ts_ping": time.Now()}),
	}
	for _, t := range h.tags {
		cs = append(cs, f.ins("host_tag", map[string]any{"pk_host_tag": "tag-" + h.id + "-" + t, "pk_host": h.id, "str_tag": t, "str_tag_type": "MANUAL"}))
	}
	return cs
}

func (f *farm) addHosts(hs ...hostSpec) {
	f.t.Helper()
	var cs []replication.Change
	for _, h := range hs {
		cs = append(cs, f.hostChanges(h)...)
	}
	f.mustCommit(cs...)
}

func req(tags ...string) Request {
	if len(tags) == 0 {
		tags = []string{"general"}
	}
	return Request{FacilityID: facA, ShowID: showS, Tags: tags, Profile: Profile{CoresMin: 100}}
}

// ids checks out hosts until none is left and returns them in order (and
// checks them back in unchanged).
func (f *farm) drain(r Request) []string {
	f.t.Helper()
	var out []string
	for {
		h, err := f.c.Checkout(context.Background(), r)
		if err != nil {
			break
		}
		out = append(out, h.ID)
	}
	for _, id := range out {
		f.c.Release(id)
	}
	f.checkInvariants()
	return out
}

func (f *farm) first(r Request) string {
	f.t.Helper()
	h, err := f.c.Checkout(context.Background(), r)
	if err != nil {
		return ""
	}
	f.c.Release(h.ID)
	return h.ID
}
