package web

import (
	"time"

	"moonji/internal/apikey"
)

// KeyStore is the replica's API key store, for tests that shorten its cache
// instead of waiting for it.
func (s *Server) KeyStore() *apikey.Store { return s.keys }

// SetRetentionDelay makes servers started from now on run retention first
// after d instead of a minute; the returned func restores it. Not for
// parallel tests.
func SetRetentionDelay(d time.Duration) (restore func()) {
	old := retentionDelay
	retentionDelay = d
	return func() { retentionDelay = old }
}
