package enginelink

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/enginelink/protocol"
)

// wait is the deadline of every condition a test waits for: generous, so
// that a loaded machine never fails a test that would pass.
const wait = 10 * time.Second

// fakeEngine is a small engine side of the protocol: it accepts the
// gateway's WebSocket, records every envelope it receives, and answers each
// chat.request as its body says (see answer).
type fakeEngine struct {
	t   *testing.T
	srv *httptest.Server

	token        string   // required Bearer token, when set
	subprotocols []string // what it accepts (default: v1)
	down         atomic.Bool
	silentFirst  bool         // the first connection never reads (no pongs)
	silentSince  atomic.Int64 // when that connection was accepted, in Unix nanoseconds

	got   chan protocol.Envelope
	quit  chan struct{}
	conns atomic.Int64

	mu   sync.Mutex
	live []*fakeConn
	// onRequest, when set, replaces answer.
	onRequest func(fc *fakeConn, env protocol.Envelope, b fakeBody)
}

type fakeConn struct {
	e   *fakeEngine
	ws  *websocket.Conn
	seq atomic.Int64
}

// fakeBody is what a test's chat body tells the fake engine to do.
type fakeBody struct {
	Marker string `json:"marker"`
	Stream bool   `json:"stream"`
	Chunks int    `json:"chunks"`
	Hold   bool   `json:"hold"`   // no chat.done: the stream stays open
	Status int    `json:"status"` // of a whole answer
	Fail   string `json:"fail"`   // "first": chat.error before any response; "mid": after a chunk; "gap": seq skips
}

func newFakeEngine(t *testing.T) *fakeEngine {
	e := &fakeEngine{t: t, got: make(chan protocol.Envelope, 100000), quit: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serveHTTP))
	t.Cleanup(e.close)
	return e
}

func (e *fakeEngine) url() string { return "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/engine" }

func (e *fakeEngine) close() {
	select {
	case <-e.quit:
		return
	default:
	}
	close(e.quit)
	e.kill()
	e.srv.Close()
}

// kill closes every live connection abruptly.
func (e *fakeEngine) kill() {
	e.mu.Lock()
	live := e.live
	e.live = nil
	e.mu.Unlock()
	for _, fc := range live {
		fc.ws.CloseNow()
	}
}

func (e *fakeEngine) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if e.down.Load() {
		http.Error(w, "engine restarting", http.StatusServiceUnavailable)
		return
	}
	if e.token != "" && r.Header.Get("Authorization") != "Bearer "+e.token {
		http.Error(w, "missing or wrong engine token", http.StatusUnauthorized)
		return
	}
	subs := e.subprotocols
	if subs == nil {
		subs = []string{protocol.Subprotocol(protocol.Version)}
	}
	if len(subs) > 0 && !strings.Contains(r.Header.Get("Sec-WebSocket-Protocol"), subs[0]) {
		http.Error(w, "this engine speaks "+subs[0], http.StatusUpgradeRequired)
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: subs})
	if err != nil {
		return
	}
	ws.SetReadLimit(protocol.MaxEnvelope)
	fc := &fakeConn{e: e, ws: ws}
	e.mu.Lock()
	e.live = append(e.live, fc)
	e.mu.Unlock()
	n := e.conns.Add(1)
	if e.silentFirst && n == 1 {
		e.silentSince.Store(time.Now().UnixNano())
		<-e.quit // never reads: pings go unanswered
		ws.CloseNow()
		return
	}
	for {
		_, data, err := ws.Read(context.Background())
		if err != nil {
			return
		}
		env, err := protocol.Decode(data)
		if err != nil {
			e.t.Errorf("the gateway sent an invalid envelope %.200q: %v", data, err)
			continue
		}
		e.got <- env
		if env.Type != protocol.TypeChatRequest {
			continue
		}
		p, _ := protocol.Payload[protocol.ChatRequest](env)
		var b fakeBody
		if err := json.Unmarshal([]byte(p.Body), &b); err != nil {
			e.t.Errorf("chat body %q: %v", p.Body, err)
			continue
		}
		if e.onRequest != nil {
			e.onRequest(fc, env, b)
			continue
		}
		fc.answer(env.Session, b)
	}
}

