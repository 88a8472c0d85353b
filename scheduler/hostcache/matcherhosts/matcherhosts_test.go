package matcherhosts

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/scheduler/hostcache"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	facility = "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1" // seed: local
	show     = "00000000-0000-0000-0000-000000000000" // seed: testing
	alloc    = "00000000-0000-0000-0000-000000000000" // seed: local.general
	gib      = int64(1024 * 1024)
)

func TestAdapterAgainstPostgres(t *testing.T) {
	url := cuebotdb.Database(t)
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for i, mode := range []int{0, 1} { // h0 AUTO, h1 thread mode ALL
		id := fmt.Sprintf("h%d", i)
		exec(`INSERT INTO host (pk_host, pk_alloc, str_name, str_lock_state, int_cores, int_cores_idle, int_mem, int_mem_idle, int_thread_mode)
			VALUES ($1, $2, $3, 'OPEN', 800, 800, $4, $4, $5)`, id, alloc, "name-"+id, 16*gib, mode)
		exec(`INSERT INTO host_stat (pk_host_stat, pk_host, int_mem_total, int_mem_free, str_state, str_os)
			VALUES ($1, $2, $3, $3, 'UP', 'linux')`, "st-"+id, id, 16*gib)
		exec(`INSERT INTO host_tag (pk_host_tag, pk_host, str_tag, str_tag_type) VALUES ($1, $2, 'general', 'MANUAL')`, "t-"+id, id)
	}
	cfg := hostcache.DefaultConfig(url)
	cfg.SlotName = fmt.Sprintf("mh_test_%d", time.Now().UnixNano()%1e9)
	cfg.StatusInterval = 200 * time.Millisecond
	c, err := hostcache.New(cfg, hostcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}

	var hosts matcher.Hosts = New(c)
	var seen []sizing.Host
	req := matcher.HostRequest{
		FacilityID: facility, ShowID: show, Tags: []clusters.Tag{{Name: "general", Type: clusters.Manual}},
		Floor: sizing.Floor{Cores: 200, MemKB: 4 * gib}, OS: "linux",
		Accept: func(h sizing.Host) bool { seen = append(seen, h); return true },
	}
	h, err := hosts.Checkout(ctx, req)
	if err != nil || h.ID != "h0" {
		t.Fatalf("checkout = %+v, %v (a non-threadable layer must not get the ALL host)", h, err)
	}
	if len(seen) != 1 || seen[0] != h || h.Name != "name-h0" || h.AllocID != alloc || h.OS != "linux" ||
		h.TotalCores != 800 || h.IdleCores != 800 || h.TotalMemKB != 16*gib || h.IdleMemKB != 16*gib {
		t.Fatalf("host handed over: %+v (Accept saw %+v)", h, seen)
	}
	_, err = hosts.Checkout(ctx, req)
	var miss *matcher.NoCandidateError
	if !errors.Is(err, matcher.ErrNoCandidate) || !errors.As(err, &miss) || miss.Watch == nil {
		t.Fatalf("second checkout: %v, want a matcher.NoCandidateError with the cache's watch", err)
	}
	if miss.Watch.Moved() {
		t.Fatal("the miss's watch moved with nothing changed")
	}
	req.Threadable = true
	if h1, err := hosts.Checkout(ctx, req); err != nil || h1.ID != "h1" {
		t.Fatalf("threadable checkout = %+v, %v", h1, err)
	} else {
		hosts.Checkin(h1) // nothing booked
	}
	if miss.Watch.Moved() {
		t.Fatal("the thread-mode ALL host coming back woke the non-threadable request that missed")
	}

	// A booking: the dispatcher's guarded UPDATE, then the check-in with
	// what Postgres returned.
	var after sizing.Host = h
	if err := pool.QueryRow(ctx, `UPDATE host SET int_cores_idle = int_cores_idle - 300, int_mem_idle = int_mem_idle - $1
		WHERE pk_host = 'h0' RETURNING int_cores_idle, int_mem_idle, int_gpus_idle, int_gpu_mem_idle`, 2*gib).
		Scan(&after.IdleCores, &after.IdleMemKB, &after.IdleGPUs, &after.IdleGPUMemKB); err != nil {
		t.Fatal(err)
	}
	hosts.Checkin(after)
	if !miss.Watch.Moved() {
		t.Fatal("h0 came back with room for the request that missed, but its watch did not move")
	}
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for {
		got, indexed, _ := c.Lookup("h0", show)
		if indexed && got.IdleCores == 500 && got.IdleMemKB == 14*gib && c.Stats().Assumed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("h0 after booking: %+v indexed=%v stats=%+v", got, indexed, c.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
