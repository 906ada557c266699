// Package admission limits how many requests one backend serves at once and
// makes the rest wait in a bounded, strictly first-in-first-out queue.
//
// Waiting in the gateway instead of inside the engine means the wait is
// measured (Slot.Waited), bounded (Options.QueueTimeout) and refused early
// when the queue is full, with a Retry-After estimated from the backend's
// recent service time.
package admission

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Reasons carried by Rejected.
const (
	ReasonQueueFull    = "queue_full"
	ReasonQueueTimeout = "queue_timeout"
)

// DefaultServiceTime is the prior for a backend's average slot hold time,
// used for Retry-After until the first slot has been released. One second is
// a deliberately short guess: it errs towards clients retrying a little
// early rather than being told to stay away for a long time on no evidence.
const DefaultServiceTime = time.Second

// ewmaWeight is the weight of the newest sample in the service-time average.
// 0.2 follows a change in load within a handful of requests while one very
// long or very short generation cannot swing the estimate on its own.
const ewmaWeight = 0.2

// Options configures a Gate.
type Options struct {
	// MaxConcurrency is how many slots may be held at once; values below 1
	// are treated as 1 because a gate that admits nobody is never useful.
	MaxConcurrency int
	// MaxQueue is how many requests may wait; 0 means none (reject at once
	// when all slots are taken). Negative values are treated as 0.
	MaxQueue int
	// QueueTimeout bounds the time spent queued; 0 means wait until the
	// caller's context ends.
	QueueTimeout time.Duration
	// OnChange, when set, is called with the new counts after every change
	// of in-flight or queued requests, so gauges need no polling. It runs
	// while the gate's lock is held, which keeps the calls in the same order
	// as the changes (a gauge can never go back to a stale value); it must
	// therefore be fast and must not call back into the Gate.
	OnChange func(inFlight, queued int)
}

// Rejected is returned by Acquire when a request is not admitted.
type Rejected struct {
	Backend string
	// Reason is ReasonQueueFull or ReasonQueueTimeout.
	Reason string
	// RetryAfter is the estimated time until a retry could be admitted,
	// rounded up to whole seconds and never below one second, ready for a
	// Retry-After header.
	RetryAfter time.Duration
	// Waited is the time spent queued before a queue_timeout (0 for
	// queue_full).
	Waited time.Duration
}

// Error describes the rejection.
func (r *Rejected) Error() string {
	return fmt.Sprintf("admission: backend %q: %s (retry after %s)", r.Backend, r.Reason, r.RetryAfter)
}

// RetryAfterSeconds returns RetryAfter as whole seconds (at least 1) for
// the Retry-After header.
func (r *Rejected) RetryAfterSeconds() int {
	return int(r.RetryAfter / time.Second)
}

// Gate admits requests to one backend.
type Gate struct {
	backend  string
	max      int
	maxQueue int
	timeout  time.Duration
	onChange func(inFlight, queued int)

	mu       sync.Mutex
	inFlight int
	// head and tail form an intrusive doubly linked list of waiters, oldest
	// first; a list (rather than a slice) lets a cancelled waiter leave from
	// the middle in O(1).
	head, tail *waiter
	queued     int
	avgService time.Duration // EWMA of slot hold times; 0 until the first Release
}

// waiter is one queued Acquire. ready is closed, under the gate's lock, when
// a slot is handed over; granted records that so a waiter whose context
// ends at the same moment knows it owns a slot.
type waiter struct {
	prev, next *waiter
	ready      chan struct{}
	granted    bool
	since      time.Time // when it joined the queue, for Snapshot's OldestWait
}

// NewGate returns a Gate for the named backend.
func NewGate(backend string, o Options) *Gate {
	if o.MaxConcurrency < 1 {
		o.MaxConcurrency = 1
	}
	if o.MaxQueue < 0 {
		o.MaxQueue = 0
	}
	if o.QueueTimeout < 0 {
		o.QueueTimeout = 0
	}
	return &Gate{
		backend:  backend,
		max:      o.MaxConcurrency,
		maxQueue: o.MaxQueue,
		timeout:  o.QueueTimeout,
		onChange: o.OnChange,
	}
}

