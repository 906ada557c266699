package ratelimit

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// result is one GCRA answer, in the shape redis_rate returns.
type result struct {
	allowed    int // units admitted (0 when refused)
	remaining  int // units that could still be admitted at once
	retryAfter time.Duration
	resetAfter time.Duration
}

// store is a GCRA backend: Redis (shared by all replicas) or memory (this
// replica only). Both follow redis_rate v10's scripts exactly, so the code
// above them, including Reconcile's handling of refunds, behaves the same
// on either.
type store interface {
	// allowN admits all n units or none. A negative n is a refund, which
	// the scripts apply only if the result still lies in the future (see
	// Reservation.Reconcile).
	allowN(ctx context.Context, key string, perMinute, n int) (result, error)
	// allowAtMost admits up to n units, as many as the bucket holds.
	allowAtMost(ctx context.Context, key string, perMinute, n int) (result, error)
}

// redisStore runs redis_rate's GCRA scripts: the state lives in Redis, so
// every replica sees the same limit.
type redisStore struct {
	rl *redis_rate.Limiter
}

func newRedisStore(c redis.UniversalClient) *redisStore {
	return &redisStore{rl: redis_rate.NewLimiter(c)}
}

func perMinute(n int) redis_rate.Limit {
	return redis_rate.Limit{Rate: n, Burst: n, Period: time.Minute}
}

func fromRedis(r *redis_rate.Result) result {
	return result{allowed: r.Allowed, remaining: r.Remaining, retryAfter: r.RetryAfter, resetAfter: r.ResetAfter}
}

func (s *redisStore) allowN(ctx context.Context, key string, rate, n int) (result, error) {
	r, err := s.rl.AllowN(ctx, key, perMinute(rate), n)
	if err != nil {
		return result{}, err
	}
	return fromRedis(r), nil
}

func (s *redisStore) allowAtMost(ctx context.Context, key string, rate, n int) (result, error) {
	r, err := s.rl.AllowAtMost(ctx, key, perMinute(rate), n)
	if err != nil {
		return result{}, err
	}
	return fromRedis(r), nil
}

// memShards spreads keys over several locks so that replicas serving many
// keys do not serialise on one mutex.
const memShards = 32

// sweepEvery is how often a shard drops keys whose bucket is full again;
// such keys carry no information, and without the sweep a replica that sees
// many distinct keys would grow without bound.
const sweepEvery = time.Minute

// memStore is an in-process GCRA with the same arithmetic as redis_rate's
// Lua scripts (times in float64 seconds, like the scripts).
type memStore struct {
	now    func() time.Time
	base   time.Time
	seed   maphash.Seed
	shards [memShards]memShard
}

type memShard struct {
	mu        sync.Mutex
	tat       map[string]float64 // theoretical arrival time, seconds since base
	lastSweep float64
}

func newMemStore(now func() time.Time) *memStore {
	m := &memStore{now: now, base: now(), seed: maphash.MakeSeed()}
	for i := range m.shards {
		m.shards[i].tat = make(map[string]float64)
	}
	return m
}

func (m *memStore) shard(key string) *memShard {
	return &m.shards[maphash.String(m.seed, key)%memShards]
}

func (m *memStore) clock() float64 {
	return m.now().Sub(m.base).Seconds()
}

// sweepLocked deletes keys whose TAT has passed, as Redis's EX would.
func (sh *memShard) sweepLocked(now float64) {
	if now-sh.lastSweep < sweepEvery.Seconds() {
		return
	}
	sh.lastSweep = now
	for k, tat := range sh.tat {
		if tat <= now {
			delete(sh.tat, k)
		}
	}
}

func secs(f float64) time.Duration {
	if f == -1 {
		return -1
	}
	return time.Duration(f * float64(time.Second))
}

// roundingTolerance absorbs floating-point error in units of one request.
const roundingTolerance = 1e-9

// allowN mirrors redis_rate's allowN script line by line.
func (m *memStore) allowN(_ context.Context, key string, rate, n int) (result, error) {
	now := m.clock()
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweepLocked(now)

	emission := time.Minute.Seconds() / float64(rate)
	increment := emission * float64(n)
	burstOffset := emission * float64(rate)

	tat, ok := sh.tat[key]
	if !ok || tat < now {
		tat = now
	}
	newTat := tat + increment
	allowAt := newTat - burstOffset
	diff := now - allowAt
	remaining := diff / emission
	// (now + x) - x is not always now in floating point: a request that
	// exactly uses up the burst (every key's last one, and the first of an
	// rpm-1 key) would be refused at random without this tolerance.
	if remaining < -roundingTolerance {
		return result{allowed: 0, remaining: 0, retryAfter: secs(-diff), resetAfter: secs(tat - now)}, nil
	}
	resetAfter := newTat - now
	if resetAfter > 0 {
		sh.tat[key] = newTat
	}
	// Like the script, a refund that would reach the present is not
	// stored at all: the old TAT stays.
	return result{allowed: n, remaining: max(int(remaining+roundingTolerance), 0), retryAfter: -1, resetAfter: secs(resetAfter)}, nil
}

// allowAtMost mirrors redis_rate's allowAtMost script line by line.
func (m *memStore) allowAtMost(_ context.Context, key string, rate, n int) (result, error) {
	now := m.clock()
	sh := m.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweepLocked(now)

	emission := time.Minute.Seconds() / float64(rate)
	burstOffset := emission * float64(rate)

	tat, ok := sh.tat[key]
	if !ok || tat < now {
		tat = now
	}
	diff := now - (tat - burstOffset)
	remaining := diff / emission
	if remaining < 1-roundingTolerance {
		return result{allowed: 0, remaining: 0, retryAfter: secs(emission - diff), resetAfter: secs(tat - now)}, nil
	}
	remaining = max(remaining, 1)
	cost := float64(n)
	if remaining < cost {
		cost = remaining
		remaining = 0
	} else {
		remaining -= cost
	}
	newTat := tat + emission*cost
	resetAfter := newTat - now
	if resetAfter > 0 {
		sh.tat[key] = newTat
	}
	return result{allowed: int(cost), remaining: int(remaining), retryAfter: -1, resetAfter: secs(resetAfter)}, nil
}

// ceilSeconds rounds d up to whole seconds, at least one: the form a
// Retry-After header needs (an integer, and 0 would invite a busy retry).
func ceilSeconds(d time.Duration) time.Duration {
	s := math.Ceil(d.Seconds())
	if s < 1 {
		s = 1
	}
	return time.Duration(s) * time.Second
}
