package admission

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"moonji/internal/lease"
)

// Scheduler hands out backend slots. One lock guards every pool and backend:
// its critical sections are a few comparisons long, and one lock is what
// lets a slot freed on a backend shared by two pools go to the older of
// their waiters.
type Scheduler struct {
	mu       sync.Mutex
	backends []*backend
	byName   map[string]*backend
	pools    []*Pool
	poolsBy  map[string]*Pool
	rng      *rand.Rand
	onChange func(backend string, inFlight, queued int)
	log      *slog.Logger

	shared     Shared
	onDegraded func(bool)
	degraded   bool
	// draining is set while degraded once the store answers again, for
	// the time it takes to adopt the slots handed out without a lease
	// (unleased, over every backend): nothing more is handed out
	// meanwhile, so that the store counts every slot held here before the
	// shared limit resumes.
	draining bool
	unleased int
	// live is the number of live replicas when the store became
	// unreachable: the share never grows while degraded because renewals
	// after a long outage see the others' liveness lapsed.
	live      int
	checkedAt time.Time // when the degraded store was last asked
	kick      chan struct{}
	done      chan struct{}
	started   bool
	closed    bool
	wg        sync.WaitGroup
}

type backend struct {
	name     string
	max      int
	weight   float64
	up       func() bool
	inFlight int
	// unleased counts the slots of inFlight handed out by this replica
	// alone while the shared limit was unreachable: they hold no lease of
	// their own. adopted holds the leases the store gave for them when it
	// answered again (never more than unleased); each of those slots gives
	// one back when it ends.
	unleased int
	adopted  []lease.Lease
	pools    []*Pool
	// retired: a reload removed it (Update); it serves what it holds.
	retired bool
}

func (b *backend) isUp() bool { return b.up == nil || b.up() }

// validWeight is w, or 1 when w is not a positive number.
func validWeight(w float64) float64 {
	if w <= 0 || math.IsNaN(w) || math.IsInf(w, 0) {
		return 1
	}
	return w
}

// Pool is one queue of a Scheduler and the backends its requests may use.
type Pool struct {
	s        *Scheduler
	name     string
	backends []*backend
	names    []string
	maxQueue int
	timeout  time.Duration
	capacity int // sum of the backends' MaxConcurrency, for Retry-After

	// head and tail form an intrusive doubly linked list of waiters in
	// arrival order; a list lets a waiter that leaves do so in O(1).
	head, tail *waiter
	queued     int
	avgService time.Duration // EWMA of slot hold times; 0 until the first release
	// registered tells that the shared store may hold a wait entry of this
	// pool, to be cleared when its queue empties.
	registered bool
	// retired: a reload removed it (Update); its waiters stay until served.
	retired bool
}

// waiter is one queued request. ready is closed, under the lock, when a
// slot is handed over; granted, b and the lease record which.
type waiter struct {
	prev, next *waiter
	ready      chan struct{}
	queued     bool
	granted    bool
	b          *backend
	lease      lease.Lease
	leased     bool
	since      time.Time
	exclude    *backend
}

// New returns a Scheduler for the given backends and pools.
func New(c Config) (*Scheduler, error) {
	s := &Scheduler{byName: map[string]*backend{}, poolsBy: map[string]*Pool{}, onChange: c.OnChange,
		shared: c.Shared, onDegraded: c.OnDegraded, log: c.Log,
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	if s.log == nil {
		s.log = slog.Default()
	}
	for _, bs := range c.Backends {
		if _, dup := s.byName[bs.Name]; dup {
			return nil, fmt.Errorf("admission: duplicate backend %q", bs.Name)
		}
		b := &backend{name: bs.Name, max: max(bs.MaxConcurrency, 1), weight: validWeight(bs.Weight), up: bs.Up}
		s.backends = append(s.backends, b)
		s.byName[b.name] = b
	}
	for _, ps := range c.Pools {
		if _, dup := s.poolsBy[ps.Name]; dup {
			return nil, fmt.Errorf("admission: duplicate pool %q", ps.Name)
		}
		if len(ps.Backends) == 0 {
			return nil, fmt.Errorf("admission: pool %q has no backend", ps.Name)
		}
		p := &Pool{s: s, name: ps.Name, maxQueue: max(ps.MaxQueue, 0), timeout: max(ps.QueueTimeout, 0)}
		for _, name := range ps.Backends {
			b, ok := s.byName[name]
			if !ok {
				return nil, fmt.Errorf("admission: pool %q: unknown backend %q", ps.Name, name)
			}
			p.backends = append(p.backends, b)
			p.names = append(p.names, name)
			p.capacity += b.max
			b.pools = append(b.pools, p)
		}
		s.pools = append(s.pools, p)
		s.poolsBy[p.name] = p
	}
	if s.shared != nil {
		s.kick = make(chan struct{}, 1)
		s.done = make(chan struct{})
	}
	return s, nil
}

// Start starts serving waiting requests from the shared limit (nothing to
// do without one).
func (s *Scheduler) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shared == nil || s.started || s.closed {
		return
	}
	s.started = true
	s.wg.Add(1)
	go s.pump()
}

