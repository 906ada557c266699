package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/engine"
	"moonji/internal/enginelink/protocol"
)

// dialStatus dials the engine and returns the handshake's status (101 when
// it upgraded; the connection is then returned, open) and the refusal's body.
func (e *testEnv) dialStatus(t testing.TB) (*websocket.Conn, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, e.url, &websocket.DialOptions{
		Subprotocols: []string{protocol.Subprotocol(protocol.Version)},
		HTTPClient:   &http.Client{Transport: &http.Transport{}},
	})
	if err == nil {
		t.Cleanup(func() { _ = ws.CloseNow() })
		return ws, http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("dial: %v", err)
	}
	var body bytes.Buffer
	if resp.Body != nil {
		_, _ = body.ReadFrom(resp.Body)
	}
	return nil, resp.StatusCode, body.String()
}

// The reviewer's attack: connections were unlimited. Now the engine
// upgrades at most MaxConns (64 by default) at a time and refuses the next
// with 503 before the upgrade, saying why; a closed connection frees its
// place.
func TestConnectionsAreBounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opt   int
		limit int
	}{
		{"default", 0, engine.DefaultMaxConns},
		{"configured", 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEnv(t, func(o *engine.Options) { o.MaxConns = tc.opt })
			conns := make([]*websocket.Conn, 0, tc.limit)
			for i := range tc.limit {
				ws, status, body := e.dialStatus(t)
				if status != http.StatusSwitchingProtocols {
					t.Fatalf("connection %d of %d refused: %d %q", i+1, tc.limit, status, body)
				}
				conns = append(conns, ws)
			}
			ws, status, body := e.dialStatus(t)
			if status != http.StatusServiceUnavailable || !strings.Contains(body, fmt.Sprint(tc.limit)) {
				if ws != nil {
					ws.CloseNow()
				}
				t.Fatalf("connection %d: %d %q, want 503 naming the limit of %d", tc.limit+1, status, body, tc.limit)
			}
			// The connections let in still work.
			c := &client{t: t, ws: conns[len(conns)-1], in: make(chan protocol.Envelope, 100)}
			go c.readAll()
			c.open("s1", "m1", chatBody("m1", false, map[string]any{"tokens": 1}))
			if a := c.collect([]string{"s1"}, nil)["s1"]; a.response == nil || a.response.Status != http.StatusOK {
				t.Fatalf("a request on an admitted connection: %+v %+v", a.response, a.err)
			}
			// A gateway that leaves frees its place.
			_ = conns[0].Close(websocket.StatusNormalClosure, "")
			eventually(t, "a connection after one closed", func() bool {
				ws, status, _ := e.dialStatus(t)
				if ws != nil {
					ws.CloseNow()
				}
				return status == http.StatusSwitchingProtocols
			})
		})
	}
}

// The reviewer's attack: an envelope of 33 MiB from a connection that has
// opened no session was read whole (and a few copies more). Now, until its
// first session opens, a connection's envelopes are at most 64 KiB: a
// larger one ends the connection with 1009 (message too big) as soon as the
// limit is passed, before the rest of it is sent, and the engine allocates
// next to nothing for it.
func TestOversizedEnvelopeBeforeSessionIsCutOff(t *testing.T) {
	var logs lockedBuffer
	e := startEnv(t, func(o *engine.Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	c := e.dial(t, nil)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	written, err := streamEnvelope(c.ws, protocol.MaxEnvelope)
	if err == nil {
		t.Fatalf("the whole %d-byte envelope was taken before any session", written)
	}
	for range c.in { // until the engine has closed the connection
	}
	runtime.ReadMemStats(&after)

	if written >= protocol.MaxEnvelope {
		t.Fatalf("%d bytes written before the engine closed: it read the whole envelope", written)
	}
	if s := websocket.CloseStatus(c.closeErr); s != -1 && s != websocket.StatusMessageTooBig {
		t.Fatalf("the connection ended with %v, want status 1009 (message too big)", c.closeErr)
	}
	eventually(t, "the engine's log of the cut-off envelope", func() bool {
		return strings.Contains(logs.String(), "an envelope over the limit before its first session")
	})
	// Everything this process allocated meanwhile, the test's own writes
	// included: a fraction of the envelope, not the envelope.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("%d MiB allocated while a %d MiB envelope was refused (%d MiB of it sent)",
			grew>>20, protocol.MaxEnvelope>>20, written>>20)
	}
	t.Logf("%d KiB sent before the engine closed (%v); %d KiB allocated", written>>10, c.closeErr, (after.TotalAlloc-before.TotalAlloc)>>10)
}

