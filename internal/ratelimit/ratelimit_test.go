package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// env is one way of running the Limiter: new returns a Limiter; instances
// from the same env share state when shared is true (Redis).
type env struct {
	name   string
	shared bool
	new    func(t testing.TB, o Options) *Limiter
}

func randomPrefix(t testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "moonji:test:" + hex.EncodeToString(b[:]) + ":"
}

func memEnv() env {
	return env{name: "memory", new: func(t testing.TB, o Options) *Limiter {
		l := New(o)
		t.Cleanup(l.Close)
		return l
	}}
}

func miniredisEnv(t testing.TB) env {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	prefix := randomPrefix(t)
	return env{name: "miniredis", shared: true, new: func(t testing.TB, o Options) *Limiter {
		o.Redis, o.Prefix = c, prefix
		l := New(o)
		t.Cleanup(l.Close)
		return l
	}}
}

// realRedisEnv connects to MOONJI_TEST_REDIS_URL. When the variable is set
// a failure to connect fails the test: it must never pass by skipping.
func realRedisEnv(t testing.TB) (env, bool) {
	url := os.Getenv("MOONJI_TEST_REDIS_URL")
	if url == "" {
		return env{}, false
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("MOONJI_TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("MOONJI_TEST_REDIS_URL is set but Redis does not answer: %v", err)
	}
	prefix := randomPrefix(t)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, "rate:"+prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		_ = c.Close()
	})
	return env{name: "redis", shared: true, new: func(t testing.TB, o Options) *Limiter {
		o.Redis, o.Prefix = c, prefix
		l := New(o)
		t.Cleanup(l.Close)
		return l
	}}, true
}

// forEachEnv runs f against memory, miniredis and, when configured, a real
// Redis, each with fresh state.
func forEachEnv(t *testing.T, f func(t *testing.T, e env)) {
	t.Run("memory", func(t *testing.T) { f(t, memEnv()) })
	t.Run("miniredis", func(t *testing.T) { f(t, miniredisEnv(t)) })
	t.Run("redis", func(t *testing.T) {
		e, ok := realRedisEnv(t)
		if !ok {
			t.Skip("MOONJI_TEST_REDIS_URL not set")
		}
		f(t, e)
	})
}

func mustAllow(t *testing.T, l *Limiter, key string, lim Limit) Decision {
	t.Helper()
	d, err := l.AllowRequest(context.Background(), key, lim)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestBurst61(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e env) {
		l := e.new(t, Options{})
		lim := Limit{RequestsPerMinute: 60}
		for i := 1; i <= 60; i++ {
			d := mustAllow(t, l, "k", lim)
			if !d.Allowed {
				t.Fatalf("request %d refused: %+v", i, d)
			}
			// Remaining is truncated from a float in the script; allow one
			// below the exact count for time passing and rounding.
			if want := 60 - i; d.Remaining > want || d.Remaining < want-1 {
				t.Fatalf("request %d: remaining %d, want %d", i, d.Remaining, want)
			}
			if d.Limit != 60 || d.RetryAfter != 0 {
				t.Fatalf("request %d: %+v", i, d)
			}
		}
		d := mustAllow(t, l, "k", lim)
		if d.Allowed {
			t.Fatalf("61st request allowed: %+v", d)
		}
		if d.RetryAfter < time.Second {
			t.Fatalf("RetryAfter = %v, want >= 1s", d.RetryAfter)
		}
		if d.RetryAfter%time.Second != 0 {
			t.Fatalf("RetryAfter = %v, want whole seconds", d.RetryAfter)
		}
		if d.ResetAfter < 55*time.Second || d.ResetAfter > 60*time.Second {
			t.Fatalf("ResetAfter = %v, want about 60s", d.ResetAfter)
		}
		// Another key is unaffected.
		if d := mustAllow(t, l, "other", lim); !d.Allowed {
			t.Fatalf("other key refused: %+v", d)
		}
	})
}

