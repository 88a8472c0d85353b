package lua_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/cuesched/cuesched/lua"
)

const resvHost = "H1"

var (
	resvK     = "acct:resv:host:" + resvHost
	resvIndex = "acct:resv:index"
)

// fittingOf lists the hosts a test grant says fit: those of allocation
// A1 are H1..H4, of A2 H5..H8; any other allocation: the host alone.
func fittingOf(host, alloc string) []any {
	switch alloc {
	case "A1":
		return []any{"H1", "H2", "H3", "H4"}
	case "A2":
		return []any{"H5", "H6", "H7", "H8", "H3"}
	}
	return []any{host}
}

// grant runs resv_grant.lua with the defaults of most tests.
func (e *env) grant(host, layer, alloc string, readyAt int64, timeout time.Duration, maxGrants, maxInAlloc int) []any {
	e.t.Helper()
	args := []any{host, host + ".name", layer, "J-" + layer, show, alloc, 6400, 8 * 1024 * 1024, readyAt, timeout.Milliseconds(),
		"test", maxGrants, maxInAlloc, layer + ".name", "J-" + layer + ".name"}
	return e.mustEval(lua.ResvGrant(), []string{"acct:resv:host:" + host, resvIndex}, append(args, fittingOf(host, alloc)...)...)
}

func (e *env) endResv(host, layer string) []any {
	e.t.Helper()
	return e.mustEval(lua.ResvEnd(), []string{"acct:resv:host:" + host, resvIndex}, host, layer)
}

// bookOn books proc p for layer on the reserved host, with an optional
// backfill-until (ms; 0 = no claim).
func (e *env) bookOn(proc, bookLayer string, until int64) []any {
	e.t.Helper()
	u := ""
	if until > 0 {
		u = strconv.FormatInt(until, 10)
	}
	keys := append(bookKeys(proc), resvK)
	return e.mustEval(lua.Book(), keys, "check", proc, show, 1, 100, 0, "", "", "", "", resvHost, bookLayer, u)
}

func TestResvGrantAndEnd(t *testing.T) {
	e := newEnv(t)
	ready := nowMS() + 60_000
	if got := e.grant(resvHost, "LW", alloc, ready, time.Minute, 8, 4); got[0] != int64(1) || len(got) != 3 {
		t.Fatalf("grant = %v, want {1, now, expires}", got)
	}
	rec, err := e.rdb.HGetAll(e.ctx, resvK).Result()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"host": resvHost, "layer": "LW", "job": "J-LW", "show": show, "alloc": alloc,
		"cores": "6400", "ready_at": strconv.FormatInt(ready, 10), "granted_by": "test", "backfills": "0", "layer_name": "LW.name"} {
		if rec[k] != v {
			t.Errorf("reservation %s = %q, want %q", k, rec[k], v)
		}
	}
	exp, _ := strconv.ParseInt(rec["expires_at"], 10, 64)
	if d := time.Until(time.UnixMilli(exp)); d < 30*time.Second || d > 2*time.Minute {
		t.Errorf("expires_at %d is %v from now, want about a minute", exp, d)
	}
	if ttl := e.rdb.PTTL(e.ctx, resvK).Val(); ttl < time.Hour {
		t.Errorf("safety TTL %v, want the expiry plus an hour", ttl)
	}
	if ok, _ := e.rdb.SIsMember(e.ctx, resvIndex, resvHost).Result(); !ok {
		t.Error("host not in the index")
	}
	// Someone else's: unchanged.
	if got := reply(e.endResv(resvHost, "OTHER")); got != "2 LW" {
		t.Errorf("end by another layer = %q, want \"2 LW\"", got)
	}
	if got := reply(e.endResv(resvHost, "LW")); got != "1 LW J-LW" {
		t.Errorf("end = %q, want \"1 LW J-LW\"", got)
	}
	if e.rdb.Exists(e.ctx, resvK).Val() != 0 || e.rdb.SCard(e.ctx, resvIndex).Val() != 0 {
		t.Error("end left the hash or the index member")
	}
	if got := reply(e.endResv(resvHost, "")); got != "0" {
		t.Errorf("second end = %q, want \"0\"", got)
	}
}

