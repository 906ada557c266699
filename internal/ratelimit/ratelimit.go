// Package ratelimit enforces per-key (and per-user) limits on requests per
// minute and, optionally, tokens per minute.
//
// With Redis configured the limits hold across all gateway replicas: the
// state is kept in Redis by github.com/go-redis/redis_rate (GCRA, one Lua
// script per decision, so concurrent replicas cannot both take the last
// unit): every request asks Redis. Without Redis, or while Redis is
// unreachable, an in-memory GCRA with the same arithmetic answers instead,
// per replica.
//
// Tokens are limited by reservation: ReserveTokens takes an estimate out of
// the budget atomically at admission, and Reservation.Reconcile charges the
// difference once the real usage is known. Checking the budget first and
// recording usage afterwards would let every request that is in flight at
// the same time pass the same check and overshoot the budget together.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limit is the allowance for one key. Zero in a field means unlimited.
type Limit struct {
	RequestsPerMinute int
	TokensPerMinute   int
}

// Decision is the answer for one dimension (requests or tokens).
type Decision struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Limit is the per-minute allowance; 0 means unlimited, and then the
	// other fields are zero and no headers should be sent for it.
	Limit int
	// Remaining is how many units could still be taken at once.
	Remaining int
	// ResetAfter is the time until the allowance is whole again.
	ResetAfter time.Duration
	// RetryAfter is 0 when Allowed; otherwise the wait until a retry can
	// succeed, rounded up to whole seconds and never below one second.
	RetryAfter time.Duration
}

// Options configures a Limiter.
type Options struct {
	// Redis, when set, holds the shared state. Give the client short
	// timeouts (DialTimeout, ReadTimeout, WriteTimeout of a few hundred
	// milliseconds, or ContextTimeoutEnabled) so that a hung Redis turns
	// into a quick fallback instead of a slow request.
	Redis redis.UniversalClient
	// Prefix starts every key this Limiter stores; default "moonji:rl:".
	// redis_rate adds its own "rate:" in front.
	Prefix string
	// RedisTimeout bounds each Redis call through the context; default
	// 250ms. It only takes effect on clients that honour context deadlines.
	RedisTimeout time.Duration
	// ProbeInterval is how often Redis is pinged while degraded; default 1s.
	ProbeInterval time.Duration
	// FallbackReplicas divides the limits while degraded, so that N
	// replicas limiting on their own admit about the configured total
	// rather than N times it. Default 1: each replica enforces the full
	// limit, which errs towards serving.
	FallbackReplicas int
	// OnDegraded, when set, is called with true when Redis becomes
	// unreachable and with false when it is back (for a "degraded" gauge).
	// Calls never overlap and come in order.
	OnDegraded func(degraded bool)
	// Logger receives the two state-change messages; default slog.Default().
	Logger *slog.Logger

	now func() time.Time // tests replace the in-memory clock
}

// Limiter decides whether requests and tokens fit their keys' limits. It is
// safe for concurrent use.
type Limiter struct {
	redis        redis.UniversalClient
	shared       store // nil without Redis
	mem          *memStore
	prefix       string
	timeout      time.Duration
	probeEvery   time.Duration
	fallbackDiv  int
	onDegraded   func(bool)
	log          *slog.Logger
	degraded     atomic.Bool
	mu           sync.Mutex // guards closedFlag against a probe starting during Close
	closedFlag   bool
	probeRunning sync.WaitGroup
	closed       chan struct{}
}

