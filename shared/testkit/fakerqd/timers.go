package fakerqd

import (
	"container/heap"
	"time"
)

// ends is the one timer of the whole fake: a min-heap of running frames by
// the time they end, served by one goroutine (ender). A farm of 10,000
// hosts keeps ~100,000 frames running; a runtime timer and a goroutine per
// frame cost more than the launches they time.
type ends []*runningFrame

func (h ends) Len() int           { return len(h) }
func (h ends) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h ends) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].slot, h[j].slot = i, j
}
func (h *ends) Push(x any) {
	f := x.(*runningFrame)
	f.slot = len(*h)
	*h = append(*h, f)
}
func (h *ends) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	f.slot = -1
	return f
}

// schedule times f's end. Callers hold s.mu.
func (s *Server) schedule(f *runningFrame) {
	f.due = f.started.Add(f.runTime)
	heap.Push(&s.ends, f)
	if f.slot == 0 {
		// A new earliest end: wake the ender to re-arm its timer.
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// unschedule drops f from the heap (a kill, or Stop). Callers hold s.mu.
func (s *Server) unschedule(f *runningFrame) {
	if f.slot >= 0 && f.slot < len(s.ends) && s.ends[f.slot] == f {
		heap.Remove(&s.ends, f.slot)
	}
}

// ender ends frames when they are due, until quit is closed.
func (s *Server) ender() {
	defer close(s.enderDone)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := time.Now()
		var due []*runningFrame
		for len(s.ends) > 0 && !s.ends[0].due.After(now) {
			due = append(due, heap.Pop(&s.ends).(*runningFrame))
		}
		wait := time.Hour
		if len(s.ends) > 0 {
			wait = s.ends[0].due.Sub(now)
		}
		s.mu.Unlock()
		for _, f := range due {
			s.finish(f, false, "")
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
		select {
		case <-s.quit:
			return
		case <-s.wake:
		case <-t.C:
		}
	}
}
