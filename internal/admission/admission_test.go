package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond until it holds or the test's patience runs out; the
// tests use it to order arrivals by observed gate state instead of sleeps.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func rejectedReason(err error) string {
	var r *Rejected
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

// TestFIFOUnderLoad sends 60 acquirers in a known order into a 16/32 gate:
// 16 must hold slots, 32 must queue and be served in arrival order, 12 must
// be refused at once, and never more than 16 may hold a slot.
func TestFIFOUnderLoad(t *testing.T) {
	const maxC, maxQ, n = 16, 32, 60
	g := NewGate("vllm", Options{MaxConcurrency: maxC, MaxQueue: maxQ})

	var (
		holding, peak atomic.Int64
		rejected      atomic.Int64
		mu            sync.Mutex
		served        []int // arrival indexes, in the order slots were obtained
		slots         = make([]*Slot, n)
		got           = make(chan int, n)
		wg            sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		before := g.InFlight() + g.Queued() + int(rejected.Load())
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := g.Acquire(context.Background())
			if err != nil {
				if rejectedReason(err) != ReasonQueueFull {
					t.Errorf("acquirer %d: unexpected error %v", i, err)
				}
				rejected.Add(1)
				return
			}
			h := holding.Add(1)
			for {
				p := peak.Load()
				if h <= p || peak.CompareAndSwap(p, h) {
					break
				}
			}
			mu.Lock()
			served = append(served, i)
			slots[i] = s
			mu.Unlock()
			got <- i
		}()
		// Acquirer i has arrived once the gate (or the rejection count)
		// shows it; only then does i+1 start, so arrival order is defined.
		// One that got a slot at once must also have recorded itself:
		// the gate counts it in flight before its goroutine appends to
		// served, and the next acquirer could otherwise record first.
		waitFor(t, "arrival", func() bool {
			if g.InFlight()+g.Queued()+int(rejected.Load()) != before+1 {
				return false
			}
			if i >= maxC {
				return true
			}
			mu.Lock()
			defer mu.Unlock()
			return len(served) == i+1
		})
	}

	if got, want := g.InFlight(), maxC; got != want {
		t.Fatalf("in flight = %d, want %d", got, want)
	}
	if got, want := g.Queued(), maxQ; got != want {
		t.Fatalf("queued = %d, want %d", got, want)
	}
	if got, want := int(rejected.Load()), n-maxC-maxQ; got != want {
		t.Fatalf("rejected = %d, want %d", got, want)
	}

	// Drain: the first 16 already hold slots; release one holder at a time
	// and check that the next arrival (not any other) got the slot.
	for i := 0; i < maxC; i++ {
		<-got
	}
	for next := maxC; next < maxC+maxQ; next++ {
		mu.Lock()
		victim := served[next-maxC]
		s := slots[victim]
		mu.Unlock()
		holding.Add(-1)
		s.Release()
		select {
		case idx := <-got:
			if idx != next {
				t.Fatalf("slot went to acquirer %d, want %d (FIFO broken)", idx, next)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("acquirer %d never got a slot", next)
		}
	}
	wg.Wait()
	if p := peak.Load(); p != maxC {
		t.Fatalf("peak holders = %d, want exactly %d", p, maxC)
	}
	mu.Lock()
	for k, idx := range served {
		if idx != k {
			t.Fatalf("service order %v is not arrival order", served)
		}
	}
	for _, s := range slots[:maxC+maxQ] {
		s.Release()
	}
	mu.Unlock()
	if g.InFlight() != 0 || g.Queued() != 0 {
		t.Fatalf("after drain: in flight %d, queued %d", g.InFlight(), g.Queued())
	}
}

