package admission

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"moonji/internal/lease"
)

func newSched(t *testing.T, c Config) *Scheduler {
	t.Helper()
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func acquire(t *testing.T, p *Pool, o AcquireOptions) *Slot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sl, err := p.Acquire(ctx, o)
	if err != nil {
		t.Fatalf("acquire on %s: %v", p.Name(), err)
	}
	return sl
}

// TestLeastLoaded: each request goes to the backend with the fewest
// requests in flight relative to its limit.
func TestLeastLoaded(t *testing.T) {
	s := newSched(t, Config{
		Backends: []BackendSpec{{Name: "a", MaxConcurrency: 4}, {Name: "b", MaxConcurrency: 2}},
		Pools:    []PoolSpec{{Name: "m", Backends: []string{"a", "b"}, MaxQueue: 8}},
	})
	p := s.Pool("m")
	count := map[string]int{}
	var slots []*Slot
	for range 6 {
		sl := acquire(t, p, AcquireOptions{})
		count[sl.Backend()]++
		slots = append(slots, sl)
		// Relative loads stay within one request of each other.
		la, lb := float64(count["a"])/4, float64(count["b"])/2
		if d := la - lb; d > 0.5 || d < -0.5 {
			t.Fatalf("after %d requests a=%d b=%d: not least loaded", len(slots), count["a"], count["b"])
		}
	}
	if count["a"] != 4 || count["b"] != 2 {
		t.Fatalf("full pool holds a=%d b=%d, want 4 and 2", count["a"], count["b"])
	}
	for _, sl := range slots {
		sl.Release()
	}
}

// TestWeightsSpreadSequentialTraffic: one request at a time (all idle, every
// choice a tie), weights 3:1 split the traffic 3:1.
func TestWeightsSpreadSequentialTraffic(t *testing.T) {
	s := newSched(t, Config{
		Backends: []BackendSpec{{Name: "big", MaxConcurrency: 8, Weight: 3}, {Name: "small", MaxConcurrency: 8, Weight: 1}},
		Pools:    []PoolSpec{{Name: "m", Backends: []string{"big", "small"}}},
	})
	p := s.Pool("m")
	count := map[string]int{}
	const n = 8000
	for range n {
		sl := acquire(t, p, AcquireOptions{})
		count[sl.Backend()]++
		sl.Release()
	}
	share := float64(count["big"]) / n
	if share < 0.72 || share > 0.78 {
		t.Fatalf("big took %.3f of the traffic, want 0.75 (counts %v)", share, count)
	}
}

// TestWeightsSpreadConcurrentTraffic: with requests held, the weights
// split the requests in flight.
func TestWeightsSpreadConcurrentTraffic(t *testing.T) {
	s := newSched(t, Config{
		Backends: []BackendSpec{{Name: "big", MaxConcurrency: 16, Weight: 3}, {Name: "small", MaxConcurrency: 16, Weight: 1}},
		Pools:    []PoolSpec{{Name: "m", Backends: []string{"big", "small"}}},
	})
	p := s.Pool("m")
	count := map[string]int{}
	var slots []*Slot
	for range 16 {
		sl := acquire(t, p, AcquireOptions{})
		count[sl.Backend()]++
		slots = append(slots, sl)
	}
	if count["big"] != 12 || count["small"] != 4 {
		t.Fatalf("16 held requests split big=%d small=%d, want 12 and 4", count["big"], count["small"])
	}
	for _, sl := range slots {
		sl.Release()
	}
}

// TestPoolQueueServesOldestOnAnyBackend: the queue belongs to the model:
// a slot freed on either backend goes to the oldest waiter.
func TestPoolQueueServesOldestOnAnyBackend(t *testing.T) {
	s := newSched(t, Config{
		Backends: []BackendSpec{{Name: "a", MaxConcurrency: 1}, {Name: "b", MaxConcurrency: 1}},
		Pools:    []PoolSpec{{Name: "m", Backends: []string{"a", "b"}, MaxQueue: 10}},
	})
	p := s.Pool("m")
	s1, s2 := acquire(t, p, AcquireOptions{}), acquire(t, p, AcquireOptions{})
	order := make(chan int, 4)
	got := make(chan *Slot, 4)
	for i := range 4 {
		queued := make(chan struct{})
		go func() {
			sl, err := p.Acquire(context.Background(), AcquireOptions{Queued: func() { close(queued) }})
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			got <- sl
		}()
		<-queued
	}
	free := []*Slot{s2, s1}
	for i := range 4 {
		free[0].Release()
		free = free[1:]
		if n := <-order; n != i {
			t.Fatalf("slot %d went to waiter %d", i, n)
		}
		free = append(free, <-got)
	}
	for _, sl := range free {
		sl.Release()
	}
}

