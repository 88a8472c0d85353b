package farm

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), cuebotdb.Database(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func TestSeedIsConsistentWithCuebot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	spec := Default()
	spec.Hosts, spec.Frames = 40, 500
	f, err := Seed(ctx, pool, spec)
	if err != nil {
		t.Fatal(err)
	}
	if f.Frames != 500 || len(f.HostNames) != 40 {
		t.Fatalf("seeded %s", f)
	}
	var frames, waiting, layerTotal, jobWaiting int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE str_state = 'WAITING') FROM frame`).Scan(&frames, &waiting); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT COALESCE(sum(int_waiting_count),0) FROM layer_stat ls JOIN layer l USING (pk_layer) JOIN job j ON j.pk_job = l.pk_job JOIN show s USING (pk_show) WHERE s.str_name IN ('aurora','borealis','cascade','delta')`).Scan(&layerTotal); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT COALESCE(sum(int_waiting_count),0) FROM job_stat`).Scan(&jobWaiting); err != nil {
		t.Fatal(err)
	}
	if frames != 500 || waiting != 500 || layerTotal != 500 || jobWaiting != 500 {
		t.Fatalf("frames=%d waiting=%d layer_stat=%d job_stat=%d, want 500 each", frames, waiting, layerTotal, jobWaiting)
	}
	// Every job has the child rows Cuebot's triggers create, every host a
	// host_stat and an ALLOC tag equal to its allocation's tag.
	var orphans int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM job j LEFT JOIN job_resource r USING (pk_job) WHERE r.pk_job IS NULL`).Scan(&orphans); err != nil || orphans != 0 {
		t.Fatalf("jobs without job_resource: %d %v", orphans, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM host h JOIN alloc a USING (pk_alloc)
		WHERE NOT EXISTS (SELECT 1 FROM host_tag t WHERE t.pk_host = h.pk_host AND t.str_tag_type = 'ALLOC' AND t.str_tag = a.str_tag)
		   OR NOT EXISTS (SELECT 1 FROM host_stat s WHERE s.pk_host = h.pk_host AND s.str_state = 'UP')`).Scan(&orphans); err != nil || orphans != 0 {
		t.Fatalf("hosts without ALLOC tag or host_stat: %d %v", orphans, err)
	}
	var managed, unmanaged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE b_scheduler_managed), count(*) FILTER (WHERE NOT b_scheduler_managed) FROM show WHERE str_name IN ('aurora','borealis','cascade','delta')`).Scan(&managed, &unmanaged); err != nil {
		t.Fatal(err)
	}
	if managed != 3 || unmanaged != 1 {
		t.Fatalf("managed=%d unmanaged=%d", managed, unmanaged)
	}
	// Every subscription has a positive burst (Cuebot books nothing otherwise).
	var zeroBurst int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM subscription s JOIN show USING (pk_show) WHERE show.str_name IN ('aurora','borealis','cascade','delta') AND int_burst <= 0`).Scan(&zeroBurst); err != nil || zeroBurst != 0 {
		t.Fatalf("zero-burst subscriptions: %d %v", zeroBurst, err)
	}
	if f.RunTime("nope") <= 0 {
		t.Fatal("default run time must be positive")
	}
}

// TestSeedCapsAllBook: every cap the farm writes lets its job or folder
// book, on a big farm and on a tiny one (where a fraction of the
// allocation rounds to 0 cores): a folder cap is -1 (unlimited) or at least
// one core, a job cap at least one core and its GPU cap positive, since a
// cap of 0 (or a job cap of -1) books nothing in Cuebot.
func TestSeedCapsAllBook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, size := range []struct{ hosts, frames int }{{40, 500}, {4, 30}} {
		pool := newPool(t)
		spec := Default()
		spec.Hosts, spec.Frames = size.hosts, size.frames
		if _, err := Seed(ctx, pool, spec); err != nil {
			t.Fatal(err)
		}
		var badFolders, badJobs, capped int
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE int_max_cores <> -1 AND int_max_cores < 100),
			       count(*) FILTER (WHERE int_max_cores <> -1) FROM folder_resource`).Scan(&badFolders, &capped); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM job_resource WHERE int_max_cores < 100 OR int_max_gpus <= 0`).Scan(&badJobs); err != nil {
			t.Fatal(err)
		}
		if badFolders != 0 || badJobs != 0 || capped == 0 {
			t.Errorf("%d hosts: %d folders and %d jobs with a cap that books nothing; %d capped folders (want some)",
				size.hosts, badFolders, badJobs, capped)
		}
	}
}

func TestSeedRejectsEmptyFarm(t *testing.T) {
	if _, err := Seed(context.Background(), nil, Spec{}); err == nil {
		t.Fatal("expected an error for an empty spec")
	}
}

// TestSeedIsDeterministic: the same Seed gives the same farm (every name,
// size, cap, tag and count; only the random keys differ) and the same run
// times; another Seed gives another farm.
func TestSeedIsDeterministic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	spec := Default()
	spec.Hosts, spec.Frames = 30, 400
	seed := func(s Spec) (*Farm, string) {
		pool := newPool(t)
		f, err := Seed(ctx, pool, s)
		if err != nil {
			t.Fatal(err)
		}
		return f, shape(t, pool)
	}
	f1, s1 := seed(spec)
	f2, s2 := seed(spec)
	if s1 != s2 {
		t.Fatalf("same seed, different farms:\n%s", firstDiff(s1, s2))
	}
	if !maps.Equal(f1.runTimes, f2.runTimes) || len(f1.runTimes) != f1.Layers {
		t.Fatalf("run times differ or are missing: %d layers, %v vs %v", f1.Layers, f1.runTimes, f2.runTimes)
	}
	spec.Seed++
	if _, s3 := seed(spec); s3 == s1 {
		t.Fatal("another seed gave the same farm")
	}
}

// shape renders everything the farm seeded except the random keys, one
// line per row, in a stable order.
func shape(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	queries := []string{
		`SELECT f.str_name, a.str_name, a.str_tag, a.b_enabled, a.b_billable FROM alloc a JOIN facility f USING (pk_facility) WHERE f.str_name <> 'local' ORDER BY 1, 2`,
		`SELECT d.str_name FROM dept d WHERE NOT d.b_default ORDER BY 1`,
		`SELECT s.str_name, s.b_scheduler_managed, a.str_name, sub.int_size, sub.int_burst
		   FROM show s LEFT JOIN subscription sub USING (pk_show) LEFT JOIN alloc a USING (pk_alloc) ORDER BY 1, 3`,
		`SELECT s.str_name, f.str_name, COALESCE(p.str_name, ''), d.str_name, r.int_max_cores, r.int_max_gpus
		   FROM folder f JOIN show s USING (pk_show) JOIN dept d USING (pk_dept) JOIN folder_resource r USING (pk_folder)
		   LEFT JOIN folder p ON p.pk_folder = f.pk_parent_folder ORDER BY 1, 2`,
		`SELECT s.str_name, d.str_name FROM point p JOIN show s USING (pk_show) JOIN dept d USING (pk_dept) ORDER BY 1, 2`,
		`SELECT h.str_name, a.str_name, h.str_lock_state, h.int_cores, h.int_cores_idle, h.int_mem, h.int_mem_idle,
		        h.int_gpus, h.int_gpus_idle, h.int_gpu_mem, h.int_gpu_mem_idle, h.int_thread_mode,
		        hs.int_mem_total, hs.int_mem_free, hs.int_swap_total, hs.int_mcp_total, hs.int_gpu_mem_total, hs.str_state, hs.str_os,
		        (SELECT string_agg(t.str_tag || ':' || t.str_tag_type, ',' ORDER BY t.str_tag_type, t.str_tag) FROM host_tag t WHERE t.pk_host = h.pk_host)
		   FROM host h JOIN alloc a USING (pk_alloc) JOIN host_stat hs USING (pk_host) ORDER BY 1`,
		`SELECT str_name, int_max_value, b_host_limit FROM limit_record ORDER BY 1`,
		`SELECT j.str_name, s.str_name, f.str_name, d.str_name, j.str_shot, j.str_user, j.str_state, j.str_log_dir, j.int_uid,
		        j.str_os, j.int_max_retries, j.int_frame_count, j.int_layer_count, r.int_priority, r.int_max_cores, r.int_max_gpus,
		        js.int_waiting_count
		   FROM job j JOIN show s USING (pk_show) JOIN folder f USING (pk_folder) JOIN dept d ON d.pk_dept = j.pk_dept
		   JOIN job_resource r USING (pk_job) JOIN job_stat js USING (pk_job) ORDER BY 1`,
		`SELECT j.str_name, l.str_name, l.str_cmd, l.str_range, l.int_chunk_size, l.int_cores_min, l.int_cores_max, l.int_mem_min,
		        l.str_tags, l.str_type, l.b_threadable, l.str_services, l.int_gpus_min, l.int_gpu_mem_min,
		        (SELECT string_agg(lr.str_name, ',' ORDER BY lr.str_name) FROM layer_limit ll JOIN limit_record lr USING (pk_limit_record) WHERE ll.pk_layer = l.pk_layer),
		        ls.int_total_count, ls.int_waiting_count,
		        (SELECT count(*) || ' ' || min(fr.int_number) || '-' || max(fr.int_number) || ' ' ||
		                bool_and(fr.str_state = 'WAITING' AND fr.str_name = lpad(fr.int_number::text, 4, '0') || '-' || l.str_name)
		           FROM frame fr WHERE fr.pk_layer = l.pk_layer)
		   FROM layer l JOIN job j USING (pk_job) JOIN layer_stat ls USING (pk_layer) ORDER BY 1, 2`,
	}
	var b strings.Builder
	for _, q := range queries {
		rows, err := pool.Query(context.Background(), q)
		if err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
		lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			vals, err := r.Values()
			return fmt.Sprint(vals...), err
		})
		if err != nil {
			tb.Fatal(err)
		}
		b.WriteString(strings.Join(lines, "\n") + "\n--\n")
	}
	return b.String()
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n  %s\n  %s", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(al), len(bl))
}

// BenchmarkSeed measures seeding the demo-sized farm and a large one. Each
// iteration seeds a fresh clone of the schema template (the clone is not
// timed). The custom metrics are per second of seeding.
func BenchmarkSeed(b *testing.B) {
	for _, size := range []struct{ hosts, frames int }{{300, 3000}, {1500, 20000}} {
		b.Run(fmt.Sprintf("hosts=%d/frames=%d", size.hosts, size.frames), func(b *testing.B) {
			ctx := context.Background()
			spec := Default()
			spec.Hosts, spec.Frames = size.hosts, size.frames
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				pool := newPool(b)
				b.StartTimer()
				if _, err := Seed(ctx, pool, spec); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				pool.Close()
			}
			secs := b.Elapsed().Seconds()
			b.ReportMetric(float64(size.frames*b.N)/secs, "frames/s")
			b.ReportMetric(float64(size.hosts*b.N)/secs, "hosts/s")
		})
	}
}
