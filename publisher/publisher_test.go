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
	"github.com/cuesched/cuesched/shared/testkit/promread"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type fixture struct {
	t   *testing.T
	ctx context.Context
	rdb redis.UniversalClient
	pub *publisher.Publisher
	reg *prometheus.Registry
	url string // the Redis database's URL
}

func newFixture(t *testing.T, opts publisher.Options) *fixture {
	t.Helper()
	t.Parallel()
	return newFixtureAt(t, testenv.NewRedisDB(t), opts)
}

// newPrivateFixture is newFixture on a Redis server of its own, for tests
// that count what server-wide commands (SCRIPT FLUSH) cause: on the shared
// server a parallel test reloads the scripts at any moment.
func newPrivateFixture(t *testing.T, opts publisher.Options) *fixture {
	t.Helper()
	t.Parallel()
	rd, err := testenv.StartRedis(context.Background(), testenv.RedisOptions{Databases: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rd.Stop)
	return newFixtureAt(t, rd.URL(0), opts)
}

func newFixtureAt(t *testing.T, url string, opts publisher.Options) *fixture {
	t.Helper()
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: url})
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
	f := &fixture{t: t, ctx: context.Background(), rdb: rdb, pub: pub, reg: reg, url: url}
	return f
}

// seedShow writes caps for show S (burst 20 cores, job J max 12 cores / 2
// GPUs, folder F unlimited) and marks it seeded.
func (f *fixture) seedShow() {
	f.t.Helper()
	_, err := f.pub.WriteLimits(f.ctx, publisher.Limits{
		Subs:    []publisher.SubLimits{{ShowID: "S", AllocID: "A", Size: 1000, Burst: 2000}},
		Folders: []publisher.FolderLimits{{FolderID: "F", ShowID: "S", MaxCores: -1, MaxGPUs: -1}},
		Jobs:    []publisher.JobLimits{{JobID: "J", MaxCores: 1200, MaxGPUs: 2, Priority: 100}},
		Points:  []publisher.PointLimits{{DeptID: "D", ShowID: "S"}},
	}, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.pub.BeginBootstrap(f.ctx, "e1"); err != nil {
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
	// cap: subscriptions and minimums; folder: folder_resource max cores
	// (only -1 is unlimited); job: job_resource max cores (no unlimited).
	for _, c := range []struct{ in, charge, cap, folder, job int64 }{
		{-500, 0, -1, 0, 0}, {-100, 0, -1, 0, 0}, {-2, 0, -1, 0, 0}, {-1, 0, -1, -1, 0}, {0, 0, 0, 0, 0},
		{1, 1, 1, 0, 0}, {50, 1, 1, 0, 0}, {99, 1, 1, 0, 0}, {100, 1, 1, 1, 1}, {101, 2, 1, 1, 1},
		{150, 2, 1, 1, 1}, {12500, 125, 125, 125, 125}, {2147483647, 21474837, 21474836, 21474836, 21474836},
	} {
		if got := publisher.ChargeCores(c.in); got != c.charge {
			t.Errorf("ChargeCores(%d) = %d, want %d", c.in, got, c.charge)
		}
		if got := publisher.CapCores(c.in); got != c.cap {
			t.Errorf("CapCores(%d) = %d, want %d", c.in, got, c.cap)
		}
		if got := publisher.FolderCapCores(c.in); got != c.folder {
			t.Errorf("FolderCapCores(%d) = %d, want %d", c.in, got, c.folder)
		}
		if got := publisher.JobCapCores(c.in); got != c.job {
			t.Errorf("JobCapCores(%d) = %d, want %d", c.in, got, c.job)
		}
	}
	for _, c := range []struct{ in, folder, job int64 }{
		{-7, 0, 0}, {-1, -1, 0}, {0, 0, 0}, {1, 1, 1}, {100, 100, 100},
	} {
		if got := publisher.FolderCapGPUs(c.in); got != c.folder {
			t.Errorf("FolderCapGPUs(%d) = %d, want %d", c.in, got, c.folder)
		}
		if got := publisher.JobCapGPUs(c.in); got != c.job {
			t.Errorf("JobCapGPUs(%d) = %d, want %d", c.in, got, c.job)
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
	if got := promread.Value(t, f.reg, "scheduler_accounting_bookings_total", "result", "duplicate"); got != 1 {
		t.Errorf("duplicate bookings metric = %v", got)
	}
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
	if got := promread.Value(t, f.reg, "scheduler_accounting_limit_exceeded_total", "table", "subscription"); got != 2 {
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

// TestZeroCapsStopBooking: caps as Cuebot reads them, end to end through
// WriteLimits (what the limit reseed and the sidecar write) and the booking
// script. A job cap of 0 or below and a folder cap of 0 (or any negative but
// -1) book nothing; a folder cap of -1 is unlimited; a job or folder GPU cap
// of 0 refuses GPU procs and not CPU ones; a cap that was never written
// refuses instead of reading as unlimited.
func TestZeroCapsStopBooking(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	f.seedShow()
	n := 0
	book := func(b publisher.Booking) error {
		n++
		b.ProcID = fmt.Sprintf("p%d", n)
		_, err := f.pub.Book(f.ctx, b)
		return err
	}
	limits := func(folderCores, folderGPUs, jobCores, jobGPUs int64) {
		t.Helper()
		if _, err := f.pub.WriteLimits(f.ctx, publisher.Limits{
			Folders: []publisher.FolderLimits{{FolderID: "F", ShowID: "S", MaxCores: folderCores, MaxGPUs: folderGPUs}},
			Jobs:    []publisher.JobLimits{{JobID: "J", MaxCores: jobCores, MaxGPUs: jobGPUs}},
		}, 0); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, err error, table string, limit int64) {
		t.Helper()
		var le *publisher.LimitError
		if !errors.As(err, &le) || le.Table != table || le.Limit != limit || le.Missing {
			t.Errorf("%s: err = %v, want a %s LimitError at %d", what, err, table, limit)
		}
	}
	cpu, gpu := booking("", 100), booking("", 100)
	gpu.GPUs = 1
	if err := book(cpu); err != nil {
		t.Fatalf("booking under the seeded caps: %v", err)
	}

	// A cap lowered to 0 by a reseed stops booking at once.
	limits(-1, -1, 0, 2)
	if v := f.rdb.HGet(f.ctx, publisher.JobKey("J"), "int_max_cores").Val(); v != "0" {
		t.Errorf("job int_max_cores in Redis = %q, want \"0\"", v)
	}
	refused("job max 0", book(cpu), publisher.TableJob, 0)
	limits(-1, -1, -100, 2)
	refused("job max -100 (no unlimited value for a job)", book(cpu), publisher.TableJob, 0)
	limits(-1, -1, 50, 2)
	refused("job max half a core", book(cpu), publisher.TableJob, 0)

	limits(0, -1, 1200, 2)
	refused("folder max 0", book(cpu), publisher.TableFolder, 0)
	limits(-2, -1, 1200, 2)
	refused("folder max -2 (only -1 is unlimited)", book(cpu), publisher.TableFolder, 0)
	limits(-1, -1, 1200, 2)
	if err := book(cpu); err != nil {
		t.Errorf("folder max -1 is unlimited: %v", err)
	}

	limits(-1, -1, 1200, 0)
	refused("job max GPUs 0", book(gpu), publisher.TableJobGPUs, 0)
	if err := book(cpu); err != nil {
		t.Errorf("a CPU proc under job max GPUs 0: %v", err)
	}
	limits(-1, 0, 1200, 2)
	refused("folder max GPUs 0", book(gpu), publisher.TableFolderGPUs, 0)
	if err := book(cpu); err != nil {
		t.Errorf("a CPU proc under folder max GPUs 0: %v", err)
	}
	limits(-1, -1, 1200, 2)
	if err := book(gpu); err != nil {
		t.Errorf("GPU proc under GPU caps -1 (folder) and 2 (job): %v", err)
	}
	f.expectCores(5)

	// A job whose caps were never written (no reseed, no seed) is refused
	// and says why.
	b := booking("", 100)
	b.JobID = "J-new"
	err := book(b)
	var le *publisher.LimitError
	if !errors.As(err, &le) || le.Table != publisher.TableJob || !le.Missing || !strings.Contains(err.Error(), "not in Redis") {
		t.Errorf("job without caps in Redis: %v, want a missing job cap", err)
	}
	// With the caller's seed of 0 it is refused as a cap of 0.
	b.Seed = &publisher.SeedCaps{JobMaxCores: 0, JobMaxGPUs: 100, FolderMaxCores: -1, FolderMaxGPUs: -1}
	refused("job seeded with max 0", book(b), publisher.TableJob, 0)
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
	if got := promread.Value(t, f.reg, "scheduler_accounting_releases_total", "result", "never_booked"); got != 1 {
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
	f.rdb.HSet(f.ctx, publisher.JobKey("J"), "int_max_cores", 1<<30) // out of the way
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

// TestSeedingFencedByEpoch: markers and acct:epoch are written only for the
// current bootstrap, so a loop leader that stalled past its lock cannot
// mark a show seeded, or open the gates, in a Redis that was emptied or
// re-bootstrapped by another leader since.
func TestSeedingFencedByEpoch(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	ctx := f.ctx
	mustOK := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	mustRefuse := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, publisher.ErrEpochSuperseded) {
			t.Fatalf("%s: %v, want ErrEpochSuperseded", what, err)
		}
	}
	seeded := func(show string) bool {
		t.Helper()
		m, err := f.pub.Seeded(ctx, []string{show})
		if err != nil {
			t.Fatal(err)
		}
		return m[show]
	}

	// Nothing begun: nothing is accepted.
	mustRefuse("marker before any bootstrap", f.pub.MarkSeeded(ctx, "S1", "A"))
	mustRefuse("epoch before any bootstrap", f.pub.SetEpoch(ctx, "A"))

	// Bootstrap A, then steady state under A.
	mustOK("begin A", f.pub.BeginBootstrap(ctx, "A"))
	mustOK("mark S1 in A", f.pub.MarkSeeded(ctx, "S1", "A"))
	mustRefuse("mark S1 with another epoch mid-bootstrap", f.pub.MarkSeeded(ctx, "S1", "Z"))
	mustOK("finish A", f.pub.SetEpoch(ctx, "A"))
	mustOK("mark S2 in A (a flip seeded later)", f.pub.MarkSeeded(ctx, "S2", "A"))
	mustRefuse("mark S3 with a stale epoch", f.pub.MarkSeeded(ctx, "S3", "Z"))
	if !seeded("S1") || !seeded("S2") || seeded("S3") {
		t.Fatalf("markers: S1 %v S2 %v S3 %v", seeded("S1"), seeded("S2"), seeded("S3"))
	}

	// Redis restarts empty: A's writes land nowhere.
	mustOK("flush", f.rdb.FlushDB(ctx).Err())
	mustRefuse("A's marker after the flush", f.pub.MarkSeeded(ctx, "S1", "A"))
	mustRefuse("A's epoch after the flush", f.pub.SetEpoch(ctx, "A"))

	// The new leader bootstraps B; A's stalled writes still land nowhere.
	mustOK("begin B", f.pub.BeginBootstrap(ctx, "B"))
	mustRefuse("A's marker during B", f.pub.MarkSeeded(ctx, "S1", "A"))
	mustRefuse("A's epoch during B", f.pub.SetEpoch(ctx, "A"))
	if seeded("S1") {
		t.Fatal("a stale marker landed during the re-bootstrap")
	}
	if ep, _ := f.pub.Epoch(ctx); ep != "" {
		t.Fatalf("gates opened by a stale epoch: %q", ep)
	}
	mustOK("mark S1 in B", f.pub.MarkSeeded(ctx, "S1", "B"))
	mustOK("finish B", f.pub.SetEpoch(ctx, "B"))
	if ep, _ := f.pub.Epoch(ctx); ep != "B" || !seeded("S1") {
		t.Fatalf("after B: epoch %q, S1 seeded %v", ep, seeded("S1"))
	}
	if err := f.pub.MarkSeeded(ctx, "S1", ""); err == nil {
		t.Fatal("an empty epoch was accepted")
	}
}

// TestCapWritesInWALOrder: caps reach Redis from the sidecar (stamped with
// the commit's LSN) and from the limit reseed (stamped with the position
// before its snapshot); a write stamped earlier than what a hash holds is
// skipped, so an older snapshot never reverts a newer cap.
func TestCapWritesInWALOrder(t *testing.T) {
	f := newFixture(t, publisher.Options{})
	write := func(maxCores, lsn uint64) int {
		t.Helper()
		skipped, err := f.pub.WriteLimits(f.ctx, publisher.Limits{LSN: lsn,
			Jobs: []publisher.JobLimits{{JobID: "J", MaxCores: int64(maxCores) * 100, MaxGPUs: 1, Priority: 1}}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		return skipped
	}
	jobMax := func() int64 {
		t.Helper()
		v, err := f.rdb.HGet(f.ctx, publisher.JobKey("J"), "int_max_cores").Int64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if s := write(12, 0x200); s != 0 || jobMax() != 12 {
		t.Fatalf("first write: skipped %d, cap %d", s, jobMax())
	}
	if s := write(5, 0x100); s != 1 || jobMax() != 12 {
		t.Fatalf("older write: skipped %d, cap %d; want it skipped and 12 kept", s, jobMax())
	}
	if s := write(7, 0x200); s != 0 || jobMax() != 7 {
		t.Fatalf("same position (a replay): skipped %d, cap %d", s, jobMax())
	}
	if s := write(8, 0x1_0000_0300); s != 0 || jobMax() != 8 {
		t.Fatalf("newer write: skipped %d, cap %d", s, jobMax())
	}
	// Lexical order must be numeric order: 0x300 < 0x1_0000_0300.
	if s := write(3, 0x300); s != 1 || jobMax() != 8 {
		t.Fatalf("older write with fewer digits: skipped %d, cap %d", s, jobMax())
	}
	// An unordered write (tools, tests) always lands and leaves the stamp.
	if s := write(9, 0); s != 0 || jobMax() != 9 {
		t.Fatalf("unordered write: skipped %d, cap %d", s, jobMax())
	}
	if s := write(4, 0x400); s != 1 || jobMax() != 9 {
		t.Fatalf("stamp lost by an unordered write: skipped %d, cap %d", s, jobMax())
	}
}

// BookAll answers each booking as Book would, in order, in one round trip:
// the same sequence through Book on another server gives the same results
// and errors (a booked proc, a bad booking, a duplicate, a job cap, a
// missing subscription), and the counters end the same. On a server whose
// script cache was flushed (a restarted or failed-over Redis) the scripts
// are loaded and the refused bookings sent once more; a cancelled call
// charges nothing and fails every booking.
func TestBookAllAnswersAsBook(t *testing.T) {
	all := newPrivateFixture(t, publisher.Options{})
	one := newFixtureAt(t, testenv.NewRedisDB(t), publisher.Options{})
	bs := []publisher.Booking{booking("p1", 500), booking("", 100), booking("p1", 500), booking("p3", 800), booking("p4", 600), booking("p5", 100)}
	bs[5].AllocID = "A2"
	for _, f := range []*fixture{all, one} {
		f.seedShow()
		if err := f.pub.Load(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := all.rdb.ScriptFlush(all.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	got, errs := all.pub.BookAll(all.ctx, bs)
	if len(got) != len(bs) || len(errs) != len(bs) {
		t.Fatalf("BookAll gave %d results and %d errors for %d bookings", len(got), len(errs), len(bs))
	}
	for i, b := range bs {
		want, werr := one.pub.Book(one.ctx, b)
		if got[i] != want || fmt.Sprint(errs[i]) != fmt.Sprint(werr) {
			t.Errorf("booking %d (%s): BookAll = %+v, %v; Book = %+v, %v", i, b.ProcID, got[i], errs[i], want, werr)
		}
	}
	var le *publisher.LimitError
	if errs[0] != nil || got[0].Cores != 5 || errs[1] == nil || !got[2].Duplicate ||
		!errors.As(errs[3], &le) || le.Table != publisher.TableJob || errs[4] != nil || !errors.As(errs[5], &le) || !le.Missing {
		t.Fatalf("BookAll = %+v, %v", got, errs)
	}
	all.expectCores(11)
	one.expectCores(11)

	ctx, cancel := context.WithCancel(all.ctx)
	cancel()
	_, errs = all.pub.BookAll(ctx, []publisher.Booking{booking("q1", 100), booking("q2", 100)})
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled booking %d: %v, want context.Canceled", i, err)
		}
	}
	all.expectCores(11)
}