// Slot is one admitted request's hold on the backend. Release it when the
// upstream call has ended (stream finished, error, or client gone).
type Slot struct {
	g        *Gate
	acquired time.Time
	waited   time.Duration
	released atomic.Bool
}

// Backend returns the backend name the Gate was made for.
func (g *Gate) Backend() string { return g.backend }

// Acquire takes a slot or waits in strict arrival order. It returns at once
// with *Rejected{Reason: "queue_full"} when the queue is full, with
// *Rejected{Reason: "queue_timeout"} after QueueTimeout, and with ctx.Err()
// when ctx ends while queued; in both of the latter cases the place in the
// queue is freed at once and those behind move up.
func (g *Gate) Acquire(ctx context.Context) (*Slot, error) {
	return g.AcquireNotify(ctx, nil)
}

// AcquireNotify is Acquire that calls queued, when not nil, just before the
// request starts to wait in the queue — and only then: a request that gets a
// slot at once, or is refused at once, never calls it. The gateway writes a
// queued request's pending usage row there, so that a request refused at
// once costs a single row write.
func (g *Gate) AcquireNotify(ctx context.Context, queued func()) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	// A free slot can only be taken when nobody is queued: otherwise a
	// newcomer would overtake the head of the queue (barging).
	if g.inFlight < g.max && g.head == nil {
		g.inFlight++
		g.changed()
		g.mu.Unlock()
		return &Slot{g: g, acquired: time.Now()}, nil
	}
	if g.queued >= g.maxQueue {
		ra := g.retryAfterLocked(g.queued)
		g.mu.Unlock()
		return nil, &Rejected{Backend: g.backend, Reason: ReasonQueueFull, RetryAfter: ra}
	}
	w := &waiter{ready: make(chan struct{}), since: time.Now()}
	g.pushLocked(w)
	g.changed()
	g.mu.Unlock()
	if queued != nil {
		queued()
	}

	start := time.Now()
	var timeout <-chan time.Time
	if g.timeout > 0 {
		t := time.NewTimer(g.timeout)
		defer t.Stop()
		timeout = t.C
	}

	select {
	case <-w.ready:
		now := time.Now()
		return &Slot{g: g, acquired: now, waited: now.Sub(start)}, nil
	case <-timeout:
		g.mu.Lock()
		if w.granted {
			// The slot arrived as the timer fired; the request did get in
			// within (about) its time, so take it rather than waste it.
			g.mu.Unlock()
			now := time.Now()
			return &Slot{g: g, acquired: now, waited: now.Sub(start)}, nil
		}
		g.removeLocked(w)
		g.changed()
		ra := g.retryAfterLocked(g.queued)
		g.mu.Unlock()
		return nil, &Rejected{Backend: g.backend, Reason: ReasonQueueTimeout, RetryAfter: ra, Waited: time.Since(start)}
	case <-ctx.Done():
		g.mu.Lock()
		if w.granted {
			// The caller is gone, so the slot it was just handed goes
			// straight on to the next in line.
			g.releaseLocked(0, false)
			g.mu.Unlock()
			return nil, ctx.Err()
		}
		g.removeLocked(w)
		g.changed()
		g.mu.Unlock()
		return nil, ctx.Err()
	}
}

// Waited returns the time the request spent queued (0 if it got a slot at
// once).
func (s *Slot) Waited() time.Duration { return s.waited }

// Release gives the slot back. It is safe to call more than once; only the
// first call counts. When requests are queued the slot is handed directly
// to the oldest one, so only that one waiter wakes and no newcomer can take
// the slot in between.
func (s *Slot) Release() {
	if !s.released.CompareAndSwap(false, true) {
		return
	}
	held := time.Since(s.acquired)
	s.g.mu.Lock()
	s.g.releaseLocked(held, true)
	s.g.mu.Unlock()
}

