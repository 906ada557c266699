package lease

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func one(name string, max int) []Backend { return []Backend{{Name: name, Max: max, Weight: 1}} }

// mustAcquire calls Acquire and fails the test on an error.
func mustAcquire(t *testing.T, r *replica, req Request) (int, Lease) {
	t.Helper()
	i, l, err := r.store.Acquire(testCtx(t), req)
	if err != nil {
		t.Fatalf("%s: acquire: %v", r.name, err)
	}
	if (i < 0) != l.IsZero() {
		t.Fatalf("%s: acquire returned index %d with lease %+v", r.name, i, l)
	}
	return i, l
}

func mustRelease(t *testing.T, r *replica, l Lease) {
	t.Helper()
	if err := r.store.Release(testCtx(t), l); err != nil {
		t.Fatalf("%s: release: %v", r.name, err)
	}
}

func count(t *testing.T, r *replica, b string) int {
	t.Helper()
	n, err := r.store.Count(testCtx(t), b)
	if err != nil {
		t.Fatalf("count %s: %v", b, err)
	}
	return n
}

// waitList plays a replica's local queue in TestLimitHoldsAcrossReplicas:
// a release notification wakes the oldest waiter only, as the admission
// scheduler retries only its queue's head.
type waitList struct {
	mu sync.Mutex
	ws []*waiter
}

type waiter struct {
	arrival time.Time
	wake    chan struct{}
}

func (l *waitList) add(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ws = append(l.ws, w)
}

func (l *waitList) remove(w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range l.ws {
		if x == w {
			l.ws = append(l.ws[:i], l.ws[i+1:]...)
			return
		}
	}
}

func (l *waitList) wakeOldest() {
	l.mu.Lock()
	defer l.mu.Unlock()
	var oldest *waiter
	for _, w := range l.ws {
		if oldest == nil || w.arrival.Before(oldest.arrival) {
			oldest = w
		}
	}
	if oldest != nil {
		select {
		case oldest.wake <- struct{}{}:
		default:
		}
	}
}

