package ratelimit

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// commandCounter counts the commands a client sends, and apart those sent
// with a context marked onPath (a request's own). While a gate is set,
// commands wait for it to close (held counts them): a Redis that is slow
// to answer.
type commandCounter struct {
	n, onPath, held atomic.Int64
	gate            atomic.Pointer[chan struct{}]
}

// onPath marks a request's context, to tell the commands sent on its path.
type onPath struct{}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		if ctx.Value(onPath{}) != nil {
			c.onPath.Add(1)
		}
		if g := c.gate.Load(); g != nil {
			c.held.Add(1)
			<-*g
		}
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// sharedRedis runs f against miniredis and, when configured, a real Redis:
// newLimiter makes replicas sharing state, whose commands count counts.
func sharedRedis(t *testing.T, f func(t *testing.T, newLimiter func() *Limiter, count *commandCounter)) {
	run := func(t *testing.T, opt *redis.Options) {
		count := &commandCounter{}
		c := redis.NewClient(opt)
		if err := c.Ping(context.Background()).Err(); err != nil {
			t.Fatalf("Redis does not answer: %v", err)
		}
		c.AddHook(count)
		t.Cleanup(func() { _ = c.Close() })
		prefix := randomPrefix(t)
		f(t, func() *Limiter {
			l := New(Options{Redis: c, Prefix: prefix})
			t.Cleanup(l.Close)
			return l
		}, count)
	}
	t.Run("miniredis", func(t *testing.T) {
		run(t, &redis.Options{Addr: miniredis.RunT(t).Addr()})
	})
	t.Run("redis", func(t *testing.T) {
		url := os.Getenv("MOONJI_TEST_REDIS_URL")
		if url == "" {
			t.Skip("MOONJI_TEST_REDIS_URL not set")
		}
		opt, err := redis.ParseURL(url)
		if err != nil {
			t.Fatalf("MOONJI_TEST_REDIS_URL: %v", err)
		}
		run(t, opt)
	})
}

// TestBusyKeyTakesRuns: a key sending many requests asks Redis for runs
// of them, not for each one.
func TestBusyKeyTakesRuns(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		l := newLimiter()
		lim := Limit{RequestsPerMinute: 1_000_000}
		for i := range 1000 {
			if d := mustAllow(t, l, "busy", lim); !d.Allowed || d.Limit != lim.RequestsPerMinute || d.Remaining <= 0 {
				t.Fatalf("request %d: %+v", i, d)
			}
		}
		// 1000/64 runs, the ramp up to 64, and a few refunds of what was
		// left when more than runFor passed.
		if n := count.n.Load(); n > 100 {
			t.Fatalf("1000 requests of a busy key sent %d commands to Redis; runs should make it a few dozen", n)
		}
	})
}

// TestBusyKeyTakesTheNextRunAhead: once a key sending steadily has runs,
// each next run is taken in the background while the current one lasts,
// so none of its requests asks Redis on its own path.
func TestBusyKeyTakesTheNextRunAhead(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		l := newLimiter()
		lim := Limit{RequestsPerMinute: 1_000_000}
		ctx := context.WithValue(context.Background(), onPath{}, true)
		allow := func(i int) {
			t.Helper()
			d, err := l.AllowRequest(ctx, "steady", lim)
			if err != nil || !d.Allowed || d.Remaining <= 0 {
				t.Fatalf("request %d: %+v, %v", i, d, err)
			}
		}
		for i := range 200 { // runs grow to the key's demand
			allow(i)
		}
		before, all := count.onPath.Load(), count.n.Load()
		for i := range 300 {
			allow(i)
			// A request a millisecond: a take ahead has the 32 requests of
			// half a run, ~32 ms, to come back.
			time.Sleep(time.Millisecond)
		}
		if n := count.onPath.Load() - before; n != 0 {
			t.Errorf("%d of 300 requests of a steady key asked Redis on their own path", n)
		}
		if n := count.n.Load() - all; n < 300/maxRun {
			t.Errorf("300 requests sent %d commands: fewer than a run of %d each", n, maxRun)
		}
	})
}

