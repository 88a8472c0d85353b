package sim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// monitor samples the farm while a scenario runs: the fill curve, and the
// global invariants that can only be seen live (a host over its resources,
// a booking that took a job, folder, subscription or limit past its cap, a
// negative Redis counter).
//
// A use above its cap is a violation only when it grew since the previous
// sample: a cap lowered below live use (CAPDROP) is legal, booking more
// past it is not.
type monitor struct {
	w *World

	mu       sync.Mutex
	samplers []func(ctx context.Context, t float64)
	prev     map[string]int64 // use per cap at the last cap sample
	prevCap  map[string]int64
	capRuns  int
	nextScan time.Time // the proc-table checks run again from then
	nextNeg  time.Time // the Redis counter scan runs again from then
	scans    int
	scanTime time.Duration
	hostOver int
	capOver  int
	negative int
	examples []string
}

type monitorSnapshot struct {
	hostOver, capOver, negative int
	examples                    []string
	scans                       int           // proc-table scans run
	scanTime                    time.Duration // their time
}

func newMonitor(w *World) *monitor {
	return &monitor{w: w, prev: map[string]int64{}, prevCap: map[string]int64{}}
}

func (m *monitor) add(f func(ctx context.Context, t float64)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.samplers = append(m.samplers, f)
}

func (m *monitor) snapshot() monitorSnapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return monitorSnapshot{m.hostOver, m.capOver, m.negative, append([]string(nil), m.examples...), m.scans, m.scanTime}
}

func (m *monitor) example(format string, args ...any) {
	if len(m.examples) < 8 {
		m.examples = append(m.examples, fmt.Sprintf(format, args...))
	}
}

const tick = 250 * time.Millisecond

func (m *monitor) run(ctx context.Context) {
	t := time.NewTicker(tick)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n++
		at := m.w.Elapsed().Seconds()
		m.sample(ctx, at, n%4 == 0)
		m.mu.Lock()
		fs := append([]func(context.Context, float64){}, m.samplers...)
		m.mu.Unlock()
		for _, f := range fs {
			f(ctx, at)
		}
	}
}

// capUseSQL: (kind, id, use, cap) for every job, folder and subscription
// with live procs, and every limit with running frames.
//
// A node-locked limit (cuesched_limit.b_per_host) counts the hosts its
// layers' RUNNING frames run on; every other limit counts the RUNNING
// frames of its layers, as Cuebot and the booking statement do (layer_stat.int_running_count), not procs: Cuebot's
// completion path stops the frame (and detaches its proc) in one
// transaction and deletes the proc in a later one, so for a moment a proc
// outlives the frame it ran while the licence is already back (the render
// process exited before RQD reported it). Counting procs there saw a seat
// still taken that was free, and reported a cap overrun that never
// happened on a render node. What holds a seat on a render node is checked
// separately, from the fake RQD (seatUse).
const capUseSQL = `
SELECT 'job', p.pk_job, sum(p.int_cores_reserved)::bigint, max(jr.int_max_cores)::bigint
  FROM proc p JOIN job_resource jr ON jr.pk_job = p.pk_job GROUP BY p.pk_job
UNION ALL
SELECT 'folder', fr.pk_folder, sum(p.int_cores_reserved)::bigint, max(fr.int_max_cores)::bigint
  FROM proc p JOIN job j ON j.pk_job = p.pk_job JOIN folder_resource fr ON fr.pk_folder = j.pk_folder
 WHERE fr.int_max_cores >= 0 GROUP BY fr.pk_folder
UNION ALL
SELECT 'subscription', s.pk_subscription, sum(p.int_cores_reserved)::bigint, max(s.int_burst)::bigint
  FROM proc p JOIN host h ON h.pk_host = p.pk_host JOIN subscription s ON s.pk_show = p.pk_show AND s.pk_alloc = h.pk_alloc
 GROUP BY s.pk_subscription
UNION ALL
SELECT 'limit', lr.str_name,
       CASE WHEN COALESCE(bool_or(cl.b_per_host), false) THEN count(DISTINCT f.str_host) ELSE count(*) END::bigint,
       max(lr.int_max_value)::bigint
  FROM frame f JOIN layer_limit ll ON ll.pk_layer = f.pk_layer JOIN limit_record lr ON lr.pk_limit_record = ll.pk_limit_record
  LEFT JOIN cuesched_limit cl ON cl.pk_limit_record = lr.pk_limit_record
 WHERE f.str_state = 'RUNNING'
 GROUP BY lr.str_name
-- A limit shared with a show Cuebot dispatches is judged by its scenario
-- (LIMIT_MIXED): Cuebot's side books from an unlocked read.
HAVING NOT EXISTS (SELECT 1 FROM layer_limit ll3 JOIN layer l3 ON l3.pk_layer = ll3.pk_layer
                     JOIN job j3 ON j3.pk_job = l3.pk_job JOIN show s3 ON s3.pk_show = j3.pk_show
                    WHERE ll3.pk_limit_record = max(lr.pk_limit_record) AND NOT s3.b_scheduler_managed)`