// TestLimitHoldsAcrossReplicas runs 100 goroutines on three replicas that
// take, hold briefly and give back slots of a backend with Max 16 (half of
// them with ReleaseSoon), and checks that no more than 16 requests ever
// hold one at once.
func TestLimitHoldsAcrossReplicas(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		const maxSlots, workers = 16, 100
		var reps []*replica
		var lists []*waitList
		for k := range 3 {
			l := &waitList{}
			lists = append(lists, l)
			reps = append(reps, newReplica(t, be, fmt.Sprintf("r%d", k), replicaConfig{
				onReleased: func(string) { l.wakeOldest() },
			}))
		}
		cands := one("gpu", maxSlots)
		// miniredis builds a Lua state for every script call, over 1 ms
		// under the race detector: shorter holds would leave it unable to
		// refill the slots, and the test would never reach the limit.
		holdMin, holdSpread := 5*time.Millisecond, 20*time.Millisecond
		if be.Mini != nil {
			holdMin, holdSpread = 40*time.Millisecond, 80*time.Millisecond
		}
		var cur, peak, grants, calls atomic.Int64
		stopAt := time.Now().Add(1500 * time.Millisecond)
		giveUp := stopAt.Add(10 * time.Second)
		var wg sync.WaitGroup
		for g := range workers {
			r, list := reps[g%len(reps)], lists[g%len(reps)]
			queue := fmt.Sprintf("q%d", g)
			wg.Go(func() {
				ctx := context.Background()
				for time.Now().Before(stopAt) {
					w := &waiter{arrival: time.Now(), wake: make(chan struct{}, 1)}
					list.add(w)
					for {
						calls.Add(1)
						i, l, err := r.store.Acquire(ctx, Request{Queue: queue, Candidates: cands, Arrival: w.arrival})
						if err != nil {
							t.Errorf("%s: acquire: %v", r.name, err)
							list.remove(w)
							return
						}
						if i < 0 {
							if time.Now().After(giveUp) {
								t.Errorf("%s/%s: waited since %v without a slot", r.name, queue, w.arrival)
								list.remove(w)
								_ = r.store.ClearWait(ctx, queue, []string{"gpu"})
								return
							}
							// Woken by a release, or retry on a timer since
							// notifications can be missed.
							select {
							case <-w.wake:
							case <-time.After(200*time.Millisecond + time.Duration(rand.N(200))*time.Millisecond):
							}
							continue
						}
						list.remove(w)
						// More slots may be free: let the next in line try.
						list.wakeOldest()
						// Counted only while the lease certainly exists: after
						// the grant, before the release.
						c := cur.Add(1)
						for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
						}
						time.Sleep(holdMin + rand.N(holdSpread))
						cur.Add(-1)
						// Half the workers give their slots back as the
						// scheduler does, queued for the next acquire or the
						// flusher; the others wait for Redis.
						if g%2 == 0 {
							r.store.ReleaseSoon(l)
						} else if err := r.store.Release(ctx, l); err != nil {
							t.Errorf("%s: release: %v", r.name, err)
							return
						}
						grants.Add(1)
						break
					}
				}
			})
		}
		wg.Wait()
		t.Logf("%s: %d grants in %d acquires, peak %d held at once (max %d)",
			be.Name, grants.Load(), calls.Load(), peak.Load(), maxSlots)
		if p := peak.Load(); p > maxSlots {
			t.Fatalf("peak of %d leases held at once, above Max %d", p, maxSlots)
		}
		if p := peak.Load(); p < maxSlots/2 {
			t.Errorf("peak %d: the test did not saturate the backend, so it proves little", p)
		}
		// The last queued releases go within the release delay.
		if !testredis.WaitFor(2*time.Second, func() bool { return count(t, reps[0], "gpu") == 0 }) {
			t.Errorf("Count 2s after every release = %d, want 0", count(t, reps[0], "gpu"))
		}
		for _, r := range reps {
			if h := r.store.Held("gpu"); h != 0 {
				t.Errorf("%s still holds %d leases", r.name, h)
			}
		}
		if n := be.Admin.ZCard(testCtx(t), be.Prefix+"lease-wait:gpu").Val(); n != 0 {
			t.Errorf("%d wait entries left after every request was served", n)
		}
	})
}

// TestDeadReplicaFreesItsSlots abandons a replica that holds leases, as a
// crash would, and checks that its slots come back within TTL while a live
// replica's leases outlast TTL by far, being renewed.
func TestDeadReplicaFreesItsSlots(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		const ttl = 600 * time.Millisecond
		a := newReplica(t, be, "a", replicaConfig{ttl: ttl})
		b := newReplica(t, be, "b", replicaConfig{ttl: ttl})
		c := newReplica(t, be, "c", replicaConfig{ttl: ttl})
		cands := one("gpu", 8)
		for range 5 {
			if i, _ := mustAcquire(t, a, Request{Queue: "p", Candidates: cands}); i != 0 {
				t.Fatal("a: refused a free slot")
			}
		}
		for range 3 {
			if i, _ := mustAcquire(t, c, Request{Queue: "p", Candidates: cands}); i != 0 {
				t.Fatal("c: refused a free slot")
			}
		}
		heldSince := time.Now()
		if !testredis.WaitFor(time.Second, func() bool { return b.store.LiveReplicas() == 3 }) {
			t.Errorf("b sees %d live replicas, want 3", b.store.LiveReplicas())
		}

		a.store.stop() // a dies: its leases stay in Redis, unrenewed
		died := time.Now()
		arrival := time.Now()
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: arrival}); i >= 0 {
			t.Fatal("b got a slot while a's leases were still live")
		}
		got := 0
		ok := testredis.WaitFor(ttl+ttl/3+500*time.Millisecond, func() bool {
			for got < 5 {
				i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: arrival})
				if i < 0 {
					return false
				}
				got++
			}
			return true
		})
		t.Logf("%s: a's 5 slots back after %v (TTL %v)", be.Name, time.Since(died).Round(time.Millisecond), ttl)
		if !ok {
			t.Fatalf("b got %d of a's 5 slots within TTL + renew interval", got)
		}
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands}); i >= 0 {
			t.Fatal("b got a 9th slot: c's leases were lost")
		}
		// c's leases were taken well over TTL ago; they are still there.
		time.Sleep(max(0, 2*ttl-time.Since(heldSince)))
		if n := count(t, b, "gpu"); n != 8 {
			t.Errorf("Count = %d %v after c took its leases (2×TTL), want 8 (renewed)", n, time.Since(heldSince).Round(time.Millisecond))
		}
		if h := c.store.Held("gpu"); h != 3 {
			t.Errorf("c holds %d leases, want 3", h)
		}
		if n := b.store.LiveReplicas(); n != 2 {
			t.Errorf("b sees %d live replicas after a died, want 2", n)
		}
	})
}

