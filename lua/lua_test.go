package lua_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/lua"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type env struct {
	t   *testing.T
	ctx context.Context
	rdb *redis.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	t.Parallel()
	opt, err := redis.ParseURL(testenv.NewRedisDB(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return &env{t: t, ctx: context.Background(), rdb: rdb}
}

// ids used by most tests.
const (
	show, alloc, folder, job, layer, dept = "S", "A", "F", "J", "L", "D"
)

var (
	subK    = "acct:sub:" + show + ":" + alloc
	folderK = "acct:folder:" + folder
	jobK    = "acct:job:" + job
	layerK  = "acct:layer:" + layer
	pointK  = "acct:point:" + dept + ":" + show
)

func bookKeys(proc string) []string {
	return []string{subK, folderK, jobK, layerK, pointK, "acct:seq", "acct:proc:" + proc,
		"acct:show:" + show, "acct:procs:" + show, "acct:tomb:" + proc, "acct:rep:" + show, "acct:repc:" + show, "acct:repg:" + show}
}

func (e *env) eval(src string, keys []string, args ...any) ([]any, error) {
	e.t.Helper()
	v, err := e.rdb.Eval(e.ctx, src, keys, args...).Result()
	if err != nil {
		return nil, err
	}
	return v.([]any), nil
}

func (e *env) mustEval(src string, keys []string, args ...any) []any {
	e.t.Helper()
	v, err := e.eval(src, keys, args...)
	if err != nil {
		e.t.Fatalf("eval: %v", err)
	}
	return v
}

func (e *env) book(mode, proc string, cores, centi, gpus int, seeds ...string) []any {
	e.t.Helper()
	args := []any{mode, proc, show, cores, centi, gpus}
	for i := 0; i < 4; i++ {
		if i < len(seeds) {
			args = append(args, seeds[i])
		} else {
			args = append(args, "")
		}
	}
	return e.mustEval(lua.Book(), bookKeys(proc), args...)
}

func (e *env) seed() {
	e.t.Helper()
	p := e.rdb.Pipeline()
	p.HSet(e.ctx, subK, "size", 10, "burst", 20)
	p.HSet(e.ctx, folderK, "int_max_cores", -1, "int_max_gpus", -1)
	p.HSet(e.ctx, jobK, "int_max_cores", 12, "int_max_gpus", 2)
	p.HSet(e.ctx, "acct:show:"+show, "seeded", "epoch1")
	if _, err := p.Exec(e.ctx); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) field(key, f string) int64 {
	e.t.Helper()
	v, err := e.rdb.HGet(e.ctx, key, f).Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		e.t.Fatalf("HGET %s %s: %v", key, f, err)
	}
	return v
}

func (e *env) counters(key string) string {
	return fmt.Sprintf("%d/%d", e.field(key, "int_cores"), e.field(key, "int_gpus"))
}

func (e *env) expectAll(want string) {
	e.t.Helper()
	for _, k := range []string{subK, folderK, jobK, layerK, pointK} {
		if got := e.counters(k); got != want {
			e.t.Errorf("%s cores/gpus = %s, want %s", k, got, want)
		}
	}
}

func (e *env) seq() int64 {
	v, err := e.rdb.Get(e.ctx, "acct:seq").Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return v
}

func reply(v []any) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, " ")
}

func TestBookChargesAllFiveAndRecords(t *testing.T) {
	e := newEnv(t)
	e.seed()
	if got := reply(e.book("check", "p1", 4, 350, 1)); got != "1 1" {
		t.Fatalf("book = %q, want \"1 1\"", got)
	}
	e.expectAll("4/1")
	rec, err := e.rdb.HGetAll(e.ctx, "acct:proc:p1").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"show": show, "sub": subK, "folder": folderK, "job": jobK, "layer": layerK,
		"point": pointK, "cores": "4", "centi": "350", "gpus": "1", "seq": "1", "origin": "check"}
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("record %s = %q, want %q", k, rec[k], v)
		}
	}
	ts, err := strconv.ParseInt(rec["ts"], 10, 64)
	if err != nil || time.Since(time.UnixMilli(ts)).Abs() > time.Minute {
		t.Errorf("record ts = %q, want Redis time in ms", rec["ts"])
	}
	if ok, _ := e.rdb.SIsMember(e.ctx, "acct:procs:"+show, "p1").Result(); !ok {
		t.Error("proc not added to acct:procs:S")
	}
}

