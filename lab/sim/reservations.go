package sim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/scheduler/reservations"
	"github.com/cuesched/cuesched/shared/config"
	"github.com/cuesched/cuesched/shared/testkit/farmseed"
)

// The RESERVATIONS variants.
var (
	noReservations = Variant{Name: "no reservations", Config: func(c *config.Config) { c.Queue.Reservations.Enabled = false }}
	// resvFailover kills the scheduler that granted a reservation while it
	// is held; judged, unlike a comparison.
	resvFailover = Variant{Name: "failover", Judged: true}
)

// wideSpec is one wide job of the scenario.
type wideSpec struct {
	name   string
	cores  int
	frames int
}

// runReservations: 64- and 128-core frames arrive on a farm of 64- and
// 128-core hosts saturated by 1-core frames (4-6 s, plus a stream of 1 s
// frames that can backfill). With reservations every wide frame runs; the
// farm stays busy; no non-owner books a reserved host except as a
// backfill. The "no reservations" variant measures the same wait without
// them; "failover" kills the scheduler that granted a reservation while it
// is held and checks that the survivor honours it.
func runReservations(ctx context.Context, w *World) error {
	failover := w.Variant.Name == resvFailover.Name
	w.Configure(func(c *config.Config) {
		c.Queue.Reservations.BlockedFor = config.Duration(3 * time.Second)
		c.Queue.Reservations.Timeout = config.Duration(90 * time.Second)
		c.Queue.Reservations.RefreshInterval = config.Duration(250 * time.Millisecond)
	})
	alloc, err := w.Seed.Alloc(ctx, w.Facility, "sim.general", "general")
	if err != nil {
		return err
	}
	n64, n128 := w.Opts.scale(4), w.Opts.scale(2)
	if err := w.hosts(ctx, "m", alloc, "general", n64, 64, 0); err != nil {
		return err
	}
	if err := w.hosts(ctx, "x", alloc, "general", n128, 128, 0); err != nil {
		return err
	}
	cores := n64*64 + n128*128
	show, err := w.Seed.Show(ctx, "main", true)
	if err != nil {
		return err
	}
	if _, err := w.Seed.Subscribe(ctx, show, alloc, cores, cores); err != nil {
		return err
	}
	// The flood: enough 4-6 s frames to keep the farm saturated for the
	// whole run, and a stream of 1 s frames (EASY backfill candidates).
	w.RunTimes(4*time.Second, 6*time.Second)
	var specs []farmseed.JobSpec
	per := cores * 4
	for i := 0; i < 8; i++ {
		specs = append(specs, farmseed.JobSpec{Name: fmt.Sprintf("flood%d", i), Show: show, Facility: w.Facility, Priority: 50,
			MaxCores: farmseed.Uncapped, Layers: []farmseed.LayerSpec{oneCore("render", per)}})
	}
	specs = append(specs, farmseed.JobSpec{Name: "quick", Show: show, Facility: w.Facility, Priority: 50,
		MaxCores: farmseed.Uncapped, Layers: []farmseed.LayerSpec{oneCore("quick", per)}})
	seeded, err := w.Seed.Jobs(ctx, specs...)
	if err != nil {
		return err
	}
	w.LayerRunTime(seeded[len(seeded)-1].Layers[0].ID, time.Second)
	schedulers := 0
	if failover {
		schedulers = max(w.Opts.Schedulers, 2)
	}
	if err := w.Start(ctx, schedulers); err != nil {
		return err
	}
	if err := w.settle(ctx, 0.9); err != nil {
		return err
	}
	// Let the flood's layers gather runtime history (backfill needs it).
	if err := Sleep(ctx, 7*time.Second); err != nil {
		return err
	}

	wides := []wideSpec{{"wide64a", 64, 3}, {"wide64b", 64, 3}, {"wide128", 128, 2}}
	var wideLayers []string
	owners := map[string]string{} // layer -> job name
	total := 0
	var t0 time.Time
	if err := w.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t0); err != nil {
		return err
	}
	arrived := w.Elapsed().Seconds()
	for _, ws := range wides {
		j, err := w.Seed.Job(ctx, farmseed.JobSpec{Name: ws.name, Show: show, Facility: w.Facility, Priority: 50, MaxCores: farmseed.Uncapped,
			Layers: []farmseed.LayerSpec{{Name: "sim", Tags: []string{"general"}, Frames: ws.frames, Cores: ws.cores, MemKB: 32 * gb}}})
		if err != nil {
			return err
		}
		wideLayers = append(wideLayers, j.Layers[0].ID)
		owners[j.Layers[0].ID] = ws.name
		w.LayerRunTime(j.Layers[0].ID, 10*time.Second)
		total += ws.frames
	}

	fv := newFirmCheck(w)
	w.Sample(func(ctx context.Context, _ float64) { fv.sample(ctx) })

	var killedAt time.Time
	var held reservations.Reservation
	survivor := -1
	if failover {
		// Kill the scheduler that granted the first reservation, while it
		// is held.
		if !w.WaitFor(ctx, 60*time.Second, func() bool {
			rs, _ := reservations.List(ctx, w.RDB)
			for _, r := range rs {
				if r.Live(time.Now()) && strings.HasPrefix(r.GrantedBy, "sim") {
					held = r
					return true
				}
			}
			return false
		}) {
			return errors.New("no reservation was granted within 60 s of the wide jobs' arrival")
		}
		victim, err := strconv.Atoi(strings.TrimPrefix(held.GrantedBy, "sim"))
		if err != nil || victim >= len(w.scheds) {
			return fmt.Errorf("reservation granted by %q: not a sim instance", held.GrantedBy)
		}
		w.Kill(victim)
		killedAt = time.Now()
		fv.since(killedAt)
		for i, in := range w.scheds {
			if !in.dead {
				survivor = i
			}
		}
		w.Note("killed scheduler %d, which granted %s's reservation of host %s (ready in %.1fs)", victim, held.JobName,
			held.HostName, time.Until(held.ReadyAt).Seconds())
		// The survivor's snapshot holds it within its refresh.
		seen := w.WaitFor(ctx, 10*time.Second, func() bool {
			r, ok := w.scheds[survivor].s.Reservations.Board().Lookup(held.Host)
			return ok && r.Layer == held.Layer
		})
		// Unless its owner already booked it (the survivor's pass may be
		// quicker than its refresh): then the host ran the owner's frame.
		w.Metric("the survivor sees the held reservation (or its owner ran there)", b2f(seen || w.ownerRan(ctx, held)), Equal, 1, "")
	}

	// Every wide frame starts.
	deadline := 90 * time.Second
	all := w.WaitFor(ctx, deadline, func() bool {
		return w.Int(ctx, `SELECT count(*) FROM frame WHERE pk_layer = ANY($1) AND str_state IN ('RUNNING', 'SUCCEEDED')`, wideLayers) >= int64(total)
	})
	ended := w.Elapsed().Seconds()
	// Utilization: booked ÷ total cores from the wide jobs' arrival, over
	// at least 60 s.
	if rest := arrived + 60 - ended; rest > 0 {
		if err := Sleep(ctx, time.Duration(rest*float64(time.Second))); err != nil {
			return err
		}
		ended = w.Elapsed().Seconds()
	}
	util := w.meanFill(arrived, ended)

	// Waits: from the arrival to each wide frame's start.
	rows, err := w.Pool.Query(ctx, `SELECT f.pk_layer, EXTRACT(EPOCH FROM (f.ts_started - $2))::float8
		FROM frame f WHERE f.pk_layer = ANY($1) AND f.str_state IN ('RUNNING', 'SUCCEEDED') AND f.ts_started IS NOT NULL`, wideLayers, t0)
	if err != nil {
		return err
	}
	var waits []float64
	firstByJob := map[string]float64{}
	for rows.Next() {
		var layer string
		var s float64
		if rows.Scan(&layer, &s) == nil {
			waits = append(waits, s)
			if v, ok := firstByJob[owners[layer]]; !ok || s < v {
				firstByJob[owners[layer]] = s
			}
		}
	}
	rows.Close()
	sort.Float64s(waits)
	ran := len(waits)
	maxWait := deadline.Seconds()
	if ran == total && ran > 0 {
		maxWait = waits[len(waits)-1]
	}
	var firsts []string
	for _, ws := range wides {
		if v, ok := firstByJob[ws.name]; ok {
			firsts = append(firsts, fmt.Sprintf("%s %.1fs", ws.name, v))
		} else {
			firsts = append(firsts, ws.name+" never")
		}
	}
	w.Note("first frame started after: %s; all %d wide frames started: %v", strings.Join(firsts, ", "), total, all)
	judged := w.Variant.Name == "" || failover
	if judged {
		w.Metric("wide frames that ran", float64(ran), Equal, float64(total), "")
		w.Metric("max wait of a wide frame (from arrival)", maxWait, AtMost, deadline.Seconds()-1, "s")
		w.Metric("farm utilization from the wide jobs' arrival", util*100, AtLeast, 85, "%")
	} else {
		w.Metric("wide frames that ran", float64(ran), Info, 0, "")
		w.Metric("max wait of a wide frame (from arrival; the deadline if some never ran)", maxWait, Info, 0, "s")
		w.Metric("farm utilization from the wide jobs' arrival", util*100, Info, 0, "%")
	}
	v, after := fv.result()
	w.Metric("non-owner bookings on a reserved host that were not backfills", float64(v), Equal, 0, "")
	for _, e := range fv.examples() {
		w.Note("violation: %s", e)
	}
	granted, backfills := fv.totals()
	w.Metric("reservations seen", float64(granted), Info, 0, "")
	w.Metric("EASY backfills admitted on reserved hosts", float64(backfills), Info, 0, "")
	if failover {
		w.Metric("non-owner bookings on a reserved host after the kill", float64(after), Equal, 0, "")
		w.Metric("the reserved host ran its owner's frame after the kill", b2f(w.ownerRan(ctx, held)), Equal, 1, "")
	}
	return nil
}

