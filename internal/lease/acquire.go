package lease

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Acquire tries to take one slot on one of req.Candidates, in one round trip
// (one EVALSHA over the candidates' keys), which also carries the releases
// ReleaseSoon has queued. A slot is free for this request only if it is not
// owed to an older waiting queue (see the package doc); among candidates
// with a free slot it picks the least loaded relative to Max×Weight, ties
// broken at random in proportion to Weight. On a grant the queue's wait
// entries move to req.Next (or go when Next is zero); on a refusal they are
// set to req.Arrival.
//
// It returns the index into req.Candidates of the granted backend and its
// lease, or -1 and the zero Lease when no candidate is free. The error is
// non-nil only when Redis failed; the caller then falls back to a share of
// Max per replica (see LiveReplicas). If the call failed without an answer,
// a lease Redis may have granted anyway is deleted by the next renewal, and
// so are the releases it carried.
func (s *Store) Acquire(ctx context.Context, req Request) (int, Lease, error) {
	n := len(req.Candidates)
	if n == 0 {
		return -1, Lease{}, errors.New("lease: acquire without candidates")
	}
	if s.isClosed() {
		return -1, Lease{}, ErrClosed
	}
	arrival := req.Arrival
	if arrival.IsZero() {
		arrival = time.Now()
	}
	next := "0"
	if !req.Next.IsZero() {
		// At least 1: "0" means no next request.
		next = strconv.FormatInt(max(req.Next.UnixMilli(), 1), 10)
	}
	member := s.memberID + strconv.FormatUint(s.seq.Add(1), 10)
	s.mu.Lock()
	back := s.giveBack
	s.giveBack = nil
	s.mu.Unlock()
	keys := make([]string, 0, 3*n+2*len(back)+1)
	args := make([]any, 0, 8+3*n+2*len(back))
	args = append(args, s.waitMember(req.Queue), member, arrival.UnixMilli(), next,
		s.o.TTL.Milliseconds(), mrand.Float64(), s.channel, len(back))
	for _, b := range req.Candidates {
		keys = append(keys, s.leaseKey(b.Name), s.waitKey(b.Name), s.waitExpKey(b.Name))
		w := b.Weight
		if w <= 0 {
			w = 1
		}
		args = append(args, b.Name, max(b.Max, 1), w)
	}
	for _, l := range back {
		keys = append(keys, s.leaseKey(l.backend), s.waitKey(l.backend))
		args = append(args, l.member, l.backend)
	}
	keys = append(keys, s.fenceKey())
	chosen, err := acquireScript.Run(ctx, s.rdb, keys, args...).Int()
	if err != nil {
		s.mu.Lock()
		if !isServerError(err) {
			for _, b := range req.Candidates {
				s.orphanLocked(b.Name, member)
			}
		}
		s.orphanAllLocked(back)
		s.mu.Unlock()
		return -1, Lease{}, fmt.Errorf("lease: acquire for queue %q on %d backends: %w", req.Queue, n, err)
	}
	if chosen < 0 || chosen > n {
		return -1, Lease{}, fmt.Errorf("lease: acquire script returned %d for %d candidates", chosen, n)
	}

	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range req.Candidates {
		if chosen != 0 && req.Next.IsZero() {
			s.forgetWaitLocked(b.Name, req.Queue)
		} else {
			s.gen++
			m := s.waits[b.Name]
			if m == nil {
				m = map[string]waitState{}
				s.waits[b.Name] = m
			}
			m[req.Queue] = waitState{gen: s.gen, touched: now}
		}
	}
	if chosen == 0 {
		return -1, Lease{}, nil
	}
	l := Lease{backend: req.Candidates[chosen-1].Name, member: member}
	if s.closed {
		// Close has already sent what it held; this lease would never be
		// renewed. It lapses within TTL, or the caller's Release frees it.
		return chosen - 1, l, nil
	}
	m := s.leases[l.backend]
	if m == nil {
		m = map[string]struct{}{}
		s.leases[l.backend] = m
	}
	m[l.member] = struct{}{}
	return chosen - 1, l, nil
}

// ClearWait removes queue's wait entries on backends, for when the local
// queue emptied because its waiters left (a queue emptied by grants has
// already cleared them through Request.Next). Slots that were owed to the
// queue become free for others, who are notified.
func (s *Store) ClearWait(ctx context.Context, queue string, backends []string) error {
	if len(backends) == 0 {
		return nil
	}
	s.mu.Lock()
	for _, b := range backends {
		s.forgetWaitLocked(b, queue)
	}
	s.mu.Unlock()
	keys := make([]string, 0, 2*len(backends))
	args := make([]any, 0, 2+len(backends))
	args = append(args, s.waitMember(queue), s.channel)
	for _, b := range backends {
		keys = append(keys, s.waitKey(b), s.waitExpKey(b))
		args = append(args, b)
	}
	// If this fails the entries are no longer renewed and lapse within TTL.
	if err := clearScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("lease: clear wait entries of queue %q: %w", queue, err)
	}
	return nil
}

// forgetWaitLocked drops the local record of one wait entry.
func (s *Store) forgetWaitLocked(backend, queue string) {
	if m := s.waits[backend]; m != nil {
		delete(m, queue)
		if len(m) == 0 {
			delete(s.waits, backend)
		}
	}
}

// isServerError reports whether err is an answer from Redis (the command
// ran, or certainly did not) rather than a failure to get one.
func isServerError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// Adopt takes counts[backend] leases on each backend for slots this replica
// handed out while Redis was unreachable, granted whatever the backend
// holds already: their requests run anyway, and Redis must count them
// before it grants anything more. It also holds back every replica's
// grants for fence, time for the other replicas that served their share
// meanwhile to adopt theirs (a fence of 0 raises none). The leases are
// renewed and released like any other. In one call; on an error the leases
// that Redis may hold are deleted by the next renewal.
func (s *Store) Adopt(ctx context.Context, counts map[string]int, fence time.Duration) (map[string][]Lease, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	keys := []string{s.fenceKey()}
	args := []any{s.o.TTL.Milliseconds(), fence.Milliseconds()}
	out := map[string][]Lease{}
	for b, c := range counts {
		if c <= 0 {
			continue
		}
		keys = append(keys, s.leaseKey(b))
		args = append(args, c)
		for range c {
			l := Lease{backend: b, member: s.memberID + strconv.FormatUint(s.seq.Add(1), 10)}
			out[b] = append(out[b], l)
			args = append(args, l.member)
		}
	}
	if err := adoptScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		s.mu.Lock()
		for _, ls := range out {
			s.orphanAllLocked(ls)
		}
		s.mu.Unlock()
		return nil, fmt.Errorf("lease: adopt slots handed out without Redis: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return out, nil // they lapse within TTL, or the caller releases them
	}
	for b, ls := range out {
		m := s.leases[b]
		if m == nil {
			m = map[string]struct{}{}
			s.leases[b] = m
		}
		for _, l := range ls {
			m[l.member] = struct{}{}
		}
	}
	return out, nil
}