func TestBookIsIdempotent(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.book("check", "p1", 4, 400, 0)
	if got := reply(e.book("check", "p1", 4, 400, 0)); got != "2 1" {
		t.Fatalf("second booking = %q, want duplicate \"2 1\"", got)
	}
	if got := reply(e.book("force", "p1", 4, 400, 0)); got != "2 1" {
		t.Fatalf("forced duplicate = %q, want \"2 1\"", got)
	}
	e.expectAll("4/0")
	if e.seq() != 1 {
		t.Errorf("acct:seq = %d, want 1", e.seq())
	}
}

func TestBookUnseededShowIsAReasonNotAZeroCap(t *testing.T) {
	e := newEnv(t)
	// Caps present but no marker: still unseeded.
	e.rdb.HSet(e.ctx, subK, "burst", 100)
	if got := reply(e.book("check", "p1", 1, 100, 0)); got != "3" {
		t.Fatalf("book on unseeded show = %q, want \"3\"", got)
	}
	e.expectAll("0/0")
	// Force mode is unconditional (it does not consult the gate).
	if got := reply(e.book("force", "p1", 1, 100, 0)); got != "1 1" {
		t.Fatalf("forced booking = %q", got)
	}
}

func TestBookLimits(t *testing.T) {
	cases := []struct {
		name  string
		setup func(e *env)
		cores int
		gpus  int
		want  string
	}{
		{"burst", nil, 21, 0, "0 subscription 0 20"},
		{"burst exact fits", nil, 12, 0, "1 1"},
		{"missing subscription", func(e *env) { e.rdb.HDel(e.ctx, subK, "burst") }, 1, 0, "0 subscription 0 0 missing"},
		{"zero burst is frozen", func(e *env) { e.rdb.HSet(e.ctx, subK, "burst", 0) }, 1, 0, "0 subscription 0 0"},
		{"folder", func(e *env) { e.rdb.HSet(e.ctx, folderK, "int_max_cores", 3, "int_cores", 1) }, 3, 0, "0 folder 1 3"},
		{"folder exact fits", func(e *env) { e.rdb.HSet(e.ctx, folderK, "int_max_cores", 3, "int_cores", 1) }, 2, 0, "1 1"},
		{"folder -1 unlimited", func(e *env) { e.rdb.HSet(e.ctx, folderK, "int_max_cores", -1, "int_cores", 100) }, 3, 0, "1 1"},
		// Cuebot: a folder max of 0 (or any negative value but -1) books nothing.
		{"folder 0 refuses", func(e *env) { e.rdb.HSet(e.ctx, folderK, "int_max_cores", 0) }, 1, 0, "0 folder 0 0"},
		{"folder -2 refuses", func(e *env) { e.rdb.HSet(e.ctx, folderK, "int_max_cores", -2) }, 1, 0, "0 folder 0 -2"},
		{"folder missing cap refuses", func(e *env) { e.rdb.HDel(e.ctx, folderK, "int_max_cores") }, 1, 0, "0 folder 0 0 missing"},
		{"job", func(e *env) { e.rdb.HSet(e.ctx, jobK, "int_cores", 10) }, 3, 0, "0 job 10 12"},
		// Cuebot: a job books only while int_cores + need <= int_max_cores,
		// so 0 and -1 are caps like any other, never "unlimited".
		{"job 0 refuses", func(e *env) { e.rdb.HSet(e.ctx, jobK, "int_max_cores", 0) }, 1, 0, "0 job 0 0"},
		{"job -1 refuses", func(e *env) { e.rdb.HSet(e.ctx, jobK, "int_max_cores", -1) }, 1, 0, "0 job 0 -1"},
		{"job missing cap refuses", func(e *env) { e.rdb.HDel(e.ctx, jobK, "int_max_cores") }, 1, 0, "0 job 0 0 missing"},
		{"folder gpus", func(e *env) { e.rdb.HSet(e.ctx, folderK, "int_max_gpus", 1) }, 1, 2, "0 folder_gpus 0 1"},
		{"folder gpus 0 refuses gpus", func(e *env) { e.rdb.HSet(e.ctx, folderK, "int_max_gpus", 0) }, 1, 1, "0 folder_gpus 0 0"},
		{"folder gpus 0 books cpu", func(e *env) { e.rdb.HSet(e.ctx, folderK, "int_max_gpus", 0) }, 1, 0, "1 1"},
		{"folder gpus -1 unlimited", nil, 1, 2, "1 1"},
		{"job gpus", nil, 1, 3, "0 job_gpus 0 2"},
		{"job gpus exact fits", nil, 1, 2, "1 1"},
		{"job gpus 0 refuses gpus", func(e *env) { e.rdb.HSet(e.ctx, jobK, "int_max_gpus", 0) }, 1, 1, "0 job_gpus 0 0"},
		{"job gpus 0 books cpu", func(e *env) { e.rdb.HSet(e.ctx, jobK, "int_max_gpus", 0) }, 1, 0, "1 1"},
		{"job gpus -1 refuses gpus", func(e *env) { e.rdb.HSet(e.ctx, jobK, "int_max_gpus", -1) }, 1, 1, "0 job_gpus 0 -1"},
		{"job gpus missing refuses gpus", func(e *env) { e.rdb.HDel(e.ctx, jobK, "int_max_gpus") }, 1, 1, "0 job_gpus 0 0 missing"},
		{"job gpus missing books cpu", func(e *env) { e.rdb.HDel(e.ctx, jobK, "int_max_gpus") }, 1, 0, "1 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.seed()
			if tc.setup != nil {
				tc.setup(e)
			}
			before := e.counters(subK)
			got := reply(e.book("check", "p1", tc.cores, tc.cores*100, tc.gpus))
			if got != tc.want {
				t.Fatalf("book = %q, want %q", got, tc.want)
			}
			if strings.HasPrefix(got, "0 ") {
				if e.seq() != 0 || e.counters(subK) != before || e.rdb.Exists(e.ctx, "acct:proc:p1").Val() != 0 {
					t.Errorf("a rejected booking wrote something: seq=%d sub=%s", e.seq(), e.counters(subK))
				}
			}
		})
	}
}

