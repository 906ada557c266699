package admission

import (
	"context"
	"slices"
	"time"

	"moonji/internal/lease"
)

// The shared path. With a Shared limit, a request nobody waits ahead of on
// this replica asks the store for a slot itself (one call); a request that
// must wait joins this replica's queue, and one goroutine per replica (the
// pump) asks the store on behalf of each queue's oldest request whenever a
// slot may have been freed: a release here or on another replica (the
// store's notification), or every pollEvery in case a notification was lost
// or a dead replica's lease expired. The store orders requests across
// replicas by arrival, so a freed slot goes to the oldest waiter anywhere.

// acquireShared asks the store for a slot for a request that nobody waits
// ahead of. ok is false when no slot is free (the store then counts the
// request as waiting) or the store failed (the scheduler is then degraded).
func (s *Scheduler) acquireShared(p *Pool, cands []lease.Backend, arrival, now time.Time) (sl *Slot, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
	i, l, err := s.shared.Acquire(ctx, lease.Request{Queue: p.name, Candidates: cands, Arrival: arrival})
	cancel()
	if err != nil {
		s.sharedFailed(err)
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if i < 0 {
		p.registered = true
		return nil, false
	}
	b := s.byName[cands[i].Name]
	b.inFlight++
	s.changedLocked(b)
	return &Slot{p: p, b: b, lease: l, leased: true, acquired: now, waited: time.Since(now)}, true
}

// giveBack returns a lease to the store without waiting for it: the
// store sends the release with its next call, or alone shortly after.
func (s *Scheduler) giveBack(l lease.Lease) {
	s.shared.ReleaseSoon(l)
}

// poke wakes the pump without blocking; a wake-up already pending is
// enough.
func (s *Scheduler) poke() {
	if s.kick == nil {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Scheduler) pump() {
	defer s.wg.Done()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-s.kick:
		case <-t.C:
		}
		s.pumpOnce()
	}
}

// pumpOnce serves every queue once, the queue with the oldest waiter first,
// or, while degraded, checks whether the store answers again.
func (s *Scheduler) pumpOnce() {
	s.mu.Lock()
	if s.degraded {
		due := time.Since(s.checkedAt) >= recoverEvery
		if due {
			s.checkedAt = time.Now()
		}
		s.mu.Unlock()
		if due {
			s.tryRecover()
		}
		return
	}
	var pools []*Pool
	for _, p := range s.pools {
		if p.head != nil || p.registered {
			pools = append(pools, p)
		}
	}
	slices.SortFunc(pools, func(a, b *Pool) int {
		switch {
		case a.head == nil && b.head == nil:
			return 0
		case a.head == nil:
			return 1
		case b.head == nil:
			return -1
		}
		return a.head.since.Compare(b.head.since)
	})
	s.mu.Unlock()
	for _, p := range pools {
		if !s.pumpPool(p) {
			return
		}
	}
}

