package auth

import (
	"sync"
	"time"
)

// maxTracked bounds how many addresses a limiter remembers. Finished windows
// are swept once per window; addresses beyond the bound, in between, share
// one overflow count, so that a scan from many addresses can neither grow the
// map without end nor escape the limit.
const maxTracked = 100_000

// overflowKey is the shared count of addresses beyond maxTracked. It cannot
// collide with an address.
const overflowKey = "(overflow)"

// windows counts events per address in fixed windows. Its methods expect the
// caller to hold mu.
type windows struct {
	window time.Duration
	max    int

	mu    sync.Mutex
	addrs map[string]*failures
	swept time.Time
}

type failures struct {
	count int
	start time.Time
}

func newWindows(window time.Duration) windows {
	return windows{window: window, max: maxTracked, addrs: map[string]*failures{}}
}

// currentLocked returns addr's count in the window that includes now, nil
// when it has none.
func (w *windows) currentLocked(addr string, now time.Time) *failures {
	f := w.addrs[addr]
	if f == nil && len(w.addrs) >= w.max {
		f = w.addrs[overflowKey]
	}
	if f == nil || now.Sub(f.start) >= w.window {
		return nil
	}
	return f
}

// addLocked counts one event from addr and returns its window.
func (w *windows) addLocked(addr string, now time.Time) *failures {
	w.sweepLocked(now)
	f := w.addrs[addr]
	if f == nil && len(w.addrs) >= w.max {
		addr = overflowKey
		f = w.addrs[addr]
	}
	if f == nil || now.Sub(f.start) >= w.window {
		f = &failures{start: now}
		w.addrs[addr] = f
	}
	f.count++
	return f
}

// sweepLocked forgets finished windows, at most once per window.
func (w *windows) sweepLocked(now time.Time) {
	if now.Sub(w.swept) < w.window {
		return
	}
	w.swept = now
	for a, f := range w.addrs {
		if now.Sub(f.start) >= w.window {
			delete(w.addrs, a)
		}
	}
}

// FailureLimiter counts failed authentications (bad or revoked API keys,
// stale session cookies) per source address in fixed windows, and blocks an
// address that reaches the limit until its window ends. Guessing a 256-bit key
// is hopeless anyway; the limit keeps a misbehaving client from filling the
// logs and loading the database. A block only ever refuses failed
// credentials: the handlers check a credential first, so a valid one from a
// blocked address (behind the same NAT as the culprit) still works. Counts
// are per replica.
type FailureLimiter struct {
	limit int
	windows
}

// NewFailureLimiter allows limit failures per address per window.
func NewFailureLimiter(limit int, window time.Duration) *FailureLimiter {
	return &FailureLimiter{limit: limit, windows: newWindows(window)}
}

// Blocked reports whether addr has used up its failures for the current window.
func (l *FailureLimiter) Blocked(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.currentLocked(addr, now)
	return f != nil && f.count >= l.limit
}

// Fail records a failure from addr and reports whether addr is now blocked.
func (l *FailureLimiter) Fail(addr string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addLocked(addr, now).count >= l.limit
}

// RequestLimiter allows each address a number of requests per window (a
// fixed window: up to limit at once, then nothing until the window ends). It
// limits requests that carry no valid credential, which cost the gateway
// something (a ledger row, a log line) and are answered before any database
// look-up once over the limit. Counts are per replica.
type RequestLimiter struct {
	limit int
	windows
}

// NewRequestLimiter allows limit requests per address per window.
func NewRequestLimiter(limit int, window time.Duration) *RequestLimiter {
	return &RequestLimiter{limit: limit, windows: newWindows(window)}
}

// Allow counts a request from addr. When it is over the limit, ok is false,
// retryAfter says when the window ends, and first is true for the first
// refusal of the window (so the caller logs once per window, not per request).
func (l *RequestLimiter) Allow(addr string, now time.Time) (ok bool, retryAfter time.Duration, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.addLocked(addr, now)
	if f.count <= l.limit {
		return true, 0, false
	}
	return false, f.start.Add(l.window).Sub(now), f.count == l.limit+1
}