func TestBookForceSkipsChecks(t *testing.T) {
	e := newEnv(t)
	e.seed()
	if got := reply(e.book("force", "p1", 50, 5000, 9)); got != "1 1" {
		t.Fatalf("force = %q", got)
	}
	e.expectAll("50/9")
	if got := e.rdb.HGet(e.ctx, "acct:proc:p1", "origin").Val(); got != "force" {
		t.Errorf("origin = %q", got)
	}
}

func TestBookSeedsMissingCapsOnly(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.rdb.HDel(e.ctx, jobK, "int_max_cores", "int_max_gpus")
	e.rdb.HDel(e.ctx, folderK, "int_max_cores")
	// Job caps missing: the caller's values (from Postgres) are used for this
	// very check; the folder's existing int_max_gpus (-1) is kept.
	if got := reply(e.book("check", "p1", 6, 600, 0, "5", "1", "7", "3")); got != "0 job 0 5" {
		t.Fatalf("book = %q, want job cap 5 from the seed", got)
	}
	if e.field(jobK, "int_max_gpus") != 1 || e.field(folderK, "int_max_cores") != 7 || e.field(folderK, "int_max_gpus") != -1 {
		t.Errorf("caps after seeding: job gpus %d folder cores %d folder gpus %d",
			e.field(jobK, "int_max_gpus"), e.field(folderK, "int_max_cores"), e.field(folderK, "int_max_gpus"))
	}
	// Existing caps are never overwritten by a seed.
	e.book("check", "p2", 1, 100, 0, "500", "", "", "")
	if e.field(jobK, "int_max_cores") != 5 {
		t.Errorf("seed overwrote job cap: %d", e.field(jobK, "int_max_cores"))
	}
}

