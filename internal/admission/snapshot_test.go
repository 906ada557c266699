package admission

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Snapshot reports the counts, the limits and the wait of whoever heads the
// queue now: when the oldest waiter leaves, the next one's wait is shown.
func TestSnapshot(t *testing.T) {
	g := NewGate("b", Options{MaxConcurrency: 1, MaxQueue: 3})
	if s := g.Snapshot(); s != (Snapshot{MaxConcurrency: 1, MaxQueue: 3}) {
		t.Fatalf("idle gate: %+v", s)
	}
	first, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s := g.Snapshot(); s.InFlight != 1 || s.Queued != 0 || s.OldestWait != 0 {
		t.Fatalf("one slot held: %+v", s)
	}

	// wait starts a waiter and returns once the gate shows it queued, with
	// the moments just before it started and just after it was seen.
	type waiting struct {
		cancel        context.CancelFunc
		slot          chan *Slot
		before, after time.Time
	}
	wait := func(n int) waiting {
		ctx, cancel := context.WithCancel(context.Background())
		w := waiting{cancel: cancel, slot: make(chan *Slot, 1), before: time.Now()}
		go func() {
			s, _ := g.Acquire(ctx)
			w.slot <- s
		}()
		waitFor(t, "a waiter", func() bool { return g.Queued() == n })
		w.after = time.Now()
		return w
	}
	a := wait(1)
	time.Sleep(20 * time.Millisecond) // a wait of at least this, whatever the clock
	b := wait(2)

	bounds := func(what string, s Snapshot, w waiting, taken time.Time) {
		t.Helper()
		// The waiter joined between before and after; the snapshot read its
		// clock between "taken" and now.
		if lo, hi := taken.Sub(w.after), time.Since(w.before); s.OldestWait < lo || s.OldestWait > hi {
			t.Errorf("%s: oldest wait %v, want between %v and %v", what, s.OldestWait, lo, hi)
		}
	}
	taken := time.Now()
	s := g.Snapshot()
	if s.InFlight != 1 || s.Queued != 2 || s.MaxConcurrency != 1 || s.MaxQueue != 3 {
		t.Fatalf("two queued: %+v", s)
	}
	bounds("head is the first waiter", s, a, taken)
	if s.OldestWait < 20*time.Millisecond {
		t.Errorf("oldest wait %v, but the first waiter has waited at least 20ms", s.OldestWait)
	}

	// The first waiter gives up: the second now heads the queue.
	a.cancel()
	if got := <-a.slot; got != nil {
		t.Fatal("a cancelled waiter got a slot")
	}
	taken = time.Now()
	s = g.Snapshot()
	if s.InFlight != 1 || s.Queued != 1 {
		t.Fatalf("after a waiter left: %+v", s)
	}
	bounds("head is the second waiter", s, b, taken)

	// The slot goes to the second waiter: nobody waits any more.
	first.Release()
	second := <-b.slot
	if s := g.Snapshot(); s.InFlight != 1 || s.Queued != 0 || s.OldestWait != 0 {
		t.Fatalf("after the hand-over: %+v", s)
	}
	second.Release()
	b.cancel()
	if s := g.Snapshot(); s != (Snapshot{MaxConcurrency: 1, MaxQueue: 3}) {
		t.Fatalf("idle again: %+v", s)
	}
}

// Snapshots taken while requests come and go always agree with the limits
// (run with -race: they read the gate under its lock).
func TestSnapshotUnderChurn(t *testing.T) {
	g := NewGate("b", Options{MaxConcurrency: 2, MaxQueue: 4})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if s, err := g.Acquire(ctx); err == nil {
					s.Release()
				}
			}
		}()
	}
	for i := 0; i < 2000; i++ {
		s := g.Snapshot()
		if s.InFlight < 0 || s.InFlight > 2 || s.Queued < 0 || s.Queued > 4 || s.OldestWait < 0 ||
			(s.Queued == 0 && s.OldestWait != 0) || (s.Queued > 0 && s.InFlight != 2) {
			t.Fatalf("inconsistent snapshot %+v", s)
		}
	}
	cancel()
	wg.Wait()
	if s := g.Snapshot(); s.InFlight != 0 || s.Queued != 0 {
		t.Fatalf("after the churn: %+v", s)
	}
}
