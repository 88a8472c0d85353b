package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type fixture struct {
	t   *testing.T
	ctx context.Context
	rdb redis.UniversalClient
	pub *publisher.Publisher
	reg *prometheus.Registry
}

func newFixture(t *testing.T, opts publisher.Options) *fixture {
	t.Helper()
	t.Parallel()
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: testenv.NewRedisDB(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	pub, err := publisher.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ctx: context.Background(), rdb: rdb, pub: pub, reg: reg}
	return f
}

// seedShow writes caps for show S (burst 20 cores, job J max 12 cores / 2
// GPUs, folder F unlimited) and marks it seeded.
func (f *fixture) seedShow() {
	f.t.Helper()
	err := f.pub.WriteLimits(f.ctx, publisher.Limits{
		Subs:    []publisher.SubLimits{{ShowID: "S", AllocID: "A", Size: 1000, Burst: 2000}},
		Folders: []publisher.FolderLimits{{FolderID: "F", ShowID: "S", MaxCores: -1, MaxGPUs: -1}},
		Jobs:    []publisher.JobLimits{{JobID: "J", MaxCores: 1200, MaxGPUs: 2, Priority: 100}},
		Points:  []publisher.PointLimits{{DeptID: "D", ShowID: "S"}},
	}, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.pub.MarkSeeded(f.ctx, "S", "e1"); err != nil {
		f.t.Fatal(err)
	}
}

func booking(proc string, centi int64) publisher.Booking {
	return publisher.Booking{ProcID: proc, ShowID: "S", AllocID: "A", FolderID: "F", JobID: "J", LayerID: "L", DeptID: "D", Centicores: centi}
}

func (f *fixture) cores(key string) int64 {
	v, err := f.rdb.HGet(f.ctx, key, "int_cores").Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return v
}

func (f *fixture) allCores() []int64 {
	return []int64{f.cores(publisher.SubKey("S", "A")), f.cores(publisher.FolderKey("F")), f.cores(publisher.JobKey("J")),
		f.cores(publisher.LayerKey("L")), f.cores(publisher.PointKey("D", "S"))}
}

func (f *fixture) expectCores(want int64) {
	f.t.Helper()
	for i, c := range f.allCores() {
		if c != want {
			f.t.Errorf("counter %d = %d cores, want %d", i, c, want)
		}
	}
}

func TestUnitConversion(t *testing.T) {
	for _, c := range []struct{ in, charge, cap int64 }{
		{-1, 0, -1}, {-500, 0, -1}, {0, 0, 0}, {1, 1, 1}, {50, 1, 1}, {99, 1, 1}, {100, 1, 1}, {101, 2, 1}, {150, 2, 1}, {12500, 125, 125},
	} {
		if got := publisher.ChargeCores(c.in); got != c.charge {
			t.Errorf("ChargeCores(%d) = %d, want %d", c.in, got, c.charge)
		}
		if got := publisher.CapCores(c.in); got != c.cap {
			t.Errorf("CapCores(%d) = %d, want %d", c.in, got, c.cap)
		}
	}
	if s := publisher.FormatLSN(0x16B3748); s != "00000000016B3748" {
		t.Errorf("FormatLSN = %q", s)
	}
	if v, err := publisher.ParseLSN("00000000016B3748"); err != nil || v != 0x16B3748 {
		t.Errorf("ParseLSN = %x, %v", v, err)
	}
}

func TestBookHappyPathDuplicateAndMetrics(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	res, err := f.pub.Book(f.ctx, booking("p1", 150))
	if err != nil || res.Duplicate || res.Cores != 2 || res.Seq != 1 {
		t.Fatalf("Book = %+v, %v", res, err)
	}
	res, err = f.pub.Book(f.ctx, booking("p1", 150))
	if err != nil || !res.Duplicate || res.Seq != 1 {
		t.Fatalf("retried Book = %+v, %v; want duplicate", res, err)
	}
	f.expectCores(2)
	if v := f.rdb.HGet(f.ctx, publisher.ProcKey("p1"), "centi").Val(); v != "150" {
		t.Errorf("record centi = %q, want exact 150", v)
	}
	if got := metricValue(t, f.reg, "scheduler_accounting_bookings_total", "result", "duplicate"); got != 1 {
		t.Errorf("duplicate bookings metric = %v", got)
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{%s=%q} not found", name, label, value)
	return 0
}

func TestLimitErrorsNameTableAndNumbers(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	if _, err := f.pub.Book(f.ctx, booking("p1", 1100)); err != nil {
		t.Fatal(err)
	}
	_, err := f.pub.Book(f.ctx, booking("p2", 250))
	var le *publisher.LimitError
	if !errors.As(err, &le) || le.Table != publisher.TableJob {
		t.Fatalf("err = %v, want job LimitError", err)
	}
	if want := "job max cores exceeded: job J: 11 + 3 > 12 cores"; err.Error() != want {
		t.Errorf("message = %q, want %q", err.Error(), want)
	}
	b := booking("p3", 1000)
	b.JobID = "J2"
	_, err = f.pub.Book(f.ctx, b)
	if want := "subscription burst exceeded: show S alloc A: 11 + 10 > 20 cores"; err == nil || err.Error() != want {
		t.Errorf("message = %v, want %q", err, want)
	}
	b = booking("p4", 100)
	b.AllocID = "A2"
	_, err = f.pub.Book(f.ctx, b)
	if !errors.As(err, &le) || !le.Missing || !strings.Contains(err.Error(), "no subscription") {
		t.Errorf("missing subscription: %v", err)
	}
	b = booking("p5", 100)
	b.GPUs = 3
	_, err = f.pub.Book(f.ctx, b)
	if want := "job max GPUs exceeded: job J: 0 + 3 > 2 GPUs"; err == nil || err.Error() != want {
		t.Errorf("message = %v, want %q", err, want)
	}
	if got := metricValue(t, f.reg, "scheduler_accounting_limit_exceeded_total", "table", "subscription"); got != 2 {
		t.Errorf("limit_exceeded{subscription} = %v, want 2", got)
	}
	f.expectCores(11)
}

func TestUnseededAndReleasedAreDistinctReasons(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	_, err := f.pub.Book(f.ctx, booking("p1", 100))
	if !errors.Is(err, publisher.ErrShowNotSeeded) || !strings.Contains(err.Error(), "show S not seeded") {
		t.Fatalf("unseeded: %v", err)
	}
	var le *publisher.LimitError
	if errors.As(err, &le) {
		t.Fatal("unseeded show reported as a limit")
	}
	f.seedShow()
	if _, err := f.pub.Book(f.ctx, booking("p1", 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Release(f.ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, booking("p1", 100)); !errors.Is(err, publisher.ErrAlreadyReleased) {
		t.Fatalf("rebooking a released proc: %v", err)
	}
	f.expectCores(0)
}

func TestBadBookingsAreRefusedClearly(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	for _, c := range []struct {
		mut  func(*publisher.Booking)
		want string
	}{
		{func(b *publisher.Booking) { b.ProcID = "" }, "proc id is empty"},
		{func(b *publisher.Booking) { b.DeptID = "" }, "dept id is empty"},
		{func(b *publisher.Booking) { b.JobID = "a b" }, "job id \"a b\" contains whitespace"},
		{func(b *publisher.Booking) { b.Centicores = 0 }, "centicores must be > 0"},
		{func(b *publisher.Booking) { b.GPUs = -1 }, "gpus must be >= 0"},
	} {
		b := booking("p", 100)
		c.mut(&b)
		if _, err := f.pub.Book(f.ctx, b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err = %v, want %q", err, c.want)
		}
	}
	f.expectCores(0)
}

func TestSeedCapsCloseTheNewJobGap(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	// Job J9 was created after the last limit reseed: Redis has no cap for it.
	b := booking("p1", 500)
	b.JobID = "J9"
	b.Seed = &publisher.SeedCaps{JobMaxCores: 400, JobMaxGPUs: 0, FolderMaxCores: -1, FolderMaxGPUs: -1}
	_, err := f.pub.Book(f.ctx, b)
	var le *publisher.LimitError
	if !errors.As(err, &le) || le.Table != "job" || le.Limit != 4 {
		t.Fatalf("err = %v, want job cap 4 from the seed", err)
	}
}

func TestRollbackAndRelease(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	for _, p := range []string{"a", "b", "c"} {
		if _, err := f.pub.Book(f.ctx, booking(p, 200)); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := f.pub.Rollback(f.ctx, "a"); err != nil || !r.RolledBack {
		t.Fatalf("Rollback = %+v, %v", r, err)
	}
	if r, err := f.pub.Rollback(f.ctx, "a"); err != nil || r.RolledBack {
		t.Fatalf("second Rollback = %+v, %v; want no-op", r, err)
	}
	r, err := f.pub.Release(f.ctx, "b", "b", "zzz")
	if err != nil || r.Released != 1 || r.AlreadyReleased != 1 || r.NeverBooked != 1 {
		t.Fatalf("Release = %+v, %v", r, err)
	}
	f.expectCores(2)
	if got := metricValue(t, f.reg, "scheduler_accounting_releases_total", "result", "never_booked"); got != 1 {
		t.Errorf("never_booked = %v", got)
	}
}

func TestReleaseBatchExactlyOnceWithChunks(t *testing.T) {
	f := newFixture(t, publisher.Options{ReleaseChunk: 2})
	f.seedShow()
	var rels []publisher.Release
	for i := 0; i < 5; i++ {
		p := fmt.Sprintf("p%d", i)
		if _, err := f.pub.Book(f.ctx, booking(p, 100)); err != nil {
			t.Fatal(err)
		}
		rels = append(rels, publisher.Release{ProcID: p})
	}
	if _, ok, _ := f.pub.Checkpoint(f.ctx); ok {
		t.Fatal("checkpoint present in a new Redis")
	}
	r, err := f.pub.ReleaseBatch(f.ctx, 0x1000, rels[:4])
	if err != nil || !r.Applied || r.Released != 4 || r.StoredLSN != 0x1000 {
		t.Fatalf("ReleaseBatch = %+v, %v", r, err)
	}
	// Replay of the same transaction (and of an older one): nothing.
	for _, lsn := range []uint64{0x1000, 0xFFF} {
		r, err = f.pub.ReleaseBatch(f.ctx, lsn, rels)
		if err != nil || r.Applied || r.StoredLSN != 0x1000 {
			t.Fatalf("replay at %X = %+v, %v", lsn, r, err)
		}
	}
	f.expectCores(1)
	// A crash after the first chunk of a batch, then its replay: the
	// replayed part is idempotent, the rest is applied once.
	if _, err := f.pub.Release(f.ctx, "p4"); err != nil {
		t.Fatal(err)
	}
	r, err = f.pub.ReleaseBatch(f.ctx, 0x2000, rels[3:])
	if err != nil || !r.Applied || r.Released != 0 || r.AlreadyReleased != 2 {
		t.Fatalf("replayed batch = %+v, %v", r, err)
	}
	f.expectCores(0)
	if lsn, ok, err := f.pub.Checkpoint(f.ctx); err != nil || !ok || lsn != 0x2000 {
		t.Fatalf("Checkpoint = %X %v %v", lsn, ok, err)
	}
	if _, err := f.pub.ReleaseBatch(f.ctx, 0, nil); err == nil {
		t.Error("LSN 0 accepted")
	}
	// Keepalive: an empty batch advances the checkpoint.
	if r, err := f.pub.ReleaseBatch(f.ctx, 0x3000, nil); err != nil || !r.Applied {
		t.Fatalf("keepalive = %+v %v", r, err)
	}
	if lsn, _, _ := f.pub.Checkpoint(f.ctx); lsn != 0x3000 {
		t.Errorf("checkpoint after keepalive = %X", lsn)
	}
}

func TestNoScriptFallback(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	if err := f.pub.Load(f.ctx); err != nil {
		t.Fatal(err)
	}
	// What a restarted or failed-over Redis looks like to EVALSHA.
	if err := f.rdb.ScriptFlush(f.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pub.Book(f.ctx, booking("p1", 100)); err != nil {
		t.Fatalf("Book after SCRIPT FLUSH: %v", err)
	}
	if _, err := f.pub.Release(f.ctx, "p1"); err != nil {
		t.Fatalf("Release after SCRIPT FLUSH: %v", err)
	}
}

func TestConcurrentBookingNeverExceedsBurst(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	f.rdb.HSet(f.ctx, publisher.JobKey("J"), "int_max_cores", -1)
	var wg sync.WaitGroup
	var mu sync.Mutex
	booked := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				_, err := f.pub.Book(f.ctx, booking(fmt.Sprintf("g%d-%d", g, i), 100))
				if err == nil {
					mu.Lock()
					booked++
					mu.Unlock()
				}
			}
		}(g)
	}
	wg.Wait()
	if booked != 20 {
		t.Errorf("booked %d one-core procs against a 20-core burst, want exactly 20", booked)
	}
	f.expectCores(20)
}

func TestNewClientConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  publisher.ClientConfig
		want string
	}{
		{publisher.ClientConfig{}, "no URL and no sentinel"},
		{publisher.ClientConfig{URL: "http://x"}, "redis url"},
		{publisher.ClientConfig{MasterName: "m"}, "without sentinel addresses"},
		{publisher.ClientConfig{SentinelAddrs: []string{"a:1"}}, "without a master name"},
	} {
		if _, err := publisher.NewClient(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err = %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := publisher.New(nil, publisher.Options{}); err == nil {
		t.Error("nil client accepted")
	}
}