// TestFairnessAcrossReplicas checks that a freed slot goes to the queue that
// has waited longest, whichever replica it is on.
func TestFairnessAcrossReplicas(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "a", replicaConfig{})
		b := newReplica(t, be, "b", replicaConfig{})
		c := newReplica(t, be, "c", replicaConfig{})
		cands := one("gpu", 1)
		_, held := mustAcquire(t, c, Request{Queue: "p", Candidates: cands})
		older := time.Now().Add(-time.Second)
		newer := time.Now()
		if i, _ := mustAcquire(t, a, Request{Queue: "p", Candidates: cands, Arrival: older}); i >= 0 {
			t.Fatal("a got a slot that c holds")
		}
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: newer}); i >= 0 {
			t.Fatal("b got a slot that c holds")
		}
		mustRelease(t, c, held)
		// b asks first, but the slot is owed to a, who has waited longer.
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: newer}); i >= 0 {
			t.Fatal("b, the newcomer, took the slot ahead of a's older waiter")
		}
		i, la := mustAcquire(t, a, Request{Queue: "p", Candidates: cands, Arrival: older})
		if i != 0 {
			t.Fatal("a, the oldest waiter, was refused the free slot")
		}
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: newer}); i >= 0 {
			t.Fatal("b got a slot that a holds")
		}
		mustRelease(t, a, la)
		i, lb := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: newer})
		if i != 0 {
			t.Fatal("b was refused once a, served, no longer waited")
		}
		mustRelease(t, b, lb)
	})
}

// TestFairnessFollowsNext checks that a queue served with requests behind it
// stays ahead of a newer queue on another replica, through Request.Next.
func TestFairnessFollowsNext(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "a", replicaConfig{})
		b := newReplica(t, be, "b", replicaConfig{})
		c := newReplica(t, be, "c", replicaConfig{})
		cands := one("gpu", 2)
		_, h1 := mustAcquire(t, c, Request{Queue: "p", Candidates: cands})
		_, h2 := mustAcquire(t, c, Request{Queue: "p", Candidates: cands})
		a1 := time.Now().Add(-2 * time.Second)
		a2 := a1.Add(time.Second)
		bArr := time.Now()
		if i, _ := mustAcquire(t, a, Request{Queue: "p", Candidates: cands, Arrival: a1, Next: a2}); i >= 0 {
			t.Fatal("a got a slot while c holds both")
		}
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: bArr}); i >= 0 {
			t.Fatal("b got a slot while c holds both")
		}
		mustRelease(t, c, h1)
		if i, _ := mustAcquire(t, a, Request{Queue: "p", Candidates: cands, Arrival: a1, Next: a2}); i != 0 {
			t.Fatal("a's head was refused the freed slot")
		}
		mustRelease(t, c, h2)
		// a's second request (a2) is older than b's: the slot is a's.
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: bArr}); i >= 0 {
			t.Fatal("b took a slot owed to a's second request")
		}
		if i, _ := mustAcquire(t, a, Request{Queue: "p", Candidates: cands, Arrival: a2}); i != 0 {
			t.Fatal("a's second request was refused")
		}
		if n := count(t, a, "gpu"); n != 2 {
			t.Fatalf("Count = %d, want 2 (both a's)", n)
		}
	})
}