// TestSharedBackendGoesToOlderPool: two pools share backend a; a slot
// freed on a goes to the older waiter of the two pools.
func TestSharedBackendGoesToOlderPool(t *testing.T) {
	s := newSched(t, Config{
		Backends: []BackendSpec{{Name: "a", MaxConcurrency: 1}, {Name: "b", MaxConcurrency: 1}},
		Pools: []PoolSpec{
			{Name: "a", Backends: []string{"a"}, MaxQueue: 4},
			{Name: "a,b", Backends: []string{"a", "b"}, MaxQueue: 4},
		},
	})
	held := acquire(t, s.Pool("a"), AcquireOptions{})
	hb := acquire(t, s.Pool("a,b"), AcquireOptions{}) // takes b, the only free one
	if hb.Backend() != "b" {
		t.Fatalf("got %s, want b", hb.Backend())
	}
	first := make(chan string, 2)
	for _, pool := range []string{"a,b", "a"} {
		queued := make(chan struct{})
		go func() {
			sl, err := s.Pool(pool).Acquire(context.Background(), AcquireOptions{Queued: func() { close(queued) }})
			if err != nil {
				t.Error(err)
				return
			}
			first <- pool
			time.Sleep(10 * time.Millisecond)
			sl.Release()
		}()
		<-queued
	}
	held.Release()
	if got := <-first; got != "a,b" {
		t.Fatalf("the slot on a went to pool %s, not to the older waiter of pool a,b", got)
	}
	<-first
	hb.Release()
}

// TestDownBackendSkipped: a backend that is down gets nothing while
// another is up; when all are down they all take requests again.
func TestDownBackendSkipped(t *testing.T) {
	var aUp, bUp atomic.Bool
	aUp.Store(true)
	bUp.Store(true)
	s := newSched(t, Config{
		Backends: []BackendSpec{{Name: "a", MaxConcurrency: 4, Up: aUp.Load}, {Name: "b", MaxConcurrency: 4, Up: bUp.Load}},
		Pools:    []PoolSpec{{Name: "m", Backends: []string{"a", "b"}}},
	})
	p := s.Pool("m")
	aUp.Store(false)
	for range 20 {
		sl := acquire(t, p, AcquireOptions{})
		if sl.Backend() != "b" {
			t.Fatalf("a is down but took a request")
		}
		sl.Release()
	}
	if p.CanRetry("b") {
		t.Fatal("CanRetry(b) with a down: there is nowhere to go")
	}
	if !p.CanRetry("a") {
		t.Fatal("CanRetry(a) with b up: b can take it")
	}
	bUp.Store(false)
	seen := map[string]bool{}
	for range 50 {
		sl := acquire(t, p, AcquireOptions{})
		seen[sl.Backend()] = true
		sl.Release()
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("with every backend down, requests went only to %v", seen)
	}
}

