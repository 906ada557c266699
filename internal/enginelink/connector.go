package enginelink

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/enginelink/protocol"
)

// connect is the connector: it dials, serves the connection until it ends,
// and waits on its one reconnect timer before the next dial, with
// exponential back-off and jitter. It returns at Close.
func (l *Link) connect() {
	defer l.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	delay := minBackoff
	connections := 0
	for {
		ws, err := l.dial()
		if err == nil {
			if connections > 0 {
				l.stats.reconnects.Add(1)
			}
			connections++
			began := time.Now()
			l.serve(ws)
			if time.Since(began) >= stableAfter {
				delay = minBackoff
			}
		} else {
			l.mu.Lock()
			l.lastErr = err
			l.mu.Unlock()
		}
		if l.ctx.Err() != nil {
			return
		}
		timer.Reset(jitter(delay))
		select {
		case <-timer.C:
		case <-l.ctx.Done():
			return
		}
		delay = min(delay*2, maxBackoff)
	}
}

// jitter spreads d by ±20 %, so that replicas do not redial in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// dial opens the WebSocket, offering this side's protocol version, and
// refuses a connection on any other subprotocol.
func (l *Link) dial() (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(l.ctx, dialTimeout)
	defer cancel()
	want := protocol.Subprotocol(protocol.Version)
	hdr := http.Header{}
	if l.opts.Token != "" {
		hdr.Set("Authorization", "Bearer "+l.opts.Token)
	}
	ws, resp, err := l.opts.Dial(ctx, l.opts.URL, &websocket.DialOptions{Subprotocols: []string{want}, HTTPHeader: hdr})
	if err != nil {
		if l.ctx.Err() != nil {
			return nil, ErrClosed
		}
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			// The engine says why in a sentence (401: the token; 426: the
			// versions it speaks): that sentence is what an operator needs.
			refusal := readRefusal(resp)
			l.log.Error("engine refused the connection", "url", l.opts.URL, "status", resp.StatusCode, "refusal", refusal)
			return nil, fmt.Errorf("engine %s refused the connection: %d %s", l.opts.Name, resp.StatusCode, refusal)
		}
		l.log.Warn("engine not reachable", "url", l.opts.URL, "err", err)
		return nil, fmt.Errorf("dial engine %s: %w", l.opts.Name, err)
	}
	if got := ws.Subprotocol(); got != want {
		ws.Close(websocket.StatusProtocolError, "subprotocol "+want+" required")
		l.log.Error("engine accepted another protocol: connection refused", "url", l.opts.URL, "subprotocol", got, "want", want)
		return nil, fmt.Errorf("engine %s accepted subprotocol %q, not %q", l.opts.Name, got, want)
	}
	// The largest envelope the protocol allows: a whole answer's body.
	ws.SetReadLimit(protocol.MaxEnvelope)
	l.log.Info("engine connected", "url", l.opts.URL)
	return ws, nil
}

// readRefusal reads the start of a refused upgrade's body (websocket.Dial
// keeps at most 1 KiB of it).
func readRefusal(resp *http.Response) string {
	if resp.Body == nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	return strings.TrimSpace(string(b))
}
