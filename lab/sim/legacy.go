package sim

import (
	"container/heap"
	"context"
	"math/rand"
	"sync"
	"time"

	"github.com/cuesched/cuesched/shared/testkit/cuebotemu"
)

// legacy is the battery's stand-in for Cuebot's own dispatcher: it books
// the frames of the shows that are NOT scheduler-managed the way Cuebot
// would (cuebotemu.Book: frame RUNNING, proc, host idle, and Cuebot's five
// accounting tables under their triggers), on hosts of allocations the show
// subscribes to, highest job priority first, and completes each frame after
// its run time through the emulator's frame-complete path. It reads
// show.b_scheduler_managed in the same critical section as its booking, so
// a flip (done under Pause) is seen at once, as the emulator documents.
type legacy struct {
	w    *World
	mu   sync.RWMutex // held (read) across one booking round; Pause takes it
	due  dueHeap
	rng  *rand.Rand
	done chan struct{}

	statMu   sync.Mutex
	booked   map[string]int // show name -> frames booked
	refusals int
	// maxLimited is the most frames of limited layers booked from one
	// read of the limit counts (one round): how far Cuebot's stale read
	// can carry it past a limit.
	maxLimited int
}

// MaxLimitedPerRead is the most frames of limited layers booked from one
// read of the limit counts.
func (l *legacy) MaxLimitedPerRead() int {
	l.statMu.Lock()
	defer l.statMu.Unlock()
	return l.maxLimited
}

// StartLegacy starts Cuebot's dispatcher for the unmanaged shows; it stops
// with the world's load.
func (w *World) StartLegacy(ctx context.Context) *legacy {
	l := &legacy{w: w, rng: rand.New(rand.NewSource(w.Opts.Seed + 17)), done: make(chan struct{}), booked: map[string]int{}}
	w.monWG.Add(1)
	go func() {
		defer w.monWG.Done()
		defer close(l.done)
		l.run(w.runCtx)
	}()
	return l
}

// Pause blocks legacy bookings until the returned func is called.
func (l *legacy) Pause() func() {
	l.mu.Lock()
	return l.mu.Unlock
}

// Booked is the frames booked so far for show.
func (l *legacy) Booked(show string) int {
	l.statMu.Lock()
	defer l.statMu.Unlock()
	return l.booked[show]
}

// Refusals counts bookings Cuebot's triggers (or a lost race) refused.
func (l *legacy) Refusals() int {
	l.statMu.Lock()
	defer l.statMu.Unlock()
	return l.refusals
}

type dueRun struct {
	at    time.Time
	frame string
	proc  string
	host  string
	ran   time.Duration
}

type dueHeap []dueRun

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueRun)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (l *legacy) run(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for l.due.Len() > 0 && !l.due[0].at.After(time.Now()) {
			r := heap.Pop(&l.due).(dueRun)
			err := l.w.Emu.Complete(ctx, cuebotemu.Completion{FrameID: r.frame, ProcID: r.proc, Host: r.host, RunTime: r.ran})
			if err != nil && ctx.Err() == nil {
				l.w.Note("legacy completion of frame %s: %v", r.frame, err)
			}
		}
		if n++; n%2 == 0 {
			l.round(ctx)
		}
	}
}

// legacyWorkSQL: WAITING frames of unmanaged shows, best job first, with
// the hosts (allocation the show subscribes to, tags matching) they may
// take.
//
// The limit condition is Cuebot's (its dispatch query's layer filter, read
// from OpenCue's DispatchQuery for the facts): a layer is dispatchable when
// it has no limit, or when one of its limits has fewer running frames (the
// sum of layer_stat.int_running_count over the limit's layers) than its
// int_max_value. It is a plain read, without a lock on limit_record, and
// every frame booked for one host from one read shares it: that is
// Cuebot's behaviour (its frame query runs per host visit). Frames of
// limited layers are booked on one host per round (one read per host
// visit); others as they fit.
const legacyWorkSQL = `
SELECT f.pk_frame, s.str_name, l.int_cores_min, l.int_mem_min, j.pk_job,
       EXISTS (SELECT 1 FROM layer_limit ll WHERE ll.pk_layer = l.pk_layer) AS limited
  FROM frame f
  JOIN layer l ON l.pk_layer = f.pk_layer
  JOIN job j ON j.pk_job = f.pk_job
  JOIN job_resource jr ON jr.pk_job = j.pk_job
  JOIN show s ON s.pk_show = j.pk_show
 WHERE f.str_state = 'WAITING' AND f.int_depend_count = 0
   AND j.str_state = 'PENDING' AND NOT j.b_paused
   AND s.b_active AND NOT s.b_scheduler_managed
   AND l.int_gpus_min = 0
   AND (NOT EXISTS (SELECT 1 FROM layer_limit ll WHERE ll.pk_layer = l.pk_layer)
        OR EXISTS (SELECT 1 FROM layer_limit ll JOIN limit_record lr ON lr.pk_limit_record = ll.pk_limit_record
                    WHERE ll.pk_layer = l.pk_layer
                      AND (SELECT COALESCE(SUM(ls.int_running_count), 0) FROM layer_limit ll2
                             JOIN layer_stat ls ON ls.pk_layer = ll2.pk_layer
                            WHERE ll2.pk_limit_record = lr.pk_limit_record) < lr.int_max_value))
 ORDER BY jr.int_priority DESC, j.ts_started, f.int_dispatch_order, f.pk_frame
 LIMIT 64`

