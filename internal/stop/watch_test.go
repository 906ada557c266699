package stop

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A run begun without onStop (a chat reply registered before its id left
// the chat) is watched by whoever takes it over: a stop that came before
// the watch fires it at once, one after it fires it once, and a run that
// has ended keeps no watch.
func TestRunWatch(t *testing.T) {
	h := NewHolder(0)
	defer h.Close()
	s := NewService(h, NewLocalBus(), Options{})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var fired atomic.Int32
	onStop := func() { fired.Add(1) }

	// Stopped before it is watched: the watch fires at once.
	r := s.BeginFresh("inf_early", 7, nil)
	if res, err := s.RequestAs(context.Background(), "inf_early", -1, Caller{UserID: 8}); err != nil || r.Stopped() || !res.NoOwner {
		t.Fatalf("someone else's stop of a registered run: %+v, %v", res, err)
	}
	done := make(chan Result, 1)
	go func() {
		res, _ := s.RequestAs(context.Background(), "inf_early", -1, Caller{UserID: 7})
		done <- res
	}()
	waitFor(t, 5*time.Second, "the owner's stop", r.Stopped)
	r.Watch(onStop)
	if n := fired.Load(); n != 1 {
		t.Fatalf("a watch of a stopped run fired %d times, want once at once", n)
	}
	r.EndWith("stopped")
	if res := <-done; !res.Acked || res.Finished {
		t.Fatalf("the owner's stop: %+v, want acknowledged by the run's end", res)
	}

	// Watched, then stopped: fired once, however many stops.
	fired.Store(0)
	r = s.BeginFresh("inf_late", 7, nil)
	r.Watch(onStop)
	h.Stop("inf_late")
	h.Stop("inf_late")
	if n := fired.Load(); n != 1 {
		t.Fatalf("fired %d times, want 1", n)
	}
	r.End()

	// Ended, then watched: nothing stays watched, nothing fires.
	fired.Store(0)
	r = s.BeginFresh("inf_over", 7, nil)
	r.End()
	r.Watch(onStop)
	h.Stop("inf_over")
	if n := fired.Load(); n != 0 {
		t.Fatalf("a watch after the end fired %d times", n)
	}
	if n := s.Running(); n != 0 {
		t.Fatalf("%d runs still registered", n)
	}
}
