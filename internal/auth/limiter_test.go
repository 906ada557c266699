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

func TestRequestLimiter(t *testing.T) {
	l := NewRequestLimiter(3, time.Minute)
	t0 := time.Unix(1_700_000_000, 0)
	for i := 1; i <= 3; i++ {
		if ok, _, _ := l.Allow("10.0.0.1", t0.Add(time.Duration(i-1)*time.Second)); !ok {
			t.Fatalf("request #%d refused", i)
		}
	}
	ok, retry, first := l.Allow("10.0.0.1", t0.Add(20*time.Second))
	if ok || !first || retry != 40*time.Second {
		t.Fatalf("4th request: ok=%v first=%v retry=%v, want refused, first, 40s", ok, first, retry)
	}
	if ok, _, first := l.Allow("10.0.0.1", t0.Add(21*time.Second)); ok || first {
		t.Errorf("5th request: ok=%v first=%v, want refused and not first", ok, first)
	}
	if ok, _, _ := l.Allow("10.0.0.2", t0.Add(21*time.Second)); !ok {
		t.Error("another address is limited too")
	}
	if ok, _, _ := l.Allow("10.0.0.1", t0.Add(time.Minute)); !ok {
		t.Error("still limited in the next window")
	}
}

// TestLimiterOverflow checks that addresses beyond the bound share one count
// instead of growing the map or escaping the limit.
func TestLimiterOverflow(t *testing.T) {
	l := NewRequestLimiter(2, time.Minute)
	l.max = 3
	t0 := time.Unix(1_700_000_000, 0)
	for _, a := range []string{"a", "b", "c"} {
		l.Allow(a, t0)
	}
	for i, a := range []string{"d", "e", "f"} {
		ok, _, _ := l.Allow(a, t0)
		if ok != (i < 2) {
			t.Errorf("overflow address %s: ok=%v", a, ok)
		}
	}
	if n := len(l.addrs); n != 4 {
		t.Errorf("%d entries, want 3 addresses and the overflow", n)
	}
	if ok, _, _ := l.Allow("a", t0); !ok {
		t.Error("a tracked address lost its own count")
	}
	// After the window the sweep makes room again.
	if ok, _, _ := l.Allow("g", t0.Add(time.Minute)); !ok || l.addrs["g"] == nil {
		t.Error("no room after the sweep")
	}

	f := NewFailureLimiter(1, time.Minute)
	f.max = 1
	f.Fail("a", t0)
	f.Fail("b", t0)
	if !f.Blocked("c", t0) || f.Blocked("a", t0.Add(time.Minute)) {
		t.Error("overflow failures not shared, or not forgotten after the window")
	}
}
