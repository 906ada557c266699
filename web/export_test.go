package web

import "moonji/internal/apikey"

// KeyStore is the replica's API key store, for tests that shorten its cache
// instead of waiting for it.
func (s *Server) KeyStore() *apikey.Store { return s.keys }
