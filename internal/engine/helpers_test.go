package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/engine"
	"moonji/internal/enginelink/protocol"
	"moonji/internal/mockllm"
	"moonji/internal/proxy"
)

// fixtures are Ollama's recorded answers, which mockllm replays byte for
// byte: a deterministic stream to compare against.
const fixtures = "../../testdata/ollama-0.17.4"

// wait bounds every wait of these tests: generous, for a loaded machine.
const wait = 15 * time.Second

type testEnv struct {
	mock    *mockllm.Server
	mockURL string
	srv     *engine.Server
	url     string // ws://…/engine
	httpURL string
}

func quietLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(&testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t testing.TB }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// startEnv starts mockllm as the upstream and an engine in front of it:
// model m1 (mockllm's own name), renamed (sent upstream as upstream-name),
// down (nothing listens there) and slow (a 300 ms timeout).
func startEnv(t *testing.T, opts ...func(*engine.Options)) *testEnv {
	t.Helper()
	mock := mockllm.New(mockllm.Options{Models: []string{"m1", "upstream-name"}, ReplayDir: fixtures,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ms := httptest.NewServer(mock)
	t.Cleanup(ms.Close)
	up := proxy.Upstream{Name: "mock", BaseURL: ms.URL + "/v1"}
	o := engine.Options{
		Models: []engine.Model{
			{Name: "m1", Upstream: up},
			{Name: "renamed", UpstreamModel: "upstream-name", Upstream: up},
			{Name: "down", Upstream: proxy.Upstream{Name: "down", BaseURL: "http://127.0.0.1:1/v1"}},
			{Name: "slow", Upstream: up, Timeout: 300 * time.Millisecond},
		},
		Logger: quietLog(t),
	}
	for _, f := range opts {
		f(&o)
	}
	srv := engine.New(o)
	es := httptest.NewServer(srv)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		es.Close()
	})
	return &testEnv{mock: mock, mockURL: ms.URL, srv: srv, httpURL: es.URL,
		url: "ws" + strings.TrimPrefix(es.URL, "http") + engine.Path}
}

// client is a gateway's end of one connection, as a test drives it.
type client struct {
	t   testing.TB
	ws  *websocket.Conn
	ids atomic.Int64
	in  chan protocol.Envelope
	// closeErr is why the connection ended; set before in is closed.
	closeErr error
}

// dial connects with the current protocol version offered.
func (e *testEnv) dial(t testing.TB, header http.Header) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, e.url, &websocket.DialOptions{
		Subprotocols: []string{protocol.Subprotocol(protocol.Version)},
		HTTPHeader:   header,
		// A transport of its own: no idle connection outlives the test.
		HTTPClient: &http.Client{Transport: &http.Transport{}},
	})
	if err != nil {
		t.Fatalf("dial %s: %v", e.url, err)
	}
	if got := ws.Subprotocol(); got != protocol.Subprotocol(protocol.Version) {
		t.Fatalf("negotiated subprotocol %q", got)
	}
	ws.SetReadLimit(protocol.MaxEnvelope)
	c := &client{t: t, ws: ws, in: make(chan protocol.Envelope, 100_000)}
	go c.readAll()
	t.Cleanup(func() { _ = ws.CloseNow() })
	return c
}

// readAll decodes what the engine sends: every message must be a valid
// envelope of the protocol.
func (c *client) readAll() {
	defer close(c.in)
	for {
		typ, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.closeErr = err
			return
		}
		if typ != websocket.MessageText {
			c.t.Errorf("the engine sent a binary message")
			continue
		}
		env, err := protocol.Decode(data)
		if err != nil {
			c.t.Errorf("the engine sent an invalid envelope %.200q: %v", data, err)
			continue
		}
		c.in <- env
	}
}

