package web_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/engine"
	"moonji/internal/mockllm"
	"moonji/internal/proxy"
	"moonji/models"
)

// engineEnv is a gateway whose model m1 is served by an `engine` backend: a
// real engine.Server (what `moonji engine` runs) over loopback, itself in
// front of the mock engine.
type engineEnv struct {
	*testEnv
	conns *trackedListener // the engine's connections, to cut them
}

// trackedListener remembers the connections it accepts, so that a test can
// cut them: a WebSocket is hijacked, and http.Server forgets hijacked
// connections (CloseClientConnections does not reach them).
type trackedListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// cut closes every connection accepted so far, as a crashed engine would.
func (l *trackedListener) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

func startEngineEnv(t *testing.T) *engineEnv {
	t.Helper()
	return startEngineEnvWith(t, 8)
}

// startEngineEnvWith is startEngineEnv with the engine backend's
// max_concurrency.
func startEngineEnvWith(t *testing.T, maxConcurrency int) *engineEnv {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, ReplayDir: fixtures, Logger: quiet})
	ms := httptest.NewServer(mock)
	t.Cleanup(ms.Close)
	eng := engine.New(engine.Options{Token: "engine-secret", Logger: quiet,
		Models: []engine.Model{{Name: "m1", Upstream: proxy.Upstream{Name: "mock", BaseURL: ms.URL + "/v1"}}}})
	es := httptest.NewUnstartedServer(eng)
	tl := &trackedListener{Listener: es.Listener}
	es.Listener = tl
	es.Start()
	t.Cleanup(es.Close)
	cfg := &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/moonji.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends: []config.Backend{{Name: "e1", Kind: config.KindEngine, URL: "ws" + strings.TrimPrefix(es.URL, "http") + engine.Path,
			APIKey: "engine-secret", MaxConcurrency: maxConcurrency, MaxQueue: 8, QueueTimeout: 5 * time.Second,
			Link: config.Link{PingInterval: time.Second}}},
		Models: []config.Model{{Name: "m1", Backend: "e1"}},
	}
	return &engineEnv{testEnv: startWithConfig(t, cfg, mock, ms.URL), conns: tl}
}

// Through an engine backend a stream reaches the client byte for byte as
// the engine's upstream wrote it, with the usage the client asked for, and
// leaves one exact row — as through an openai backend.
func TestEngineBackendRelaysExactly(t *testing.T) {
	e := startEngineEnv(t)
	for _, c := range []struct {
		name, body, want string
	}{
		{"stream with usage", `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Once upon a time"}],"mock":{"replay":"chat_stream.sse"}}`,
			mustFixture(t, "chat_stream.sse")},
		{"stream without usage", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"Once upon a time"}],"mock":{"replay":"chat_stream.sse"}}`,
			strings.Replace(mustFixture(t, "chat_stream.sse"), usageFrame(mustFixture(t, "chat_stream.sse")), "", 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := e.post(c.body)
			got := readAll(t, resp.Body)
			if resp.StatusCode != http.StatusOK || got != c.want {
				t.Fatalf("status %d; relay differs from the recording (%d vs %d bytes)\n got: %q\nwant: %q", resp.StatusCode, len(got), len(c.want), tail(got), tail(c.want))
			}
			row := e.final(resp.Header.Get("X-Inference-Id"))
			if row.Outcome != models.OutcomeSuccess || row.UsageSource != models.UsageFromEngine || row.CompletionTokens != 64 || row.Backend != "e1" {
				t.Errorf("row = %+v", row)
			}
		})
	}
	t.Run("whole answer", func(t *testing.T) {
		resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"hi"}],"mock":{"tokens":7}}`)
		body := readAll(t, resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"completion_tokens":7`) {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if row := e.final(resp.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeSuccess || row.CompletionTokens != 7 {
			t.Errorf("row = %+v", row)
		}
	})
	t.Run("engine's error answer", func(t *testing.T) {
		resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"hi"}],"mock":{"fail_status":503}}`)
		body := readAll(t, resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"error"`) {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if row := e.final(resp.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeError || row.Status != 503 {
			t.Errorf("row = %+v", row)
		}
	})
}

// A Stop reaches the engine's upstream (the mock sees its request
// cancelled), the client gets a complete stream, and the row says stopped.
func TestEngineBackendStop(t *testing.T) {
	e := startEngineEnv(t)
	resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tag":"stopme","tps":20,"tokens":400}}`)
	id := resp.Header.Get("X-Inference-Id")
	if _, err := e.Mock.WaitFor(ctxTimeout(t, 10*time.Second), "stopme", func(r mockllm.Record) bool { return r.ChunksSent >= 3 }); err != nil {
		t.Fatal(err)
	}
	if a := cancelVia(t, e.testEnv, e.Key, id); a.status != http.StatusOK {
		t.Fatalf("stop: %d %v", a.status, a.body)
	}
	body := readAll(t, resp.Body)
	if !strings.HasSuffix(body, "data: [DONE]\n\n") || !strings.Contains(body, `"finish_reason":"stop"`) {
		t.Fatalf("the stopped stream does not end cleanly: %q", tail(body))
	}
	if _, err := e.Mock.WaitFor(ctxTimeout(t, 10*time.Second), "stopme", func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
		t.Fatalf("the engine's upstream request was not cancelled: %v", err)
	}
	if row := e.final(id); row.Outcome != models.OutcomeStopped {
		t.Errorf("row = %+v", row)
	}
}

