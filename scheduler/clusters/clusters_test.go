package clusters_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cuesched/cuesched/scheduler/clusters"
	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type world struct {
	pool             *pgxpool.Pool
	seed             *farmseed.Seeder
	f1, f2           string
	a, b, c          farmseed.Show
	general, gpu, g2 string
}

// newWorld seeds two facilities; show a is managed, b unmanaged, c managed
// but inactive.
func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w := &world{pool: pool, seed: &farmseed.Seeder{DB: pool}}
	s := w.seed
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	w.f1, err = s.Facility(ctx, "f1")
	must(err)
	w.f2, err = s.Facility(ctx, "f2")
	must(err)
	w.a, err = s.Show(ctx, "showa", true)
	must(err)
	w.b, err = s.Show(ctx, "showb", false)
	must(err)
	w.c, err = s.Show(ctx, "showc", true)
	must(err)
	_, err = pool.Exec(ctx, `UPDATE show SET b_active = false WHERE pk_show = $1`, w.c.ID)
	must(err)
	w.general, err = s.Alloc(ctx, w.f1, "f1.general", "general")
	must(err)
	w.gpu, err = s.Alloc(ctx, w.f1, "f1.gpu", "gpu")
	must(err)
	w.g2, err = s.Alloc(ctx, w.f2, "f2.general", "general2")
	must(err)
	empty, err := s.Alloc(ctx, w.f1, "f1.empty", "empty")
	must(err)
	for _, sub := range []struct {
		show  farmseed.Show
		alloc string
	}{{w.a, w.general}, {w.a, w.gpu}, {w.a, w.g2}, {w.a, empty}, {w.b, w.general}, {w.c, w.general}} {
		_, err = s.Subscribe(ctx, sub.show, sub.alloc, 100, 100)
		must(err)
	}
	_, err = s.Host(ctx, farmseed.HostSpec{Name: "h1", Alloc: w.general, AllocTag: "general", Cores: 8,
		Tags: []farmseed.HostTag{{Name: "urgent", Type: "MANUAL"}, {Name: "avx", Type: "HARDWARE"}}})
	must(err)
	_, err = s.Host(ctx, farmseed.HostSpec{Name: "h2", Alloc: w.gpu, AllocTag: "gpu", Cores: 8})
	must(err)
	_, err = s.Host(ctx, farmseed.HostSpec{Name: "h3", Alloc: w.g2, AllocTag: "general2", Cores: 8})
	must(err)
	return w
}

func describe(cs []*clusters.Cluster, showNames map[string]string) []string {
	var out []string
	for _, c := range cs {
		var tags []string
		for _, t := range c.Tags {
			tags = append(tags, t.Name)
		}
		out = append(out, showNames[c.ShowID]+":"+c.Type().Label()+":"+strings.Join(tags, ","))
	}
	sort.Strings(out)
	return out
}

func equal(t *testing.T, got, want []string) {
	t.Helper()
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("clusters:\n got  %v\n want %v", got, want)
	}
}

