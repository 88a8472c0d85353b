package bench

import (
	"bytes"
	"image/png"
	"strings"
	"testing"
)

const sample = `goos: linux
goarch: amd64
pkg: github.com/cuesched/cuesched/scheduler/hostcache
cpu: Some CPU @ 2.00GHz
BenchmarkCheckout/hosts=1000/btree-2         	  500000	      2100 ns/op	       0 B/op
BenchmarkCheckout/hosts=1000/linear-2        	   20000	     61000 ns/op	  29.05 x-vs-linear-ratio
BenchmarkCheckout/hosts=10000/btree-2        	  500000	      2300 ns/op	       0 B/op
BenchmarkFreshness-2   1   1.2 p50-ms   4.5 p99-ms
--- FAIL: BenchmarkBroken
pkg: github.com/cuesched/cuesched/publisher
BenchmarkBookingScript-2 	   10000	    110000 ns/op	 9000 ops/s	 0.82 vs-redis-benchmark-ratio	 0.4 sidecar/pgbench
ok  	github.com/cuesched/cuesched/publisher	3.1s
`

func TestParseAndRender(t *testing.T) {
	rep, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 5 || rep.CPU != "Some CPU @ 2.00GHz" || len(rep.Failures) != 1 {
		t.Fatalf("parsed %+v", rep)
	}
	r := rep.Results[1]
	if r.Name != "Checkout/hosts=1000/linear" || r.Family != "Checkout" || r.Iterations != 20000 ||
		len(r.Metrics) != 2 || r.Metrics[1].Unit != "x-vs-linear-ratio" || r.Metrics[1].Value != 29.05 {
		t.Fatalf("line parsed as %+v", r)
	}
	if fams := rep.Families(); len(fams) != 3 {
		t.Fatalf("families %d", len(fams))
	}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md, map[string]string{"github.com/cuesched/cuesched/publisher BookingScript": "x.png"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Ratios against same-run baselines", "vs-redis-benchmark-ratio | 0.82", "BookingScript sidecar/pgbench | 0.4", "![BookingScript](x.png)", "--- FAIL: BenchmarkBroken", "| Checkout/hosts=1000/btree | 500000 | 2100 |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	var img bytes.Buffer
	if err := Chart(&img, rep.Families()[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&img); err != nil {
		t.Fatalf("chart is not a PNG: %v", err)
	}
	// Checkout was measured at two farm sizes: it gets a growth chart.
	checkout := rep.Families()[1]
	if checkout[0].Family != "Checkout" || !Growth(checkout) || Growth(rep.Families()[0]) {
		t.Fatalf("growth detection: %v", rep.Families())
	}
	img.Reset()
	if err := GrowthChart(&img, checkout); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&img); err != nil {
		t.Fatalf("growth chart is not a PNG: %v", err)
	}
}

// A figure and its baselines share an axis.
func TestMeasure(t *testing.T) {
	for unit, want := range map[string]string{
		"dispatch_frames/s": "frames/s", "round1_dispatch_frames/s": "frames/s", "pgbench_frames/s": "frames/s",
		"frames/s": "frames/s", "stmts/frame": "stmts/frame", "round1_stmts/frame": "stmts/frame",
		"pgbench_loop_frames/s": "frames/s", "e2e-vs-pgbench-loop-ratio": "ratio",
		"x-vs-linear-ratio": "ratio", "sidecar/pgbench": "ratio", "p50-ms": "ms", "commit_to_redis_p99_ms": "ms", "ns/op": "ns/op",
	} {
		if got := Measure(unit); got != want {
			t.Errorf("Measure(%q) = %q, want %q", unit, got, want)
		}
	}
}

// Same-run baselines are drawn grey; our figures and every ratio are not.
func TestBaseline(t *testing.T) {
	for unit, want := range map[string]bool{
		"pgbench_frames/s": true, "round1_dispatch_frames/s": true, "dbalone_completion_frames/s": true,
		"pgbench_loop_frames/s": true, "dispatch_frames/s": false, "frames/s": false,
		"e2e-vs-pgbench-loop-ratio": false, "pgbench-loop-vs-pgbench-ratio": false,
	} {
		if got := baseline("EndToEnd", unit); got != want {
			t.Errorf("baseline(EndToEnd, %q) = %v, want %v", unit, got, want)
		}
	}
}
