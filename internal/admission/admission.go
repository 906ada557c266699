// Package admission limits how many requests each backend serves at once and
// makes the rest wait in bounded, strictly first-in-first-out queues.
//
// A Scheduler knows every backend and every pool: the queue of the models
// served by one set of backends. A request takes a slot on the least loaded
// backend of its pool that is up, or waits in the pool's queue; a slot freed
// on any backend goes to the oldest waiter that may use it. With a Shared
// limit (lease.Store over Redis) each backend's limit holds for all replicas
// together, and a freed slot goes to the oldest waiter of any replica.
//
// Waiting in the gateway instead of inside the engine means the wait is
// measured (Slot.Waited), bounded (the queue timeout) and refused early when
// the queue is full, with a Retry-After estimated from the pool's recent
// service time.
package admission

import (
	"context"
	"fmt"
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

// Options configures a Gate: a Scheduler with one backend and one pool.
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
	// Backend names the pool that refused: the backend's name for a model
	// with one backend.
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

// Gate admits requests to one backend: a Scheduler with one backend and
// one pool of the same name.
type Gate struct {
	s *Scheduler
	p *Pool
}

// NewGate returns a Gate for the named backend.
func NewGate(backend string, o Options) *Gate {
	var onChange func(string, int, int)
	if o.OnChange != nil {
		onChange = func(_ string, inFlight, queued int) { o.OnChange(inFlight, queued) }
	}
	s, err := New(Config{
		Backends: []BackendSpec{{Name: backend, MaxConcurrency: o.MaxConcurrency}},
		Pools:    []PoolSpec{{Name: backend, Backends: []string{backend}, MaxQueue: o.MaxQueue, QueueTimeout: o.QueueTimeout}},
		OnChange: onChange,
	})
	if err != nil {
		panic(err) // one backend, one pool: cannot fail
	}
	return &Gate{s: s, p: s.Pool(backend)}
}

// Backend returns the backend name the Gate was made for.
func (g *Gate) Backend() string { return g.p.name }

// Acquire takes a slot or waits in strict arrival order (Pool.Acquire).
func (g *Gate) Acquire(ctx context.Context) (*Slot, error) {
	return g.p.Acquire(ctx, AcquireOptions{})
}

// AcquireNotify is Acquire that calls queued, when not nil, just before the
// request starts to wait in the queue — and only then.
func (g *Gate) AcquireNotify(ctx context.Context, queued func()) (*Slot, error) {
	return g.p.Acquire(ctx, AcquireOptions{Queued: queued})
}

// InFlight returns the number of slots currently held.
func (g *Gate) InFlight() int { return g.Snapshot().InFlight }

// Queued returns the number of requests currently waiting.
func (g *Gate) Queued() int { return g.Snapshot().Queued }

// Snapshot is a backend's state at one moment, as the live dashboard shows
// it.
type Snapshot struct {
	InFlight, MaxConcurrency int
	Queued, MaxQueue         int
	// OldestWait is how long the oldest waiter has waited so far; 0 when
	// nobody waits.
	OldestWait time.Duration
}

// Snapshot returns the gate's counts and limits and the age of its oldest
// waiter, read under one hold of the lock so that they agree.
func (g *Gate) Snapshot() Snapshot { return g.s.Snapshot(g.p.name) }

// AvgServiceTime returns the current estimate of how long a slot is held:
// the moving average of released slots, or DefaultServiceTime before any.
func (g *Gate) AvgServiceTime() time.Duration {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	return g.p.avgServiceLocked()
}

// RetryAfter returns the Retry-After a request rejected now as queue_full
// would be given.
func (g *Gate) RetryAfter() time.Duration {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	return g.p.retryAfterLocked(g.p.queued)
}