const legacyHostsSQL = `
SELECT h.pk_host, h.str_name, h.int_cores_idle, h.int_mem_idle, s.str_name
  FROM host h
  JOIN host_stat hs ON hs.pk_host = h.pk_host
  JOIN subscription sub ON sub.pk_alloc = h.pk_alloc
  JOIN show s ON s.pk_show = sub.pk_show
 WHERE hs.str_state = 'UP' AND h.str_lock_state = 'OPEN' AND h.int_cores_idle >= 100
   AND NOT s.b_scheduler_managed AND s.b_active`

type legacyHost struct {
	id, name   string
	cores, mem int64
}

// round books what fits, once.
func (l *legacy) round(ctx context.Context) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	w := l.w
	hosts := map[string][]*legacyHost{} // show -> hosts
	byID := map[string]*legacyHost{}
	rows, err := w.Pool.Query(ctx, legacyHostsSQL)
	if err != nil {
		return
	}
	for rows.Next() {
		var h legacyHost
		var show string
		if rows.Scan(&h.id, &h.name, &h.cores, &h.mem, &show) != nil {
			continue
		}
		p := byID[h.id]
		if p == nil {
			p = &h
			byID[h.id] = p
		}
		hosts[show] = append(hosts[show], p)
	}
	rows.Close()
	if len(byID) == 0 {
		return
	}
	type work struct {
		frame, show, job string
		cores, mem       int64
		limited          bool
	}
	var ws []work
	rows, err = w.Pool.Query(ctx, legacyWorkSQL)
	if err != nil {
		return
	}
	for rows.Next() {
		var x work
		if rows.Scan(&x.frame, &x.show, &x.cores, &x.mem, &x.job, &x.limited) == nil {
			ws = append(ws, x)
		}
	}
	rows.Close()
	limited, limitedHost := 0, ""
	defer func() {
		l.statMu.Lock()
		l.maxLimited = max(l.maxLimited, limited)
		l.statMu.Unlock()
	}()
	for _, x := range ws {
		if ctx.Err() != nil {
			return
		}
		cores := max(x.cores, 100)
		for _, h := range hosts[x.show] {
			if h.cores < cores || h.mem < x.mem {
				continue
			}
			if x.limited && limitedHost != "" && h.id != limitedHost {
				// Cuebot reads the limit counts in its query for one host
				// visit: frames of limited layers for another host wait
				// for the next read.
				break
			}
			proc, err := w.Emu.Book(ctx, cuebotemu.Booking{FrameID: x.frame, HostID: h.id, Cores: cores, MemKB: x.mem})
			if err != nil {
				// A trigger refused it (burst, job max cores, the host
				// taken by the scheduler meanwhile) or the frame moved on.
				l.statMu.Lock()
				l.refusals++
				l.statMu.Unlock()
				h.cores = 0
				break
			}
			h.cores -= cores
			h.mem -= x.mem
			span := int64(w.runMax - w.runMin)
			ran := w.runMin
			if span > 0 {
				ran += time.Duration(l.rng.Int63n(span))
			}
			heap.Push(&l.due, dueRun{at: time.Now().Add(ran), frame: x.frame, proc: proc, host: h.name, ran: ran})
			l.statMu.Lock()
			l.booked[x.show]++
			l.statMu.Unlock()
			if x.limited {
				limited++
				limitedHost = h.id
			}
			break
		}
	}
}
