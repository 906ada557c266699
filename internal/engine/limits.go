package engine

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
)

// What a stranger can make the engine hold is bounded:
//
//   - at most Options.MaxConns connections at once (DefaultMaxConns); the
//     next upgrade is refused with 503 before anything is allocated for it;
//   - until a connection has opened its first session it may send
//     envelopes of at most MaxEnvelopeBeforeSession bytes, a limit
//     coder/websocket enforces while it reads: past it the connection is
//     closed with 1009 (message too big) and the rest is never read;
//   - a connection reads one envelope at a time.
//
// So connections without a session hold at most MaxConns ×
// MaxEnvelopeBeforeSession (4 MiB by default) of envelopes being read.
// A connection with a session reads envelopes up to protocol.MaxEnvelope,
// held about three times over while decoded (the bytes read, the payload,
// the body string: 85–130 MB of RSS for a 33 MiB one, measured), so at
// most MaxConns of those at once. A token keeps that to gateways, which bound their
// bodies themselves (max_body_bytes); without one, only loopback peers are
// served.
const (
	// DefaultMaxConns is Options.MaxConns's default: a connection per
	// gateway replica per engine backend, with room to spare.
	DefaultMaxConns = 64
	// MaxEnvelopeBeforeSession bounds an envelope from a connection that has
	// opened no session yet: a gateway's session.open (ids and a model name
	// of at most 1,024 characters) is a few hundred bytes, and the rest
	// leaves room for settings, which no gateway sends yet.
	MaxEnvelopeBeforeSession = 64 << 10
)

// admit reserves one of MaxConns places for a connection about to be
// upgraded, or says why it cannot have one; release gives the place back.
func (s *Server) admit() (refusal string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closing:
		return "This engine is shutting down; connect to another or retry later."
	case s.admitted >= s.opts.MaxConns:
		return fmt.Sprintf("This engine already serves %d connections, its limit; retry later.", s.opts.MaxConns)
	}
	s.admitted++
	return ""
}

func (s *Server) release() {
	s.mu.Lock()
	s.admitted--
	s.mu.Unlock()
}

// tokenlessRefusal says why an engine without a token refuses r, or ""
// when it may serve it: only a loopback peer, and no browser page (a page's
// WebSocket always carries an Origin, and DNS rebinding can make that
// origin match the Host), so that an engine bound to a public address by
// mistake still serves no stranger.
func tokenlessRefusal(r *http.Request) string {
	if !loopbackPeer(r.RemoteAddr) {
		return "This engine has no token and serves loopback peers only; set engine.token (or MOONJI_ENGINE_TOKEN) on the engine and the same token as the gateway's backend api_key."
	}
	if r.Header.Get("Origin") != "" {
		return "This engine has no token and serves no browser page; set engine.token (or MOONJI_ENGINE_TOKEN) on the engine and the same token as the gateway's backend api_key."
	}
	return ""
}

// loopbackPeer reports whether a request's RemoteAddr is a loopback
// address (IPv4, IPv6, or IPv4 mapped into IPv6).
func loopbackPeer(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
