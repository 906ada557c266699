// A pool's queue of waiters, its service-time estimate, and the state
// Snapshot reports.

package admission

import (
	"math"
	"strings"
	"time"
)

// insertLocked queues w in arrival order: at the tail for a newcomer, or
// further ahead for a retry that keeps its original place.
func (p *Pool) insertLocked(w *waiter) {
	w.queued = true
	p.queued++
	at := p.tail
	for at != nil && at.since.After(w.since) {
		at = at.prev
	}
	// w goes right after at (or first when at is nil).
	w.prev = at
	if at == nil {
		w.next = p.head
		p.head = w
	} else {
		w.next = at.next
		at.next = w
	}
	if w.next != nil {
		w.next.prev = w
	} else {
		p.tail = w
	}
}

func (p *Pool) removeLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		p.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		p.tail = w.prev
	}
	w.prev, w.next = nil, nil
	w.queued = false
	p.queued--
}

func (s *Scheduler) changedLocked(b *backend) {
	if s.onChange == nil {
		return
	}
	queued := 0
	for _, p := range b.pools {
		queued += p.queued
	}
	s.onChange(b.name, b.inFlight, queued)
}

// sampleLocked adds one slot hold time to the pool's service-time average.
func (p *Pool) sampleLocked(held time.Duration) {
	if p.avgService == 0 {
		// The first observation replaces the prior outright, so a backend
		// much slower or faster than the prior is reflected at once.
		p.avgService = held
	} else {
		p.avgService = time.Duration(ewmaWeight*float64(held) + (1-ewmaWeight)*float64(p.avgService))
	}
	if p.avgService <= 0 {
		p.avgService = 1 // keep "no sample yet" distinguishable
	}
}

func (p *Pool) avgServiceLocked() time.Duration {
	if p.avgService == 0 {
		return DefaultServiceTime
	}
	return p.avgService
}

// retryAfterLocked estimates when a request arriving behind queued others
// could be admitted: each slot of the pool frees up about once per average
// service time, and queued+1 requests need one. Rounded up to whole
// seconds, at least one, at most a day.
func (p *Pool) retryAfterLocked(queued int) time.Duration {
	est := float64(queued+1) * float64(p.avgServiceLocked()) / float64(max(p.capacity, 1))
	secs := math.Ceil(est / float64(time.Second))
	secs = min(max(secs, 1), 86400)
	return time.Duration(secs) * time.Second
}

// Snapshot returns one backend's state: its slots on this replica, and the
// requests waiting in the pools it serves.
func (s *Scheduler) Snapshot(backend string) Snapshot {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.byName[backend]
	if !ok {
		return Snapshot{}
	}
	snap := Snapshot{InFlight: b.inFlight, MaxConcurrency: b.max}
	var oldest time.Time
	for _, p := range b.pools {
		snap.Queued += p.queued
		if !p.retired { // its waiters count; its queue takes nobody new
			snap.MaxQueue += p.maxQueue
		}
		if p.head != nil && (oldest.IsZero() || p.head.since.Before(oldest)) {
			oldest = p.head.since
		}
	}
	if !oldest.IsZero() {
		snap.OldestWait = max(now.Sub(oldest), 0)
	}
	return snap
}

// PoolName is the name of the pool for a set of backends: models served by
// the same backends share one queue.
func PoolName(backends []string) string { return strings.Join(backends, ",") }