// TestBookSeededZeroCapsRefuse: caps of 0 that arrive through the caller's
// seed (a job created with max 0 since the last reseed) are written and
// enforced as caps, never mistaken for "not supplied" or "unlimited".
func TestBookSeededZeroCapsRefuse(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.rdb.HDel(e.ctx, jobK, "int_max_cores", "int_max_gpus")
	if got := reply(e.book("check", "p1", 1, 100, 0, "0", "0", "-1", "-1")); got != "0 job 0 0" {
		t.Fatalf("book under a seeded job cap of 0 = %q, want \"0 job 0 0\"", got)
	}
	if v, err := e.rdb.HGet(e.ctx, jobK, "int_max_cores").Result(); err != nil || v != "0" {
		t.Errorf("seeded job int_max_cores = %q, %v; want \"0\" written", v, err)
	}
	// The job's GPU cap of 0 refuses a GPU booking once its core cap allows.
	e.rdb.HSet(e.ctx, jobK, "int_max_cores", 10)
	if got := reply(e.book("check", "p2", 1, 100, 1)); got != "0 job_gpus 0 0" {
		t.Fatalf("GPU booking under a seeded job GPU cap of 0 = %q", got)
	}
	if got := reply(e.book("check", "p3", 1, 100, 0)); got != "1 1" {
		t.Fatalf("CPU booking under a job GPU cap of 0 = %q, want booked", got)
	}
	// A folder seeded with 0 refuses; one seeded with -1 (above) is unlimited.
	e.rdb.Del(e.ctx, folderK)
	if got := reply(e.book("check", "p4", 1, 100, 0, "", "", "0", "-1")); got != "0 folder 0 0" {
		t.Fatalf("book under a seeded folder cap of 0 = %q", got)
	}
}

func TestBookTombstoneRefuses(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.rdb.Set(e.ctx, "acct:tomb:p1", "1", time.Minute)
	if got := reply(e.book("check", "p1", 1, 100, 0)); got != "4" {
		t.Fatalf("book of released proc = %q, want \"4\"", got)
	}
	e.expectAll("0/0")
}

func TestBookRejectsBadArguments(t *testing.T) {
	e := newEnv(t)
	e.seed()
	bad := [][]any{
		{"maybe", "p", show, 1, 100, 0, "", "", "", ""},
		{"check", "", show, 1, 100, 0, "", "", "", ""},
		{"check", "p", "", 1, 100, 0, "", "", "", ""},
		{"check", "p", show, -1, 100, 0, "", "", "", ""},
		{"check", "p", show, 1.5, 100, 0, "", "", "", ""},
		{"check", "p", show, "x", 100, 0, "", "", "", ""},
		{"check", "p", show, 1, 100, 0, "1.5", "", "", ""},
	}
	for _, args := range bad {
		if _, err := e.eval(lua.Book(), bookKeys("p"), args...); err == nil || !strings.Contains(err.Error(), "acct book") {
			t.Errorf("args %v: err = %v, want a clear acct book error", args, err)
		}
	}
	if e.seq() != 0 || e.counters(subK) != "0/0" {
		t.Errorf("bad arguments wrote: seq %d", e.seq())
	}
}

func (e *env) release(mode, lsn string, ids ...string) []any {
	e.t.Helper()
	args := []any{mode, lsn, 60000}
	for _, id := range ids {
		args = append(args, id)
	}
	return e.mustEval(lua.Release(), []string{"acct:seq", "acct:sidecar:lsn"}, args...)
}

func TestReleaseIsRecordDrivenAndIdempotent(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.book("check", "p1", 4, 400, 1)
	e.book("check", "p2", 2, 150, 0)
	if got := reply(e.release("release", "", "p1")); got != "1 1 0 0" {
		t.Fatalf("release = %q", got)
	}
	e.expectAll("2/0")
	if got := reply(e.release("release", "", "p1", "never")); got != "1 0 1 1" {
		t.Fatalf("second release = %q, want already-released 1, never-booked 1", got)
	}
	e.expectAll("2/0")
	if e.rdb.Exists(e.ctx, "acct:proc:p1").Val() != 0 || e.rdb.SIsMember(e.ctx, "acct:procs:"+show, "p1").Val() {
		t.Error("record of p1 left behind")
	}
	if ttl := e.rdb.PTTL(e.ctx, "acct:tomb:never").Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("tombstone TTL = %v, want <= 60s", ttl)
	}
	if e.seq() != 3 {
		t.Errorf("acct:seq = %d, want 3 (two bookings, one release)", e.seq())
	}
}

func TestReleaseUsesTheKeysTheBookingCharged(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.book("check", "p1", 4, 400, 0)
	// Someone moved the job to another folder meanwhile: the release must
	// still undo the charge on the folder the booking was made against.
	e.rdb.HSet(e.ctx, "acct:folder:F2", "int_cores", 0)
	e.release("release", "", "p1")
	if e.counters(folderK) != "0/0" || e.counters("acct:folder:F2") != "0/0" {
		t.Errorf("folders after release: F=%s F2=%s", e.counters(folderK), e.counters("acct:folder:F2"))
	}
}