// TestDeadWaiterStopsBlocking checks that a dead replica's wait entry keeps
// its slot owed only until it lapses, and that ClearWait frees it at once.
func TestDeadWaiterStopsBlocking(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		const ttl = 600 * time.Millisecond
		a := newReplica(t, be, "a", replicaConfig{ttl: ttl})
		b := newReplica(t, be, "b", replicaConfig{ttl: ttl})
		c := newReplica(t, be, "c", replicaConfig{ttl: ttl})
		d := newReplica(t, be, "d", replicaConfig{ttl: ttl})
		cands := one("gpu", 1)

		// ClearWait: a's waiter leaves, and b is told and served at once.
		_, held := mustAcquire(t, c, Request{Queue: "p", Candidates: cands})
		if i, _ := mustAcquire(t, a, Request{Queue: "p", Candidates: cands, Arrival: time.Now().Add(-time.Second)}); i >= 0 {
			t.Fatal("a got the held slot")
		}
		mustRelease(t, c, held)
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands}); i >= 0 {
			t.Fatal("b took the slot owed to a")
		}
		drain(b.released)
		if err := a.store.ClearWait(testCtx(t), "p", []string{"gpu"}); err != nil {
			t.Fatal(err)
		}
		expectReleased(t, b, "gpu")
		i, lb := mustAcquire(t, b, Request{Queue: "p", Candidates: cands})
		if i != 0 {
			t.Fatal("b refused after a's waiter left")
		}
		mustRelease(t, b, lb)

		// A dead replica's waiter blocks only until its entry lapses.
		_, held = mustAcquire(t, c, Request{Queue: "p", Candidates: cands})
		if i, _ := mustAcquire(t, d, Request{Queue: "p", Candidates: cands, Arrival: time.Now().Add(-time.Second)}); i >= 0 {
			t.Fatal("d got the held slot")
		}
		mustRelease(t, c, held)
		d.store.stop() // d dies while waiting; its entry stays, unrenewed
		died := time.Now()
		arrival := time.Now()
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: arrival}); i >= 0 {
			t.Fatal("b took the slot owed to d while d's entry was live")
		}
		ok := testredis.WaitFor(ttl+ttl/3+500*time.Millisecond, func() bool {
			i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands, Arrival: arrival})
			return i == 0
		})
		t.Logf("%s: dead waiter stopped blocking after %v (TTL %v)", be.Name, time.Since(died).Round(time.Millisecond), ttl)
		if !ok {
			t.Fatal("d's wait entry still blocks b after TTL + renew interval")
		}
	})
}

// TestWeightedChoice checks the 3:1 split of idle backends weighted 3 and 1,
// and that a request goes to the least loaded candidate with a free slot.
func TestWeightedChoice(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		r := newReplica(t, be, "r", replicaConfig{})
		cands := []Backend{{Name: "x", Max: 100, Weight: 3}, {Name: "y", Max: 100, Weight: 1}}
		// Fewer rounds on miniredis, whose Lua is slow under the race
		// detector; the tolerance is five standard deviations either way.
		n := 4000
		if be.Mini != nil {
			n = 1000
		}
		tol := 5 * math.Sqrt(0.75*0.25/float64(n))
		var hits [2]int
		for range n {
			i, l := mustAcquire(t, r, Request{Queue: "p", Candidates: cands})
			if i < 0 {
				t.Fatal("refused with both backends idle")
			}
			hits[i]++
			mustRelease(t, r, l)
		}
		frac := float64(hits[0]) / float64(n)
		t.Logf("%s: x (weight 3) %d, y (weight 1) %d: %.3f to x", be.Name, hits[0], hits[1], frac)
		if math.Abs(frac-0.75) > tol {
			t.Errorf("x got %.3f of %d requests, want 0.75 ± %.3f", frac, n, tol)
		}

		// Least loaded: two leases on a, so the next goes to b.
		eq := []Backend{{Name: "a", Max: 4, Weight: 1}, {Name: "b", Max: 4, Weight: 1}}
		for range 2 {
			mustAcquire(t, r, Request{Queue: "p", Candidates: eq[:1]})
		}
		if i, _ := mustAcquire(t, r, Request{Queue: "p", Candidates: eq}); i != 1 {
			t.Errorf("with a at 2/4 and b at 0/4 the request went to %d, want b", i)
		}
		// a at 2/4 and b at 1/4: still b.
		if i, _ := mustAcquire(t, r, Request{Queue: "p", Candidates: eq}); i != 1 {
			t.Errorf("with a at 2/4 and b at 1/4 the request went to %d, want b", i)
		}
		// Load is relative to Max×Weight: 2/(4×3) on a is below 2/(4×1) on b.
		wt := []Backend{{Name: "a", Max: 4, Weight: 3}, {Name: "b", Max: 4, Weight: 1}}
		for range 2 {
			mustAcquire(t, r, Request{Queue: "p", Candidates: wt[1:]})
		}
		if i, _ := mustAcquire(t, r, Request{Queue: "p", Candidates: wt}); i != 0 {
			t.Errorf("with a at 2/12 and b at 4/4 the request went to %d, want a", i)
		}
		// A full backend is skipped whatever its weight.
		full := []Backend{{Name: "f", Max: 1, Weight: 1000}, {Name: "g", Max: 5, Weight: 1}}
		mustAcquire(t, r, Request{Queue: "p", Candidates: full[:1]})
		for range 3 {
			if i, _ := mustAcquire(t, r, Request{Queue: "p", Candidates: full}); i != 1 {
				t.Fatalf("the request went to %d, want g: f is full", i)
			}
		}
	})
}

