package auth

import (
	"testing"
	"time"
)

func TestFailureLimiter(t *testing.T) {
	l := NewFailureLimiter(3, time.Minute)
	t0 := time.Unix(1_700_000_000, 0)
	for i := 1; i <= 3; i++ {
		if l.Blocked("10.0.0.1", t0) {
			t.Fatalf("blocked after %d failures", i-1)
		}
		if blocked := l.Fail("10.0.0.1", t0); blocked != (i == 3) {
			t.Errorf("Fail #%d reported blocked=%v", i, blocked)
		}
	}
	if !l.Blocked("10.0.0.1", t0.Add(30*time.Second)) {
		t.Error("not blocked after the limit")
	}
	if l.Blocked("10.0.0.2", t0) {
		t.Error("another address is blocked too")
	}
	if l.Blocked("10.0.0.1", t0.Add(time.Minute)) {
		t.Error("still blocked after the window")
	}
	// A new window starts counting again, and old windows are swept.
	l.Fail("10.0.0.1", t0.Add(2*time.Minute))
	if l.Blocked("10.0.0.1", t0.Add(2*time.Minute)) {
		t.Error("blocked after one failure in a new window")
	}
	l.Fail("10.0.0.3", t0.Add(4*time.Minute))
	l.mu.Lock()
	n := len(l.addrs)
	l.mu.Unlock()
	if n != 1 {
		t.Errorf("%d addresses remembered after their windows ended, want 1", n)
	}
}
