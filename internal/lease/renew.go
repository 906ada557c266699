package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/backoff"
)

// renewItem is one lease or wait entry sent for renewal, in the order the
// renew script counts positions.
type renewItem struct {
	backend string
	member  string // lease member, or queue name for a wait entry
	wait    bool
	gen     uint64
}

// snapshotLocked builds the KEYS and ARGV of renewScript (or leaveScript)
// for everything the store holds. With renew set it leaves out wait entries
// idle for longer than WaitIdle and orphans older than TTL, which Redis has
// dropped by now, and forgets both locally.
func (s *Store) snapshotLocked(now time.Time, renew bool) ([]string, []any, []renewItem) {
	backends := map[string]struct{}{}
	for b := range s.leases {
		backends[b] = struct{}{}
	}
	for b := range s.waits {
		backends[b] = struct{}{}
	}
	for b := range s.orphans {
		backends[b] = struct{}{}
	}
	keys := []string{s.replicasKey()}
	args := []any{s.o.Replica, s.o.TTL.Milliseconds(), s.channel}
	var items []renewItem
	for b := range backends {
		keys = append(keys, s.leaseKey(b), s.waitKey(b), s.waitExpKey(b))
		args = append(args, b, len(s.leases[b]))
		for m := range s.leases[b] {
			args = append(args, m)
			items = append(items, renewItem{backend: b, member: m})
		}
		var queues []string
		for q, w := range s.waits[b] {
			if renew && now.Sub(w.touched) > s.o.WaitIdle {
				s.log.Warn("wait entry idle too long; no longer renewed (call ClearWait when a queue empties)",
					"backend", b, "queue", q, "idle", now.Sub(w.touched).Round(time.Second))
				s.forgetWaitLocked(b, q)
				continue
			}
			queues = append(queues, q)
			items = append(items, renewItem{backend: b, member: q, wait: true, gen: w.gen})
		}
		args = append(args, len(queues))
		for _, q := range queues {
			args = append(args, s.waitMember(q))
		}
		var orphans []string
		for _, o := range s.orphans[b] {
			if !renew || now.Sub(o.at) <= s.o.TTL {
				orphans = append(orphans, o.member)
			}
		}
		args = append(args, len(orphans))
		for _, m := range orphans {
			args = append(args, m)
		}
	}
	return keys, args, items
}

// renew sends one renewal for everything the store holds.
func (s *Store) renew(ctx context.Context) error {
	s.mu.Lock()
	keys, args, items := s.snapshotLocked(time.Now(), true)
	// Orphans are sent once; if this renewal fails they are sent again
	// until they are older than TTL.
	sentOrphans := s.orphans
	s.orphans = map[string][]orphan{}
	s.mu.Unlock()

	s.renewals.Add(1)
	res, err := renewScript.Run(ctx, s.rdb, keys, args...).Slice()
	if err != nil {
		s.mu.Lock()
		for b, list := range sentOrphans {
			for _, o := range list {
				if time.Since(o.at) <= s.o.TTL {
					s.orphans[b] = append(s.orphans[b], o)
				}
			}
		}
		s.mu.Unlock()
		return fmt.Errorf("lease: renew %d leases and wait entries: %w", len(items), err)
	}
	if len(res) != 2 {
		return fmt.Errorf("lease: renew script returned %d values, want 2", len(res))
	}
	live, _ := res[0].(int64)
	s.live.Store(max(live, 1))
	lost, _ := res[1].([]any)
	if len(lost) == 0 {
		return nil
	}
	readded := false
	defer func() {
		if readded {
			select {
			case s.flushSoon <- struct{}{}:
			default:
			}
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range lost {
		pos, _ := v.(int64)
		if pos < 1 || int(pos) > len(items) {
			continue
		}
		it := items[pos-1]
		if it.wait {
			// Only if no Acquire has set the entry again meanwhile.
			if w, ok := s.waits[it.backend][it.member]; ok && w.gen == it.gen {
				s.forgetWaitLocked(it.backend, it.member)
			}
			continue
		}
		if _, ok := s.leases[it.backend][it.member]; ok {
			// The request still runs: the script has counted it again.
			s.log.Warn("lease had expired or was lost by Redis while its request ran; counted again (its slot may have been taken twice meanwhile)",
				"backend", it.backend)
			continue
		}
		// Released while the renewal was on its way, and the release ran
		// first: the renewal has added it back, so release it again.
		s.giveBack = append(s.giveBack, Lease{backend: it.backend, member: it.member})
		readded = true
	}
	return nil
}

// renewLoop renews every TTL/3; after a failure it retries sooner, with a
// doubling back-off, so that a short outage does not eat into the leases'
// margin.
func (s *Store) renewLoop(ctx context.Context) {
	defer s.wg.Done()
	interval := s.o.TTL / 3
	delay := min(50*time.Millisecond, interval)
	first, failing := true, false
	for {
		if first {
			// Loading the scripts up front makes the first Acquire and
			// Release single EVALSHAs too.
			if err := s.loadScripts(ctx, interval); err != nil {
				s.lastErr.Store(&err)
			}
		}
		rctx, cancel := context.WithTimeout(ctx, interval)
		err := s.renew(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		wait := interval
		if err != nil {
			s.lastErr.Store(&err)
			if !failing {
				s.log.Warn("lease renewal failed; retrying", "err", err)
			}
			failing = true
			wait = backoff.Jitter(delay)
			delay = min(delay*2, interval)
		} else {
			if failing {
				s.log.Info("lease renewal restored")
			}
			failing = false
			delay = min(50*time.Millisecond, interval)
			if first {
				first = false
				close(s.renewedOnce)
			}
		}
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// loadScripts loads every script in one pipeline.
func (s *Store) loadScripts(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		// Not Script.Load, which would record the empty digest of a
		// pipelined command that has not run yet.
		for _, src := range sources {
			p.ScriptLoad(ctx, src)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lease: load scripts: %w", err)
	}
	return nil
}