func TestLoadScopesAndChunks(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	names := map[string]string{w.a.ID: "a", w.b.ID: "b", w.c.ID: "c"}

	all, err := clusters.Load(ctx, w.pool, clusters.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, describe(all, names), []string{
		"a:alloc:general", "a:alloc:gpu", "a:alloc:general2",
		"a:hostname:h1,h2", "a:hostname:h3", "a:manual:urgent", "a:hardware:avx",
	})
	for _, c := range all {
		if c.Type() == clusters.Alloc && c.AllocID() == "" {
			t.Errorf("alloc cluster %s has no allocation id", c)
		}
	}

	f1, err := clusters.Load(ctx, w.pool, clusters.LoadOptions{FacilityID: w.f1, IgnoreTags: []string{"avx"}, HostnameChunkSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, describe(f1, names), []string{
		"a:alloc:general", "a:alloc:gpu", "a:hostname:h1", "a:hostname:h2", "a:manual:urgent",
	})
	for _, c := range f1 {
		if c.FacilityID != w.f1 {
			t.Errorf("cluster %s outside facility f1", c)
		}
	}

	// Loading twice gives the same keys in the same order.
	again, err := clusters.Load(ctx, w.pool, clusters.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range all {
		if all[i].Key() != again[i].Key() {
			t.Fatalf("load is not deterministic: %s vs %s", all[i], again[i])
		}
	}
}

// A tag on hosts of two allocations a show subscribes to is one tag of
// that show's cluster, and each managed show subscribed to an allocation
// gets the allocation's tags (Load pairs the tags with the subscriptions).
func TestLoadTagOnTwoAllocations(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	s := w.seed
	if _, err := s.Host(ctx, farmseed.HostSpec{Name: "h4", Alloc: w.gpu, AllocTag: "gpu", Cores: 8,
		Tags: []farmseed.HostTag{{Name: "urgent", Type: "MANUAL"}}}); err != nil {
		t.Fatal(err)
	}
	d, err := s.Show(ctx, "showd", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Subscribe(ctx, d, w.gpu, 100, 100); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{w.a.ID: "a", w.b.ID: "b", w.c.ID: "c", d.ID: "d"}
	all, err := clusters.Load(ctx, w.pool, clusters.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	equal(t, describe(all, names), []string{
		"a:alloc:general", "a:alloc:gpu", "a:alloc:general2",
		"a:hostname:h1,h2,h4", "a:hostname:h3", "a:manual:urgent", "a:hardware:avx",
		"d:alloc:gpu", "d:hostname:h2,h4", "d:manual:urgent",
	})
}

func TestResolveFacility(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	id, err := clusters.ResolveFacility(context.Background(), w.pool, "f2")
	if err != nil || id != w.f2 {
		t.Fatalf("ResolveFacility(f2) = %q, %v; want %q", id, err, w.f2)
	}
	_, err = clusters.ResolveFacility(context.Background(), w.pool, "nowhere")
	if !errors.Is(err, clusters.ErrUnknownFacility) || !strings.Contains(err.Error(), "nowhere") {
		t.Fatalf("unknown facility error = %v", err)
	}
}

func TestMatchingTagsProbeOrder(t *testing.T) {
	c := clusters.New("f", "s", []clusters.Tag{{Name: "b", Type: clusters.Manual}, {Name: "a", Type: clusters.Manual}})
	got := c.MatchingTags([]string{"zzz", "b", "a"})
	if len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" {
		t.Fatalf("MatchingTags = %v", got)
	}
	if m := c.MatchingTags([]string{"nope"}); len(m) != 0 {
		t.Fatalf("MatchingTags(nope) = %v", m)
	}
	d := clusters.New("f", "s", []clusters.Tag{{Name: "a", Type: clusters.Manual}, {Name: "b", Type: clusters.Manual}, {Name: "a", Type: clusters.Manual}})
	if c.Key() != d.Key() {
		t.Fatalf("tag order or duplicates change the key: %s vs %s", c.Key(), d.Key())
	}
}

func static(n int) []*clusters.Cluster {
	var cs []*clusters.Cluster
	for i := 0; i < n; i++ {
		cs = append(cs, clusters.New("f", "s", []clusters.Tag{{Name: string(rune('a' + i)), Type: clusters.Manual}}))
	}
	return cs
}

func TestFeedRoundRobinInFlightAndSleep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := clusters.NewStaticFeed(static(3), clusters.FeedOptions{Registerer: prometheus.NewRegistry()})

	var got []string
	var held []*clusters.Cluster
	for i := 0; i < 3; i++ {
		c, err := f.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.Tags[0].Name)
		held = append(held, c)
	}
	if strings.Join(got, "") != "abc" {
		t.Fatalf("round robin order = %v", got)
	}
	// All three in flight: Next must block.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if c, err := f.Next(short); err == nil {
		t.Fatalf("Next returned in-flight cluster %s", c)
	}
	cancel()

	// a sleeps long, b short, c returned awake.
	f.Done(held[0], time.Hour)
	f.Done(held[1], 150*time.Millisecond)
	f.Done(held[2], 0)
	c, err := f.Next(ctx)
	if err != nil || c.Tags[0].Name != "c" {
		t.Fatalf("Next = %v, %v; want c", c, err)
	}
	start := time.Now()
	// c is in flight, a sleeps an hour: the next one is b after its sleep.
	c2, err := f.Next(ctx)
	if err != nil || c2.Tags[0].Name != "b" {
		t.Fatalf("Next = %v, %v; want b", c2, err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("b handed out after %v, before its sleep ended", d)
	}
	f.Done(c, 0)
	f.Done(c2, 0)
	f.WakeAll()
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		c, err := f.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seen[c.Tags[0].Name] = true
	}
	if len(seen) != 3 {
		t.Fatalf("after WakeAll got %v", seen)
	}
}