// TestSteadyKeyFindsItsNextRun: a key sending a few requests a second (a
// chat client streaming one answer after another) finds a run when the
// last one ends: it is taken as the leftover goes back, not on the path
// of the key's next request. Once the key stops, its runs stop.
func TestSteadyKeyFindsItsNextRun(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		l := newLimiter()
		lim := Limit{RequestsPerMinute: 1_000_000}
		ctx := context.WithValue(context.Background(), onPath{}, true)
		start := time.Now()
		var onPath int64
		for i := 0; time.Since(start) < 3*runFor+runFor/2; i++ {
			before := count.onPath.Load()
			d, err := l.AllowRequest(ctx, "chat", lim)
			if err != nil || !d.Allowed {
				t.Fatalf("request %d: %+v, %v", i, d, err)
			}
			// The first second's requests build the runs up.
			if time.Since(start) > runFor {
				onPath += count.onPath.Load() - before
			}
			time.Sleep(runFor / 7)
		}
		if onPath != 0 {
			t.Errorf("%d requests of a key sending seven a second asked Redis on their own path after its first second", onPath)
		}
		// Stopped, the key gets one run more at most: its current run
		// ends within runFor, the one taken then runFor later.
		time.Sleep(2*runFor + runFor/4)
		before := count.n.Load()
		time.Sleep(runFor + runFor/2)
		if n := count.n.Load() - before; n != 0 {
			t.Errorf("a key that stopped sending 2¼ s ago sent %d commands to Redis in the next 1½ s", n)
		}
	})
}

// TestStoppedKeyGetsOneRunMore: when a run ends, the next is taken only
// for a key that sent a request in the last runFor, whichever demand
// periods its requests fell in: here the key's last two requests opened a
// period, so its demand still counts them when the renewed run ends, 1.85 s
// after the last one.
func TestStoppedKeyGetsOneRunMore(t *testing.T) {
	var takes, gives int
	p0 := time.Unix(1_000_000, 0)
	now := p0
	r := newRuns(func(string, int, int) { gives++ }, func(string, int, int) { takes++ }, func() time.Time { return now })
	const key, rate = "k", 1_000_000
	k := &keyRun{period: p0, before: 10, inPeriod: 2, last: p0.Add(50 * time.Millisecond),
		rate: rate, left: 3, size: 4, gen: 1}
	r.shard(key).keys[key] = k

	now = p0.Add(900 * time.Millisecond)
	r.expire(key, 1)
	if gives != 1 || takes != 1 {
		t.Fatalf("the run of a key that sent a request 0.85 s ago ended: %d give-backs and %d takes, want 1 and 1", gives, takes)
	}
	k.endTake() // the renewed run arrives
	k.left, k.gen = 4, 2

	now = p0.Add(1900 * time.Millisecond)
	r.expire(key, 2)
	if gives != 2 || takes != 1 {
		t.Fatalf("the renewed run of a key silent for 1.85 s ended: %d give-backs and %d takes in all, want 2 and 1", gives, takes)
	}
}

// TestTakeAheadLetsItsRequestGoFirst: the request that uses up half a
// run asks for the next one to be taken ahead a little later, not at once
// (when its goroutine would run while the request waits on its engine): 2
// ms later for a run taken long ago, a quarter of the run's age for a busy
// key's young run, so that the run's second half outlasts the wait.
func TestTakeAheadLetsItsRequestGoFirst(t *testing.T) {
	for _, c := range []struct {
		name string
		age  time.Duration // since the run was taken
		want time.Duration
	}{
		{"a chat client's run, taken 300 ms ago", 300 * time.Millisecond, 2 * time.Millisecond},
		{"a busy key's run, taken 4 ms ago", 4 * time.Millisecond, time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRuns(func(string, int, int) {}, func(string, int, int) {}, time.Now)
			const key, rate = "k", 1_000_000
			now := time.Unix(1_000_000, 0)
			r.shard(key).keys[key] = &keyRun{period: now.Add(-c.age), before: 4, last: now.Add(-c.age),
				rate: rate, left: 3, size: 4, expires: now.Add(runFor - c.age), gen: 1}
			d, served, n, after, wait := r.next(key, rate, false, now)
			if !d.Allowed || !served || wait != nil {
				t.Fatalf("not served from the run: %+v, %v, %v", d, served, wait)
			}
			if n == 0 {
				t.Fatal("half the run handed out and no take ahead asked for")
			}
			if after != c.want {
				t.Errorf("the take ahead starts %v after its request, want %v", after, c.want)
			}
		})
	}
}