// The engine going away mid-stream fails the request as engine_disconnected
// and frees its slot; the link comes back by itself when the engine does.
func TestEngineBackendLost(t *testing.T) {
	e := startEngineEnv(t)
	resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tag":"lost","tps":20,"tokens":400}}`)
	id := resp.Header.Get("X-Inference-Id")
	if _, err := e.Mock.WaitFor(ctxTimeout(t, 10*time.Second), "lost", func(r mockllm.Record) bool { return r.ChunksSent >= 2 }); err != nil {
		t.Fatal(err)
	}
	e.conns.cut() // the engine's side of the WebSocket drops
	body := readAll(t, resp.Body)
	if !strings.Contains(body, "engine_disconnected") {
		t.Errorf("the client was not told: %q", tail(body))
	}
	row := e.final(id)
	if row.Outcome != models.OutcomeError || row.Reason != "engine_disconnected" {
		t.Errorf("row = %+v", row)
	}
	waitFor(t, "the slot to be free", 10*time.Second, func() bool {
		for _, b := range e.srv.Gateway.Backends() {
			if b.Name == "e1" {
				return b.InFlight == 0 && b.Queued == 0
			}
		}
		return false
	})
	// The link redials; the next request is served.
	next := e.postWith(context.Background(), e.Key, `{"model":"m1","messages":[{"role":"user","content":"again"}],"mock":{"tokens":3}}`)
	if got := readAll(t, next.Body); next.StatusCode != http.StatusOK {
		t.Fatalf("after the engine came back: %d %s", next.StatusCode, got)
	}
	// The metrics say it: connected again, after one reconnect.
	resp, err := http.Get(e.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics := readAll(t, resp.Body)
	for _, want := range []string{`moonji_engine_connected{backend="e1"} 1`, `moonji_engine_reconnects_total{backend="e1"} 1`,
		`moonji_engine_messages_dropped_total{backend="e1",reason="unknown_session"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// 200 streams at once, with distinct prompts, share the replica's one
// connection to the engine: each client gets its own answer and nothing of
// another's, and each leaves its own row.
func TestEngineBackendManySessionsOneConnection(t *testing.T) {
	e := startEngineEnvWith(t, 256)
	const n = 200
	type result struct {
		i        int
		id, body string
		status   int
	}
	results := make(chan result, n)
	for i := range n {
		go func() {
			body := fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"%smarker-%03d says hello"}],"mock":{"tps":200}}`, mockllm.EchoPrefix, i)
			resp := e.postWith(context.Background(), e.Key, body)
			results <- result{i: i, id: resp.Header.Get("X-Inference-Id"), body: readAll(t, resp.Body), status: resp.StatusCode}
		}()
	}
	for range n {
		r := <-results
		want := fmt.Sprintf("marker-%03d says hello", r.i)
		if text := sseContent(r.body); r.status != http.StatusOK || text != want {
			t.Fatalf("session %d: status %d, text %q, want %q", r.i, r.status, text, want)
		}
		if row := e.final(r.id); row.Outcome != models.OutcomeSuccess || row.Backend != "e1" {
			t.Errorf("session %d: row %+v", r.i, row)
		}
	}
	resp, err := http.Get(e.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	// One connection throughout, and nothing lost. (A chat.done that
	// arrives after the relay has read [DONE] and closed the body finds its
	// session gone: dropped as unknown_session, as a late reply must be.)
	m := readAll(t, resp.Body)
	for _, want := range []string{`moonji_engine_reconnects_total{backend="e1"} 0`,
		`moonji_engine_messages_dropped_total{backend="e1",reason="expired"} 0`,
		`moonji_engine_messages_dropped_total{backend="e1",reason="slow_reader"} 0`,
		`moonji_engine_messages_dropped_total{backend="e1",reason="invalid"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// sseContent is the content a chat stream's chunks add up to.
func sseContent(sse string) string {
	var b strings.Builder
	for _, frame := range strings.Split(sse, "\n\n") {
		data, ok := strings.CutPrefix(frame, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		b.WriteString(gjson.Get(data, "choices.0.delta.content").Str)
	}
	return b.String()
}
