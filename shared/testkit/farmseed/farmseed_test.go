package farmseed

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cuesched/cuesched/shared/testkit/cuebotdb"
	"github.com/cuesched/cuesched/shared/testkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newTestSeeder gives a test its own database, a Seeder on it and a
// facility "fac".
func newTestSeeder(t *testing.T) (*pgxpool.Pool, *Seeder, string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), cuebotdb.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := &Seeder{DB: pool}
	fac, err := s.Facility(context.Background(), "fac")
	if err != nil {
		t.Fatal(err)
	}
	return pool, s, fac
}

// noCopy hides the pool's CopyFrom, so the seeder takes its INSERT path.
type noCopy struct{ DB }

// TestJobsWriteFramesAsCuebot seeds the same jobs through COPY (a pool)
// and through the INSERT fallback, and checks both against what Cuebot's
// launch and activation leave: frame names with at least four digits
// (also past 9999), one frame per chunk, dispatch order 0..n-1 per layer,
// layer order, stat counts, department, retries and PENDING.
func TestJobsWriteFramesAsCuebot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, base, fac := newTestSeeder(t)
	fx, err := base.Department(ctx, "fx")
	if err != nil {
		t.Fatal(err)
	}
	show, err := base.Show(ctx, "bulk", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := base.Point(ctx, show, fx); err != nil {
		t.Fatal(err)
	}
	var points int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM point WHERE pk_show = $1 AND pk_dept IN ($2, $3)`, show.ID, fx, SeedDept).Scan(&points); err != nil || points != 2 {
		t.Fatalf("points of the show: %d %v, want 2", points, err)
	}
	for _, path := range []struct {
		name string
		db   DB
	}{{"copy", pool}, {"insert", noCopy{pool}}} {
		s := &Seeder{DB: path.db}
		spec := func(n string) JobSpec {
			return JobSpec{Name: path.name + "-" + n, Show: show, Facility: fac, Layers: []LayerSpec{
				{Name: path.name + "-" + n + "-a", Range: "9998-10001"},
				{Name: path.name + "-" + n + "-b", Frames: 10, Chunk: 3},
			}}
		}
		two := spec("two")
		two.Dept, two.MaxRetries = fx, 2
		jobs, err := s.Jobs(ctx, spec("one"), two)
		if err != nil {
			t.Fatalf("%s: %v", path.name, err)
		}
		if len(jobs) != 2 || jobs[0].FrameCount() != 8 || jobs[1].FrameCount() != 8 {
			t.Fatalf("%s: jobs %+v", path.name, jobs)
		}
		for i, j := range jobs {
			var state, dept string
			var frames, layers, retries, waiting int
			if err := pool.QueryRow(ctx, `SELECT j.str_state, j.pk_dept, j.int_frame_count, j.int_layer_count, j.int_max_retries,
				s.int_waiting_count FROM job j JOIN job_stat s USING (pk_job) WHERE j.pk_job = $1`, j.ID).Scan(
				&state, &dept, &frames, &layers, &retries, &waiting); err != nil {
				t.Fatal(err)
			}
			wantDept, wantRetries := SeedDept, 3
			if i == 1 {
				wantDept, wantRetries = fx, 2
			}
			if state != "PENDING" || dept != wantDept || frames != 8 || layers != 2 || retries != wantRetries || waiting != 8 {
				t.Errorf("%s %s: state=%s dept=%s frames=%d layers=%d retries=%d waiting=%d", path.name, j.Name,
					state, dept, frames, layers, retries, waiting)
			}
			for li, l := range j.Layers {
				rows, err := pool.Query(ctx, `SELECT pk_frame, str_name, int_number, int_dispatch_order, int_layer_order,
					str_state, ts_updated IS NOT NULL AND ts_eligible IS NOT NULL FROM frame WHERE pk_layer = $1 ORDER BY int_dispatch_order`, l.ID)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				var ids []string
				for rows.Next() {
					var id, name, st string
					var n, ord, lord int
					var stamped bool
					if err := rows.Scan(&id, &name, &n, &ord, &lord, &st, &stamped); err != nil {
						t.Fatal(err)
					}
					ids = append(ids, id)
					got = append(got, fmt.Sprintf("%s/%d/%d/%d/%s/%v", name, n, ord, lord, st, stamped))
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				nums, lord := []int{9998, 9999, 10000, 10001}, 1
				if li == 1 {
					nums, lord = []int{1, 4, 7, 10}, 2
				}
				var want []string
				for k, n := range nums {
					want = append(want, fmt.Sprintf("%04d-%s/%d/%d/%d/WAITING/true", n, l.Name, n, k, lord))
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s %s frames:\n got %v\nwant %v", path.name, l.Name, got, want)
				}
				if !slices.Equal(ids, l.Frames) {
					t.Errorf("%s %s: returned frame keys %v are not the rows' %v", path.name, l.Name, l.Frames, ids)
				}
				var total, lw int
				if err := pool.QueryRow(ctx, `SELECT int_total_count, int_waiting_count FROM layer_stat WHERE pk_layer = $1`, l.ID).Scan(&total, &lw); err != nil || total != 4 || lw != 4 {
					t.Errorf("%s %s layer_stat total=%d waiting=%d %v, want 4", path.name, l.Name, total, lw, err)
				}
			}
		}
	}
}

// TestJobsReportsTheFailingRow: a bad row fails with an error naming it,
// and the jobs inserted before it are returned.
func TestJobsReportsTheFailingRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, s, fac := newTestSeeder(t)
	show, err := s.Show(ctx, "bad", true)
	if err != nil {
		t.Fatal(err)
	}
	good := JobSpec{Name: "good", Show: show, Facility: fac, Layers: []LayerSpec{{Name: "l"}}}
	bad := JobSpec{Name: "bad", Show: show, Facility: fac, Layers: []LayerSpec{{Name: "l", Range: "5-1"}}}
	jobs, err := s.Jobs(ctx, good, bad)
	if err == nil || len(jobs) != 2 || jobs[0].Name != "good" {
		t.Fatalf("jobs=%+v err=%v, want the good job and an error", jobs, err)
	}
	if want := `bad range "5-1"`; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
}

// TestHostWritesItsRowsAsCuebot: one Host call leaves the host, its
// host_stat and its tags (ALLOC constant, HOSTNAME, extra tags; empty
// names skipped), with the tags also joined into host.str_tags.
func TestHostWritesItsRowsAsCuebot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s, fac := newTestSeeder(t)
	alloc, err := s.Alloc(ctx, fac, "fac.gpu", "gpu")
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Host(ctx, HostSpec{Name: "g1", Alloc: alloc, AllocTag: "gpu", Cores: 16, MemKB: 96 * GB, GPUs: 2, GPUMemKB: 24 * GB,
		Tags: []HostTag{{"cuda", "HARDWARE"}, {"", "MANUAL"}}})
	if err != nil {
		t.Fatal(err)
	}
	var cores, procs, idle, mem, gpus, gpuMem, statMem, statGPU int64
	var strTags, state, os string
	if err := pool.QueryRow(ctx, `SELECT h.int_cores, h.int_procs, h.int_cores_idle, h.int_mem_idle, h.int_gpus_idle, h.int_gpu_mem_idle,
		h.str_tags, s.int_mem_free, s.int_gpu_mem_free, s.str_state, s.str_os
		FROM host h JOIN host_stat s ON s.pk_host = h.pk_host AND s.pk_host_stat = h.pk_host WHERE h.pk_host = $1`, id).Scan(
		&cores, &procs, &idle, &mem, &gpus, &gpuMem, &strTags, &statMem, &statGPU, &state, &os); err != nil {
		t.Fatal(err)
	}
	if cores != 1600 || procs != 16 || idle != 1600 || mem != 96*GB || gpus != 2 || gpuMem != 24*GB ||
		statMem != 96*GB || statGPU != 24*GB || state != "UP" || os != "linux" || strTags != "gpu g1 cuda" {
		t.Fatalf("host: cores=%d procs=%d idle=%d mem=%d gpus=%d gpuMem=%d tags=%q stat mem=%d gpu=%d %s %s",
			cores, procs, idle, mem, gpus, gpuMem, strTags, statMem, statGPU, state, os)
	}
	rows, err := pool.Query(ctx, `SELECT str_tag || ':' || str_tag_type || ':' || b_constant FROM host_tag WHERE pk_host = $1 ORDER BY 1`, id)
	if err != nil {
		t.Fatal(err)
	}
	tags, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"cuda:HARDWARE:false", "g1:HOSTNAME:false", "gpu:ALLOC:true"}; !slices.Equal(tags, want) {
		t.Fatalf("tags %v, want %v", tags, want)
	}
	if _, err := s.Host(ctx, HostSpec{Name: "g1", Alloc: alloc, AllocTag: "gpu"}); err == nil || !strings.Contains(err.Error(), "host g1") {
		t.Fatalf("a duplicate host name: %v, want an error naming the host", err)
	}
}

// TestCapsAsCuebotReadsThem: a job cap has no "unlimited" value in Cuebot,
// so JobSpec's Uncapped is stored as a huge cap, never as -1 (which books
// nothing); SetJobCaps writes 0 and negative caps verbatim; a folder keeps
// -1 as its unlimited sentinel and 0 as a cap of 0.
func TestCapsAsCuebotReadsThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s, fac := newTestSeeder(t)
	show, err := s.Show(ctx, "caps", true)
	if err != nil {
		t.Fatal(err)
	}
	jobCaps := func(id string) (cores, gpus int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT int_max_cores, int_max_gpus FROM job_resource WHERE pk_job = $1`, id).Scan(&cores, &gpus); err != nil {
			t.Fatal(err)
		}
		return cores, gpus
	}
	for _, c := range []struct {
		name              string
		maxCores, maxGPUs int
		cores, gpus       int
	}{
		{"default", 0, 0, 1_000_000, 100},
		{"uncapped", Uncapped, Uncapped, UncappedCores, UncappedGPUs},
		{"capped", 4, 2, 400, 2},
	} {
		j, err := s.Job(ctx, JobSpec{Name: c.name, Show: show, Facility: fac, MaxCores: c.maxCores, MaxGPUs: c.maxGPUs, Layers: []LayerSpec{{}}})
		if err != nil {
			t.Fatal(err)
		}
		if cores, gpus := jobCaps(j.ID); cores != c.cores || gpus != c.gpus {
			t.Errorf("%s: job caps %d centicores / %d GPUs, want %d / %d", c.name, cores, gpus, c.cores, c.gpus)
		}
		if c.name != "capped" {
			continue
		}
		if err := s.SetJobCaps(ctx, j.ID, 0, -1); err != nil {
			t.Fatal(err)
		}
		if cores, gpus := jobCaps(j.ID); cores != 0 || gpus != -1 {
			t.Errorf("SetJobCaps(0, -1): job caps %d / %d, want 0 / -1 verbatim", cores, gpus)
		}
	}
	for _, c := range []struct {
		maxCores, maxGPUs int
		cores, gpus       int
	}{{-1, -1, -1, -1}, {-5, -3, -1, -1}, {0, 0, 0, 0}, {3, 1, 300, 1}} {
		f, err := s.Folder(ctx, show, fmt.Sprintf("f%d", c.maxCores), c.maxCores, c.maxGPUs)
		if err != nil {
			t.Fatal(err)
		}
		var cores, gpus int
		if err := pool.QueryRow(ctx, `SELECT int_max_cores, int_max_gpus FROM folder_resource WHERE pk_folder = $1`, f).Scan(&cores, &gpus); err != nil {
			t.Fatal(err)
		}
		if cores != c.cores || gpus != c.gpus {
			t.Errorf("Folder(%d, %d): caps %d / %d, want %d / %d", c.maxCores, c.maxGPUs, cores, gpus, c.cores, c.gpus)
		}
	}
}