func TestRollbackLeavesNoTombstone(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.book("check", "p1", 4, 400, 0)
	if got := reply(e.release("rollback", "", "p1")); got != "1 1 0 0" {
		t.Fatalf("rollback = %q", got)
	}
	e.expectAll("0/0")
	if e.rdb.Exists(e.ctx, "acct:tomb:p1").Val() != 0 {
		t.Error("rollback wrote a tombstone")
	}
	if got := reply(e.release("rollback", "", "p1")); got != "1 0 0 1" {
		t.Fatalf("second rollback = %q, want a no-op", got)
	}
	// The proc id can be booked again after a rollback.
	if got := reply(e.book("check", "p1", 4, 400, 0)); got[0] != '1' {
		t.Fatalf("rebooking after rollback = %q", got)
	}
}

func TestReleaseBatchLSNCheckpoint(t *testing.T) {
	e := newEnv(t)
	e.seed()
	for _, p := range []string{"a", "b", "c"} {
		e.book("check", p, 1, 100, 0)
	}
	if got := reply(e.release("release", "00000000000000A0", "a", "b")); got != "1 2 0 0" {
		t.Fatalf("batch = %q", got)
	}
	// A replay of the same transaction, or an older one, changes nothing.
	for _, lsn := range []string{"00000000000000A0", "000000000000009F"} {
		if got := reply(e.release("release", lsn, "c")); got != "0 00000000000000A0" {
			t.Fatalf("stale batch %s = %q", lsn, got)
		}
	}
	e.expectAll("1/0")
	// An empty batch advances the checkpoint (keepalive).
	if got := reply(e.release("release", "00000000000001A0")); got != "1 0 0 0" {
		t.Fatalf("empty batch = %q", got)
	}
	if e.rdb.Get(e.ctx, "acct:sidecar:lsn").Val() != "00000000000001A0" {
		t.Errorf("lsn = %q", e.rdb.Get(e.ctx, "acct:sidecar:lsn").Val())
	}
	for _, bad := range []string{"a0", "00000000000001a0", "0000000000000001A0"} {
		if _, err := e.eval(lua.Release(), []string{"acct:seq", "acct:sidecar:lsn"}, "release", bad, 1000, "c"); err == nil {
			t.Errorf("LSN %q accepted", bad)
		}
	}
	e.expectAll("1/0")
}

type entry struct {
	proc                           string
	sub, folder, job, layer, point string
	cores, centi, gpus             int
}

func defEntry(proc string, cores int) entry {
	return entry{proc, subK, folderK, jobK, layerK, pointK, cores, cores * 100, 0}
}

func (e *env) reconcile(seq0, t0, grace, maxAge int64, present []entry, drop ...string) []any {
	e.t.Helper()
	return e.reconcileLive("-", seq0, t0, grace, maxAge, present, drop...)
}

// reconcileLive is reconcile with the live backends argument ("-" =
// unknown, else comma-separated pids).
func (e *env) reconcileLive(live string, seq0, t0, grace, maxAge int64, present []entry, drop ...string) []any {
	e.t.Helper()
	args := []any{show, seq0, t0, grace, maxAge, live, len(present)}
	for _, p := range present {
		args = append(args, p.proc, p.sub, p.folder, p.job, p.layer, p.point, p.cores, p.centi, p.gpus)
	}
	for _, d := range drop {
		args = append(args, d)
	}
	return e.mustEval(lua.Reconcile(), reconcileKeys, args...)
}

func nowMS() int64 { return time.Now().UnixMilli() }

var reconcileKeys = []string{"acct:seq", "acct:procs:" + show, "acct:rep:" + show, "acct:repc:" + show, "acct:repg:" + show}