// New returns a Limiter. Call Close when done with it to stop the
// background Redis probe.
func New(o Options) *Limiter {
	if o.Prefix == "" {
		o.Prefix = "moonji:rl:"
	}
	if o.RedisTimeout <= 0 {
		o.RedisTimeout = 250 * time.Millisecond
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = time.Second
	}
	if o.FallbackReplicas < 1 {
		o.FallbackReplicas = 1
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	l := &Limiter{
		redis:       o.Redis,
		mem:         newMemStore(o.now),
		prefix:      o.Prefix,
		timeout:     o.RedisTimeout,
		probeEvery:  o.ProbeInterval,
		fallbackDiv: o.FallbackReplicas,
		onDegraded:  o.OnDegraded,
		log:         o.Logger,
		closed:      make(chan struct{}),
	}
	if o.Redis != nil {
		l.shared = newRedisStore(o.Redis)
	}
	return l
}

// Close stops the background probe, if one is running. It does not close
// the Redis client, which belongs to the caller.
func (l *Limiter) Close() {
	l.mu.Lock()
	if !l.closedFlag {
		l.closedFlag = true
		close(l.closed)
	}
	l.mu.Unlock()
	l.probeRunning.Wait()
}

// Degraded reports whether Redis is configured but unreachable, so that
// limits are currently enforced per replica from memory.
func (l *Limiter) Degraded() bool { return l.degraded.Load() }

// AllowRequest counts one request against key's RequestsPerMinute. The
// error is non-nil only when ctx has ended; Redis failures are absorbed by
// the in-memory fallback.
func (l *Limiter) AllowRequest(ctx context.Context, key string, lim Limit) (Decision, error) {
	if lim.RequestsPerMinute <= 0 {
		return Decision{Allowed: true}, nil
	}
	k := l.prefix + "req:" + key
	res, _, rate, err := l.run(ctx, lim.RequestsPerMinute, func(ctx context.Context, s store, rate int) (result, error) {
		return s.allowN(ctx, k, rate, 1)
	})
	if err != nil {
		return Decision{}, err
	}
	return decision(res, rate), nil
}

// Reservation is an admitted estimate of a request's tokens, to be settled
// with Reconcile when the real usage is known.
type Reservation struct {
	l        *Limiter
	key      string
	limit    int // the configured per-minute limit
	applied  int // the limit st enforced (divided while degraded)
	reserved int
	st       store // the store that holds the reservation
	done     atomic.Bool
}

// ReserveTokens takes estimate tokens out of key's TokensPerMinute budget,
// all or nothing, in one atomic step. The estimate is raised to at least 1
// and lowered to at most the budget less one token, so that a request
// larger than a minute's allowance can still run once the budget is full,
// and pays the rest at Reconcile. (Less one because the GCRA arithmetic is
// in floating point: taking exactly the whole budget from a full bucket
// compares now with now+x-x and is refused at random.) With no token
// limit, or when refused, the Reservation is a no-op, so Reconcile may
// always be called. The error is non-nil only when ctx has ended.
func (l *Limiter) ReserveTokens(ctx context.Context, key string, lim Limit, estimate int) (Decision, *Reservation, error) {
	if lim.TokensPerMinute <= 0 {
		return Decision{Allowed: true}, &Reservation{}, nil
	}
	k := l.prefix + "tok:" + key
	var n int
	res, st, rate, err := l.run(ctx, lim.TokensPerMinute, func(ctx context.Context, s store, rate int) (result, error) {
		n = min(max(estimate, 1), max(rate-1, 1))
		return s.allowN(ctx, k, rate, n)
	})
	if err != nil {
		return Decision{}, &Reservation{}, err
	}
	d := decision(res, rate)
	if !d.Allowed {
		return d, &Reservation{}, nil
	}
	return d, &Reservation{l: l, key: k, limit: lim.TokensPerMinute, applied: rate, reserved: n, st: st}, nil
}

// Reserved returns the number of tokens taken at admission.
func (r *Reservation) Reserved() int {
	if r == nil {
		return 0
	}
	return r.reserved
}

// refundMargin is left unrefunded when a refund would otherwise reach the
// present: redis_rate's script drops such a refund entirely (see
// Reconcile), and the time between our two calls must not push the second
// attempt over that edge too.
const refundMargin = 50 * time.Millisecond

// Reconcile settles the reservation with the actual token count: it
// refunds the difference when actual is lower and charges it when higher.
// Only the first call counts; calling it on a no-op Reservation does
// nothing. Use a context that outlives the client's (the request may have
// ended because the client left).
//
// Refunds use redis_rate's AllowN with a negative n, which moves the GCRA
// arrival time back. The script stores the result only if it still lies in
// the future; a refund reaching past the present is silently dropped and
// the old state kept. When that happens (seen as ResetAfter <= 0) the
// refund is retried once, cut to what is still outstanding minus a small
// margin, which leaves the bucket (almost) full, as a correct refund would.
// A refund goes only to the store that took the reservation: if that was
// Redis and Redis is now unreachable the refund is lost, which errs towards
// limiting. A refund never makes the budget exceed its limit.
//
// Extra usage is charged with AllowAtMost, which takes as much as the
// bucket holds: a request that overran its estimate empties the bucket,
// and usage beyond that is forgiven rather than carried as debt, because
// the GCRA state cannot hold more than one full budget of debt. Charges go
// to whichever store currently enforces the limit.
func (r *Reservation) Reconcile(ctx context.Context, actual int) {
	if r == nil || r.l == nil || !r.done.CompareAndSwap(false, true) {
		return
	}
	actual = max(actual, 0)
	diff := actual - r.reserved
	switch {
	case diff > 0:
		_, _, _, err := r.l.run(ctx, r.limit, func(ctx context.Context, s store, rate int) (result, error) {
			return s.allowAtMost(ctx, r.key, rate, diff)
		})
		if err != nil {
			r.l.log.Debug("ratelimit: token charge not recorded", "err", err)
		}
	case diff < 0:
		if err := r.refund(ctx, -diff); err != nil {
			r.l.log.Debug("ratelimit: token refund not recorded", "err", err)
		}
	}
}

func (r *Reservation) refund(ctx context.Context, n int) error {
	l := r.l
	// Refund under the limit the reservation was taken with (the divided
	// one if it was taken while degraded), so the emission interval, and
	// with it the amount given back, is the same.
	rate := r.applied
	call := func(n int) (result, error) {
		if r.st == l.mem {
			return l.mem.allowN(ctx, r.key, rate, -n)
		}
		if l.degraded.Load() {
			return result{}, errors.New("redis unreachable")
		}
		cctx, cancel := context.WithTimeout(ctx, l.timeout)
		defer cancel()
		res, err := r.st.allowN(cctx, r.key, rate, -n)
		if err != nil && ctx.Err() == nil {
			l.markDegraded(err)
		}
		return res, err
	}
	res, err := call(n)
	if err != nil {
		return fmt.Errorf("refund %d tokens: %w", n, err)
	}
	if res.resetAfter > 0 {
		return nil
	}
	// Dropped: the state kept its old arrival time, which was
	// resetAfter + n emission intervals ahead of now. Refund all of
	// that but the margin.
	emission := time.Minute.Seconds() / float64(rate)
	outstanding := res.resetAfter.Seconds() + float64(n)*emission
	k := int(math.Floor((outstanding - refundMargin.Seconds()) / emission))
	if k <= 0 {
		return nil
	}
	if _, err := call(k); err != nil {
		return fmt.Errorf("refund %d tokens: %w", k, err)
	}
	return nil
}

// run sends op to Redis, or to memory when Redis is absent, degraded or
// fails (marking it degraded). It returns the store that answered and the
// limit applied there (divided by FallbackReplicas in the fallback).
func (l *Limiter) run(ctx context.Context, rate int, op func(ctx context.Context, s store, rate int) (result, error)) (result, store, int, error) {
	if err := ctx.Err(); err != nil {
		return result{}, nil, 0, err
	}
	if l.shared != nil && !l.degraded.Load() {
		cctx, cancel := context.WithTimeout(ctx, l.timeout)
		res, err := op(cctx, l.shared, rate)
		cancel()
		if err == nil {
			return res, l.shared, rate, nil
		}
		if ctx.Err() != nil {
			// The caller is gone; that says nothing about Redis.
			return result{}, nil, 0, ctx.Err()
		}
		l.markDegraded(err)
	}
	if l.shared != nil {
		rate = l.fallbackRate(rate)
	}
	res, err := op(ctx, l.mem, rate)
	return res, l.mem, rate, err
}

func (l *Limiter) fallbackRate(rate int) int {
	return max(1, (rate+l.fallbackDiv-1)/l.fallbackDiv)
}

// markDegraded switches to the in-memory fallback, logs it once and starts
// the probe that switches back.
func (l *Limiter) markDegraded(cause error) {
	if !l.degraded.CompareAndSwap(false, true) {
		return
	}
	l.log.Warn("ratelimit: redis unreachable, enforcing limits per replica from memory", "err", cause)
	if l.onDegraded != nil {
		l.onDegraded(true)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closedFlag {
		return
	}
	l.probeRunning.Add(1)
	go l.probe()
}

// probe pings Redis until it answers, then leaves degraded mode. Probing in
// the background keeps requests off a dead Redis: while degraded they go
// straight to memory instead of each waiting for a connection to fail.
func (l *Limiter) probe() {
	defer l.probeRunning.Done()
	t := time.NewTicker(l.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-l.closed:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(l.timeout, l.probeEvery))
		err := l.redis.Ping(ctx).Err()
		cancel()
		if err != nil {
			continue
		}
		l.log.Info("ratelimit: redis reachable again, limits are shared across replicas")
		if l.onDegraded != nil {
			l.onDegraded(false)
		}
		// Cleared after the hook so that a new failure's OnDegraded(true)
		// cannot run before this OnDegraded(false).
		l.degraded.Store(false)
		return
	}
}

func decision(r result, limit int) Decision {
	d := Decision{
		Allowed:    r.allowed > 0,
		Limit:      limit,
		Remaining:  max(r.remaining, 0),
		ResetAfter: max(r.resetAfter, 0),
	}
	if !d.Allowed {
		d.RetryAfter = ceilSeconds(r.retryAfter)
	}
	return d
}