// frame is the fake engine's n-th SSE frame for marker.
func frame(marker string, n int) string {
	return fmt.Sprintf("data: {\"marker\":%q,\"n\":%d}\n\n", marker, n)
}

func (fc *fakeConn) answer(session string, b fakeBody) {
	switch {
	case b.Fail == "first":
		fc.send(protocol.TypeChatError, session, protocol.ChatError{Status: 503, Code: "overloaded", Message: "engine busy"})
		return
	case !b.Stream:
		body := fmt.Sprintf(`{"marker":%q,"text":"<b>&é \u00e9"}`, b.Marker)
		fc.send(protocol.TypeChatResponse, session, protocol.ChatResponse{Status: b.Status, ContentType: "application/json", Body: body})
		return
	}
	fc.send(protocol.TypeChatResponse, session, protocol.ChatResponse{Status: 200, ContentType: "text/event-stream", Stream: true})
	for i := 1; i <= b.Chunks; i++ {
		seq := int64(i)
		if b.Fail == "gap" && i > 1 {
			seq++
		}
		fc.send(protocol.TypeChatChunk, session, protocol.ChatChunk{Seq: seq, Frame: frame(b.Marker, i)})
	}
	switch {
	case b.Fail == "mid":
		fc.send(protocol.TypeChatError, session, protocol.ChatError{Status: 500, Code: "upstream", Message: "engine crashed mid-answer"})
	case !b.Hold:
		fc.send(protocol.TypeChatDone, session, protocol.ChatDone{FinishReason: "stop", Usage: &protocol.Usage{PromptTokens: 3, CompletionTokens: b.Chunks}})
	}
}

func (fc *fakeConn) send(typ, session string, payload any) {
	env, err := protocol.New(fmt.Sprintf("e-%d", fc.seq.Add(1)), typ, session, payload)
	if err != nil {
		panic(err)
	}
	data, err := protocol.Encode(env)
	if err != nil {
		panic(err)
	}
	fc.sendRaw(data)
}

func (fc *fakeConn) sendRaw(data []byte) {
	_ = fc.ws.Write(context.Background(), websocket.MessageText, data) // a killed connection: the test sees it elsewhere
}

// expect waits for an envelope of typ for session (any session when "").
func (e *fakeEngine) expect(t *testing.T, typ, session string) protocol.Envelope {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case env := <-e.got:
			if env.Type == typ && (session == "" || env.Session == session) {
				return env
			}
		case <-deadline:
			t.Fatalf("the fake engine never received %s for session %q", typ, session)
		}
	}
}

// logBuffer collects a link's logs for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (lb *logBuffer) Write(p []byte) (int, error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.b.Write(p)
}

func (lb *logBuffer) String() string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.b.String()
}

// newLink starts a link to e with opts' other fields, and closes it at the
// test's end after checking that no session is left in the router.
func newLink(t *testing.T, e *fakeEngine, opts Options) (*Link, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	opts.Name = "fake"
	opts.URL = e.url()
	opts.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := New(opts)
	l.Start()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("link logs:\n%s", logs.String())
		}
		l.Close()
	})
	return l, logs
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitConnected(t *testing.T, l *Link) {
	t.Helper()
	eventually(t, "the link to connect", func() bool { return l.Stats().Connected == 1 })
}

// routerEmpty checks that every session was unregistered.
func routerEmpty(t *testing.T, l *Link) {
	t.Helper()
	eventually(t, "the router to be empty", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.sessions) == 0 && len(l.queue) == 0 && l.Stats().SessionsOpen == 0
	})
}

func body(b fakeBody) []byte {
	data, err := json.Marshal(b)
	if err != nil {
		panic(err)
	}
	return data
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
