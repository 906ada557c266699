// Package backoff holds the jittered wait and the cancellable sleep that
// the Redis retry loops (internal/lease, internal/redissub) share, so that
// they back off the same way instead of each keeping a copy.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter returns a duration in [d/2, d), so that replicas do not retry in
// lockstep. A d of 1 or less is returned as it is.
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// Sleep waits for d and reports false if ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