// Close stops the shared path's goroutine; slots still held are released
// by their owners as usual.
func (s *Scheduler) Close() {
	s.mu.Lock()
	if s.closed || s.shared == nil {
		s.closed = true
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	s.wg.Wait()
}

// Pool returns the named pool, or nil.
func (s *Scheduler) Pool(name string) *Pool { return s.poolsBy[name] }

// Wake hands free slots to waiting requests after something other than a
// release freed them: a backend came back up.
func (s *Scheduler) Wake() {
	s.mu.Lock()
	if s.localLocked() {
		for _, p := range s.pools {
			s.dispatchLocked(p)
		}
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.poke()
}

// Degraded reports whether the shared limit is unreachable and this
// replica serves from its share.
func (s *Scheduler) Degraded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.degraded
}

// Name returns the pool's name.
func (p *Pool) Name() string { return p.name }

// Backends returns the names of the pool's backends, in configuration
// order; callers must not change the slice.
func (p *Pool) Backends() []string { return p.names }

// Slot is one admitted request's hold on a backend. Release it when the
// upstream call has ended (stream finished, error, or client gone).
type Slot struct {
	p        *Pool
	b        *backend
	lease    lease.Lease
	leased   bool
	acquired time.Time
	waited   time.Duration
	released atomic.Bool
}

// Backend returns the name of the backend the slot is on.
func (sl *Slot) Backend() string { return sl.b.name }

// Waited returns the time the request spent queued (0 if it got a slot at
// once).
func (sl *Slot) Waited() time.Duration { return sl.waited }

// AcquireOptions tune one Acquire.
type AcquireOptions struct {
	// Queued, when set, is called just before the request starts to wait in
	// the queue — and only then: a request that gets a slot at once, or is
	// refused at once, never calls it. The gateway writes a queued request's
	// pending usage row there.
	Queued func()
	// Exclude names a backend the request must not be given: the one that
	// just failed it, for its retry.
	Exclude string
	// Arrival, when set, is the request's original arrival: a retry keeps
	// its place among the requests that came after it.
	Arrival time.Time
}

// Acquire takes a slot on one of the pool's backends, or waits in strict
// arrival order. It returns at once with *Rejected{Reason: "queue_full"}
// when the queue is full, with *Rejected{Reason: "queue_timeout"} after the
// queue timeout, and with ctx.Err() when ctx ends while queued; in both of
// the latter cases the place in the queue is freed at once.
func (p *Pool) Acquire(ctx context.Context, o AcquireOptions) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := p.s
	now := time.Now()
	arrival := o.Arrival
	if arrival.IsZero() {
		arrival = now
	}
	s.mu.Lock()
	exclude := s.byName[o.Exclude]
	if p.head == nil {
		// Nobody waits: a free slot may be taken at once. When someone
		// waits, a newcomer must queue behind them (no barging).
		if !s.localLocked() {
			if cands := p.candidatesLocked(exclude); len(cands) > 0 {
				s.mu.Unlock()
				if sl, ok := s.acquireShared(p, cands, arrival, now); ok {
					return sl, nil
				}
				s.mu.Lock()
			}
		}
		// Without a shared limit, or once it has failed (degraded).
		if p.head == nil && s.localLocked() {
			if b := p.pickLocked(exclude); b != nil {
				b.inFlight++
				s.unleasedLocked(b, false)
				s.changedLocked(b)
				s.mu.Unlock()
				return &Slot{p: p, b: b, acquired: now}, nil
			}
		}
	}
	if p.queued >= p.maxQueue {
		ra := p.retryAfterLocked(p.queued)
		s.mu.Unlock()
		return nil, &Rejected{Backend: p.name, Reason: ReasonQueueFull, RetryAfter: ra}
	}
	w := &waiter{ready: make(chan struct{}), since: arrival, exclude: exclude}
	p.insertLocked(w)
	// Read under the lock: a reload may change it (Update).
	queueTimeout := p.timeout
	for _, b := range p.backends {
		s.changedLocked(b)
	}
	if s.localLocked() {
		// A slot may have been freed while the lock was let go, or be free
		// on a backend an excluded waiter ahead cannot take.
		s.dispatchLocked(p)
	}
	local := s.localLocked()
	s.mu.Unlock()
	if !local {
		s.poke()
	}
	select {
	case <-w.ready:
		// Granted while queueing: the request never waited.
		return w.slot(p, now), nil
	default:
	}
	if o.Queued != nil {
		o.Queued()
	}
	var timeout <-chan time.Time
	if queueTimeout > 0 {
		t := time.NewTimer(queueTimeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-w.ready:
		return w.slot(p, now), nil
	case <-timeout:
		s.mu.Lock()
		if w.granted {
			// The slot arrived as the timer fired; the request did get in
			// within (about) its time, so take it rather than waste it.
			s.mu.Unlock()
			return w.slot(p, now), nil
		}
		p.removeLocked(w)
		for _, b := range p.backends {
			s.changedLocked(b)
		}
		ra := p.retryAfterLocked(p.queued)
		s.mu.Unlock()
		return nil, &Rejected{Backend: p.name, Reason: ReasonQueueTimeout, RetryAfter: ra, Waited: time.Since(now)}
	case <-ctx.Done():
		s.mu.Lock()
		if w.granted {
			// The caller is gone, so the slot it was just handed goes on
			// to the next in line.
			s.mu.Unlock()
			w.slot(p, now).release(false)
			return nil, ctx.Err()
		}
		p.removeLocked(w)
		for _, b := range p.backends {
			s.changedLocked(b)
		}
		s.mu.Unlock()
		return nil, ctx.Err()
	}
}

func (w *waiter) slot(p *Pool, queuedAt time.Time) *Slot {
	now := time.Now()
	return &Slot{p: p, b: w.b, lease: w.lease, leased: w.leased, acquired: now, waited: now.Sub(queuedAt)}
}

// CanRetry reports whether a request that failed on the named backend has
// another backend of the pool to go to: one that is up.
func (p *Pool) CanRetry(failed string) bool {
	p.s.mu.Lock() // a reload may change b.up (Update)
	defer p.s.mu.Unlock()
	for _, b := range p.backends {
		if b.name != failed && b.isUp() {
			return true
		}
	}
	return false
}

// Release gives the slot back. It is safe to call more than once; only the
// first call counts. A waiting request gets the slot at once: directly from
// this replica's queue, or through the shared store.
func (sl *Slot) Release() { sl.release(true) }

func (sl *Slot) release(sample bool) {
	if !sl.released.CompareAndSwap(false, true) {
		return
	}
	held := time.Since(sl.acquired)
	p, s := sl.p, sl.p.s
	s.mu.Lock()
	if sample {
		p.sampleLocked(held)
	}
	sl.b.inFlight--
	var adopted lease.Lease
	if s.shared != nil && !sl.leased {
		sl.b.unleased--
		s.unleased--
		if n := len(sl.b.adopted); n > 0 {
			adopted = sl.b.adopted[n-1]
			sl.b.adopted = sl.b.adopted[:n-1]
		}
	}
	local := s.localLocked()
	// A slot handed straight on reports its backend's counts once, as they
	// are after the handover: a gauge never shows the slot free meanwhile.
	if !local || s.dispatchBackendLocked(sl.b) == 0 {
		s.changedLocked(sl.b)
	}
	s.mu.Unlock()
	if sl.leased {
		s.giveBack(sl.lease)
	} else if !adopted.IsZero() {
		s.giveBack(adopted)
	}
	if !local {
		s.poke()
	}
}

// unleasedLocked counts a slot just handed out on b that holds no lease
// although there is a shared limit.
func (s *Scheduler) unleasedLocked(b *backend, leased bool) {
	if s.shared != nil && !leased {
		b.unleased++
		s.unleased++
	}
}

// localLocked tells whether slots are handed out by this replica alone:
// without a shared limit, or while it is unreachable.
func (s *Scheduler) localLocked() bool { return s.shared == nil || s.degraded }

// capLocked is how many slots of b this replica may hold: all of them
// without a shared limit (and with one, never more than the whole limit),
// a share of them while the shared limit is unreachable.
func (s *Scheduler) capLocked(b *backend) int {
	if !s.degraded {
		return b.max
	}
	if s.draining {
		return 0
	}
	return max(1, b.max/max(1, s.live, s.shared.LiveReplicas()))
}

// pickLocked chooses the backend for a request: among those up (or all, if
// none is) with a free slot, the one with the fewest requests in flight
// relative to MaxConcurrency×Weight, ties broken at random in proportion to
// Weight. One pass, no allocation.
func (p *Pool) pickLocked(exclude *backend) *backend {
	s := p.s
	anyUp := false
	for _, b := range p.backends {
		if b != exclude && b.isUp() {
			anyUp = true
			break
		}
	}
	var best *backend
	var bestScore, tieWeight float64
	for _, b := range p.backends {
		if b == exclude || (anyUp && !b.isUp()) || b.inFlight >= s.capLocked(b) {
			continue
		}
		score := float64(b.inFlight) / (float64(b.max) * b.weight)
		switch {
		case best == nil || score < bestScore:
			best, bestScore, tieWeight = b, score, b.weight
		case score == bestScore:
			tieWeight += b.weight
			if s.rng.Float64()*tieWeight < b.weight {
				best = b
			}
		}
	}
	return best
}

// candidatesLocked lists the backends the shared store may choose from for
// a request: up (or all, if none is), not excluded, and not already full on
// this replica alone.
func (p *Pool) candidatesLocked(exclude *backend) []lease.Backend {
	anyUp := false
	for _, b := range p.backends {
		if b != exclude && b.isUp() {
			anyUp = true
			break
		}
	}
	out := make([]lease.Backend, 0, len(p.backends))
	for _, b := range p.backends {
		if b == exclude || (anyUp && !b.isUp()) || b.inFlight >= b.max {
			continue
		}
		out = append(out, lease.Backend{Name: b.name, Max: b.max, Weight: b.weight})
	}
	return out
}

// dispatchLocked hands free slots to the pool's waiters, oldest first, and
// returns how many it handed. A waiter that excludes the only free backend
// is passed over for the next.
func (s *Scheduler) dispatchLocked(p *Pool) int {
	granted := 0
	for w := p.head; w != nil; {
		next := w.next
		b := p.pickLocked(w.exclude)
		if b == nil {
			if w.exclude == nil {
				break // nothing is free for anyone
			}
			w = next
			continue
		}
		s.grantLocked(p, w, b)
		granted++
		w = next
	}
	return granted
}

// dispatchBackendLocked hands a slot freed on b to the oldest waiter of the
// pools b serves, and returns how many slots it handed.
func (s *Scheduler) dispatchBackendLocked(b *backend) int {
	if len(b.pools) == 1 {
		return s.dispatchLocked(b.pools[0])
	}
	granted := 0
	for {
		var oldest *Pool
		var pick *backend
		for _, p := range b.pools {
			if p.head == nil || (oldest != nil && !p.head.since.Before(oldest.head.since)) {
				continue
			}
			if c := p.pickLocked(p.head.exclude); c != nil {
				oldest, pick = p, c
			}
		}
		if oldest == nil {
			return granted
		}
		s.grantLocked(oldest, oldest.head, pick)
		granted++
	}
}

func (s *Scheduler) grantLocked(p *Pool, w *waiter, b *backend) {
	p.removeLocked(w)
	b.inFlight++
	s.unleasedLocked(b, w.leased)
	w.granted, w.b = true, b
	close(w.ready)
	for _, pb := range p.backends {
		s.changedLocked(pb)
	}
}