func TestReplicasShareLimit(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e env) {
		if !e.shared {
			t.Skip("in-memory limiters are per replica by design")
		}
		a, b := e.new(t, Options{}), e.new(t, Options{})
		lim := Limit{RequestsPerMinute: 60}
		allowed := 0
		for i := 0; i < 100; i++ {
			l := a
			if i%2 == 1 {
				l = b
			}
			if mustAllow(t, l, "shared", lim).Allowed {
				allowed++
			}
		}
		if allowed != 60 {
			t.Fatalf("two replicas allowed %d requests in a burst, want 60 in total", allowed)
		}
	})
}

// TestConcurrentReservationsCannotOvershoot fires 40 concurrent 100-token
// reservations at a 1000-token budget; at most 10 may succeed (plus what
// refills while the test runs).
func TestConcurrentReservationsCannotOvershoot(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e env) {
		l := e.new(t, Options{})
		lim := Limit{TokensPerMinute: 1000}
		var ok atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		t0 := time.Now()
		for i := 0; i < 40; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d, _, err := l.ReserveTokens(context.Background(), "tok", lim, 100)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					ok.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		refill := int64(time.Since(t0).Seconds() * 1000 / 60 / 100)
		if n := ok.Load(); n < 10 || n > 10+refill {
			t.Fatalf("%d reservations of 100 admitted against a budget of 1000 (refill allowance %d)", n, refill)
		}
	})
}

// reserve is a helper returning the decision and reservation.
func reserve(t *testing.T, l *Limiter, key string, tpm, n int) (Decision, *Reservation) {
	t.Helper()
	d, r, err := l.ReserveTokens(context.Background(), key, Limit{TokensPerMinute: tpm}, n)
	if err != nil {
		t.Fatal(err)
	}
	return d, r
}

func TestReconcile(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e env) {
		l := e.new(t, Options{})
		ctx := context.Background()
		const tpm = 6000 // 100 tokens/s

		t.Run("refund", func(t *testing.T) {
			d, r := reserve(t, l, "refund", tpm, 3000)
			if !d.Allowed || r.Reserved() != 3000 {
				t.Fatalf("reserve: %+v", d)
			}
			r.Reconcile(ctx, 1000) // refund 2000: 5000 left
			r.Reconcile(ctx, 0)    // ignored: only the first call counts
			if d, _ := reserve(t, l, "refund", tpm, 5300); d.Allowed {
				t.Fatalf("5300 admitted after using 1000 of 6000: %+v (second Reconcile counted?)", d)
			}
			if d, _ := reserve(t, l, "refund", tpm, 4900); !d.Allowed {
				t.Fatalf("4900 refused after using 1000 of 6000: %+v (refund lost)", d)
			}
		})
		t.Run("charge", func(t *testing.T) {
			_, r := reserve(t, l, "charge", tpm, 1000)
			r.Reconcile(ctx, 4000) // 3000 more: 2000 left
			if d, _ := reserve(t, l, "charge", tpm, 2300); d.Allowed {
				t.Fatalf("2300 admitted after using 4000 of 6000: %+v (charge lost)", d)
			}
			if d, _ := reserve(t, l, "charge", tpm, 1900); !d.Allowed {
				t.Fatalf("1900 refused after using 4000 of 6000: %+v", d)
			}
		})
		t.Run("full refund", func(t *testing.T) {
			// A refund of everything outstanding is the case redis_rate's
			// script drops; Reconcile must still leave the bucket full.
			_, r := reserve(t, l, "full", tpm, tpm)
			r.Reconcile(ctx, 0)
			if d, _ := reserve(t, l, "full", tpm, tpm-100); !d.Allowed {
				t.Fatalf("budget not restored after a full refund: %+v", d)
			}
		})
		t.Run("overrun is capped at one budget", func(t *testing.T) {
			_, r := reserve(t, l, "over", tpm, 100)
			r.Reconcile(ctx, 1_000_000)
			d, _ := reserve(t, l, "over", tpm, 100)
			if d.Allowed || d.RetryAfter > 2*time.Second {
				t.Fatalf("after an overrun: %+v, want refused with a short wait (no debt beyond an empty bucket)", d)
			}
		})
		t.Run("estimate above budget", func(t *testing.T) {
			d, r := reserve(t, l, "big", tpm, 10*tpm)
			if !d.Allowed || r.Reserved() != tpm-1 {
				t.Fatalf("oversized estimate: %+v reserved %d, want allowed with the whole budget", d, r.Reserved())
			}
		})
	})
}