// Once a session is open the connection may send envelopes up to
// protocol.MaxEnvelope: a chat body of 1 MiB goes through.
func TestLargeBodyInsideASession(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	// The bulk is a field engines ignore, so that the prompt stays short.
	pad := strings.Repeat("x", 1<<20)
	body := fmt.Sprintf(`{"model":"m1","stream":false,"mock":{"tokens":2},"pad":%q,"messages":[{"role":"user","content":"hi"}]}`, pad)
	c.open("s1", "m1", body)
	a := c.collect([]string{"s1"}, nil)["s1"]
	if a.response == nil || a.response.Status != http.StatusOK {
		t.Fatalf("a 1 MiB body in a session: response %+v, error %+v", a.response, a.err)
	}
}

// Without a token the engine upgrades only loopback peers and no browser
// page (a request with an Origin: DNS rebinding makes a page's origin
// match the Host), so that an engine put on a public address by mistake
// still serves no stranger. With a token, the token decides.
func TestTokenlessEngineServesOnlyLoopback(t *testing.T) {
	open := engine.New(engine.Options{Logger: quietLog(t)})
	guarded := engine.New(engine.Options{Logger: quietLog(t), Token: "s3cret"})
	for _, tc := range []struct {
		srv     *engine.Server
		remote  string
		origin  string
		token   string
		refused bool
	}{
		{open, "10.1.2.3:5000", "", "", true},
		{open, "192.168.1.20:5000", "", "", true},
		{open, "[2001:db8::1]:5000", "", "", true},
		{open, "[::ffff:10.0.0.1]:5000", "", "", true},
		{open, "garbage", "", "", true},
		{open, "127.0.0.1:5000", "http://evil.example:9300", "", true},
		{open, "127.0.0.1:5000", "", "", false},
		{open, "127.9.9.9:5000", "", "", false},
		{open, "[::1]:5000", "", "", false},
		{open, "[::ffff:127.0.0.1]:5000", "", "", false},
		{guarded, "10.1.2.3:5000", "", "s3cret", false},
	} {
		r := httptest.NewRequest(http.MethodGet, engine.Path, nil)
		r.RemoteAddr = tc.remote
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Version", "13")
		r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		r.Header.Set("Sec-WebSocket-Protocol", protocol.Subprotocol(protocol.Version))
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.token != "" {
			r.Header.Set("Authorization", "Bearer "+tc.token)
		}
		w := httptest.NewRecorder()
		tc.srv.ServeHTTP(w, r)
		// A recorder cannot be hijacked: a request let through fails at the
		// upgrade itself, with another status than the refusal's.
		if refused := w.Code == http.StatusForbidden; refused != tc.refused {
			t.Errorf("peer %s origin %q token %q: %d %q, want refused=%v", tc.remote, tc.origin, tc.token, w.Code, w.Body, tc.refused)
		}
		if tc.refused && !strings.Contains(w.Body.String(), "MOONJI_ENGINE_TOKEN") {
			t.Errorf("peer %s: the refusal %q does not say how to allow it", tc.remote, w.Body)
		}
	}
}

// streamEnvelope sends one text message of size bytes, the start of a
// chat.request and then filler, in 64 KiB frames, and returns how many
// bytes were written before a write failed.
func streamEnvelope(ws *websocket.Conn, size int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	w, err := ws.Writer(ctx, websocket.MessageText)
	if err != nil {
		return 0, err
	}
	head := []byte(`{"v":1,"id":"big","type":"chat.request","session":"s1","payload":{"body":"`)
	n, err := w.Write(head)
	if err != nil {
		return n, err
	}
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	for n < size {
		p := chunk[:min(len(chunk), size-n)]
		m, err := w.Write(p)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, w.Close()
}

// eventually waits until cond holds, failing the test after wait.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, wait)
		}
		<-tick.C
	}
}

// lockedBuffer is a log destination the engine's goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
