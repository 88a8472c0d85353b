package sidecar_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

// BenchmarkSidecarReleases measures the sidecar against pgbench deleting
// the same kind of rows in the same run:
//
//   - catch-up throughput: pgbench deletes N managed procs (one per
//     transaction, 4 clients) while no sidecar runs; then a sidecar starts
//     and applies the retained releases. Reported: pgbench_deletes/s,
//     sidecar_releases/s and their ratio (> 1: the sidecar drains faster
//     than Postgres can produce deletes).
//   - live latency: pgbench deletes N more procs at full speed while the
//     sidecar streams; reported: commit→Redis p50/p99 (ms) from the
//     sidecar's own quantiles, and the live releases/s (when pgbench
//     outruns the sidecar these latencies include the queue);
//   - steady latency: pgbench deletes at a fixed 1000/s (a busy farm
//     releases far fewer procs per second); commit→Redis p50/p99.
//
// Deletes are committed with synchronous_commit=on, as Cuebot's are (the
// test cluster defaults to off, which would delay decoding by up to
// wal_writer_delay).
func BenchmarkSidecarReleases(b *testing.B) {
	binDir, err := testenv.PostgresBinDir()
	if err != nil {
		b.Skip(err)
	}
	pgbench := filepath.Join(binDir, "pgbench")
	if _, err := os.Stat(pgbench); err != nil {
		b.Skipf("pgbench not installed: %v", err)
	}
	const n = 6000
	for i := 0; i < b.N; i++ {
		h := newHarness(b, harnessOpts{})
		script := filepath.Join(b.TempDir(), "delete.sql")
		del := fmt.Sprintf("DELETE FROM proc WHERE pk_proc = (SELECT pk_proc FROM proc WHERE pk_show IN ('%s', '%s') LIMIT 1 FOR UPDATE SKIP LOCKED);\n",
			h.a.rows.ShowID, h.b.rows.ShowID)
		if err := os.WriteFile(script, []byte(del), 0o644); err != nil {
			b.Fatal(err)
		}
		runPgbench := func(txns int, rate int) float64 {
			b.Helper()
			const clients = 4
			args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", "2",
				"-t", strconv.Itoa(txns / clients), "-f", script}
			if rate > 0 {
				args = append(args, "-R", strconv.Itoa(rate))
			}
			cmd := exec.Command(pgbench, append(args, h.dbURL)...)
			cmd.Env = append(os.Environ(), "PGOPTIONS=-c synchronous_commit=on")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				b.Fatalf("pgbench: %v\n%s", err, out.String())
			}
			m := regexp.MustCompile(`tps = ([0-9.]+)`).FindStringSubmatch(out.String())
			if m == nil {
				b.Fatalf("no tps in pgbench output:\n%s", out.String())
			}
			tps, _ := strconv.ParseFloat(m[1], 64)
			return tps
		}
		forgetAll := func() {
			for _, p := range h.liveProcs() {
				if p.show != h.u {
					h.forget(p)
				}
			}
		}

		// Phase 1: catch-up throughput.
		h.book(h.a, n/2)
		h.book(h.b, n/2)
		ip := h.start(true)
		ip.waitActive(b, 10*time.Second)
		h.waitCheckpoint(h.walNow(), 10*time.Second)
		ip.stop(b)
		pgTPS := runPgbench(n, 0)
		forgetAll()
		target := h.walNow()
		start := time.Now()
		ip = h.start(false)
		h.waitCheckpoint(target, 5*time.Minute)
		catchUp := time.Since(start)
		h.assertExact()
		scRate := float64(n) / catchUp.Seconds()
		ip.stop(b)

		// Phase 2: live latency under the same load.
		h.book(h.a, n/2)
		h.book(h.b, n/2)
		ip = h.start(false)
		ip.waitActive(b, 10*time.Second)
		h.waitCheckpoint(h.walNow(), 10*time.Second)
		t0 := time.Now()
		pgTPS2 := runPgbench(n, 0)
		forgetAll()
		h.waitCheckpoint(h.walNow(), 5*time.Minute)
		live := time.Since(t0)
		h.assertExact()
		p50, p99 := quantile(b, ip.reg, 0.5), quantile(b, ip.reg, 0.99)
		ip.stop(b)

		// Phase 3: latency at a steady, unsaturated rate.
		const rate, m = 1000, 3000
		h.book(h.a, m/2)
		h.book(h.b, m/2)
		ip = h.start(false)
		ip.waitActive(b, 10*time.Second)
		h.waitCheckpoint(h.walNow(), 10*time.Second)
		runPgbench(m, rate)
		forgetAll()
		h.waitCheckpoint(h.walNow(), time.Minute)
		h.assertExact()
		r50, r99 := quantile(b, ip.reg, 0.5), quantile(b, ip.reg, 0.99)
		ip.stop(b)

		b.ReportMetric(pgTPS, "pgbench_deletes/s")
		b.ReportMetric(scRate, "sidecar_releases/s")
		b.ReportMetric(scRate/pgTPS, "sidecar/pgbench")
		b.ReportMetric(float64(n)/live.Seconds(), "live_releases/s")
		b.ReportMetric(pgTPS2, "live_pgbench_deletes/s")
		b.ReportMetric(p50*1000, "commit_to_redis_p50_ms")
		b.ReportMetric(p99*1000, "commit_to_redis_p99_ms")
		b.ReportMetric(r50*1000, "at1000/s_p50_ms")
		b.ReportMetric(r99*1000, "at1000/s_p99_ms")
	}
}

func quantile(b *testing.B, g prometheus.Gatherer, q float64) float64 {
	b.Helper()
	mfs, err := g.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sidecar_commit_to_redis_quantile_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, qq := range m.GetSummary().GetQuantile() {
				if qq.GetQuantile() == q {
					return qq.GetValue()
				}
			}
		}
	}
	b.Fatalf("no %v quantile", q)
	return 0
}
