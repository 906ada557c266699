package devidp

import (
	"sync"
	"time"
)

// failureLimiter counts failed sign-ins per client address in fixed windows. It slows down
// password guessing; it is not meant to withstand an attacker with many addresses.
type failureLimiter struct {
	limit  int
	window time.Duration

	mu      sync.Mutex
	entries map[string]*failureWindow
}

type failureWindow struct {
	start time.Time
	count int
}

// maxLimiterEntries bounds the map; beyond it, expired windows are swept on the next failure.
const maxLimiterEntries = 10000

func newFailureLimiter(limit int, window time.Duration) *failureLimiter {
	return &failureLimiter{limit: limit, window: window, entries: make(map[string]*failureWindow)}
}

// blocked reports whether addr has used up its failures in the current window.
func (l *failureLimiter) blocked(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[addr]
	return ok && now.Sub(e.start) < l.window && e.count >= l.limit
}

// fail records a failed attempt from addr.
func (l *failureLimiter) fail(addr string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) >= maxLimiterEntries {
		for a, e := range l.entries {
			if now.Sub(e.start) >= l.window {
				delete(l.entries, a)
			}
		}
	}
	e, ok := l.entries[addr]
	if !ok || now.Sub(e.start) >= l.window {
		e = &failureWindow{start: now}
		l.entries[addr] = e
	}
	e.count++
}

// reset forgets addr's failures after a successful sign-in. Without it, e2e suites (all from
// 127.0.0.1) that test wrong passwords would lock out the tests that follow.
func (l *failureLimiter) reset(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.entries, addr)
}