// limitLayersSQL: (layer, limit name, max, node-locked) for every layer
// under a limit that only scheduler-managed shows use (one shared with a
// show Cuebot dispatches is judged by LIMIT_MIXED).
const limitLayersSQL = `
SELECT ll.pk_layer, lr.str_name, lr.int_max_value::bigint, COALESCE(cl.b_per_host, false)
  FROM layer_limit ll JOIN limit_record lr ON lr.pk_limit_record = ll.pk_limit_record
  LEFT JOIN cuesched_limit cl ON cl.pk_limit_record = lr.pk_limit_record
 WHERE NOT EXISTS (SELECT 1 FROM layer_limit ll3 JOIN layer l3 ON l3.pk_layer = ll3.pk_layer
                     JOIN job j3 ON j3.pk_job = l3.pk_job JOIN show s3 ON s3.pk_show = j3.pk_show
                    WHERE ll3.pk_limit_record = lr.pk_limit_record AND NOT s3.b_scheduler_managed)`

// capUse is one cap's use at a sample.
type capUse struct {
	kind, id   string
	use, limit int64
}

// seatUse counts, per limit, the frames of its layers that run on the fake
// RQD right now: the processes that hold a licence seat. Launch follows
// the booking's commit and the completion report follows the process's
// exit, so these are always a subset of the RUNNING frames the booking
// statement counts.
func (m *monitor) seatUse(ctx context.Context) ([]capUse, error) {
	w := m.w
	if w.Fake == nil {
		return nil, nil
	}
	rows, err := w.Pool.Query(ctx, limitLayersSQL)
	if err != nil {
		return nil, err
	}
	type lim struct {
		name    string
		max     int64
		perHost bool
	}
	byLayer := map[string][]lim{}
	caps := map[string]int64{}
	for rows.Next() {
		var layer string
		var l lim
		if err := rows.Scan(&layer, &l.name, &l.max, &l.perHost); err != nil {
			rows.Close()
			return nil, err
		}
		byLayer[layer] = append(byLayer[layer], l)
		caps[l.name] = l.max
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(byLayer) == 0 {
		return nil, nil
	}
	// A node-locked limit's seats are the hosts running one of its frames.
	hosts, err := queryList[string](ctx, w, `SELECT str_name FROM host`)
	if err != nil {
		return nil, err
	}
	use := map[string]int64{}
	for _, h := range hosts {
		seated := map[string]bool{}
		for _, rf := range w.Fake.Running(h) {
			for _, l := range byLayer[rf.GetLayerId()] {
				if !l.perHost {
					use[l.name]++
				} else if !seated[l.name] {
					seated[l.name] = true
					use[l.name]++
				}
			}
		}
	}
	var out []capUse
	for name, n := range use {
		out = append(out, capUse{kind: "limit seats", id: name, use: n, limit: caps[name]})
	}
	return out, nil
}

// scanDuty bounds the share of the time the monitor's proc-table checks
// take: after a scan that took d, the next starts no sooner than
// d*scanDuty later (and no sooner than the next tick). At the battery's
// sizes a scan takes milliseconds and runs every tick as before; at 10,000
// hosts it runs every second or two instead of keeping a PostgreSQL core
// busy. What a sample proves is unchanged (a use past its cap that grew
// since the previous sample; a host's procs past its resources), and the
// fake RQD checks every launch against its host's cores and GPUs
// (fakerqd.Config.Capacity), so an over-booked render node is seen
// whatever the sampling rate.
const scanDuty = 10

func (m *monitor) sample(ctx context.Context, at float64, slow bool) {
	w := m.w
	if w.scale {
		w.mu.Lock()
		w.fill = append(w.fill, Point{T: at, Fill: w.LaunchedFill()})
		w.mu.Unlock()
	} else {
		var total, booked int64
		if err := w.Pool.QueryRow(ctx, `SELECT COALESCE(sum(int_cores),0)::bigint,
		COALESCE((SELECT sum(int_cores_reserved) FROM proc),0)::bigint FROM host`).Scan(&total, &booked); err == nil && total > 0 {
			w.mu.Lock()
			w.fill = append(w.fill, Point{T: at, Fill: float64(booked) / float64(total)})
			w.mu.Unlock()
		}
	}
	if slow && !time.Now().Before(m.nextNeg) {
		// The counter scan walks Redis's whole keyspace (SCAN's MATCH
		// filters after the walk): at 10,000 hosts that is tens of
		// thousands of keys, as much Redis time as the bookings'
		// scripts. It runs at most once a second and, like the
		// proc-table checks, takes at most a scanDuty-th of the time.
		began := time.Now()
		m.negatives(ctx, at)
		m.nextNeg = began.Add(time.Since(began) * scanDuty)
	}
	if time.Now().Before(m.nextScan) {
		return
	}
	began := time.Now()
	m.scanProcs(ctx, at)
	took := time.Since(began)
	m.mu.Lock()
	m.scans++
	m.scanTime += took
	m.mu.Unlock()
	m.nextScan = began.Add(took * scanDuty)
}

// scanProcs runs the checks that read the whole proc table: hosts past
// their resources and uses past their caps.
func (m *monitor) scanProcs(ctx context.Context, at float64) {
	w := m.w
	rows, err := w.Pool.Query(ctx, `SELECT h.str_name FROM proc p JOIN host h ON h.pk_host = p.pk_host
		GROUP BY h.pk_host, h.str_name HAVING sum(p.int_cores_reserved) > max(h.int_cores) OR sum(p.int_mem_reserved) > max(h.int_mem)
		    OR sum(p.int_gpus_reserved) > max(h.int_gpus)`)
	if err == nil {
		for rows.Next() {
			var h string
			if rows.Scan(&h) == nil {
				m.mu.Lock()
				m.hostOver++
				m.example("at %.1fs host %s over its cores, memory or GPUs", at, h)
				m.mu.Unlock()
			}
		}
		rows.Close()
	}
	rows, err = w.Pool.Query(ctx, capUseSQL)
	if err != nil && ctx.Err() == nil {
		m.mu.Lock()
		m.example("cap query failed: %v", err)
		m.mu.Unlock()
	}
	if err == nil {
		var uses []capUse
		for rows.Next() {
			var u capUse
			if rows.Scan(&u.kind, &u.id, &u.use, &u.limit) == nil {
				uses = append(uses, u)
			}
		}
		rows.Close()
		seats, serr := m.seatUse(ctx)
		if serr != nil && ctx.Err() == nil {
			m.mu.Lock()
			m.example("seat query failed: %v", serr)
			m.mu.Unlock()
		}
		uses = append(uses, seats...)
		seen, caps := map[string]int64{}, map[string]int64{}
		m.mu.Lock()
		m.capRuns++
		first := m.capRuns == 1
		m.mu.Unlock()
		for _, u := range uses {
			kind, id, use, limit := u.kind, u.id, u.use, u.limit
			key := kind + "/" + id
			seen[key], caps[key] = use, limit
			m.mu.Lock()
			// Over its cap and grown since the last sample, under a cap
			// that was not lowered meanwhile (the first sample has no
			// "before": it proves nothing).
			prevUse, known := m.prev[key]
			lowered := known && limit < m.prevCap[key]
			if use > limit && use > prevUse && !lowered && !first {
				m.capOver++
				m.example("at %.1fs %s %s grew to %d past its cap %d", at, kind, id, use, limit)
			}
			m.mu.Unlock()
		}
		m.mu.Lock()
		m.prev, m.prevCap = seen, caps
		m.mu.Unlock()
	}
}

// negatives scans the accounting counters for a negative value. One walk
// of the keyspace serves the four kinds (SCAN's MATCH filters after the
// walk, so a walk per pattern would cost four).
func (m *monitor) negatives(ctx context.Context, at float64) {
	rdb := m.w.RDB
	var keys []string
	iter := rdb.Scan(ctx, 0, "acct:*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		for _, prefix := range []string{"acct:sub:", "acct:job:", "acct:folder:", "acct:layer:"} {
			if strings.HasPrefix(k, prefix) {
				keys = append(keys, k)
				break
			}
		}
	}
	if len(keys) == 0 {
		return
	}
	pipe := rdb.Pipeline()
	cmds := make([]interface{ Val() []any }, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, "int_cores", "int_gpus")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return
	}
	for i, c := range cmds {
		for _, v := range c.Val() {
			s, _ := v.(string)
			if n, err := strconv.ParseInt(s, 10, 64); err == nil && n < 0 {
				m.mu.Lock()
				m.negative++
				m.example("at %.1fs %s counter %d", at, keys[i], n)
				m.mu.Unlock()
			}
		}
	}
}
