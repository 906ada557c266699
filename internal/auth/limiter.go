package auth

import (
	"sync"
	"time"
)

// FailureLimiter counts failed authentications (bad or revoked API keys,
// stale session cookies) per source address in fixed windows, and blocks an
// address that reaches the limit until its window ends. Guessing a 256-bit key
// is hopeless anyway; the limit keeps a misbehaving client from filling the
// logs and loading the database. Counts are per replica.
type FailureLimiter struct {
	limit  int
	window time.Duration

	mu    sync.Mutex
	addrs map[string]*failures
	swept time.Time
}

type failures struct {
	count int
	start time.Time
}

// NewFailureLimiter allows limit failures per address per window.
func NewFailureLimiter(limit int, window time.Duration) *FailureLimiter {
	return &FailureLimiter{limit: limit, window: window, addrs: map[string]*failures{}}
}

// Blocked reports whether addr has used up its failures for the current window.
func (l *FailureLimiter) Blocked(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.addrs[addr]
	return f != nil && now.Sub(f.start) < l.window && f.count >= l.limit
}

// Fail records a failure from addr and reports whether addr is now blocked.
func (l *FailureLimiter) Fail(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(now)
	f := l.addrs[addr]
	if f == nil || now.Sub(f.start) >= l.window {
		f = &failures{start: now}
		l.addrs[addr] = f
	}
	f.count++
	return f.count >= l.limit
}

// sweepLocked forgets finished windows, at most once per window, so that a
// scan from many addresses cannot grow the map without end.
func (l *FailureLimiter) sweepLocked(now time.Time) {
	if now.Sub(l.swept) < l.window {
		return
	}
	l.swept = now
	for a, f := range l.addrs {
		if now.Sub(f.start) >= l.window {
			delete(l.addrs, a)
		}
	}
}