// TestReleasePublishes checks that a release another replica waits for
// reaches its OnReleased, and that releases nobody waits for publish
// nothing.
func TestReleasePublishes(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "a", replicaConfig{})
		b := newReplica(t, be, "b", replicaConfig{})
		cands := one("gpu", 1)
		_, la := mustAcquire(t, a, Request{Queue: "p", Candidates: cands})
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: cands}); i >= 0 {
			t.Fatal("b got a held slot")
		}
		drain(b.released)
		mustRelease(t, a, la)
		expectReleased(t, b, "gpu")

		i, lb := mustAcquire(t, b, Request{Queue: "p", Candidates: cands})
		if i != 0 {
			t.Fatal("b refused a free slot")
		}
		mustRelease(t, b, lb)
		_, la = mustAcquire(t, a, Request{Queue: "p", Candidates: cands})
		mustRelease(t, a, la)
		select {
		case got := <-b.released:
			t.Errorf("OnReleased(%q) with nobody waiting", got)
		case <-time.After(200 * time.Millisecond):
		}
	})
}

func drain(ch chan string) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func expectReleased(t *testing.T, r *replica, want string) {
	t.Helper()
	select {
	case got := <-r.released:
		if got != want {
			t.Errorf("%s: OnReleased(%q), want %q", r.name, got, want)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("%s: OnReleased not called within 2s", r.name)
	}
}

// TestReleaseSoon checks the release that does not wait for Redis: the
// next Acquire carries it (no command of its own), or it is sent after the
// delay, several in one command, and announced to whoever waits; it goes
// with the leave at Close; and when the Acquire that carried it got no
// answer, the next renewal deletes it.
func TestReleaseSoon(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		count := func(t *testing.T, backend string) int {
			t.Helper()
			n, err := be.Admin.ZCard(testCtx(t), be.Prefix+"lease:"+backend).Result()
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}

		// Carried by the next Acquire: one command for both.
		r := newReplica(t, be, "r", replicaConfig{ttl: 30 * time.Second, releaseDelay: time.Hour})
		_, l1 := mustAcquire(t, r, Request{Queue: "p", Candidates: one("gpu", 10)})
		sent0 := r.counter.N.Load()
		r.store.ReleaseSoon(l1)
		_, l2 := mustAcquire(t, r, Request{Queue: "p", Candidates: one("gpu", 10)})
		if sent := r.counter.N.Load() - sent0; sent != 1 {
			t.Errorf("ReleaseSoon then Acquire sent %d commands, want 1", sent)
		}
		if n := count(t, "gpu"); n != 1 {
			t.Errorf("%d leases on gpu after the Acquire that carried a release, want 1", n)
		}
		r.store.ReleaseSoon(l1) // released already: nothing to send
		mustRelease(t, r, l2)

		// Sent after the delay, five in one command.
		q := newReplica(t, be, "q", replicaConfig{ttl: 30 * time.Second, releaseDelay: 50 * time.Millisecond})
		var held []Lease
		for range 5 {
			_, l := mustAcquire(t, q, Request{Queue: "p", Candidates: one("npu", 10)})
			held = append(held, l)
		}
		sent0 = q.counter.N.Load()
		for _, l := range held {
			q.store.ReleaseSoon(l)
		}
		if !testredis.WaitFor(2*time.Second, func() bool { return count(t, "npu") == 0 }) {
			t.Fatalf("%d leases on npu 2s after ReleaseSoon with a 50ms delay", count(t, "npu"))
		}
		if sent := q.counter.N.Load() - sent0; sent != 1 {
			t.Errorf("five ReleaseSoon calls sent %d commands, want 1", sent)
		}

		// With no Acquire to carry it, a release goes within the delay, and
		// whoever waits for its backend is told. Both slots of tpu are d's
		// (the default delay), and w waits.
		d := newReplica(t, be, "d", replicaConfig{ttl: 30 * time.Second})
		w := newReplica(t, be, "w", replicaConfig{ttl: 30 * time.Second})
		_, t1 := mustAcquire(t, d, Request{Queue: "p", Candidates: one("tpu", 2)})
		mustAcquire(t, d, Request{Queue: "p", Candidates: one("tpu", 2)})
		if i, _ := mustAcquire(t, w, Request{Queue: "p", Candidates: one("tpu", 2)}); i >= 0 {
			t.Fatal("w got a slot of a full backend")
		}
		drain(w.released)
		d.store.ReleaseSoon(t1)
		expectReleased(t, w, "tpu")
		if n := count(t, "tpu"); n != 1 {
			t.Fatalf("%d leases on tpu once the release was announced, want 1", n)
		}
		if i, _ := mustAcquire(t, w, Request{Queue: "p", Candidates: one("tpu", 2)}); i != 0 {
			t.Fatal("w refused the slot d gave back")
		}

		// The Acquire carrying a release gets no answer: the release
		// becomes an orphan for the next renewal.
		_, l3 := mustAcquire(t, r, Request{Queue: "p", Candidates: one("gpu", 10)})
		r.store.ReleaseSoon(l3)
		r.gate.Cut()
		if _, _, err := r.store.Acquire(testCtx(t), Request{Queue: "p", Candidates: one("gpu", 10)}); err == nil {
			t.Fatal("Acquire succeeded while cut off from Redis")
		}
		r.gate.Heal()
		r.store.mu.Lock()
		orphaned := slices.ContainsFunc(r.store.orphans["gpu"], func(o orphan) bool { return o.member == l3.member })
		r.store.mu.Unlock()
		if !orphaned {
			t.Error("the release an Acquire without answer carried is not left to the next renewal")
		}

		// Close sends what is still queued.
		c := newReplica(t, be, "c", replicaConfig{ttl: 30 * time.Second, releaseDelay: time.Hour})
		_, l4 := mustAcquire(t, c, Request{Queue: "p", Candidates: one("fpga", 10)})
		c.store.ReleaseSoon(l4)
		if err := c.store.Close(); err != nil {
			t.Fatal(err)
		}
		if n := count(t, "fpga"); n != 0 {
			t.Errorf("%d leases on fpga after Close with a release queued, want 0", n)
		}
	})
}