func TestReconcileAdoptsSkipsTombstonedAndRetargets(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.book("check", "booked", 2, 200, 0)
	e.rdb.Set(e.ctx, "acct:tomb:gone", "1", time.Minute)
	moved := defEntry("booked", 2)
	moved.folder = "acct:folder:F2"
	got := reply(e.reconcile(e.seq(), nowMS(), 1000, 60000,
		[]entry{defEntry("cuebot", 3), defEntry("gone", 5), moved}))
	// adopted 1, retargeted 1, dropped 0, skipped 1, kept 0; drift: 3 on
	// each table for the adoption, 2+2 on folder for the move.
	if got != "1 1 1 0 1 0 3 7 3 3 3 0" {
		t.Fatalf("reconcile = %q", got)
	}
	if e.counters(subK) != "5/0" || e.counters(folderK) != "3/0" || e.counters("acct:folder:F2") != "2/0" {
		t.Errorf("counters: sub %s folder %s F2 %s", e.counters(subK), e.counters(folderK), e.counters("acct:folder:F2"))
	}
	if o := e.rdb.HGet(e.ctx, "acct:proc:cuebot", "origin").Val(); o != "adopt" {
		t.Errorf("adopted origin = %q", o)
	}
	// A release of the moved proc now undoes F2, where it is charged.
	e.release("release", "", "booked", "cuebot")
	e.expectAll("0/0")
	if e.counters("acct:folder:F2") != "0/0" {
		t.Errorf("F2 = %s", e.counters("acct:folder:F2"))
	}
}

func TestReconcileNeverDropsInFlight(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.book("check", "old", 1, 100, 0)
	seq0 := e.seq() + 1 // "old" was booked before the snapshot began
	e.book("check", "new", 1, 100, 0)
	t0 := nowMS()
	// Grace of 1 minute: "old" is younger than t0 - grace, so it may still be
	// in flight (its INSERT not yet visible): kept.
	if got := reply(e.reconcile(seq0, t0, 60000, 60000, nil, "old", "new")); got != "1 0 0 0 0 2 0 0 0 0 0 0" {
		t.Fatalf("reconcile with grace = %q", got)
	}
	e.expectAll("2/0")
	// Later, with "old" past the grace: dropped; "new" (seq >= seq0) kept.
	if got := reply(e.reconcile(seq0, t0+120000, 60000, 1<<40, nil, "old", "new")); got != "1 0 0 1 0 1 1 1 1 1 1 0" {
		t.Fatalf("reconcile after grace = %q", got)
	}
	e.expectAll("1/0")
}

// bookWithPID books like book, with the backend pid argument (ARGV[14]).
func (e *env) bookWithPID(proc string, cores int, pid string) []any {
	e.t.Helper()
	return e.mustEval(lua.Book(), bookKeys(proc), "check", proc, show, cores, cores*100, 0, "", "", "", "", "", "", "", pid)
}

// TestReconcileDropsRecordsOfGoneBackends: a record whose booking names a
// PostgreSQL backend that is not live any more is orphaned at once, within
// the grace; one whose backend is live, one without a pid, one booked
// after seq0, and every one when liveness is unknown ("-"), are kept.
func TestReconcileDropsRecordsOfGoneBackends(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.bookWithPID("dead", 1, "4242")
	e.bookWithPID("alive", 1, "777")
	e.book("check", "nopid", 1, 100, 0)
	if pid := e.rdb.HGet(e.ctx, "acct:proc:dead", "pid").Val(); pid != "4242" {
		t.Fatalf("record pid = %q, want 4242", pid)
	}
	seq0 := e.seq() + 1
	e.bookWithPID("later", 1, "4242")
	t0 := nowMS()
	drop := []string{"dead", "alive", "nopid", "later"}
	if got := reply(e.reconcileLive("-", seq0, t0, 60000, 60000, nil, drop...)); got != "1 0 0 0 0 4 0 0 0 0 0 0" {
		t.Fatalf("reconcile, liveness unknown = %q", got)
	}
	if got := reply(e.reconcileLive("1,777,90", seq0, t0, 60000, 60000, nil, drop...)); got != "1 0 0 1 0 3 1 1 1 1 1 1" {
		t.Fatalf("reconcile with live backends = %q", got)
	}
	if e.rdb.Exists(e.ctx, "acct:proc:dead").Val() != 0 {
		t.Error("the record of the gone backend is still there")
	}
	e.expectAll("3/0")
	if _, err := e.eval(lua.Book(), bookKeys("bad"), "check", "bad", show, 1, 100, 0, "", "", "", "", "", "", "", "x1"); err == nil ||
		!strings.Contains(err.Error(), "backend pid") {
		t.Fatalf("bad pid: %v", err)
	}
}

