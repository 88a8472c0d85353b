package matcher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/hostcache"
	"github.com/cuesched/cuesched/scheduler/hostcache/matcherhosts"
	"github.com/cuesched/cuesched/scheduler/matcher"
	"github.com/cuesched/cuesched/scheduler/sizing"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestSpreadRoom(t *testing.T) {
	t.Parallel()
	s := matcher.Spread{Fraction: 0.25, MinFrames: 8}
	host := func(total, idle, layer int64) sizing.Host {
		var h sizing.Host
		h.TotalCores, h.IdleCores, h.LayerCores = total*100, idle*100, layer*100
		return h
	}
	cases := []struct {
		name       string
		h          sizing.Host
		frameCores int64
		room       int64
		ok         bool
	}{
		{"a quarter of 64 cores", host(64, 64, 0), 100, 1600, true},
		{"holding 10 of 16", host(64, 50, 10), 100, 600, true},
		{"at its share", host(64, 40, 16), 100, 0, false},
		{"floor: 8 frames on a small host", host(8, 8, 0), 100, 800, true},
		{"floor: 8 four-core frames", host(64, 64, 8), 400, 2400, true},
		{"less than a frame left", host(64, 64, 15), 200, 100, false},
		{"whole-host frames are not capped", host(64, 64, 40), 0, 6400, true},
	}
	for _, c := range cases {
		room, ok := s.Room(c.h, c.frameCores)
		if room != c.room || ok != c.ok {
			t.Errorf("%s: Room = %d, %v; want %d, %v", c.name, room, ok, c.room, c.ok)
		}
	}
	if room, ok := (matcher.Spread{}).Room(host(64, 64, 60), 100); !ok || room != 6400 {
		t.Errorf("the zero Spread capped: %d %v", room, ok)
	}
}

// withCache replaces the harness's hosts with the replication-fed host
// cache (E-PVM, locality) and returns a matcher over it.
func (h *harness) withCache(spread matcher.Spread) (*matcher.Matcher, *hostcache.Cache) {
	h.t.Helper()
	cfg := hostcache.DefaultConfig(h.pool.Config().ConnString())
	cfg.SlotName = fmt.Sprintf("matcher_test_%d_%d", time.Now().UnixNano()%1e9, h.n)
	cfg.StatusInterval = 200 * time.Millisecond
	c, err := hostcache.New(cfg, hostcache.Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	h.t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, testenv.Patience(30*time.Second))
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		h.t.Fatal(err)
	}
	m := matcher.New(h.pool, matcherhosts.New(c), h.disp, matcher.Config{Attempts: 10, FramesPerLayer: 20, Policy: h.policy, Spread: spread},
		matcher.Options{Registerer: prometheus.NewRegistry(), Backoff: h.backoff, Permits: h.permits})
	return m, c
}

// waitHosts waits until the cache mirrors n hosts.
func waitHosts(t *testing.T, c *hostcache.Cache, n int) {
	t.Helper()
	deadline := time.Now().Add(testenv.Patience(10 * time.Second))
	for c.Stats().Hosts < n {
		if time.Now().After(deadline) {
			t.Fatalf("cache has %+v, want %d hosts", c.Stats(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) procsPerHost(jobID string) map[string]int {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `SELECT h.str_name, count(*) FROM proc p JOIN host h USING (pk_host)
		WHERE p.pk_job = $1 GROUP BY h.str_name`, jobID)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var n string
		var c int
		if err := rows.Scan(&n, &c); err != nil {
			h.t.Fatal(err)
		}
		out[n] = c
	}
	return out
}

// Layer spread through the real host cache and dispatcher: one layer holds
// at most a quarter of a 64-core host (16 one-core frames), the rest of its
// batch goes to another host, and the host cache remembers what it holds
// across passes; when the layer is the only work of the pass the cap is
// lifted.
func TestProcessSpreadsALayerByItsShareOfAHost(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.host(64, "")
	h.host(64, "")
	m, c := h.withCache(matcher.Spread{Fraction: 0.25, MinFrames: 8})
	waitHosts(t, c, 2)
	j := h.job(farmseed.JobSpec{Layers: []farmseed.LayerSpec{layer(60)}})
	out, err := m.Process(context.Background(), h.cluster, j)
	if err != nil {
		t.Fatal(err)
	}
	if out.Dispatched != 20 {
		t.Fatalf("outcome %+v, want the pass's 20 frames", out)
	}
	per := h.procsPerHost(j.ID)
	if len(per) != 2 || per["h1"] > 16 || per["h2"] > 16 {
		t.Fatalf("frames per host %v, want at most 16 (a quarter of 64 cores) on each", per)
	}
	// The next pass: the cache counts the layer's cores on each host, so
	// it tops both up to 16 and no further.
	out, err = m.Process(context.Background(), h.cluster, j)
	if err != nil {
		t.Fatal(err)
	}
	if per = h.procsPerHost(j.ID); out.Dispatched != 12 || per["h1"] != 16 || per["h2"] != 16 {
		t.Fatalf("second pass %+v: frames per host %v, want 16 and 16", out, per)
	}
	// Alone in its pass, the layer takes what is free.
	for _, l := range h.backoff.Held(h.cluster.Key()) {
		h.backoff.Booked(h.cluster.Key(), l)
	}
	out, err = m.ProcessInTurn(context.Background(), h.cluster, j, matcher.Turn{Alone: true})
	if err != nil {
		t.Fatal(err)
	}
	if per = h.procsPerHost(j.ID); out.Dispatched != 20 || per["h1"]+per["h2"] != 52 {
		t.Fatalf("alone: %+v, frames per host %v", out, per)
	}
	if n := checkedOut(c); n != 0 {
		t.Fatalf("%d hosts left checked out", n)
	}
}

func checkedOut(c *hostcache.Cache) int { return c.Stats().CheckedOut }
