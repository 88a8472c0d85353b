package matcher

import (
	"sync"
	"time"
)

// Permits are in-process, expiring, exclusive claims on layers, so two
// cluster passes of one scheduler never work the same layer at once. They
// are not shared between instances: across instances the frame UPDATE's
// int_version guard (with FOR UPDATE SKIP LOCKED) is what keeps a frame from
// being started twice, and permits only save wasted work.
type Permits struct {
	mu  sync.Mutex
	now func() time.Time
	m   map[string]time.Time // layer -> expiry
	ops int
}

// NewPermits returns an empty permit table.
func NewPermits() *Permits {
	return &Permits{now: time.Now, m: map[string]time.Time{}}
}

// Acquire grants the layer for d unless an unexpired permit exists.
func (p *Permits) Acquire(layer string, d time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if exp, ok := p.m[layer]; ok && now.Before(exp) {
		return false
	}
	p.m[layer] = now.Add(d)
	p.ops++
	if p.ops%1024 == 0 {
		for l, exp := range p.m {
			if !now.Before(exp) {
				delete(p.m, l)
			}
		}
	}
	return true
}

// Release drops the layer's permit.
func (p *Permits) Release(layer string) {
	p.mu.Lock()
	delete(p.m, layer)
	p.mu.Unlock()
}

// Len is the number of permits held (tests).
func (p *Permits) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}