// TestTwentyFour reproduces the seed's measurement: 24 concurrent requests
// on 16/32 give 16 immediate, 8 queued, all served.
func TestTwentyFour(t *testing.T) {
	var maxQueued atomic.Int64
	g := NewGate("vllm", Options{MaxConcurrency: 16, MaxQueue: 32, OnChange: func(_, q int) {
		if int64(q) > maxQueued.Load() {
			maxQueued.Store(int64(q))
		}
	}})
	var (
		wg               sync.WaitGroup
		immediate, later atomic.Int64
		start            = make(chan struct{})
	)
	// Long enough that all 24 have arrived before the first slot frees.
	hold := 300 * time.Millisecond
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			s, err := g.Acquire(context.Background())
			if err != nil {
				t.Errorf("acquire: %v", err)
				return
			}
			if s.Waited() == 0 {
				immediate.Add(1)
			} else {
				later.Add(1)
			}
			time.Sleep(hold)
			s.Release()
		}()
	}
	close(start)
	wg.Wait()
	if maxQueued.Load() != 8 {
		t.Fatalf("peak queue = %d, want 8", maxQueued.Load())
	}
	if immediate.Load() != 16 || later.Load() != 8 {
		t.Fatalf("immediate=%d queued=%d, want 16 and 8", immediate.Load(), later.Load())
	}
	if g.InFlight() != 0 || g.Queued() != 0 {
		t.Fatalf("leftover: in flight %d, queued %d", g.InFlight(), g.Queued())
	}
}

func TestQueueTimeout(t *testing.T) {
	g := NewGate("ollama", Options{MaxConcurrency: 1, MaxQueue: 4, QueueTimeout: 50 * time.Millisecond})
	s, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	t0 := time.Now()
	_, err = g.Acquire(context.Background())
	var r *Rejected
	if !errors.As(err, &r) || r.Reason != ReasonQueueTimeout {
		t.Fatalf("err = %v, want queue_timeout", err)
	}
	if el := time.Since(t0); el < 50*time.Millisecond || el > 2*time.Second {
		t.Fatalf("timed out after %v, want about 50ms", el)
	}
	if r.RetryAfter < time.Second || r.RetryAfter%time.Second != 0 {
		t.Fatalf("RetryAfter = %v, want whole seconds >= 1s", r.RetryAfter)
	}
	if r.Waited < 50*time.Millisecond {
		t.Fatalf("Waited = %v", r.Waited)
	}
	if g.Queued() != 0 {
		t.Fatalf("queued = %d after timeout, want 0", g.Queued())
	}
}

