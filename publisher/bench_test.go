package publisher_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// BenchmarkBookingScript measures the booking script (check mode, all five
// hashes, record, acct:seq) driven from Go through Publisher.Book, next to
// redis-benchmark running the very same script by EVALSHA with the same
// concurrency against the same private redis-server, in the same run. Each
// iteration books benchBookings procs with each driver, three times,
// interleaved; the ratio is Go's mean throughput over redis-benchmark's
// (1.0 = the Go client adds nothing; the server is the bottleneck).
//
// Beside them, the dispatcher's way: Publisher.BookAll, batchWorkers
// goroutines sending batchSize bookings a round trip, and the CPU a
// booking costs each way, in this process (getrusage) and in redis-server
// (INFO cpu): on a 2-core box the scheduler, Redis and PostgreSQL share
// the cores, so CPU per booking is what a fill pays.
func BenchmarkBookingScript(b *testing.B) {
	const benchBookings, clients = 50000, 50
	// The dispatcher's way (BookAll): a few workers, a batch each.
	const batchWorkers, batchSize = 4, 20
	rbBin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		b.Skip("redis-benchmark not installed")
	}
	ctx := context.Background()
	rd, err := testenv.StartRedis(ctx, testenv.RedisOptions{Databases: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer rd.Stop()
	rdb, err := publisher.NewClient(publisher.ClientConfig{URL: rd.URL(0), PoolSize: clients})
	if err != nil {
		b.Fatal(err)
	}
	defer rdb.Close()
	pub, err := publisher.New(rdb, publisher.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pub.WriteLimits(ctx, publisher.Limits{
		Subs:    []publisher.SubLimits{{ShowID: "S", AllocID: "A", Burst: 1 << 50}},
		Folders: []publisher.FolderLimits{{FolderID: "F", ShowID: "S", MaxCores: -1, MaxGPUs: -1}},
		// A job cap has no "unlimited" value (-1 books nothing): a huge one.
		Jobs: []publisher.JobLimits{{JobID: "J", MaxCores: 1 << 40, MaxGPUs: 1 << 30}},
	}, 0); err != nil {
		b.Fatal(err)
	}
	if err := pub.BeginBootstrap(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	if err := pub.MarkSeeded(ctx, "S", "bench"); err != nil {
		b.Fatal(err)
	}
	if err := pub.Load(ctx); err != nil {
		b.Fatal(err)
	}

	var seq atomic.Int64
	var goOps, rbOps, allOps float64
	// CPU per booking, client process and redis-server, of the one-by-one
	// and the batched driver.
	var goCPU, goRedisCPU, allCPU, allRedisCPU time.Duration
	const rounds = 3 // interleaved, to even out a noisy machine
	b.ResetTimer()
	for i := 0; i < b.N*rounds; i++ {
		// Go, batched as the dispatcher books: batchWorkers goroutines each
		// send BookAll of batchSize bookings at a time.
		var wg sync.WaitGroup
		var next atomic.Int64
		cpu0, rcpu0 := selfCPU(), redisCPU(ctx, b, rdb)
		start := time.Now()
		for c := 0; c < batchWorkers; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n := min(batchSize, benchBookings-int(next.Add(batchSize))+batchSize)
					if n <= 0 {
						return
					}
					bs := make([]publisher.Booking, n)
					for j := range bs {
						bs[j] = booking("all-"+strconv.FormatInt(seq.Add(1), 10), 100)
					}
					_, errs := pub.BookAll(ctx, bs)
					for _, err := range errs {
						if err != nil {
							b.Error(err)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		allOps += benchBookings / time.Since(start).Seconds()
		allCPU += selfCPU() - cpu0
		allRedisCPU += redisCPU(ctx, b, rdb) - rcpu0

		// Go: clients goroutines share benchBookings distinct procs.
		next.Store(0)
		cpu0, rcpu0 = selfCPU(), redisCPU(ctx, b, rdb)
		start = time.Now()
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= benchBookings {
					id := "go-" + strconv.FormatInt(seq.Add(1), 10)
					if _, err := pub.Book(ctx, booking(id, 100)); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		goOps += benchBookings / time.Since(start).Seconds()
		goCPU += selfCPU() - cpu0
		goRedisCPU += redisCPU(ctx, b, rdb) - rcpu0

		// redis-benchmark: the same script, keys and arguments; the proc id
		// is randomised per call (__rand_int__) so bookings are not duplicates.
		keys := []string{publisher.SubKey("S", "A"), publisher.FolderKey("F"), publisher.JobKey("J"), publisher.LayerKey("L"),
			publisher.PointKey("D", "S"), publisher.SeqKey, publisher.ProcKey("rb-__rand_int__"), publisher.ShowKey("S"),
			publisher.ShowProcsKey("S"), publisher.TombKey("rb-__rand_int__")}
		rk := publisher.RepairKeys("S")
		keys = append(keys, rk[:]...)
		args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(rd.Port()), "-n", strconv.Itoa(benchBookings),
			"-c", strconv.Itoa(clients), "-r", "1000000000", "--csv", "evalsha", pub.BookingSHA(), strconv.Itoa(len(keys))}
		args = append(args, keys...)
		args = append(args, "check", "rb-__rand_int__", "S", "1", "100", "0", "", "", "", "")
		var out bytes.Buffer
		cmd := exec.Command(rbBin, args...)
		cmd.Stdout = &out
		cmd.Stderr = &out
		if err := cmd.Run(); err != nil {
			b.Fatalf("redis-benchmark: %v\n%s", err, out.String())
		}
		rps, err := parseRedisBenchmarkCSV(out.String())
		if err != nil {
			b.Fatal(err)
		}
		rbOps += rps
	}
	b.StopTimer()
	// The bookings all succeeded (none were rejected or duplicated away).
	if n := rdb.SCard(ctx, publisher.ShowProcsKey("S")).Val(); n < int64(2*b.N*rounds*benchBookings) {
		b.Fatalf("only %d records after %d Go bookings", n, 2*b.N*rounds*benchBookings)
	}
	runs := float64(b.N * rounds)
	goOps /= runs
	rbOps /= runs
	allOps /= runs
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / (runs * benchBookings) }
	b.ReportMetric(goOps, "go-bookings/s")
	b.ReportMetric(rbOps, "redis-benchmark-bookings/s")
	b.ReportMetric(goOps/rbOps, "go-vs-redis-benchmark-ratio")
	b.ReportMetric(allOps, "go-batched-bookings/s")
	b.ReportMetric(per(goCPU), "go-client-cpu-µs/booking")
	b.ReportMetric(per(allCPU), "go-batched-client-cpu-µs/booking")
	b.ReportMetric(per(goRedisCPU), "go-redis-cpu-µs/booking")
	b.ReportMetric(per(allRedisCPU), "go-batched-redis-cpu-µs/booking")
	b.ReportMetric(per(allCPU+allRedisCPU)/per(goCPU+goRedisCPU), "batched-vs-one-by-one-cpu-ratio")
	b.ReportMetric(0, "ns/op")
}

// parseRedisBenchmarkCSV returns the rps of the single test in --csv output.
func parseRedisBenchmarkCSV(out string) (float64, error) {
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark csv: %v\n%s", err, out)
	}
	for _, r := range recs {
		if len(r) >= 2 && r[0] != "test" {
			return strconv.ParseFloat(r[1], 64)
		}
	}
	return 0, fmt.Errorf("redis-benchmark printed no result:\n%s", out)
}

// selfCPU is this process's user+system CPU so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is redis-server's user+system CPU so far (INFO cpu).
func redisCPU(ctx context.Context, b *testing.B, rdb interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}) time.Duration {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var secs float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %s: %v", line, err)
			}
			secs += f
		}
	}
	return time.Duration(secs * float64(time.Second))
}