// TestRetryExcludesFailedBackend: a retry never goes back to the backend
// that failed it, and it keeps its place ahead of later arrivals.
func TestRetryExcludesFailedBackend(t *testing.T) {
	s := newSched(t, Config{
		Backends: []BackendSpec{{Name: "a", MaxConcurrency: 1}, {Name: "b", MaxConcurrency: 1}},
		Pools:    []PoolSpec{{Name: "m", Backends: []string{"a", "b"}, MaxQueue: 4}},
	})
	p := s.Pool("m")
	arrival := time.Now()
	first := acquire(t, p, AcquireOptions{})
	other := acquire(t, p, AcquireOptions{})
	failed := first.Backend()
	// A later request waits.
	laterQueued := make(chan struct{})
	later := make(chan *Slot, 1)
	go func() {
		sl, err := p.Acquire(context.Background(), AcquireOptions{Queued: func() { close(laterQueued) }})
		if err != nil {
			t.Error(err)
		}
		later <- sl
	}()
	<-laterQueued
	// The failed request gives its slot back and retries elsewhere: the
	// freed slot on the failed backend goes to the later waiter.
	first.Release()
	ls := <-later
	if ls.Backend() != failed {
		t.Fatalf("later waiter got %s, want the freed %s", ls.Backend(), failed)
	}
	retried := make(chan *Slot, 1)
	go func() {
		sl, err := p.Acquire(context.Background(), AcquireOptions{Exclude: failed, Arrival: arrival})
		if err != nil {
			t.Error(err)
		}
		retried <- sl
	}()
	// Freeing the failed backend again does not serve the retry.
	ls.Release()
	select {
	case sl := <-retried:
		t.Fatalf("retry got %s although only the failed backend was free", sl.Backend())
	case <-time.After(50 * time.Millisecond):
	}
	other.Release()
	if sl := <-retried; sl.Backend() == failed {
		t.Fatalf("retry went back to the failed backend %s", failed)
	} else {
		sl.Release()
	}
}

// TestWakeServesWaitersWhenBackendReturns: a slot free on a backend that
// was down goes to the waiters as soon as it is up again.
func TestWakeServesWaitersWhenBackendReturns(t *testing.T) {
	var aUp atomic.Bool
	s := newSched(t, Config{
		Backends: []BackendSpec{{Name: "a", MaxConcurrency: 1, Up: aUp.Load}, {Name: "b", MaxConcurrency: 1}},
		Pools:    []PoolSpec{{Name: "m", Backends: []string{"a", "b"}, MaxQueue: 4}},
	})
	p := s.Pool("m")
	hb := acquire(t, p, AcquireOptions{})
	got := make(chan *Slot, 1)
	go func() {
		sl, err := p.Acquire(context.Background(), AcquireOptions{})
		if err != nil {
			t.Error(err)
		}
		got <- sl
	}()
	select {
	case <-got:
		t.Fatal("a down backend served a waiter")
	case <-time.After(50 * time.Millisecond):
	}
	aUp.Store(true)
	s.Wake()
	select {
	case sl := <-got:
		if sl.Backend() != "a" {
			t.Fatalf("got %s, want a", sl.Backend())
		}
		sl.Release()
	case <-time.After(2 * time.Second):
		t.Fatal("the waiter was not served once a came back")
	}
	hb.Release()
}

// fakeShared is a Shared limit in memory that can be made to fail: enough
// to test the scheduler's side (the Redis side is lease's tests).
type fakeShared struct {
	mu      sync.Mutex
	held    map[string]int
	max     map[string]int
	down    atomic.Bool
	slow    atomic.Bool // calls fail but Ping answers: a slow store, not a dead one
	calls   atomic.Int64
	live    int
	next    int
	waiting map[string]bool
}

