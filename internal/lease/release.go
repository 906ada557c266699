package lease

import (
	"context"
	"fmt"
	"time"

	"moonji/internal/backoff"
)

// releaseDelay is how long a release given with ReleaseSoon waits for an
// Acquire of this replica to carry it before the flusher sends it, in one
// call with every release queued meanwhile. The slot looks taken to the
// other replicas until then, so the delay is short: at 1,000 requests a
// second, 2 ms let all but about one release in seven ride on an acquire.
const releaseDelay = 2 * time.Millisecond

// Release frees the lease (ZREM, and a notification on the store's channel
// if anyone waits for the backend) and stops renewing it, in one call that
// also sends the releases ReleaseSoon has queued. It is safe to call twice;
// the second call and a zero Lease do nothing. If Redis does not answer,
// the lease is still forgotten here: the next renewal deletes it, or else
// it lapses within TTL.
func (s *Store) Release(ctx context.Context, l Lease) error {
	s.forget(l)
	return s.Flush(ctx)
}

// ReleaseSoon frees the lease like Release, without waiting for Redis: it
// stops renewing it at once and queues its release, which the replica's
// next Acquire carries or, when none comes within releaseDelay, the flusher
// sends. On a store that is not running it is Release with a timeout of
// TTL/3.
func (s *Store) ReleaseSoon(l Lease) {
	s.mu.Lock()
	if !s.started || s.closed {
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), s.o.TTL/3)
		defer cancel()
		if err := s.Release(ctx, l); err != nil {
			s.log.Warn("lease release failed; it lapses within the TTL", "backend", l.backend, "err", err)
		}
		return
	}
	held := s.forgetLocked(l)
	s.mu.Unlock()
	if held {
		select {
		case s.flushSoon <- struct{}{}:
		default: // the flusher is already due to send it
		}
	}
}

// forget stops renewing l and queues its release for the next call.
func (s *Store) forget(l Lease) {
	s.mu.Lock()
	s.forgetLocked(l)
	s.mu.Unlock()
}

// forgetLocked is forget; it reports false when l is zero or not held
// (released already).
func (s *Store) forgetLocked(l Lease) bool {
	if l.IsZero() {
		return false
	}
	m := s.leases[l.backend]
	if _, ok := m[l.member]; !ok {
		return false
	}
	delete(m, l.member)
	if len(m) == 0 {
		delete(s.leases, l.backend)
	}
	s.giveBack = append(s.giveBack, l)
	return true
}

// Flush sends the queued releases, in one call. If Redis does not answer
// they are left to the next renewal, which deletes them.
func (s *Store) Flush(ctx context.Context) error {
	s.mu.Lock()
	back := s.giveBack
	s.giveBack = nil
	s.mu.Unlock()
	if len(back) == 0 {
		return nil
	}
	keys := make([]string, 0, 2*len(back))
	args := make([]any, 0, 1+2*len(back))
	args = append(args, s.channel)
	for _, l := range back {
		keys = append(keys, s.leaseKey(l.backend), s.waitKey(l.backend))
		args = append(args, l.member, l.backend)
	}
	if err := releaseScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		s.mu.Lock()
		s.orphanAllLocked(back)
		s.mu.Unlock()
		if len(back) == 1 {
			return fmt.Errorf("lease: release on %q: %w", back[0].backend, err)
		}
		return fmt.Errorf("lease: release %d leases: %w", len(back), err)
	}
	return nil
}

// flusher sends, releaseDelay after a ReleaseSoon, the releases that no
// Acquire has carried by then: all of those queued, in one call.
func (s *Store) flusher(ctx context.Context) {
	defer s.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return // Close sends what is left
		case <-s.flushSoon:
		}
		if !backoff.Sleep(ctx, s.o.releaseDelay) {
			return
		}
		// This call sends the releases queued during the delay too.
		select {
		case <-s.flushSoon:
		default:
		}
		fctx, cancel := context.WithTimeout(ctx, s.o.TTL/3)
		err := s.Flush(fctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("lease release failed; the next renewal deletes the leases", "err", err)
		}
	}
}

// orphanLocked queues member for deletion by the next renewal.
func (s *Store) orphanLocked(backend, member string) {
	s.orphans[backend] = append(s.orphans[backend], orphan{member: member, at: time.Now()})
}

// orphanAllLocked queues leases whose release got no answer for deletion
// by the next renewal. (After an error from Redis itself too: a script
// that failed may have released some of them, and deleting a lease twice
// is harmless.)
func (s *Store) orphanAllLocked(ls []Lease) {
	for _, l := range ls {
		s.orphanLocked(l.backend, l.member)
	}
}