func TestResvGrantRefusals(t *testing.T) {
	e := newEnv(t)
	ready := nowMS() + 60_000
	e.grant("H1", "L1", "A1", ready, time.Minute, 3, 2)
	for _, c := range []struct {
		name               string
		host, layer, alloc string
		maxGrants, maxIn   int
		want               string
	}{
		{"host taken", "H1", "L2", "A1", 3, 2, "0 host_reserved L1"},
		{"layer holds one", "H2", "L1", "A1", 3, 2, "0 layer_holds H1"},
		{"alloc fraction", "H2", "L2", "A1", 3, 1, "0 max_fraction 1"},
		{"max grants", "H2", "L2", "A2", 1, 2, "0 max_grants 1"},
	} {
		if got := reply(e.grant(c.host, c.layer, c.alloc, ready, time.Minute, c.maxGrants, c.maxIn)); got != c.want {
			t.Errorf("%s: grant = %q, want %q", c.name, got, c.want)
		}
	}
	if got := e.grant("H2", "L2", "A1", ready, time.Minute, 3, 2); got[0] != int64(1) {
		t.Fatalf("grant within the caps = %v", got)
	}
	if got := reply(e.grant("H3", "L3", "A1", ready, time.Minute, 3, 2)); got != "0 max_fraction 2" {
		t.Errorf("third in the allocation = %q", got)
	}
	// Only the listed (fitting) hosts count: in A2's list H3 is the only
	// one reserved... once it is.
	if got := e.grant("H5", "L3", "A2", ready, time.Minute, 3, 1); got[0] != int64(1) {
		t.Errorf("first among other fitting hosts = %v", got)
	}
	if got := reply(e.grant("H6", "L4", "A2", ready, time.Minute, 4, 1)); got != "0 max_fraction 1" {
		t.Errorf("second among A2's fitting hosts, max 1 = %q", got)
	}
	e.endResv("H5", "")
	if got := e.grant("H3", "L3", "A2", ready, time.Minute, 3, 2); got[0] != int64(1) {
		t.Errorf("third in another allocation = %v", got)
	}
	if n := e.rdb.SCard(e.ctx, resvIndex).Val(); n != 3 {
		t.Errorf("index has %d members, want 3", n)
	}
}

// An expired reservation is no reservation: a new grant takes the host and
// drops the stale index members; booking ignores it.
func TestResvExpiry(t *testing.T) {
	e := newEnv(t)
	e.seed()
	e.grant(resvHost, "LW", alloc, nowMS()+60_000, 50*time.Millisecond, 8, 8)
	e.grant("H9", "L9", alloc, nowMS()+60_000, 50*time.Millisecond, 8, 8)
	time.Sleep(120 * time.Millisecond)
	if got := reply(e.bookOn("p1", "OTHER", 0)); got != "1 1" {
		t.Errorf("booking on an expired reservation = %q, want a plain \"1 1\"", got)
	}
	if got := e.grant(resvHost, "L2", alloc, nowMS()+60_000, time.Minute, 1, 1); got[0] != int64(1) {
		t.Fatalf("grant over an expired reservation = %v (max 1: the expired ones must not count)", got)
	}
	if m := e.rdb.SMembers(e.ctx, resvIndex).Val(); len(m) != 1 || m[0] != resvHost {
		t.Errorf("index = %v, want only %s", m, resvHost)
	}
	if e.rdb.Exists(e.ctx, "acct:resv:host:H9").Val() != 0 {
		t.Error("the expired hash of H9 was not deleted")
	}
}

