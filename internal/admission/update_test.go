package admission

import (
	"context"
	"testing"
	"time"
)

// waitQueued waits until the pool holds n waiters.
func waitQueued(t *testing.T, s *Scheduler, backend string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.Snapshot(backend).Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("backend %s: %d queued, want %d", backend, s.Snapshot(backend).Queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUpdateRaisesLimitForWaiters: requests queued under a limit of 1 are
// served at once when a reload raises it, not lost.
func TestUpdateRaisesLimitForWaiters(t *testing.T) {
	s := newSched(t, Config{Backends: []BackendSpec{{Name: "a", MaxConcurrency: 1}},
		Pools: []PoolSpec{{Name: "a", Backends: []string{"a"}, MaxQueue: 4}}})
	p := s.Pool("a")
	first := acquire(t, p, AcquireOptions{})
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
	waitQueued(t, s, "a", 2)
	if err := s.Update(Config{Backends: []BackendSpec{{Name: "a", MaxConcurrency: 3}},
		Pools: []PoolSpec{{Name: "a", Backends: []string{"a"}, MaxQueue: 4}}}); err != nil {
		t.Fatal(err)
	}
	a, b := <-got, <-got
	if snap := s.Snapshot("a"); snap.InFlight != 3 || snap.MaxConcurrency != 3 || snap.Queued != 0 {
		t.Fatalf("after the reload: %+v, want 3 in flight of 3, none queued", snap)
	}
	for _, sl := range []*Slot{first, a, b} {
		sl.Release()
	}
}

// TestUpdateLowersLimit: a lower limit cuts nothing in flight and hands out
// no slot until the backend is under it.
func TestUpdateLowersLimit(t *testing.T) {
	s := newSched(t, Config{Backends: []BackendSpec{{Name: "a", MaxConcurrency: 2}},
		Pools: []PoolSpec{{Name: "a", Backends: []string{"a"}, MaxQueue: 4}}})
	p := s.Pool("a")
	x, y := acquire(t, p, AcquireOptions{}), acquire(t, p, AcquireOptions{})
	if err := s.Update(Config{Backends: []BackendSpec{{Name: "a", MaxConcurrency: 1}},
		Pools: []PoolSpec{{Name: "a", Backends: []string{"a"}, MaxQueue: 4}}}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *Slot, 1)
	go func() {
		sl, _ := p.Acquire(context.Background(), AcquireOptions{})
		got <- sl
	}()
	waitQueued(t, s, "a", 1)
	x.Release() // 1 in flight: at the new limit, the waiter still waits
	if snap := s.Snapshot("a"); snap.InFlight != 1 || snap.Queued != 1 {
		t.Fatalf("after one release: %+v, want 1 in flight and 1 queued", snap)
	}
	y.Release()
	(<-got).Release()
}

// TestUpdateRetiresPool: a pool the reload removes keeps its waiters and
// serves them on its backends; a new pool starts beside it.
func TestUpdateRetiresPool(t *testing.T) {
	s := newSched(t, Config{Backends: []BackendSpec{{Name: "a", MaxConcurrency: 1}},
		Pools: []PoolSpec{{Name: "a", Backends: []string{"a"}, MaxQueue: 4}}})
	old := s.Pool("a")
	held := acquire(t, old, AcquireOptions{})
	got := make(chan *Slot, 1)
	go func() {
		sl, _ := old.Acquire(context.Background(), AcquireOptions{})
		got <- sl
	}()
	waitQueued(t, s, "a", 1)
	if err := s.Update(Config{Backends: []BackendSpec{{Name: "b", MaxConcurrency: 1}},
		Pools: []PoolSpec{{Name: "b", Backends: []string{"b"}, MaxQueue: 4}}}); err != nil {
		t.Fatal(err)
	}
	nb := acquire(t, s.Pool("b"), AcquireOptions{})
	held.Release()
	sl := <-got
	if sl.Backend() != "a" {
		t.Fatalf("the waiter of the retired pool ran on %s, want a", sl.Backend())
	}
	sl.Release()
	nb.Release()
	if err := s.Update(Config{Backends: []BackendSpec{{Name: "b"}}, Pools: []PoolSpec{{Name: "b", Backends: []string{"x"}}}}); err == nil {
		t.Fatal("a pool naming an unknown backend was accepted")
	}
}