// TestCommandCount checks that a request costs one command to acquire and
// one to release (Release; ReleaseSoon usually costs none, TestReleaseSoon),
// and that holding leases costs one command per renewal interval for the
// whole replica, not one per lease.
func TestCommandCount(t *testing.T) {
	testredis.ForEachIsolated(t, func(t *testing.T, be *testredis.Backend) {
		// A long TTL: no renewal falls inside the first measurement.
		r := newReplica(t, be, "r", replicaConfig{ttl: 30 * time.Second})
		cands := []Backend{{Name: "x", Max: 1000, Weight: 1}, {Name: "y", Max: 1000, Weight: 2}}
		const n = 200
		var stats0 map[string]int64
		if be.Mini == nil {
			stats0 = be.CommandStats(t)
		}
		sent0, renew0 := r.counter.N.Load(), r.store.renewals.Load()
		for range n {
			_, l := mustAcquire(t, r, Request{Queue: "p", Candidates: cands})
			mustRelease(t, r, l)
		}
		sent, renews := r.counter.N.Load()-sent0, r.store.renewals.Load()-renew0
		t.Logf("%s: %d acquire+release pairs: %d commands sent, %d renewals", be.Name, n, sent, renews)
		if sent > 2*n+renews {
			t.Errorf("%d commands for %d pairs and %d renewals, want at most %d", sent, n, renews, 2*n+renews)
		}
		if be.Mini == nil {
			stats := be.CommandStats(t)
			scripts := stats["evalsha"] + stats["eval"] - stats0["evalsha"] - stats0["eval"]
			var all int64
			for k, v := range stats {
				all += v - stats0[k]
			}
			t.Logf("%s: server ran %d scripts, %d commands counting those the scripts ran (%.1f per pair)",
				be.Name, scripts, all, float64(all)/n)
			if scripts > 2*n+renews {
				t.Errorf("server ran %d scripts for %d pairs and %d renewals, want at most %d", scripts, n, renews, 2*n+renews)
			}
		}

		// Holding 50 leases over several renewal intervals costs the
		// renewals only.
		h := newReplica(t, be, "h", replicaConfig{ttl: 300 * time.Millisecond})
		var held []Lease
		for range 50 {
			_, l := mustAcquire(t, h, Request{Queue: "p", Candidates: cands})
			held = append(held, l)
		}
		// The hook counts renewals and other commands apart, so a renewal
		// in flight when the window opens or closes cannot skew the count.
		others0, renew0, hs0 := h.counter.Others.Load(), h.counter.Matched.Load(), h.counter.Handshakes.Load()
		time.Sleep(time.Second)
		others, renews := h.counter.Others.Load()-others0, h.counter.Matched.Load()-renew0
		t.Logf("%s: 50 leases held for 1s (renew every 100ms): %d renewals, %d other commands, %d of new connections' handshakes",
			be.Name, renews, others, h.counter.Handshakes.Load()-hs0)
		if renews < 5 || renews > 20 || others != 0 {
			last := ""
			if p := h.counter.LastOther.Load(); p != nil {
				last = *p
			}
			t.Errorf("holding 50 leases for 1s cost %d renewals and %d other commands (the last: %q); want 5 to 20 renewals (one per interval, not per lease) and nothing else", renews, others, last)
		}
		for _, l := range held {
			mustRelease(t, h, l)
		}
	})
}