// pumpPool takes slots for the pool's waiters, oldest first, until the
// store has none free; it clears the pool's wait entries once nobody waits.
// It returns false when the store failed.
func (s *Scheduler) pumpPool(p *Pool) bool {
	for {
		s.mu.Lock()
		if s.degraded || s.closed {
			s.mu.Unlock()
			return false
		}
		w := p.head
		if w == nil {
			registered := p.registered
			p.registered = false
			s.mu.Unlock()
			if registered {
				ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
				err := s.shared.ClearWait(ctx, p.name, p.names)
				cancel()
				if err != nil {
					s.sharedFailed(err)
					return false
				}
			}
			return true
		}
		cands := p.candidatesLocked(w.exclude)
		var next time.Time
		if w.next != nil {
			next = w.next.since
		}
		s.mu.Unlock()
		if len(cands) == 0 {
			return true // this replica holds every slot it may
		}
		ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
		i, l, err := s.shared.Acquire(ctx, lease.Request{Queue: p.name, Candidates: cands, Arrival: w.since, Next: next})
		cancel()
		if err != nil {
			s.sharedFailed(err)
			return false
		}
		s.mu.Lock()
		p.registered = true
		if i < 0 {
			s.mu.Unlock()
			return true
		}
		if w.queued {
			w.lease, w.leased = l, true // before the grant wakes the waiter
			s.grantLocked(p, w, s.byName[cands[i].Name])
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		// The waiter left (timeout, client gone) while its slot was being
		// taken: give the slot back.
		s.giveBack(l)
	}
}

// sharedFailed is called when a call to the store failed. A failure may
// only be slowness (a loaded machine, a long pause): the per-replica share
// is taken only when a ping fails too, because slots handed out from it
// hold no lease, and other replicas that still reach the store would fill
// the whole limit on top of them.
func (s *Scheduler) sharedFailed(err error) {
	if perr := s.pingStore(); perr == nil {
		s.log.Warn("shared concurrency limit: a call failed but the store answers; keeping the shared limit", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.degraded {
		return
	}
	s.degraded = true
	s.draining = false
	s.live = s.shared.LiveReplicas()
	s.checkedAt = time.Now()
	s.log.Warn("shared concurrency limit unreachable: each backend's limit is now shared out per replica",
		"live_replicas", max(1, s.shared.LiveReplicas()), "err", err)
	if s.onDegraded != nil {
		s.onDegraded(true)
	}
	for _, p := range s.pools {
		s.dispatchLocked(p)
	}
}

// pingStore pings the store up to downPings times and returns nil at the
// first answer: a slow store (calls past the timeout now and then) is not
// down, and taking the share while the other replicas still reach it puts
// this replica's slots on top of the whole limit.
func (s *Scheduler) pingStore() error {
	var err error
	for range downPings {
		ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
		err = s.shared.Ping(ctx)
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

// tryRecover goes back to the shared limit once the store answers again.
// The slots handed out without a lease are still running: first they get
// leases (adopted), so that the store counts them, and the store grants
// nothing to anyone for adoptFence, time for the other replicas that
// served their share to adopt theirs; meanwhile nothing more is handed out
// here (draining).
func (s *Scheduler) tryRecover() {
	ctx, cancel := context.WithTimeout(context.Background(), sharedCallTimeout)
	err := s.shared.Ping(ctx)
	cancel()
	if err != nil {
		return
	}
	s.mu.Lock()
	if !s.degraded {
		s.mu.Unlock()
		return
	}
	s.draining = true
	counts := map[string]int{}
	for _, b := range s.backends {
		if n := b.unleased - len(b.adopted); n > 0 {
			counts[b.name] = n
		}
	}
	s.mu.Unlock()
	ctx, cancel = context.WithTimeout(context.Background(), sharedCallTimeout)
	adopted, err := s.shared.Adopt(ctx, counts, adoptFence)
	cancel()
	s.mu.Lock()
	if err != nil {
		s.draining = false
		s.mu.Unlock()
		s.log.Warn("shared concurrency limit: adopting the slots handed out without it failed; still serving the share", "err", err)
		return
	}
	var extra []lease.Lease
	for name, ls := range adopted {
		b := s.byName[name]
		// Slots that ended during the call need no lease.
		keep := max(0, min(len(ls), b.unleased-len(b.adopted)))
		b.adopted = append(b.adopted, ls[:keep]...)
		extra = append(extra, ls[keep:]...)
	}
	s.log.Info("shared concurrency limit reachable again: the slots handed out without it are counted there",
		"slots", s.unleased)
	s.resumeSharedLocked()
	s.mu.Unlock()
	for _, l := range extra {
		s.giveBack(l)
	}
}

// resumeSharedLocked leaves the per-replica share; the pump serves the
// requests that wait.
func (s *Scheduler) resumeSharedLocked() {
	s.degraded, s.draining = false, false
	s.log.Info("shared concurrency limit reachable again: limits hold across replicas")
	if s.onDegraded != nil {
		s.onDegraded(false)
	}
	s.poke()
}