// TestRequestsWaitForTheTakeInFlight: while Redis is slow to answer a
// busy key's take, its requests that find the run used up wait for that
// take instead of each sending a command of its own, and are served from
// what it brings.
func TestRequestsWaitForTheTakeInFlight(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		l := newLimiter()
		lim := Limit{RequestsPerMinute: 1_000_000}
		for range 200 { // runs grow to the key's demand
			mustAllow(t, l, "busy", lim)
		}
		release := holdRedis(t, count)
		const n = 100 // more than what is left of a run of maxRun
		b := sendBurst(t, l, "busy", lim, n)
		// Time for what is left of the run to be handed out, and for any
		// request that would send a command of its own to send it.
		time.Sleep(100 * time.Millisecond)
		if held := count.held.Load(); held != 1 {
			t.Errorf("%d commands sent while Redis was slow to answer; want the one take", held)
		}
		if b.served.Load() == n {
			t.Fatal("every request was served from the run: none waited, the test proves nothing")
		}
		release()
		b.wg.Wait()
		if got := b.allowed.Load(); got != n {
			t.Errorf("%d of %d requests allowed, all within the limit", got, n)
		}
	})
}

// TestKeyAtItsLimitDoesNotQueueBehindATake: once a busy key's takes
// bring one request or none (it is at its limit), its requests ask Redis
// each for itself again, at once, rather than wait for one another's
// refusals one round trip at a time.
func TestKeyAtItsLimitDoesNotQueueBehindATake(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		l := newLimiter()
		lim := Limit{RequestsPerMinute: 6000} // runs of up to 60
		refused := 0
		for i := 0; refused < 10; i++ {
			if i > 7000 {
				t.Fatal("7,000 requests and the limit of 6,000 a minute not reached")
			}
			if !mustAllow(t, l, "full", lim).Allowed {
				refused++
			}
		}
		release := holdRedis(t, count)
		const n = 20
		b := sendBurst(t, l, "full", lim, n)
		waitUntil(t, "every request of the burst asking Redis", func() bool { return count.held.Load() == n })
		release()
		b.wg.Wait()
	})
}

// holdRedis makes the commands count's client sends wait until release
// is called, or the test ends: a Redis slow to answer.
func holdRedis(t *testing.T, count *commandCounter) (release func()) {
	gate := make(chan struct{})
	count.gate.Store(&gate)
	var once sync.Once
	release = func() {
		once.Do(func() {
			count.gate.Store(nil)
			close(gate)
		})
	}
	t.Cleanup(release)
	return release
}

// burst is n requests sent at once, each on a goroutine of its own.
type burst struct {
	wg              sync.WaitGroup
	served, allowed atomic.Int64
}

// sendBurst sends a burst of n requests of key through l.
func sendBurst(t *testing.T, l *Limiter, key string, lim Limit, n int) *burst {
	b := &burst{}
	for range n {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			d, err := l.AllowRequest(context.Background(), key, lim)
			if err != nil {
				t.Error(err)
			}
			if d.Allowed {
				b.allowed.Add(1)
			}
			b.served.Add(1)
		}()
	}
	return b
}

// TestSmallLimitAsksEveryTime: a key allowed 100 requests a minute or
// fewer never takes a run, so its count in Redis is exact at every request.
func TestSmallLimitAsksEveryTime(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		l := newLimiter()
		lim := Limit{RequestsPerMinute: 100}
		mustAllow(t, l, "warm-up", lim) // loads the script into a fresh Redis
		before := count.n.Load()
		for i := range 100 {
			d := mustAllow(t, l, "small", lim)
			if want := 100 - 1 - i; !d.Allowed || d.Remaining > want || d.Remaining < want-1 {
				t.Fatalf("request %d: %+v, want allowed with %d remaining", i, d, want)
			}
		}
		if d := mustAllow(t, l, "small", lim); d.Allowed {
			t.Fatalf("request 101 of 100: %+v", d)
		}
		if n := count.n.Load() - before; n != 101 {
			t.Fatalf("101 requests sent %d commands, want one each", n)
		}
	})
}