// TestCancelledWaiterLeaves checks that a waiter whose context ends leaves
// the queue at once (making room for a newcomer) and that the one behind it
// moves up and gets the next slot.
func TestCancelledWaiterLeaves(t *testing.T) {
	g := NewGate("ollama", Options{MaxConcurrency: 1, MaxQueue: 2})
	holder, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	ctxA, cancelA := context.WithCancel(context.Background())
	errA := make(chan error, 1)
	go func() {
		_, err := g.Acquire(ctxA)
		errA <- err
	}()
	waitFor(t, "A queued", func() bool { return g.Queued() == 1 })

	gotB := make(chan *Slot, 1)
	go func() {
		s, err := g.Acquire(context.Background())
		if err != nil {
			t.Errorf("B: %v", err)
		}
		gotB <- s
	}()
	waitFor(t, "B queued", func() bool { return g.Queued() == 2 })

	// Queue full now.
	if _, err := g.Acquire(context.Background()); rejectedReason(err) != ReasonQueueFull {
		t.Fatalf("third waiter: err = %v, want queue_full", err)
	}

	cancelA()
	select {
	case err := <-errA:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("A: err = %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("cancelled waiter did not return")
	}
	if q := g.Queued(); q != 1 {
		t.Fatalf("queued = %d after cancel, want 1", q)
	}

	holder.Release()
	select {
	case s := <-gotB:
		if s.Waited() <= 0 {
			t.Fatalf("B waited %v", s.Waited())
		}
		s.Release()
	case <-time.After(2 * time.Second):
		t.Fatal("B never got the slot after A left")
	}
	if g.InFlight() != 0 || g.Queued() != 0 {
		t.Fatalf("leftover: in flight %d, queued %d", g.InFlight(), g.Queued())
	}
}

// TestNoBarging checks that a slot freed while someone is queued goes to
// the queued request, never to a newcomer that arrives at the same moment.
func TestNoBarging(t *testing.T) {
	g := NewGate("b", Options{MaxConcurrency: 1, MaxQueue: 1})
	for round := 0; round < 200; round++ {
		holder, err := g.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		queued := make(chan *Slot, 1)
		go func() {
			s, err := g.Acquire(context.Background())
			if err != nil {
				t.Errorf("queued waiter: %v", err)
			}
			queued <- s
		}()
		waitFor(t, "waiter queued", func() bool { return g.Queued() == 1 })
		holder.Release()
		// The slot now belongs to the waiter even if it has not run yet,
		// so a newcomer must not get it; it queues (the queue has room
		// again) and gives up when its short deadline passes.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		s, err := g.Acquire(ctx)
		cancel()
		if err == nil {
			s.Release()
			t.Fatalf("round %d: newcomer barged past the queue", round)
		}
		w := <-queued
		if w == nil {
			t.Fatalf("round %d: the queued waiter got no slot", round)
		}
		w.Release()
	}
}

func TestReleaseIdempotent(t *testing.T) {
	var changes atomic.Int64
	g := NewGate("b", Options{MaxConcurrency: 2, MaxQueue: 0, OnChange: func(int, int) { changes.Add(1) }})
	s1, _ := g.Acquire(context.Background())
	s2, _ := g.Acquire(context.Background())
	s1.Release()
	s1.Release()
	s1.Release()
	if got := g.InFlight(); got != 1 {
		t.Fatalf("in flight = %d after releasing one slot thrice, want 1", got)
	}
	s2.Release()
	if got := g.InFlight(); got != 0 {
		t.Fatalf("in flight = %d, want 0", got)
	}
	if got := changes.Load(); got != 4 {
		t.Fatalf("OnChange calls = %d, want 4", got)
	}
}

func TestOnChangeSeesEveryState(t *testing.T) {
	type st struct{ in, q int }
	var seen []st
	g := NewGate("b", Options{MaxConcurrency: 1, MaxQueue: 1, OnChange: func(in, q int) { seen = append(seen, st{in, q}) }})
	s, _ := g.Acquire(context.Background())
	done := make(chan struct{})
	go func() {
		s2, err := g.Acquire(context.Background())
		if err == nil {
			s2.Release()
		}
		close(done)
	}()
	waitFor(t, "queued", func() bool { return g.Queued() == 1 })
	s.Release()
	<-done
	want := []st{{1, 0}, {1, 1}, {1, 0}, {0, 0}}
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	if len(seen) != len(want) {
		t.Fatalf("OnChange saw %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("OnChange saw %v, want %v", seen, want)
		}
	}
}

// TestRetryAfterEstimate checks the queue_full Retry-After: the prior
// before any release, then growth with queue length and with service time.
func TestRetryAfterEstimate(t *testing.T) {
	g := NewGate("b", Options{MaxConcurrency: 2, MaxQueue: 10})
	// Prior: 1s service, (0+1)*1s/2 = 0.5s -> rounded up to 1s.
	if got := g.RetryAfter(); got != time.Second {
		t.Fatalf("prior RetryAfter = %v, want 1s", got)
	}
	g.s.mu.Lock()
	g.p.avgService = 4 * time.Second
	short := g.p.retryAfterLocked(1) // 2*4/2 = 4s
	long := g.p.retryAfterLocked(10) // 11*4/2 = 22s
	g.p.avgService = 8 * time.Second
	slower := g.p.retryAfterLocked(10) // 11*8/2 = 44s
	g.s.mu.Unlock()
	if short != 4*time.Second || long != 22*time.Second || slower != 44*time.Second {
		t.Fatalf("estimates = %v, %v, %v; want 4s, 22s, 44s", short, long, slower)
	}

	// End to end: service time learnt from Release feeds the rejection.
	g2 := NewGate("b2", Options{MaxConcurrency: 1, MaxQueue: 0})
	s, _ := g2.Acquire(context.Background())
	time.Sleep(30 * time.Millisecond)
	s.Release()
	if avg := g2.AvgServiceTime(); avg < 30*time.Millisecond || avg > time.Second {
		t.Fatalf("avg service = %v after one 30ms hold", avg)
	}
	s, _ = g2.Acquire(context.Background())
	defer s.Release()
	_, err := g2.Acquire(context.Background())
	var r *Rejected
	if !errors.As(err, &r) || r.Reason != ReasonQueueFull || r.RetryAfter != time.Second || r.RetryAfterSeconds() != 1 {
		t.Fatalf("err = %#v, want queue_full with 1s", err)
	}
}

// TestRetryAfterGrowsWithLoad drives the estimate through real gates: a
// slower backend and a longer queue both give a longer Retry-After.
func TestRetryAfterGrowsWithLoad(t *testing.T) {
	fill := func(hold time.Duration, queue int) time.Duration {
		g := NewGate("b", Options{MaxConcurrency: 1, MaxQueue: queue})
		// Set the learnt average directly; real holds of seconds would make
		// the test slow, and Release's averaging is tested above.
		g.s.mu.Lock()
		g.p.avgService = hold
		g.s.mu.Unlock()
		s, _ := g.Acquire(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := 0; i < queue; i++ {
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = g.Acquire(ctx) }()
		}
		waitFor(t, "queue full", func() bool { return g.Queued() == queue })
		_, err := g.Acquire(context.Background())
		cancel()
		wg.Wait()
		s.Release()
		var r *Rejected
		if !errors.As(err, &r) {
			t.Fatalf("err = %v, want Rejected", err)
		}
		return r.RetryAfter
	}
	a := fill(2*time.Second, 2) // 3*2 = 6s
	b := fill(2*time.Second, 8) // 9*2 = 18s
	c := fill(5*time.Second, 8) // 9*5 = 45s
	if !(a < b && b < c) || a != 6*time.Second || b != 18*time.Second || c != 45*time.Second {
		t.Fatalf("RetryAfter = %v, %v, %v; want 6s < 18s < 45s", a, b, c)
	}
}

func TestCancelledBeforeAcquire(t *testing.T) {
	g := NewGate("b", Options{MaxConcurrency: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if g.InFlight() != 0 {
		t.Fatal("slot taken by a cancelled context")
	}
}

// TestStress hammers a small gate with acquirers that hold, time out or
// cancel, and checks that the counters return to zero and the limit held.
func TestStress(t *testing.T) {
	g := NewGate("b", Options{MaxConcurrency: 3, MaxQueue: 5, QueueTimeout: 5 * time.Millisecond})
	var holding, peak atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 400; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*time.Millisecond)
			defer cancel()
			s, err := g.Acquire(ctx)
			if err != nil {
				return
			}
			h := holding.Add(1)
			for {
				p := peak.Load()
				if h <= p || peak.CompareAndSwap(p, h) {
					break
				}
			}
			time.Sleep(time.Millisecond)
			holding.Add(-1)
			s.Release()
			s.Release()
		}()
	}
	wg.Wait()
	if peak.Load() > 3 {
		t.Fatalf("peak holders %d > 3", peak.Load())
	}
	if g.InFlight() != 0 || g.Queued() != 0 {
		t.Fatalf("leftover: in flight %d, queued %d", g.InFlight(), g.Queued())
	}
}

