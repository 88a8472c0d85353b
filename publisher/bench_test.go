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
	"testing"
	"time"

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
func BenchmarkBookingScript(b *testing.B) {
	const benchBookings, clients = 50000, 50
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
	var goOps, rbOps float64
	const rounds = 3 // interleaved, to even out a noisy machine
	b.ResetTimer()
	for i := 0; i < b.N*rounds; i++ {
		// Go: clients goroutines share benchBookings distinct procs.
		var wg sync.WaitGroup
		var next atomic.Int64
		start := time.Now()
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
	if n := rdb.SCard(ctx, publisher.ShowProcsKey("S")).Val(); n < int64(b.N*rounds*benchBookings) {
		b.Fatalf("only %d records after %d Go bookings", n, b.N*rounds*benchBookings)
	}
	goOps /= float64(b.N * rounds)
	rbOps /= float64(b.N * rounds)
	b.ReportMetric(goOps, "go-bookings/s")
	b.ReportMetric(rbOps, "redis-benchmark-bookings/s")
	b.ReportMetric(goOps/rbOps, "go-vs-redis-benchmark-ratio")
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