// TestRunsNeverExceedTheLimit: replicas taking runs of one key at the same
// time admit no more than its limit (plus what refills meanwhile).
func TestRunsNeverExceedTheLimit(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		const rpm = 6000 // runs of up to 60
		lim := Limit{RequestsPerMinute: rpm}
		replicas := []*Limiter{newLimiter(), newLimiter(), newLimiter()}
		var admitted, attempts atomic.Int64
		hammer := func(each int) {
			var wg sync.WaitGroup
			for _, l := range replicas {
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range each {
							attempts.Add(1)
							d, err := l.AllowRequest(context.Background(), "shared", lim)
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								admitted.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
		}
		start := time.Now()
		hammer(400) // 4,800 requests: all fit
		if got := admitted.Load(); got != attempts.Load() {
			t.Fatalf("admitted %d of %d requests, all within the limit of %d", got, attempts.Load(), rpm)
		}
		if n := count.n.Load(); n > attempts.Load()/4 {
			t.Fatalf("%d requests sent %d commands: runs should have saved most", attempts.Load(), n)
		}
		hammer(200) // 2,400 more: the limit is reached
		elapsed := time.Since(start)
		refill := int64(elapsed.Seconds()*rpm/60) + 2
		if got := admitted.Load(); got > rpm+refill {
			t.Fatalf("admitted %d of %d requests in %v: the limit is %d (+%d refilled)", got, attempts.Load(), elapsed, rpm, refill)
		}
		// At most the three replicas' last runs are still held.
		if got := admitted.Load(); got < rpm-3*maxRun {
			t.Fatalf("admitted only %d of %d requests: the limit is %d", got, attempts.Load(), rpm)
		}
	})
}

// leaveARun sends 200 requests of key "k" through l and returns how many
// are left of its last run (runs of 1, 2, 4 … 60: some are).
func leaveARun(t *testing.T, l *Limiter, lim Limit) int {
	t.Helper()
	for range 200 {
		mustAllow(t, l, "k", lim)
	}
	k := l.prefix + "req:k"
	sh := l.runs.shard(k)
	sh.mu.Lock()
	left := sh.keys[k].left
	sh.mu.Unlock()
	if left == 0 {
		t.Fatal("the last run was used up exactly: nothing to give back, the test proves nothing")
	}
	return left
}

// TestRunLeftoversGoBack: what a replica did not use of its last run goes
// back to Redis runFor later, for the other replicas.
func TestRunLeftoversGoBack(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		const rpm = 6000
		lim := Limit{RequestsPerMinute: rpm}
		l := newLimiter()
		left := leaveARun(t, l, lim)
		time.Sleep(runFor + 100*time.Millisecond)
		// A replica of its own (no run yet: it asks Redis) sees the
		// bucket with the leftovers back: 200 used, and its own.
		d := mustAllow(t, newLimiter(), "k", lim)
		if want := rpm - 201; d.Remaining < want-1 {
			t.Fatalf("after the run expired: remaining %d, want at least %d (%d were left of the run)", d.Remaining, want-1, left)
		}
	})
}

// TestCloseGivesBackRuns: a replica that shuts down gives back what is
// left of its runs at once.
func TestCloseGivesBackRuns(t *testing.T) {
	sharedRedis(t, func(t *testing.T, newLimiter func() *Limiter, count *commandCounter) {
		const rpm = 6000
		lim := Limit{RequestsPerMinute: rpm}
		l := newLimiter()
		left := leaveARun(t, l, lim)
		l.Close()
		d := mustAllow(t, newLimiter(), "k", lim)
		if want := rpm - 201; d.Remaining < want-1 {
			t.Fatalf("right after Close: remaining %d, want at least %d (%d were left of the run)", d.Remaining, want-1, left)
		}
		before := count.n.Load()
		time.Sleep(runFor + 100*time.Millisecond) // the closed limiter's timer runs and sends nothing
		if n := count.n.Load() - before; n != 0 {
			t.Fatalf("a closed limiter sent %d commands when its run's timer ran", n)
		}
	})
}

// TestRunsFallBackWhenRedisIsDown: with Redis gone, a busy key is served
// from memory, and served from runs again once Redis is back.
func TestRunsFallBackWhenRedisIsDown(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = c.Close() })
	l := New(Options{Redis: c, Prefix: randomPrefix(t), ProbeInterval: 20 * time.Millisecond})
	t.Cleanup(l.Close)
	lim := Limit{RequestsPerMinute: 1_000_000}
	for range 100 {
		mustAllow(t, l, "k", lim)
	}
	m.Close()
	time.Sleep(runFor + 50*time.Millisecond) // the run expires; its refund fails
	for i := range 50 {
		if d := mustAllow(t, l, "k", lim); !d.Allowed {
			t.Fatalf("request %d with Redis down: %+v", i, d)
		}
	}
	if !l.Degraded() {
		t.Fatal("Redis is down but the limiter is not degraded")
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Degraded() {
		if time.Now().After(deadline) {
			t.Fatal("the limiter did not notice Redis was back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 100 {
		if d := mustAllow(t, l, "k", lim); !d.Allowed {
			t.Fatalf("request %d with Redis back: %+v", i, d)
		}
	}
}