// meanFill averages the monitor's fill samples in [from, to] (seconds since
// Start).
func (w *World) meanFill(from, to float64) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var sum float64
	n := 0
	for _, p := range w.fill {
		if p.T >= from && p.T <= to {
			sum += p.Fill
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// ownerRan reports whether a frame of r's owner layer ran on r's host.
func (w *World) ownerRan(ctx context.Context, r reservations.Reservation) bool {
	if r.Host == "" {
		return false
	}
	return w.Int(ctx, `SELECT count(*) FROM frame f JOIN host h ON h.str_name = f.str_host
		WHERE f.pk_layer = $1 AND h.pk_host = $2 AND f.str_state IN ('RUNNING', 'SUCCEEDED')`, r.Layer, r.Host) > 0
}

// firmCheck samples the procs on reserved hosts: a proc of another layer
// whose Redis booking record was written after the grant must have been
// admitted as a backfill (the record's resv field), else the reservation
// was not firm.
type firmCheck struct {
	w *World

	mu        sync.Mutex
	seen      map[string]bool // violating procs
	after     time.Time       // count violations booked after this too
	nAfter    int
	ex        []string
	resv      map[string]bool // host/layer/granted_at seen
	backfills map[string]int64
}

func newFirmCheck(w *World) *firmCheck {
	return &firmCheck{w: w, seen: map[string]bool{}, resv: map[string]bool{}, backfills: map[string]int64{}}
}

func (f *firmCheck) since(t time.Time) {
	f.mu.Lock()
	f.after = t
	f.mu.Unlock()
}

func (f *firmCheck) sample(ctx context.Context) {
	rs, err := reservations.List(ctx, f.w.RDB)
	if err != nil {
		return
	}
	now := time.Now()
	for _, r := range rs {
		if !r.Live(now) {
			continue
		}
		key := r.Host + "/" + r.Layer + "/" + r.GrantedAt.String()
		f.mu.Lock()
		f.resv[key] = true
		f.backfills[key] = r.Backfills
		f.mu.Unlock()
		rows, err := f.w.Pool.Query(ctx, `SELECT pk_proc FROM proc WHERE pk_host = $1 AND pk_layer IS DISTINCT FROM $2`, r.Host, r.Layer)
		if err != nil {
			continue
		}
		var procs []string
		for rows.Next() {
			var p string
			if rows.Scan(&p) == nil {
				procs = append(procs, p)
			}
		}
		rows.Close()
		for _, p := range procs {
			v, err := f.w.RDB.HMGet(ctx, publisher.ProcKey(p), "ts", "resv").Result()
			if err != nil || v[0] == nil {
				continue
			}
			ts, _ := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
			tag, _ := v[1].(string)
			if ts <= r.GrantedAt.UnixMilli() || tag == publisher.ReservationBackfill {
				continue
			}
			f.mu.Lock()
			if !f.seen[p] {
				f.seen[p] = true
				if !f.after.IsZero() && time.UnixMilli(ts).After(f.after) {
					f.nAfter++
				}
				if len(f.ex) < 5 {
					f.ex = append(f.ex, fmt.Sprintf("proc %s booked on %s %dms after %s's reservation was granted", p, r.HostName,
						ts-r.GrantedAt.UnixMilli(), r.JobName))
				}
			}
			f.mu.Unlock()
		}
	}
}

func (f *firmCheck) result() (violations, afterKill int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen), f.nAfter
}

func (f *firmCheck) examples() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ex...)
}

func (f *firmCheck) totals() (reservations int, backfills int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.backfills {
		backfills += b
	}
	return len(f.resv), backfills
}