// send sends an envelope and returns its id.
func (c *client) send(typ, session string, payload any) string {
	c.t.Helper()
	id := "g-" + strconv.FormatInt(c.ids.Add(1), 10)
	env, err := protocol.New(id, typ, session, payload)
	if err != nil {
		c.t.Fatal(err)
	}
	data, err := protocol.Encode(env)
	if err != nil {
		c.t.Fatal(err)
	}
	c.raw(websocket.MessageText, data)
	return id
}

func (c *client) raw(typ websocket.MessageType, data []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := c.ws.Write(ctx, typ, data); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// open opens a session of model and sends its chat body.
func (c *client) open(session, model, body string) {
	c.t.Helper()
	c.send(protocol.TypeSessionOpen, session, protocol.SessionOpen{Model: model, Settings: map[string]string{"k": "v"}})
	c.send(protocol.TypeChatRequest, session, protocol.ChatRequest{Body: body})
}

// next returns the next envelope, failing the test after wait.
func (c *client) next() protocol.Envelope {
	c.t.Helper()
	select {
	case env, ok := <-c.in:
		if !ok {
			c.t.Fatal("the connection closed while an envelope was awaited")
		}
		return env
	case <-time.After(wait):
		c.t.Fatal("no envelope within the deadline")
	}
	return protocol.Envelope{}
}

// answer is what a session received, in order.
type answer struct {
	response *protocol.ChatResponse
	chunks   []protocol.ChatChunk
	done     *protocol.ChatDone
	err      *protocol.ChatError
	after    int // envelopes for the session after its end (must stay 0)
}

func (a *answer) ended() bool {
	return a.done != nil || a.err != nil || (a.response != nil && !a.response.Stream)
}

// collect reads until every named session's answer has ended, and returns
// the answers; `error` envelopes and those of other sessions go to other.
func (c *client) collect(sessions []string, other func(protocol.Envelope)) map[string]*answer {
	c.t.Helper()
	out := map[string]*answer{}
	for _, s := range sessions {
		out[s] = &answer{}
	}
	open := len(sessions)
	for open > 0 {
		env := c.next()
		a, ok := out[env.Session]
		if !ok || env.Type == protocol.TypeError {
			if other == nil {
				c.t.Fatalf("unexpected envelope %s for %q", env.Type, env.Session)
			}
			other(env)
			continue
		}
		if a.ended() {
			a.after++
			continue
		}
		switch env.Type {
		case protocol.TypeChatResponse:
			p := must(protocol.Payload[protocol.ChatResponse](env))
			a.response = &p
		case protocol.TypeChatChunk:
			a.chunks = append(a.chunks, must(protocol.Payload[protocol.ChatChunk](env)))
		case protocol.TypeChatDone:
			p := must(protocol.Payload[protocol.ChatDone](env))
			a.done = &p
		case protocol.TypeChatError:
			p := must(protocol.Payload[protocol.ChatError](env))
			a.err = &p
		default:
			c.t.Fatalf("session %s got a %s", env.Session, env.Type)
		}
		if a.ended() {
			open--
		}
	}
	return out
}

// frames joins a streamed answer's frames, checking seq counts from 1.
func (a *answer) frames(t testing.TB) []byte {
	t.Helper()
	var b bytes.Buffer
	for i, ch := range a.chunks {
		if ch.Seq != int64(i+1) {
			t.Fatalf("chunk %d has seq %d", i+1, ch.Seq)
		}
		b.WriteString(ch.Frame)
	}
	return b.Bytes()
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// direct calls mockllm without the engine: what the engine must relay.
func (e *testEnv) direct(t testing.TB, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(e.mockURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// chatBody is a chat body with the given mock knobs.
func chatBody(model string, stream bool, mock map[string]any) string {
	b := map[string]any{"model": model, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": "Tell me a story."}}}
	if stream {
		b["stream_options"] = map[string]bool{"include_usage": true}
	}
	if mock != nil {
		b["mock"] = mock
	}
	return string(must(json.Marshal(b)))
}
