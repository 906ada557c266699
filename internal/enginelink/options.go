package enginelink

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/coder/websocket"
)

// Options configure a Link. Zero values take the defaults.
type Options struct {
	// Name is the backend's name, in logs and errors.
	Name string
	// URL is the engine's WebSocket endpoint, e.g. ws://127.0.0.1:9300/engine.
	URL string
	// Token, when set, is sent as `Authorization: Bearer <token>`.
	Token string
	// QueueSize bounds the requests waiting while the engine is not
	// connected (default 256).
	QueueSize int
	// MessageTTL is how long a request may wait in that queue (default 10 s).
	MessageTTL time.Duration
	// PingInterval is the heartbeat's period; a peer silent for two of them
	// is closed and redialled (default 5 s).
	PingInterval time.Duration
	// SessionFrames and SessionBytes bound the replies buffered for one
	// session whose reader has not taken them yet (default 256 frames,
	// 4 MiB): past either, that session alone fails.
	SessionFrames int
	SessionBytes  int
	// Log receives the link's logs (default slog.Default()).
	Log *slog.Logger
	// Dial opens the WebSocket (default websocket.Dial); tests replace it.
	Dial func(ctx context.Context, url string, opts *websocket.DialOptions) (*websocket.Conn, *http.Response, error)
}

// Back-off between dials: doubling from minBackoff to maxBackoff, ±20 %.
const (
	minBackoff  = 100 * time.Millisecond
	maxBackoff  = 10 * time.Second
	dialTimeout = 10 * time.Second
	// stableAfter is how long a connection must have lived for the next
	// dial to start from minBackoff again: an engine that accepts and drops
	// at once must not be redialled ten times a second.
	stableAfter = time.Second
)

func (o Options) withDefaults() Options {
	if o.QueueSize <= 0 {
		o.QueueSize = 256
	}
	if o.MessageTTL <= 0 {
		o.MessageTTL = 10 * time.Second
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 5 * time.Second
	}
	if o.SessionFrames <= 0 {
		o.SessionFrames = 256
	}
	if o.SessionBytes <= 0 {
		o.SessionBytes = 4 << 20
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Dial == nil {
		o.Dial = websocket.Dial
	}
	return o
}