// TestRedisDown checks that Acquire fails fast while Redis is unreachable
// or hung and works again once it is back, and that a store started while
// Redis is down catches up by itself.
func TestRedisDown(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		short := func(o *redis.Options) {
			o.DialTimeout = 200 * time.Millisecond
			o.ReadTimeout = 200 * time.Millisecond
			o.WriteTimeout = 200 * time.Millisecond
			o.ContextTimeoutEnabled = true
			o.MaxRetries = -1
		}
		r := newReplica(t, be, "r", replicaConfig{ttl: 600 * time.Millisecond, client: short})
		cands := one("gpu", 4)
		acquireWithin := func(limit time.Duration) (int, Lease, error) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			i, l, err := r.store.Acquire(ctx, Request{Queue: "p", Candidates: cands})
			if d := time.Since(start); d > limit {
				t.Errorf("Acquire took %v, want under %v", d.Round(time.Millisecond), limit)
			}
			return i, l, err
		}
		backAgain := func(what string) {
			t.Helper()
			var lastErr error
			ok := testredis.WaitFor(3*time.Second, func() bool {
				i, l, err := acquireWithin(time.Second)
				lastErr = err
				if err != nil || i < 0 {
					return false
				}
				return r.store.Release(testCtx(t), l) == nil
			})
			if !ok {
				t.Fatalf("Acquire still fails 3s after %s: %v", what, lastErr)
			}
		}

		// Cut off: connections refused.
		r.gate.Cut()
		if _, _, err := acquireWithin(time.Second); err == nil {
			t.Fatal("Acquire succeeded while cut off from Redis")
		}
		r.gate.Heal()
		backAgain("the partition healed")

		// Hung: Redis swallows the request and never answers.
		r.gate.Freeze()
		if _, _, err := acquireWithin(time.Second); err == nil {
			t.Fatal("Acquire succeeded against a hung Redis")
		}
		backAgain("the connections were replaced")

		if be.Mini != nil {
			// The server itself goes away and comes back on the same
			// address (miniredis keeps its data).
			be.Mini.Close()
			if _, _, err := acquireWithin(time.Second); err == nil {
				t.Fatal("Acquire succeeded while Redis was stopped")
			}
			if err := be.Mini.Restart(); err != nil {
				t.Fatal(err)
			}
			backAgain("Redis restarted")
		}

		// A replica starts while Redis is down: Start reports it, and the
		// store catches up in the background.
		late := newReplica(t, be, "late", replicaConfig{ttl: 600 * time.Millisecond, client: short, noStart: true})
		late.gate.Cut()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := late.store.Start(ctx)
		cancel()
		if err == nil {
			t.Fatal("Start succeeded with Redis unreachable")
		}
		t.Logf("%s: Start while down: %v", be.Name, err)
		late.gate.Heal()
		if !testredis.WaitFor(3*time.Second, func() bool {
			return be.Admin.ZScore(testCtx(t), be.Prefix+"lease-replicas", "late").Err() == nil
		}) {
			t.Fatal("the late replica never registered once Redis was reachable")
		}
		if !testredis.WaitFor(2*time.Second, func() bool { return r.store.LiveReplicas() == 2 }) {
			t.Errorf("r sees %d live replicas, want 2", r.store.LiveReplicas())
		}
		if err := late.store.Start(testCtx(t)); err == nil {
			t.Error("a second Start succeeded")
		}
	})
}