// The firm refusal: a non-owner booking on a reserved host is refused
// atomically with a structured reason and no write; the owner books; a
// backfill is admitted only if it ends before the ready time.
func TestBookHonoursReservation(t *testing.T) {
	e := newEnv(t)
	e.seed()
	ready := nowMS() + 60_000
	e.grant(resvHost, "LW", alloc, ready, time.Minute, 8, 8)

	got := e.bookOn("p1", layer, 0)
	if reply(got) != "0 reservation 0 "+strconv.FormatInt(ready, 10)+" reserved LW J-LW" {
		t.Fatalf("non-owner booking = %q, want a reservation refusal", reply(got))
	}
	e.expectAll("0/0")
	if e.seq() != 0 || e.rdb.Exists(e.ctx, "acct:proc:p1").Val() != 0 {
		t.Fatal("a refused booking wrote something")
	}
	late := ready + 1
	if got := reply(e.bookOn("p2", layer, late)); got != "0 reservation "+strconv.FormatInt(late, 10)+" "+strconv.FormatInt(ready, 10)+" backfill LW J-LW" {
		t.Fatalf("late backfill = %q, want a backfill refusal", got)
	}
	e.expectAll("0/0")
	if got := reply(e.bookOn("p3", layer, ready)); got != "1 1 backfill" {
		t.Fatalf("backfill ending at the ready time = %q, want \"1 1 backfill\"", got)
	}
	if n := e.field(resvK, "backfills"); n != 1 {
		t.Errorf("backfills = %d, want 1", n)
	}
	if got := reply(e.bookOn("p4", "LW", 0)); got != "1 2 owner" {
		t.Fatalf("owner booking = %q, want \"1 2 owner\"", got)
	}
	if v := e.rdb.HGet(e.ctx, "acct:proc:p4", "resv").Val(); v != "owner" {
		t.Errorf("record resv = %q, want owner", v)
	}
	// The booking script never ends the reservation itself.
	if e.rdb.Exists(e.ctx, resvK).Val() != 1 {
		t.Error("owner booking ended the reservation")
	}
	// Force mode (recording a proc that exists) is not refused.
	if got := reply(e.mustEval(lua.Book(), append(bookKeys("p5"), resvK), "force", "p5", show, 1, 100, 0, "", "", "", "", resvHost, layer, "")); got != "1 3" {
		t.Errorf("forced booking = %q, want \"1 3\"", got)
	}
	// Without the reservation key nothing about reservations is read.
	if got := reply(e.book("check", "p6", 1, 100, 0)); got != "1 4" {
		t.Errorf("booking without the reservation key = %q, want \"1 4\"", got)
	}
	// Caps are checked first: a capped booking reports the cap.
	e.rdb.HSet(e.ctx, jobK, "int_max_cores", 0)
	if got := e.bookOn("p7", layer, 0); got[1] != "job" {
		t.Errorf("capped booking on a reserved host = %v, want the job cap", got)
	}
}

func TestResvArgumentsValidated(t *testing.T) {
	e := newEnv(t)
	e.seed()
	if _, err := e.eval(lua.Book(), append(bookKeys("p1"), resvK), "check", "p1", show, 1, 100, 0, "", "", "", "", "", layer, ""); err == nil {
		t.Error("booking with a reservation key and no host id accepted")
	}
	if _, err := e.eval(lua.Book(), append(bookKeys("p1"), resvK), "check", "p1", show, 1, 100, 0, "", "", "", "", resvHost, layer, "soon"); err == nil {
		t.Error("non-integer backfill-until accepted")
	}
	if _, err := e.eval(lua.ResvGrant(), []string{resvK, resvIndex}, resvHost, "n", "L", "J", show, alloc, 100, 0, 1, 0, "x", 8, 8, "", ""); err == nil {
		t.Error("grant with a zero timeout accepted")
	}
	if _, err := e.eval(lua.ResvGrant(), []string{resvK, resvIndex}, resvHost, "n", "", "J", show, alloc, 100, 0, 1, 1000, "x", 8, 8, "", ""); err == nil {
		t.Error("grant without a layer accepted")
	}
	if e.rdb.Exists(e.ctx, resvK).Val() != 0 || e.seq() != 0 {
		t.Error("a rejected call wrote something")
	}
}