func TestReconcileRefusesStaleSnapshot(t *testing.T) {
	e := newEnv(t)
	e.seed()
	got := e.reconcile(0, nowMS()-10000, 0, 5000, []entry{defEntry("x", 1)})
	if got[0].(int64) != -1 {
		t.Fatalf("stale snapshot = %v, want -1", got)
	}
	e.expectAll("0/0")
}

// TestReconcileRefusesARolledBackSeq: acct:seq below the mark read before
// the snapshot means Redis lost writes since (an older snapshot came
// back). Adopting the snapshot's procs would raise acct:seq over the loss
// and hide it from the schedulers' watch: refused, nothing changed.
func TestReconcileRefusesARolledBackSeq(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.book("check", "a", 1, 100, 0)
	e.book("check", "b", 1, 100, 0)
	seq0 := e.seq()
	if err := e.rdb.Set(e.ctx, "acct:seq", seq0-1, 0).Err(); err != nil { // b's write lost
		t.Fatal(err)
	}
	got := e.reconcile(seq0, nowMS(), 0, 60000, []entry{defEntry("cuebot", 3)}, "a")
	if reply(got) != fmt.Sprintf("-2 %d", seq0-1) {
		t.Fatalf("reconcile after acct:seq went back = %q, want -2 %d", reply(got), seq0-1)
	}
	if e.seq() != seq0-1 || e.rdb.Exists(e.ctx, "acct:proc:cuebot").Val() != 0 {
		t.Errorf("the refused reconcile changed Redis: acct:seq %d", e.seq())
	}
	e.expectAll("2/0")
}

func TestReconcileRejectsBadEntries(t *testing.T) {
	e := newEnv(t)
	_, err := e.eval(lua.Reconcile(), reconcileKeys, show, 0, nowMS(), 0, 60000, "-", 2,
		"p", subK, folderK, jobK, layerK, pointK, 1, 100, 0)
	if err == nil || !strings.Contains(err.Error(), "present entries") {
		t.Fatalf("short entries: %v", err)
	}
	_, err = e.eval(lua.Reconcile(), reconcileKeys, show, 0, nowMS(), 0, 60000, "-", 1,
		"p", subK, folderK, jobK, layerK, pointK, -1, 100, 0)
	if err == nil || !strings.Contains(err.Error(), "non-negative") {
		t.Fatalf("negative amount: %v", err)
	}
}

var repairKeys = []string{"acct:procs:" + show, "acct:rep:" + show, "acct:repc:" + show, "acct:repg:" + show}

func (e *env) repair(mode, gen string, args ...any) []any {
	e.t.Helper()
	return e.mustEval(lua.Repair(), repairKeys, append([]any{mode, gen, 60000}, args...)...)
}

// fullRepair runs a whole session: start, scan to the end in batches of 1,
// fix the given keys plus every key the sums name, finish.
func (e *env) fullRepair(gen string, baseline ...string) string {
	e.t.Helper()
	e.repair("start", gen)
	for cursor := "0"; ; {
		v := e.repair("scan", gen, cursor, 1)
		cursor = v[1].(string)
		if cursor == "0" {
			break
		}
	}
	keys := map[string]bool{}
	for _, k := range baseline {
		keys[k] = true
	}
	for _, h := range []string{"acct:repc:" + show, "acct:repg:" + show} {
		for _, k := range e.rdb.HKeys(e.ctx, h).Val() {
			keys[k] = true
		}
	}
	args := []any{}
	for k := range keys {
		args = append(args, k)
	}
	out := reply(e.repair("fix", gen, args...))
	e.repair("finish", gen)
	return out
}