func BenchmarkAcquireReleaseUncontended(b *testing.B) {
	g := NewGate("b", Options{MaxConcurrency: 16, MaxQueue: 32})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s, err := g.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		s.Release()
	}
}

func BenchmarkAcquireReject(b *testing.B) {
	g := NewGate("b", Options{MaxConcurrency: 1, MaxQueue: 0})
	ctx := context.Background()
	s, _ := g.Acquire(ctx)
	defer s.Release()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Acquire(ctx); err == nil {
			b.Fatal("admitted")
		}
	}
}

// AcquireNotify calls its hook only for a request that waits.
func TestAcquireNotifyOnlyWhenQueued(t *testing.T) {
	g := NewGate("b", Options{MaxConcurrency: 1, MaxQueue: 1})
	calls := 0
	hook := func() { calls++ }
	first, err := g.AcquireNotify(context.Background(), hook)
	if err != nil || calls != 0 {
		t.Fatalf("a free slot: err %v, hook called %d times", err, calls)
	}
	got := make(chan *Slot)
	go func() {
		s, _ := g.AcquireNotify(context.Background(), hook)
		got <- s
	}()
	for g.Queued() != 1 {
		time.Sleep(time.Millisecond)
	}
	if _, err := g.AcquireNotify(context.Background(), hook); err == nil {
		t.Fatal("a full queue admitted a third request")
	}
	first.Release()
	(<-got).Release()
	if calls != 1 {
		t.Errorf("hook called %d times, want once (the queued request only)", calls)
	}
}