func TestUnlimitedAndNilSafety(t *testing.T) {
	l := New(Options{})
	defer l.Close()
	d, err := l.AllowRequest(context.Background(), "k", Limit{})
	if err != nil || !d.Allowed || d.Limit != 0 {
		t.Fatalf("unlimited requests: %+v %v", d, err)
	}
	d, r, err := l.ReserveTokens(context.Background(), "k", Limit{RequestsPerMinute: 5}, 100)
	if err != nil || !d.Allowed || r == nil {
		t.Fatalf("unlimited tokens: %+v %v %v", d, r, err)
	}
	r.Reconcile(context.Background(), 10) // no-op, must not panic
	var nilRes *Reservation
	nilRes.Reconcile(context.Background(), 1)
}

func TestCancelledContext(t *testing.T) {
	forEachEnv(t, func(t *testing.T, e env) {
		l := e.new(t, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := l.AllowRequest(ctx, "k", Limit{RequestsPerMinute: 1}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if l.Degraded() {
			t.Fatal("a cancelled caller marked Redis degraded")
		}
	})
}

// TestMemoryRefill drives the in-memory GCRA with a fake clock.
func TestMemoryRefill(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	l := New(Options{now: clock})
	defer l.Close()
	lim := Limit{RequestsPerMinute: 60}
	for i := 0; i < 60; i++ {
		mustAllow(t, l, "k", lim)
	}
	d := mustAllow(t, l, "k", lim)
	if d.Allowed || d.RetryAfter != time.Second || d.ResetAfter != time.Minute {
		t.Fatalf("61st: %+v, want refused, retry 1s, reset 1m", d)
	}
	advance(999 * time.Millisecond)
	if d := mustAllow(t, l, "k", lim); d.Allowed {
		t.Fatalf("allowed before the emission interval passed: %+v", d)
	}
	advance(time.Millisecond)
	if d := mustAllow(t, l, "k", lim); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after 1s: %+v, want one more allowed", d)
	}
	advance(2 * time.Minute)
	if d := mustAllow(t, l, "k", lim); !d.Allowed || d.Remaining != 59 {
		t.Fatalf("after full refill: %+v", d)
	}
	// The sweep drops idle keys once a minute.
	advance(2 * time.Minute)
	mustAllow(t, l, "fresh", lim)
	total := 0
	for i := range l.mem.shards {
		sh := &l.mem.shards[i]
		sh.mu.Lock()
		total += len(sh.tat)
		sh.mu.Unlock()
	}
	if total > 2 {
		t.Fatalf("%d keys kept, idle ones should be swept", total)
	}
}

// TestMemoryMatchesRedisRate runs the same operations through redis_rate
// on miniredis (with its clock pinned) and through the in-memory store, and
// requires the same answers: the fallback must limit like the primary.
func TestMemoryMatchesRedisRate(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c.Close()
	rs := newRedisStore(c)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m.SetTime(now)
	ms := newMemStore(func() time.Time { return now })
	ctx := context.Background()

	type op struct {
		atMost bool
		n      int
		wait   time.Duration
	}
	ops := []op{
		{n: 1}, {n: 10}, {n: 50}, {n: 5}, {n: 1}, {atMost: true, n: 5},
		{wait: 2500 * time.Millisecond, n: 2}, {n: -3}, {n: -1000}, {atMost: true, n: 100},
		{wait: 10 * time.Second, atMost: true, n: 3}, {n: 60}, {wait: time.Minute, n: 60},
	}
	for i, o := range ops {
		now = now.Add(o.wait)
		m.SetTime(now)
		var a, b result
		var err error
		if o.atMost {
			a, err = rs.allowAtMost(ctx, "x", 60, o.n)
			b, _ = ms.allowAtMost(ctx, "x", 60, o.n)
		} else {
			a, err = rs.allowN(ctx, "x", 60, o.n)
			b, _ = ms.allowN(ctx, "x", 60, o.n)
		}
		if err != nil {
			t.Fatal(err)
		}
		close := func(x, y time.Duration) bool { return (x - y).Abs() < time.Millisecond }
		if a.allowed != b.allowed || (a.remaining-b.remaining) > 1 || (b.remaining-a.remaining) > 1 ||
			!close(a.retryAfter, b.retryAfter) || !close(a.resetAfter, b.resetAfter) {
			t.Fatalf("op %d %+v: redis_rate %+v, memory %+v", i, o, a, b)
		}
	}
}

// TestRedisRateNegativeN records how redis_rate v10.0.1 treats a negative
// n, which Reconcile's refunds rely on: it moves the arrival time back,
// but a refund that would reach the present is dropped, not clamped.
func TestRedisRateNegativeN(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c.Close()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m.SetTime(now)
	rl := redis_rate.NewLimiter(c)
	ctx := context.Background()
	lim := redis_rate.PerMinute(60)

	if r, _ := rl.AllowN(ctx, "k", lim, 30); r.Allowed != 30 || r.Remaining != 30 {
		t.Fatalf("take 30: %+v", r)
	}
	if r, _ := rl.AllowN(ctx, "k", lim, -10); r.Allowed != -10 || r.Remaining != 40 || r.ResetAfter != 20*time.Second {
		t.Fatalf("refund 10: %+v, want remaining 40, reset 20s", r)
	}
	// Refunding 25 of the 20 outstanding would reach past now: dropped.
	if r, _ := rl.AllowN(ctx, "k", lim, -25); r.ResetAfter > 0 {
		t.Fatalf("over-refund: %+v, expected a non-positive ResetAfter", r)
	}
	if r, _ := rl.AllowN(ctx, "k", lim, 0); r.Remaining != 40 {
		t.Fatalf("after over-refund remaining = %d; redis_rate changed: it used to drop it (40)", r.Remaining)
	}
}

// logCounter is an slog.Handler that counts messages by level.
type logCounter struct {
	mu    sync.Mutex
	warn  int
	info  int
	texts []string
}

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch r.Level {
	case slog.LevelWarn:
		h.warn++
	case slog.LevelInfo:
		h.info++
	}
	h.texts = append(h.texts, r.Message)
	return nil
}
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logCounter) WithGroup(string) slog.Handler      { return h }
func (h *logCounter) counts() (int, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.warn, h.info
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRedisDownFallback closes miniredis under a running Limiter: requests
// must still be answered (and limited) from memory, the degraded state must
// be reported and logged once, and all of it must revert when Redis is back.
func TestRedisDownFallback(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	logs := &logCounter{}
	var mu sync.Mutex
	var states []bool
	l := New(Options{
		Redis:            c,
		Prefix:           randomPrefix(t),
		ProbeInterval:    20 * time.Millisecond,
		FallbackReplicas: 3,
		Logger:           slog.New(logs),
		OnDegraded:       func(d bool) { mu.Lock(); states = append(states, d); mu.Unlock() },
	})
	defer l.Close()
	lim := Limit{RequestsPerMinute: 60, TokensPerMinute: 600}

	if d := mustAllow(t, l, "k", lim); !d.Allowed || l.Degraded() {
		t.Fatalf("healthy: %+v degraded=%v", d, l.Degraded())
	}
	m.Close()

	// The limit continues from memory, divided among 3 replicas: 20.
	allowed := 0
	for i := 0; i < 30; i++ {
		d, err := l.AllowRequest(context.Background(), "k", lim)
		if err != nil {
			t.Fatalf("request %d with Redis down: %v", i, err)
		}
		if d.Allowed {
			allowed++
			if d.Limit != 20 {
				t.Fatalf("degraded limit = %d, want 20", d.Limit)
			}
		}
	}
	if allowed != 20 {
		t.Fatalf("allowed %d with Redis down, want 20 (60 / 3 replicas)", allowed)
	}
	if !l.Degraded() {
		t.Fatal("Degraded() = false with Redis down")
	}
	// Tokens too: 600 / 3 = 200 per replica. Reserve 150, use 0: the full
	// refund must restore the fallback budget.
	d, r, err := l.ReserveTokens(context.Background(), "k", lim, 150)
	if err != nil || !d.Allowed || d.Limit != 200 {
		t.Fatalf("token reservation with Redis down: %+v %v", d, err)
	}
	r.Reconcile(context.Background(), 0)
	if d, _, _ := l.ReserveTokens(context.Background(), "k", lim, 190); !d.Allowed {
		t.Fatalf("fallback token budget not restored by the refund: %+v", d)
	}
	if w, _ := logs.counts(); w != 1 {
		t.Fatalf("%d warnings logged for one outage, want 1", w)
	}

	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "recovery", func() bool { return !l.Degraded() })
	if _, i := logs.counts(); i != 1 {
		t.Fatalf("%d info messages for one recovery, want 1", i)
	}
	mu.Lock()
	got := append([]bool(nil), states...)
	mu.Unlock()
	if len(got) != 2 || !got[0] || got[1] {
		t.Fatalf("OnDegraded calls = %v, want [true false]", got)
	}
	// Back on Redis: the full limit again and the key stored in Redis.
	d = mustAllow(t, l, "fresh", lim)
	if !d.Allowed || d.Limit != 60 {
		t.Fatalf("after recovery: %+v", d)
	}
	if keys := m.Keys(); len(keys) == 0 {
		t.Fatal("nothing stored in Redis after recovery")
	}
}

