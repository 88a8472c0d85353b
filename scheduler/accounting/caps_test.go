package accounting

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cuesched/cuesched/publisher"
)

// TestDualWriteAtTheTopOfTheIntegerRange: the recompute's dual write moves
// each cap it passes (to keep Cuebot's verify triggers quiet) and moves it
// back; a job cap at the top of job_resource's integer range must survive
// that without an overflow, and a job cap of 0 or -1 stays what it was.
func TestDualWriteAtTheTopOfTheIntegerRange(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 3, jobMaxCores: 100, jobMaxGPUs: 10, hosts: 1})
	caps := [][2]int64{{2147483647, 2147483647}, {0, 0}, {-1, -1}}
	for i, c := range caps {
		sh.mustInsertProc("p"+string(rune('a'+i)), i, 300, 1)
		f.exec(`UPDATE job_resource SET int_max_cores = $2, int_max_gpus = $3 WHERE pk_job = $1`, sh.jobs[i].id, c[0], c[1])
	}
	f.exec(`UPDATE subscription SET int_burst = 9223372036854775807 WHERE pk_show = $1`, sh.id)
	s, _ := f.service(Config{})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range caps {
		if got := f.pgInt(`SELECT int_cores FROM job_resource WHERE pk_job = $1`, sh.jobs[i].id); got != 300 {
			t.Errorf("job %d (caps %v): job_resource.int_cores = %d, want 300 written", i, c, got)
		}
		if got := f.pgInt(`SELECT int_max_cores FROM job_resource WHERE pk_job = $1`, sh.jobs[i].id); got != c[0] {
			t.Errorf("job %d: int_max_cores = %d, want %d restored", i, got, c[0])
		}
		if got := f.pgInt(`SELECT int_max_gpus FROM job_resource WHERE pk_job = $1`, sh.jobs[i].id); got != c[1] {
			t.Errorf("job %d: int_max_gpus = %d, want %d restored", i, got, c[1])
		}
	}
	if got := f.pgInt(`SELECT int_burst FROM subscription WHERE pk_show = $1`, sh.id); got != 9223372036854775807 {
		t.Errorf("burst = %d, want restored", got)
	}
}

// TestLimitReseedZeroCapsStopBooking: caps as Cuebot reads them, end to end
// through the limit reseed loop. A job or folder max cores lowered to 0 stops
// booking at the next reseed, a job max of -1 books nothing (a job cap has no
// "unlimited" value), a folder max of -1 is unlimited while -2 is not, a job
// max GPUs of 0 refuses GPU procs and not CPU ones; and the audit reads the
// Redis caps back with the same conversions (no drift).
func TestLimitReseedZeroCapsStopBooking(t *testing.T) {
	t.Parallel()
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 100, folderMaxCores: -1, jobs: 1, jobMaxCores: 10, jobMaxGPUs: 2, hosts: 1})
	s, _ := f.service(Config{})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	n := 0
	book := func(gpus int64) error {
		n++
		b := sh.booking(fmt.Sprintf("p%d", n), 0, 100)
		b.GPUs = gpus
		_, err := f.pub.Book(f.ctx, b)
		return err
	}
	caps := func(folderCores, folderGPUs, jobCores, jobGPUs int64) {
		t.Helper()
		f.exec(`UPDATE folder_resource SET int_max_cores = $2, int_max_gpus = $3 WHERE pk_folder = $1`, sh.folder, folderCores, folderGPUs)
		f.exec(`UPDATE job_resource SET int_max_cores = $2, int_max_gpus = $3 WHERE pk_job = $1`, sh.jobs[0].id, jobCores, jobGPUs)
		if err := s.ReseedLimits(f.ctx); err != nil {
			t.Fatal(err)
		}
		f.requireNoDrift() // caps only: no booking is ever left in flight here
	}
	refused := func(what string, err error, table string) {
		t.Helper()
		var le *publisher.LimitError
		if !errors.As(err, &le) || le.Table != table || le.Limit != 0 || le.Missing {
			t.Errorf("%s: err = %v, want a %s LimitError at 0", what, err, table)
		}
	}
	if err := book(0); err != nil {
		t.Fatalf("booking under the seeded caps: %v", err)
	}
	sh.mustInsertProc("p1", 0, 100, 0)

	caps(-1, -1, 0, 2)
	refused("job max cores lowered to 0", book(0), publisher.TableJob)
	caps(-1, -1, -1, 2)
	refused("job max cores -1", book(0), publisher.TableJob)
	caps(0, -1, 1000, 2)
	refused("folder max cores lowered to 0", book(0), publisher.TableFolder)
	caps(-2, -1, 1000, 2)
	refused("folder max cores -2", book(0), publisher.TableFolder)
	caps(-1, -1, 1000, 0)
	refused("job max GPUs 0", book(1), publisher.TableJobGPUs)
	if err := book(0); err != nil {
		t.Errorf("a CPU proc under job max GPUs 0 and folder max -1: %v", err)
	}
	if got := f.counter(publisher.JobKey(sh.jobs[0].id), "int_max_gpus"); got != 0 {
		t.Errorf("job int_max_gpus in Redis = %d, want 0", got)
	}
}

// TestLimitReseedKeepsNewerSidecarCaps: the sidecar wrote a job's cap from
// a transaction later than the reseed's snapshot; the reseed leaves it.
func TestLimitReseedKeepsNewerSidecarCaps(t *testing.T) {
	f := newFarm(t)
	sh := f.addShow(showSpec{managed: true, burstCores: 10, jobs: 1, jobMaxCores: 6})
	s, _ := f.service(Config{})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	key := keyOf("job", sh, 0)
	if v := f.counter(key, "int_max_cores"); v != 6 {
		t.Fatalf("bootstrap wrote job cap %d, want 6", v)
	}
	// A later transaction lowered the cap to 2; the sidecar wrote it,
	// stamped far past any snapshot this test can take.
	if _, err := f.pub.WriteLimits(f.ctx, publisher.Limits{LSN: 1 << 60,
		Jobs: []publisher.JobLimits{{JobID: sh.jobs[0].id, MaxCores: 200, MaxGPUs: 100, Priority: 1}}}, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.ReseedLimits(f.ctx); err != nil {
		t.Fatal(err)
	}
	if v := f.counter(key, "int_max_cores"); v != 2 {
		t.Fatalf("limit reseed reverted the newer cap: %d, want 2", v)
	}
	// Once the stamp is older than the snapshot, the reseed writes again.
	if err := f.rdb.HSet(f.ctx, key, "cap_lsn", publisher.FormatLSN(1)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.ReseedLimits(f.ctx); err != nil {
		t.Fatal(err)
	}
	if v := f.counter(key, "int_max_cores"); v != 6 {
		t.Fatalf("limit reseed over an older stamp: cap %d, want Postgres's 6", v)
	}
}