func TestFeedNextWakesOnDone(t *testing.T) {
	t.Parallel()
	f := clusters.NewStaticFeed(static(1), clusters.FeedOptions{})
	c, _ := f.Next(context.Background())
	got := make(chan *clusters.Cluster, 1)
	go func() {
		c, _ := f.Next(context.Background())
		got <- c
	}()
	time.Sleep(20 * time.Millisecond)
	f.Done(c, 0)
	select {
	case c2 := <-got:
		if c2.Key() != c.Key() {
			t.Fatalf("got %s", c2)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Next did not wake up on Done")
	}
}

func TestFeedAwakeGateAndReload(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	f, err := clusters.NewFeed(ctx, w.pool, clusters.FeedOptions{
		Load:         clusters.LoadOptions{FacilityID: w.f1},
		ScanInterval: time.Hour, ReloadInterval: time.Hour, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(f.Clusters()); n != 5 {
		t.Fatalf("loaded %d clusters, want 5", n)
	}
	if a := f.Active(); len(a) != 0 {
		t.Fatalf("no work yet, but %d clusters awake", len(a))
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	if c, err := f.Next(short); err == nil {
		t.Fatalf("Next handed out %s with no work anywhere", c)
	}
	cancel()

	// A job tagged "urgent" wakes only the manual cluster; one in the
	// unmanaged show wakes nothing; a paused one nothing either.
	if _, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "j-urgent", Show: w.a, Facility: w.f1,
		Layers: []farmseed.LayerSpec{{Tags: []string{"urgent"}, Frames: 2}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "j-b", Show: w.b, Facility: w.f1,
		Layers: []farmseed.LayerSpec{{Tags: []string{"general"}, Frames: 2}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.seed.Job(ctx, farmseed.JobSpec{Name: "j-paused", Show: w.a, Facility: w.f1, Paused: true,
		Layers: []farmseed.LayerSpec{{Tags: []string{"gpu"}, Frames: 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	active := f.Active()
	if len(active) != 1 || active[0].Type() != clusters.Manual {
		t.Fatalf("awake = %v, want only the manual cluster", active)
	}
	c, err := f.Next(ctx)
	if err != nil || c.Key() != active[0].Key() {
		t.Fatalf("Next = %v, %v", c, err)
	}
	// An empty pass puts it to sleep; when its work goes away and comes
	// back, the scan forgets the sleep.
	f.Done(c, time.Hour)
	if _, err := w.pool.Exec(ctx, `UPDATE job SET b_paused = true WHERE str_name = 'j-urgent'`); err != nil {
		t.Fatal(err)
	}
	if err := f.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE job SET b_paused = false WHERE str_name = 'j-urgent'`); err != nil {
		t.Fatal(err)
	}
	if err := f.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel = context.WithTimeout(ctx, time.Second)
	defer cancel()
	if c, err := f.Next(short); err != nil || c.Type() != clusters.Manual {
		t.Fatalf("cluster whose work came back still asleep: %v, %v", c, err)
	} else {
		f.Done(c, 0)
	}

	// Reload: unchanged set is not swapped; flipping show b to managed adds
	// its allocation and host clusters.
	if swapped, err := f.Reload(ctx); err != nil || swapped {
		t.Fatalf("Reload of an unchanged set = %v, %v", swapped, err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE show SET b_scheduler_managed = true WHERE pk_show = $1`, w.b.ID); err != nil {
		t.Fatal(err)
	}
	if swapped, err := f.Reload(ctx); err != nil || !swapped {
		t.Fatalf("Reload after a managed flip = %v, %v", swapped, err)
	}
	nb := 0
	for _, c := range f.Clusters() {
		if c.ShowID == w.b.ID {
			nb++
		}
	}
	// Show b subscribes to f1.general only: alloc:general, hostname:h1,
	// manual:urgent, hardware:avx.
	if nb != 4 {
		t.Fatalf("show b has %d clusters after the flip, want 4", nb)
	}
	if err := f.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	foundB := false
	for _, c := range f.Active() {
		if c.ShowID == w.b.ID && c.Type() == clusters.Alloc {
			foundB = true
		}
	}
	if !foundB {
		t.Fatal("show b's general cluster with waiting work is not awake after reload + scan")
	}
}

// A cancelled context ends Next even when a cluster is ready, so workers
// stop promptly on shutdown.
func TestFeedNextHonoursCancellation(t *testing.T) {
	t.Parallel()
	f := clusters.NewStaticFeed(static(2), clusters.FeedOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c, err := f.Next(ctx); err == nil {
		t.Fatalf("Next on a cancelled context returned %s", c)
	}
}