func BenchmarkAllowRequestMemory(b *testing.B) {
	l := New(Options{})
	defer l.Close()
	ctx := context.Background()
	lim := Limit{RequestsPerMinute: 1 << 30}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.AllowRequest(ctx, "bench-key", lim); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAllowRequestMiniredis(b *testing.B) {
	m := miniredis.RunT(b)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer c.Close()
	l := New(Options{Redis: c})
	defer l.Close()
	ctx := context.Background()
	lim := Limit{RequestsPerMinute: 1 << 30}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.AllowRequest(ctx, "bench-key", lim); err != nil {
			b.Fatal(err)
		}
	}
	if l.Degraded() {
		b.Fatal("benchmark ran on the fallback")
	}
}

func BenchmarkAllowRequestRedis(b *testing.B) {
	e, ok := realRedisEnv(b)
	if !ok {
		b.Skip("MOONJI_TEST_REDIS_URL not set")
	}
	l := e.new(b, Options{})
	ctx := context.Background()
	lim := Limit{RequestsPerMinute: 1 << 30}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.AllowRequest(ctx, "bench-key", lim); err != nil {
			b.Fatal(err)
		}
	}
	if l.Degraded() {
		b.Fatal("benchmark ran on the fallback")
	}
}

// A request that exactly uses up its key's burst — the first of an rpm-1
// key, the last of any burst — is admitted every time, not at the mercy of
// floating-point rounding.
func TestExactBurstIsAdmitted(t *testing.T) {
	l := New(Options{})
	defer l.Close()
	for i := 0; i < 2000; i++ {
		key := fmt.Sprintf("k%d", i)
		d, err := l.AllowRequest(context.Background(), key, Limit{RequestsPerMinute: 1})
		if err != nil || !d.Allowed {
			t.Fatalf("key %d: first request under rpm 1 refused: %+v %v", i, d, err)
		}
		for j := 0; j < 2; j++ {
			d, _ = l.AllowRequest(context.Background(), key+"x", Limit{RequestsPerMinute: 3})
		}
		if d, _ = l.AllowRequest(context.Background(), key+"x", Limit{RequestsPerMinute: 3}); !d.Allowed {
			t.Fatalf("key %d: third request under rpm 3 refused: %+v", i, d)
		}
	}
}