// TestHostsWritesWhatHostWrites: the bulk insert gives every host the rows
// Host gives one.
func TestHostsWritesWhatHostWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, s, fac := newTestSeeder(t)
	alloc, err := s.Alloc(ctx, fac, "fac.gpu", "gpu")
	if err != nil {
		t.Fatal(err)
	}
	spec := func(name string) HostSpec {
		return HostSpec{Name: name, Alloc: alloc, AllocTag: "gpu", Cores: 16, MemKB: 96 * GB, GPUs: 2, GPUMemKB: 24 * GB,
			Tags: []HostTag{{"cuda", "HARDWARE"}}}
	}
	if _, err := s.Host(ctx, spec("one")); err != nil {
		t.Fatal(err)
	}
	ids, err := s.Hosts(ctx, spec("bulk1"), spec("bulk2"))
	if err != nil || len(ids) != 2 {
		t.Fatalf("Hosts: %v %v", ids, err)
	}
	row := func(name string) string {
		var out string
		if err := pool.QueryRow(ctx, `SELECT concat_ws(',', h.int_cores, h.int_procs, h.int_cores_idle, h.int_mem, h.int_mem_idle,
			h.int_gpus, h.int_gpus_idle, h.int_gpu_mem_idle, h.str_lock_state, replace(h.str_tags, h.str_name, 'NAME'),
			s.int_mem_free, s.int_gpu_mem_free, s.str_state, s.str_os,
			(SELECT string_agg(replace(str_tag, h.str_name, 'NAME') || ':' || str_tag_type || ':' || b_constant, ' ' ORDER BY str_tag_type, str_tag)
			   FROM host_tag WHERE pk_host = h.pk_host))
			FROM host h JOIN host_stat s ON s.pk_host = h.pk_host AND s.pk_host_stat = h.pk_host WHERE h.str_name = $1`, name).Scan(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	want := row("one")
	for _, n := range []string{"bulk1", "bulk2"} {
		if got := row(n); got != want {
			t.Fatalf("%s: %s\nHost wrote:  %s", n, got, want)
		}
	}
	if _, err := s.Hosts(ctx, spec("bulk1")); err == nil || !strings.Contains(err.Error(), "1 hosts") {
		t.Fatalf("a duplicate host name: %v", err)
	}
}