func (f *fakeShared) Acquire(_ context.Context, req lease.Request) (int, lease.Lease, error) {
	f.calls.Add(1)
	if f.down.Load() || f.slow.Load() {
		return -1, lease.Lease{}, errors.New("fake store down")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, c := range req.Candidates {
		if f.held[c.Name] < c.Max {
			f.held[c.Name]++
			f.next++
			f.waiting[req.Queue] = !req.Next.IsZero()
			return i, lease.FakeLease(c.Name, strconv.Itoa(f.next)), nil
		}
	}
	f.waiting[req.Queue] = true
	return -1, lease.Lease{}, nil
}

func (f *fakeShared) Release(_ context.Context, l lease.Lease) error {
	f.calls.Add(1)
	if f.down.Load() {
		return errors.New("fake store down")
	}
	f.mu.Lock()
	f.held[l.Backend()]--
	f.mu.Unlock()
	return nil
}

// ReleaseSoon releases at once; a release that fails is lost, as a lease
// not given back lapses in the real store.
func (f *fakeShared) ReleaseSoon(l lease.Lease) { _ = f.Release(context.Background(), l) }

func (f *fakeShared) ClearWait(_ context.Context, queue string, _ []string) error {
	f.calls.Add(1)
	if f.down.Load() {
		return errors.New("fake store down")
	}
	f.mu.Lock()
	delete(f.waiting, queue)
	f.mu.Unlock()
	return nil
}

// Adopt counts the slots handed out while it was down, whatever is held
// already, as the real store does (the fence is not kept here).
func (f *fakeShared) Adopt(_ context.Context, counts map[string]int, _ time.Duration) (map[string][]lease.Lease, error) {
	f.calls.Add(1)
	if f.down.Load() || f.slow.Load() {
		return nil, errors.New("fake store down")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]lease.Lease{}
	for b, n := range counts {
		for range n {
			f.held[b]++
			f.next++
			out[b] = append(out[b], lease.FakeLease(b, strconv.Itoa(f.next)))
		}
	}
	return out, nil
}

func (f *fakeShared) LiveReplicas() int { return f.live }

func (f *fakeShared) Ping(context.Context) error {
	if f.down.Load() {
		return errors.New("fake store down")
	}
	return nil
}

// TestSharedLimitHoldsAndQueues: with a shared limit, slots come from the
// store; waiters are served by the pump when a slot is freed elsewhere.
// sharedSched is a scheduler with one backend, "a", of max slots and one
// pool, "a" (pool's other fields as given), whose limit is shared with
// live replicas through a fake store. degraded follows OnDegraded.
func sharedSched(t *testing.T, live, max int, pool PoolSpec) (f *fakeShared, s *Scheduler, degraded *atomic.Bool) {
	t.Helper()
	f = &fakeShared{held: map[string]int{}, waiting: map[string]bool{}, live: live}
	degraded = &atomic.Bool{}
	pool.Name, pool.Backends = "a", []string{"a"}
	s = newSched(t, Config{
		Backends:   []BackendSpec{{Name: "a", MaxConcurrency: max}},
		Pools:      []PoolSpec{pool},
		Shared:     f,
		OnDegraded: degraded.Store,
	})
	return f, s, degraded
}

func TestSharedLimitHoldsAndQueues(t *testing.T) {
	f, s, degraded := sharedSched(t, 3, 4, PoolSpec{MaxQueue: 8})
	p := s.Pool("a")
	// Another replica holds 3 of the 4 slots.
	f.mu.Lock()
	f.held["a"] = 3
	f.mu.Unlock()
	mine := acquire(t, p, AcquireOptions{})
	if !mine.leased {
		t.Fatal("slot not leased from the shared store")
	}
	got := make(chan *Slot, 1)
	go func() {
		sl, err := p.Acquire(context.Background(), AcquireOptions{})
		if err != nil {
			t.Error(err)
		}
		got <- sl
	}()
	select {
	case <-got:
		t.Fatal("a fifth slot was handed out past the shared limit of 4")
	case <-time.After(100 * time.Millisecond):
	}
	// The other replica releases one: the pump finds it (by polling here;
	// the store's notification wakes it sooner in production).
	f.mu.Lock()
	f.held["a"]--
	f.mu.Unlock()
	select {
	case sl := <-got:
		sl.Release()
	case <-time.After(2 * time.Second):
		t.Fatal("the waiter was not served after a slot was freed")
	}
	mine.Release()
	// The queue is empty again: its wait entry is cleared.
	deadline := time.Now().Add(2 * time.Second)
	for {
		f.mu.Lock()
		_, waiting := f.waiting["a"]
		f.mu.Unlock()
		if !waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pool's wait entry was never cleared")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if degraded.Load() {
		t.Fatal("degraded without a failure")
	}
}

// TestSharedLimitFallsBackToShare: when the store fails, each replica
// serves max/live replicas (at least 1), never unlimited, and goes back to
// the shared limit once the store answers.
func TestSharedLimitFallsBackToShare(t *testing.T) {
	f, s, degraded := sharedSched(t, 3, 16, PoolSpec{MaxQueue: 0})
	p := s.Pool("a")
	f.down.Store(true)
	var slots []*Slot
	for {
		sl, err := p.Acquire(context.Background(), AcquireOptions{})
		if err != nil {
			var rej *Rejected
			if !errors.As(err, &rej) || rej.Reason != ReasonQueueFull {
				t.Fatalf("got %v, want queue_full", err)
			}
			break
		}
		slots = append(slots, sl)
		if len(slots) > 16 {
			t.Fatal("unlimited while the store is down")
		}
	}
	if len(slots) != 16/3 {
		t.Fatalf("held %d slots while degraded, want the share 16/3 = %d", len(slots), 16/3)
	}
	if !degraded.Load() || !s.Degraded() {
		t.Fatal("not reported as degraded")
	}
	for _, sl := range slots {
		sl.Release()
	}
	f.down.Store(false)
	deadline := time.Now().Add(3 * time.Second)
	for s.Degraded() {
		if time.Now().After(deadline) {
			t.Fatal("still degraded after the store came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if degraded.Load() {
		t.Fatal("OnDegraded(false) not called")
	}
	sl := acquire(t, p, AcquireOptions{})
	if !sl.leased {
		t.Fatal("after recovery the slot should come from the store")
	}
	sl.Release()
}

// TestSharedLimitAdoptsUnleasedSlots: slots handed out while the store was
// unreachable hold no lease. When the store answers again, the replica
// takes leases for them (adopts them) before it takes any slot from the
// store: otherwise the store would grant the whole limit on top of them
// (the engine saw 23 requests at once under a limit of 16). Each of them
// gives its lease back when it ends.
func TestSharedLimitAdoptsUnleasedSlots(t *testing.T) {
	// Two live replicas: this one's share is 2 of the 4 slots.
	f, s, degraded := sharedSched(t, 2, 4, PoolSpec{MaxQueue: 8})
	p := s.Pool("a")
	f.down.Store(true)
	var unleased []*Slot
	for range 2 {
		sl := acquire(t, p, AcquireOptions{})
		if sl.leased {
			t.Fatal("a slot leased from a store that is down")
		}
		unleased = append(unleased, sl)
	}
	if !s.Degraded() {
		t.Fatal("not degraded with the store down")
	}
	// The store is back, and another replica that never lost it holds 2
	// of the 4 slots: with these 2 unleased, the backend is full.
	f.mu.Lock()
	f.held["a"] = 2
	f.mu.Unlock()
	f.down.Store(false)
	got := make(chan *Slot, 2)
	for range 2 {
		go func() {
			sl, err := p.Acquire(context.Background(), AcquireOptions{})
			if err != nil {
				t.Error(err)
			}
			got <- sl
		}()
	}
	waitFor(t, "the shared limit to resume", func() bool { return !s.Degraded() })
	f.mu.Lock()
	held := f.held["a"]
	f.mu.Unlock()
	if held != 4 {
		t.Fatalf("the store counts %d slots, want 4: the 2 handed out without it were not adopted", held)
	}
	select {
	case <-got:
		t.Fatal("a slot was handed out on top of the unleased ones: 5 of 4 in use")
	case <-time.After(300 * time.Millisecond):
	}
	for i := range 2 {
		unleased[i].Release()
		select {
		case sl := <-got:
			if !sl.leased {
				t.Fatal("after resuming, the slot should come from the store")
			}
			defer sl.Release()
		case <-time.After(3 * time.Second):
			t.Fatal("a waiter was not served once an unleased slot ended")
		}
		select {
		case <-got:
			t.Fatal("two waiters served for one slot ended")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if s.Degraded() || degraded.Load() {
		t.Fatal("still degraded after the unleased slots ended")
	}
}

// TestSharedLimitSlowStoreKeepsLimit: a failed call to a store that still
// answers a ping (a pause, not an outage) does not switch to the
// per-replica share, whose slots would hold no lease.
func TestSharedLimitSlowStoreKeepsLimit(t *testing.T) {
	f, s, _ := sharedSched(t, 3, 16, PoolSpec{MaxQueue: 8, QueueTimeout: 300 * time.Millisecond})
	p := s.Pool("a")
	f.slow.Store(true)
	_, err := p.Acquire(context.Background(), AcquireOptions{})
	var rej *Rejected
	if !errors.As(err, &rej) || rej.Reason != ReasonQueueTimeout {
		t.Fatalf("got %v, want a queue timeout while the store's calls fail", err)
	}
	if s.Degraded() {
		t.Fatal("degraded although the store answers a ping")
	}
	f.slow.Store(false)
	sl := acquire(t, p, AcquireOptions{})
	if !sl.leased {
		t.Fatal("slot not leased")
	}
	sl.Release()
}
