// Package engine is the engine side of the gateway–engine protocol
// (docs/engine-protocol.md): `moonji engine` accepts gateways' WebSockets at
// /engine and runs each session's chat request against the OpenAI-compatible
// upstream of its model, relaying the answer as envelopes — a streamed one
// frame by frame, byte for byte.
//
// One connection carries many sessions. Each session's request runs in a
// goroutine of its own under a context the session owns: session.cancel,
// session.close and the connection's end cancel it, and the upstream sees its
// connection close. Every envelope leaves through the connection's one writer,
// so frames never interleave, and a session whose output the connection
// cannot take is cancelled alone.
package engine

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/enginelink/protocol"
	"moonji/internal/proxy"
)

// Path is where gateways connect.
const Path = "/engine"

// Model is one model the engine serves: the name a session.open names and
// the upstream that runs it.
type Model struct {
	Name string
	// UpstreamModel, when set, replaces the body's model before the request
	// goes upstream.
	UpstreamModel string
	Upstream      proxy.Upstream
	// Timeout bounds one request to the upstream (0: none); past it the
	// session gets chat.error 504.
	Timeout time.Duration
}

// Options configure a Server. Only Models is required.
type Options struct {
	Models []Model
	// Token, when set, must come as `Authorization: Bearer <token>`.
	Token string
	// Client calls the upstreams; nil: proxy.NewClient().
	Client *proxy.Client
	// Logger; nil: slog.Default().
	Logger *slog.Logger
	// SendQueue is how many envelopes a connection's writer holds (default
	// 256).
	SendQueue int
	// SendTimeout is how long a session may wait for room in that queue
	// before it is cancelled (default 10 s): a connection that cannot take
	// one session's output must not hold the others.
	SendTimeout time.Duration
	// WriteTimeout bounds one WebSocket write (default 30 s); a connection
	// that takes no bytes for that long is closed.
	WriteTimeout time.Duration
	// MaxSessions bounds the live sessions of one connection (default
	// 10,000); more are refused with chat.error 503.
	MaxSessions int
	// MaxConns bounds the connections open at once (default
	// DefaultMaxConns); more are refused with 503 before the upgrade.
	MaxConns int
	// PingInterval is the engine's own heartbeat (default 5 s): a gateway
	// that answers no ping for two intervals is gone — its host died, or a
	// NAT forgot the connection — and its connection is closed, freeing its
	// sessions, instead of waiting for TCP to notice.
	PingInterval time.Duration
}

// Server accepts gateways' WebSockets; it is an http.Handler.
type Server struct {
	opts   Options
	models map[string]Model
	client *proxy.Client
	log    *slog.Logger

	mu      sync.Mutex
	closing bool
	conns   map[*conn]struct{}
	// admitted counts the connections given a place (upgraded, or being
	// upgraded), at most MaxConns.
	admitted int
	// running counts the requests running on every connection; idle is
	// closed (and replaced) whenever it falls to zero, for Shutdown.
	running int
	idle    chan struct{}
}

// New returns a Server for the given models.
func New(o Options) *Server {
	if o.SendQueue <= 0 {
		o.SendQueue = 256
	}
	if o.SendTimeout <= 0 {
		o.SendTimeout = 10 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = 10_000
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 5 * time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	s := &Server{opts: o, models: map[string]Model{}, client: o.Client, log: o.Logger,
		conns: map[*conn]struct{}{}, idle: make(chan struct{})}
	if s.client == nil {
		s.client = proxy.NewClient()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	for _, m := range o.Models {
		s.models[m.Name] = m
	}
	return s
}

// ServeHTTP checks the peer (without a token), the token, the offered
// protocol versions and the connection limit, then serves the connection
// until it closes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != Path {
		http.NotFound(w, r)
		return
	}
	if s.opts.Token == "" {
		if refusal := tokenlessRefusal(r); refusal != "" {
			s.log.Warn("engine connection refused: the engine has no token and serves only loopback peers, no browser page",
				"remote", r.RemoteAddr, "browser", r.Header.Get("Origin") != "")
			http.Error(w, refusal, http.StatusForbidden)
			return
		}
	}
	if !s.authorized(r) {
		// Which part was wrong is not said: a prober learns nothing.
		http.Error(w, "This engine needs the right token: send Authorization: Bearer <engine.token>.", http.StatusUnauthorized)
		return
	}
	want := protocol.Subprotocol(protocol.Version)
	offered := offeredSubprotocols(r)
	if !contains(offered, want) {
		w.Header().Set("Sec-WebSocket-Version", "13")
		http.Error(w, fmt.Sprintf("This engine speaks the engine protocol version %d only (WebSocket subprotocol %q); the client offered %s.",
			protocol.Version, want, describeOffer(offered)), http.StatusUpgradeRequired)
		return
	}
	if refusal := s.admit(); refusal != "" {
		http.Error(w, refusal, http.StatusServiceUnavailable)
		return
	}
	defer s.release()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{want}})
	if err != nil {
		// Accept has answered the request itself.
		s.log.Warn("engine connection refused", "remote", r.RemoteAddr, "err", err)
		return
	}
	c := newConn(s, ws, r.RemoteAddr)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = ws.Close(websocket.StatusGoingAway, "engine shutting down")
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	c.serve()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// authorized reports whether the request carries the configured token (any
// request when none is configured: tokenlessRefusal has vetted the peer).
// The comparison takes the same time whatever the token's first wrong byte.
func (s *Server) authorized(r *http.Request) bool {
	if s.opts.Token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.opts.Token)) == 1
}

// offeredSubprotocols lists the client's Sec-WebSocket-Protocol entries.
func offeredSubprotocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// describeOffer words the client's offer for the 426 sentence, bounded: the
// header is the client's, and the answer should stay short.
func describeOffer(offered []string) string {
	if len(offered) == 0 {
		return "no subprotocol"
	}
	if len(offered) > 4 {
		offered = append(offered[:4:4], "…")
	}
	q := make([]string, len(offered))
	for i, p := range offered {
		q[i] = fmt.Sprintf("%.40q", p)
	}
	return strings.Join(q, ", ")
}

// requestStarted and requestEnded count the requests running, for Shutdown.
func (s *Server) requestStarted() {
	s.mu.Lock()
	s.running++
	s.mu.Unlock()
}

func (s *Server) requestEnded() {
	s.mu.Lock()
	s.running--
	if s.running == 0 {
		close(s.idle)
		s.idle = make(chan struct{})
	}
	s.mu.Unlock()
}

// Shutdown sends goaway on every connection and refuses new ones, lets the
// running requests finish until ctx is done, then closes every connection
// (which cancels whatever still runs) and waits for them to end. It
// returns ctx's error when requests had to be cut short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.goAway("engine shutting down")
	}
	var err error
	for {
		s.mu.Lock()
		running, idle := s.running, s.idle
		s.mu.Unlock()
		if running == 0 {
			break
		}
		select {
		case <-idle:
			continue
		case <-ctx.Done():
			err = ctx.Err()
		}
		break
	}
	for _, c := range conns {
		c.closeGracefully(err == nil)
	}
	for _, c := range conns {
		<-c.done
	}
	s.log.Info("engine shut down", "connections", len(conns), "cut_short", err != nil)
	return err
}

// Sessions counts the sessions open on every connection, and the requests
// running for them: what the engine holds for its gateways (both fall to
// zero once every session has ended and its connection forgot it).
func (s *Server) Sessions() (open, running int) {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	running = s.running
	s.mu.Unlock()
	for _, c := range conns {
		c.mu.Lock()
		open += len(c.sessions)
		c.mu.Unlock()
	}
	return open, running
}