// InFlight returns the number of slots currently held.
func (g *Gate) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight
}

// Queued returns the number of requests currently waiting.
func (g *Gate) Queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queued
}

// Snapshot is a gate's state at one moment, as the live dashboard shows it.
type Snapshot struct {
	InFlight, MaxConcurrency int
	Queued, MaxQueue         int
	// OldestWait is how long the head of the queue has waited so far; 0
	// when nobody waits.
	OldestWait time.Duration
}

// Snapshot returns the gate's counts and limits and the age of its oldest
// waiter, all read under one hold of the lock so that they agree with each
// other. It allocates nothing, so a dashboard polling every few seconds
// costs the gate one short lock.
func (g *Gate) Snapshot() Snapshot {
	now := time.Now() // read outside the lock: a clock read need not delay Acquire
	g.mu.Lock()
	s := Snapshot{InFlight: g.inFlight, MaxConcurrency: g.max, Queued: g.queued, MaxQueue: g.maxQueue}
	if g.head != nil {
		s.OldestWait = max(now.Sub(g.head.since), 0)
	}
	g.mu.Unlock()
	return s
}

// AvgServiceTime returns the current estimate of how long a slot is held:
// the moving average of released slots, or DefaultServiceTime before any.
func (g *Gate) AvgServiceTime() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.avgServiceLocked()
}

// RetryAfter returns the Retry-After a request rejected now as queue_full
// would be given; useful for logging or a gauge.
func (g *Gate) RetryAfter() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.retryAfterLocked(g.queued)
}

func (g *Gate) avgServiceLocked() time.Duration {
	if g.avgService == 0 {
		return DefaultServiceTime
	}
	return g.avgService
}

// retryAfterLocked estimates when a request arriving behind queued others
// could be admitted: each of the max slots frees up about once per average
// service time, and queued+1 requests (those ahead plus this one) need a
// slot. The result is rounded up to whole seconds, at least one.
func (g *Gate) retryAfterLocked(queued int) time.Duration {
	est := float64(queued+1) * float64(g.avgServiceLocked()) / float64(g.max)
	secs := math.Ceil(est / float64(time.Second))
	if secs < 1 {
		secs = 1
	}
	// Cap at a day so absurd averages cannot overflow a Duration.
	if secs > 86400 {
		secs = 86400
	}
	return time.Duration(secs) * time.Second
}

// releaseLocked frees one held slot. With a waiter queued the slot moves to
// it (inFlight stays the same); otherwise inFlight drops. sample says
// whether held is a real hold time for the service-time average.
func (g *Gate) releaseLocked(held time.Duration, sample bool) {
	if sample {
		if g.avgService == 0 {
			// The first observation replaces the prior outright, so a
			// backend that is much slower or faster than the prior is
			// reflected at once.
			g.avgService = held
			if g.avgService <= 0 {
				g.avgService = 1 // keep "no sample yet" distinguishable
			}
		} else {
			g.avgService = time.Duration(ewmaWeight*float64(held) + (1-ewmaWeight)*float64(g.avgService))
			if g.avgService <= 0 {
				g.avgService = 1
			}
		}
	}
	if w := g.head; w != nil {
		g.removeLocked(w)
		w.granted = true
		close(w.ready)
	} else {
		g.inFlight--
	}
	g.changed()
}

func (g *Gate) pushLocked(w *waiter) {
	w.prev = g.tail
	if g.tail != nil {
		g.tail.next = w
	} else {
		g.head = w
	}
	g.tail = w
	g.queued++
}

func (g *Gate) removeLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		g.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		g.tail = w.prev
	}
	w.prev, w.next = nil, nil
	g.queued--
}

func (g *Gate) changed() {
	if g.onChange != nil {
		g.onChange(g.inFlight, g.queued)
	}
}
