package backoff

import (
	"context"
	"testing"
	"time"
)

func TestJitter(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, 1} {
		if got := Jitter(d); got != d {
			t.Errorf("Jitter(%v) = %v, want %v unchanged", d, got, d)
		}
	}
	for _, d := range []time.Duration{2, 3, time.Millisecond, 50 * time.Millisecond, time.Hour} {
		lo, hi := time.Duration(1<<62), time.Duration(-1)
		for range 1000 {
			j := Jitter(d)
			if j < d/2 || j >= d {
				t.Fatalf("Jitter(%v) = %v, want within [%v, %v)", d, j, d/2, d)
			}
			lo, hi = min(lo, j), max(hi, j)
		}
		// Spread, not a constant: a thousand draws over a range of
		// millions of values do not all land on one.
		if d >= time.Millisecond && lo == hi {
			t.Errorf("Jitter(%v) returned %v every time", d, lo)
		}
	}
}

func TestSleepWaits(t *testing.T) {
	const d = 20 * time.Millisecond
	start := time.Now()
	if !Sleep(context.Background(), d) {
		t.Fatal("Sleep returned false with a live context")
	}
	if el := time.Since(start); el < d {
		t.Fatalf("Sleep(%v) returned after %v", d, el)
	}
}

func TestSleepCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep returned true with a context already ended")
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	defer cancel()
	start := time.Now()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep returned true although its context ended during the wait")
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("Sleep took %v to notice the cancellation", el)
	}
}