// TestRenewalHousekeeping checks the renewal's two clean-ups: a lease Redis
// no longer has is forgotten rather than resurrected, and a lease whose
// acquire failed without an answer (an orphan) is deleted from Redis.
func TestRenewalHousekeeping(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		r := newReplica(t, be, "r", replicaConfig{ttl: 300 * time.Millisecond})
		cands := one("gpu", 4)
		_, l := mustAcquire(t, r, Request{Queue: "p", Candidates: cands})
		key := be.Prefix + "lease:gpu"
		if err := be.Admin.ZRem(testCtx(t), key, l.member).Err(); err != nil {
			t.Fatal(err)
		}
		// Its request still runs: the renewal counts it again, so that
		// nothing is granted on top of it.
		if !testredis.WaitFor(time.Second, func() bool { return be.Admin.ZScore(testCtx(t), key, l.member).Err() == nil }) {
			t.Fatal("a lease Redis lost while it was held was not counted again")
		}
		if r.store.Held("gpu") != 1 {
			t.Fatal("the store let go of a lease whose request still runs")
		}
		if err := r.store.Release(testCtx(t), l); err != nil {
			t.Fatal(err)
		}
		if be.Admin.ZScore(testCtx(t), key, l.member).Err() != redis.Nil {
			t.Fatal("the lease counted again was not released")
		}

		orphan := r.store.memberID + "orphan"
		be.Admin.ZAdd(testCtx(t), key, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: orphan})
		r.store.mu.Lock()
		r.store.orphanLocked("gpu", orphan)
		r.store.mu.Unlock()
		if !testredis.WaitFor(time.Second, func() bool { return be.Admin.ZScore(testCtx(t), key, orphan).Err() == redis.Nil }) {
			t.Fatal("the orphan lease was not deleted by a renewal")
		}
	})
}
