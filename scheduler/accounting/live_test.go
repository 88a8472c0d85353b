package accounting

import (
	"testing"

	"github.com/cuesched/cuesched/scheduler/jobs"
)

// TestLiveUseReadsTheChargedCounters: Live reads what the booking script
// charges (whole cores per proc, in centicores for the pending query), and
// does not vouch for a show whose accounting is not seeded.
func TestLiveUseReadsTheChargedCounters(t *testing.T) {
	t.Parallel()
	f, a, b := cuebotBooked(t)
	s, _ := f.service(Config{})
	if err := s.Bootstrap(f.ctx); err != nil {
		t.Fatal(err)
	}
	live := Live{RDB: f.rdb}
	use, ok, err := live.LiveUse(f.ctx, a.id, []string{a.jobs[0].id, a.jobs[1].id, "no-such-job"}, []string{a.folder}, []string{a.alloc})
	if err != nil || !ok {
		t.Fatalf("LiveUse(seeded show) = ok %v, %v", ok, err)
	}
	want := map[string]jobs.Use{a.jobs[0].id: {Cores: 400}, a.jobs[1].id: {Cores: 100, GPUs: 1}, "no-such-job": {}}
	for id, w := range want {
		if use.Jobs[id] != w {
			t.Errorf("job %s use = %+v, want %+v", id, use.Jobs[id], w)
		}
	}
	if got := use.Folders[a.folder]; got != (jobs.Use{Cores: 500, GPUs: 1}) {
		t.Errorf("folder use = %+v, want 500 centicores and 1 GPU", got)
	}
	if got := use.Allocs[a.alloc]; got.Cores != 500 {
		t.Errorf("subscription use = %+v, want 500 centicores", got)
	}
	if _, ok, err := live.LiveUse(f.ctx, b.id, []string{b.jobs[0].id}, []string{b.folder}, []string{b.alloc}); err != nil || ok {
		t.Fatalf("LiveUse(unmanaged, unseeded show) = ok %v, %v; want not vouched for", ok, err)
	}
}