func TestRepairZeroBaselineAndSums(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.book("check", "p1", 3, 300, 1)
	e.book("check", "p2", 2, 200, 0)
	// Drift: a counter edited by hand, and a drained key left stale-high.
	e.rdb.HSet(e.ctx, jobK, "int_cores", 99)
	e.rdb.HSet(e.ctx, "acct:job:J-drained", "int_cores", 7, "int_gpus", 1)
	e.rdb.SAdd(e.ctx, "acct:procs:"+show, "dangling")
	got := e.fullRepair("g1", subK, "acct:job:J-drained", "acct:sub:S:A2")
	// fixed: job (94 cores), J-drained (7), acct:sub:S:A2 (created at 0/0)
	if got != "1 3 0 0 101 0 0" {
		t.Fatalf("repair fix = %q", got)
	}
	e.expectAll("5/1")
	if e.counters("acct:job:J-drained") != "0/0" || e.counters("acct:sub:S:A2") != "0/0" {
		t.Errorf("baseline keys: %s %s", e.counters("acct:job:J-drained"), e.counters("acct:sub:S:A2"))
	}
	if e.rdb.SIsMember(e.ctx, "acct:procs:"+show, "dangling").Val() {
		t.Error("dangling member kept")
	}
	if n := e.rdb.Exists(e.ctx, "acct:rep:"+show, "acct:repc:"+show, "acct:repg:"+show).Val(); n != 0 {
		t.Errorf("%d session keys left after finish", n)
	}
	if got := e.fullRepair("g2", subK); got != "1 0 0 0 0 0 0" {
		t.Errorf("second repair = %q, want nothing to fix", got)
	}
}

// TestRepairSessionStaysExactUnderMutations: bookings, releases, a
// rollback, an adoption, retargets and drops hit records counted and not yet
// counted while a repair session is half-way through its scan; the fix must
// still leave every counter equal to the sum of the records.
func TestRepairSessionStaysExactUnderMutations(t *testing.T) {
	e := newEnv(t)
	e.seed()
	const n = 300 // a hashtable-encoded set: SSCAN really returns it in parts
	for i := 0; i < n; i++ {
		e.book("force", fmt.Sprintf("p%d", i), 1, 100, 0)
	}
	e.rdb.HSet(e.ctx, layerK, "int_cores", 5000) // drift to repair
	e.repair("start", "g")
	cursor := "0"
	for i := 0; i < 3; i++ { // part of the records counted
		cursor = e.repair("scan", "g", cursor, 20)[1].(string)
	}
	if cursor == "0" {
		t.Fatal("the scan finished at once; the test needs a partial scan")
	}
	// Mutations during the session.
	e.book("force", "new1", 2, 200, 1)
	var rel, moved, dropped []string
	var movedE []entry
	for i := 0; i < 10; i++ {
		rel = append(rel, fmt.Sprintf("p%d", i))
		m := defEntry(fmt.Sprintf("p%d", 10+i), 1)
		m.folder = "acct:folder:F2"
		movedE = append(movedE, m)
		moved = append(moved, m.proc)
		dropped = append(dropped, fmt.Sprintf("p%d", 20+i))
	}
	e.release("release", "", rel...)
	e.release("rollback", "", "new1")
	e.book("force", "new2", 1, 100, 0)
	e.reconcile(e.seq(), nowMS(), 0, 60000, append(movedE, defEntry("adopted", 3)))
	e.reconcile(e.seq(), nowMS()+1000, 0, 1<<40, nil, dropped...) // the dropped were booked well before the mark
	for cursor != "0" {
		cursor = e.repair("scan", "g", cursor, 20)[1].(string)
	}
	args := []any{}
	for _, k := range []string{subK, folderK, jobK, layerK, pointK, "acct:folder:F2"} {
		args = append(args, k)
	}
	got := reply(e.repair("fix", "g", args...))
	// Records left: n-20 procs (10 of them in F2), new2 (1), adopted (3).
	left := fmt.Sprintf("%d/0", n-20+1+3)
	for k, want := range map[string]string{subK: left, jobK: left, layerK: left, pointK: left,
		folderK: fmt.Sprintf("%d/0", n-30+1+3), "acct:folder:F2": "10/0"} {
		if got := e.counters(k); got != want {
			t.Errorf("after fix: %s = %s, want %s", k, got, want)
		}
	}
	if !strings.HasPrefix(got, "1 1 0 0 0 ") {
		t.Errorf("fix = %q, want exactly the hand-edited layer fixed", got)
	}
	_ = moved
}

func TestRepairSupersededSessionStops(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.repair("start", "old")
	e.repair("start", "new")
	for _, mode := range []string{"scan", "fix", "finish"} {
		args := []any{}
		if mode == "scan" {
			args = []any{"0", 10}
		}
		if got := reply(e.repair(mode, "old", args...)); got != "0" {
			t.Errorf("%s of a superseded session = %q, want 0", mode, got)
		}
	}
	if _, err := e.eval(lua.Repair(), repairKeys, "nope", "g", 1000); err == nil {
		t.Error("bad mode accepted")
	}
}
