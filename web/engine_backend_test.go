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
	engine *engineProc
}

// engineProc is a `moonji engine` that a test can kill and start again on
// the same address, as a crashed and restarted process would be.
type engineProc struct {
	t        testing.TB
	addr     string // fixed after the first start
	upstream string // the mock engine's /v1 URL
	srv      *http.Server
	conns    *trackedListener
}

// trackedListener remembers the connections it accepts, so that a test can
// cut them: a WebSocket is hijacked, and http.Server forgets hijacked
// connections (Close does not reach them).
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

// startEngineProc starts an engine serving m1 from upstream.
func startEngineProc(t testing.TB, upstream string) *engineProc {
	t.Helper()
	p := &engineProc{t: t, addr: "127.0.0.1:0", upstream: upstream}
	p.start()
	t.Cleanup(p.kill)
	return p
}

// start listens on the engine's address (a fresh one the first time) and
// serves a new engine.Server: nothing of the previous one survives.
func (p *engineProc) start() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("engine listen: %v", err)
	}
	p.addr = ln.Addr().String()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.New(engine.Options{Token: "engine-secret", Logger: quiet, PingInterval: time.Second,
		Models: []engine.Model{{Name: "m1", Upstream: proxy.Upstream{Name: "mock", BaseURL: p.upstream}}}})
	p.conns = &trackedListener{Listener: ln}
	p.srv = &http.Server{Handler: eng}
	go p.srv.Serve(p.conns)
}

// kill stops the engine at once: no goaway, its connections cut.
func (p *engineProc) kill() {
	if p.srv == nil {
		return
	}
	p.srv.Close()
	p.conns.cut()
	p.srv = nil
}

// url is the engine's WebSocket URL.
func (p *engineProc) url() string { return "ws://" + p.addr + engine.Path }

func startEngineEnv(t *testing.T) *engineEnv {
	t.Helper()
	return startEngineEnvWith(t, 8)
}

// startEngineEnvWith is startEngineEnv with the engine backend's
// max_concurrency.
func startEngineEnvWith(t *testing.T, maxConcurrency int, opts ...envOption) *engineEnv {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, ReplayDir: fixtures, Logger: quiet})
	ms := httptest.NewServer(mock)
	t.Cleanup(ms.Close)
	p := startEngineProc(t, ms.URL+"/v1")
	cfg := &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/moonji.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends: []config.Backend{{Name: "e1", Kind: config.KindEngine, URL: p.url(),
			APIKey: "engine-secret", MaxConcurrency: maxConcurrency, MaxQueue: 8, QueueTimeout: 5 * time.Second,
			Link: config.Link{PingInterval: time.Second}}},
		Models: []config.Model{{Name: "m1", Backend: "e1"}},
	}
	for _, o := range opts {
		o(cfg)
	}
	return &engineEnv{testEnv: startWithConfig(t, cfg, mock, ms.URL), engine: p}
}

// withEngineBackend turns a configuration's first backend (an openai one
// in front of the mock) into an engine backend: one engine, started at the
// first call, in front of the same mock, shared by every replica that uses
// the option.
func withEngineBackend(t *testing.T) envOption {
	var p *engineProc
	return func(cfg *config.Config) {
		b := &cfg.Backends[0]
		if p == nil {
			p = startEngineProc(t, b.URL)
		}
		b.Kind, b.URL, b.APIKey = config.KindEngine, p.url(), "engine-secret"
		b.Link = config.Link{PingInterval: time.Second}
	}
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
	e.engine.conns.cut() // the engine's side of the WebSocket drops
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
	// One connection throughout, and nothing lost or dropped: a chat.done
	// that arrives after the relay read [DONE] and closed the body still
	// finds its session.
	m := readAll(t, resp.Body)
	for _, want := range []string{`moonji_engine_reconnects_total{backend="e1"} 0`,
		`moonji_engine_messages_dropped_total{backend="e1",reason="unknown_session"} 0`,
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

// An engine process that dies and comes back: the stream it was serving
// fails as engine_disconnected; requests made while it is down wait in the
// link's queue and are served, in order, when it is back within their TTL;
// one past the queue's bound is refused at once, and one that outwaits its
// TTL fails — both as engine_unavailable. Every request leaves exactly one
// row saying which, and no slot or session is left behind.
func TestEngineRestartWithQueuedRequests(t *testing.T) {
	e := startEngineEnvWith(t, 8, func(cfg *config.Config) {
		cfg.Backends[0].Link.QueueSize = 2
		cfg.Backends[0].Link.MessageTTL = 3 * time.Second
	})
	ids := map[string]string{} // what each request should have left, by its id
	engineGauge := func(name string) float64 { return metricValue(t, e.testEnv, name, `backend="e1"`) }

	// A stream is running when the engine dies.
	running := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tag":"running","tps":20,"tokens":400}}`)
	if _, err := e.Mock.WaitFor(ctxTimeout(t, 10*time.Second), "running", func(r mockllm.Record) bool { return r.ChunksSent >= 2 }); err != nil {
		t.Fatal(err)
	}
	e.engine.kill()
	if body := readAll(t, running.Body); !strings.Contains(body, "engine_disconnected") {
		t.Errorf("the running stream was not told: %q", tail(body))
	}
	ids[running.Header.Get("X-Inference-Id")] = "error/engine_disconnected"
	waitFor(t, "the link to notice", 5*time.Second, func() bool { return engineGauge("moonji_engine_connected") == 0 })

	// Down: two requests queue (the link's queue_size), a third is refused.
	type answer struct {
		id, body string
		status   int
	}
	queued := make(chan answer, 2)
	for i, body := range []string{
		fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"%squeued stream"}],"mock":{"tps":200}}`, mockllm.EchoPrefix),
		`{"model":"m1","messages":[{"role":"user","content":"queued whole"}],"mock":{"tokens":5}}`,
	} {
		go func() {
			resp := e.post(body)
			queued <- answer{resp.Header.Get("X-Inference-Id"), readAll(t, resp.Body), resp.StatusCode}
		}()
		waitFor(t, fmt.Sprintf("request %d to queue", i+1), 5*time.Second, func() bool {
			return engineGauge("moonji_engine_queued_messages") == float64(i+1)
		})
	}
	full := e.post(`{"model":"m1","messages":[{"role":"user","content":"one too many"}]}`)
	if body := readAll(t, full.Body); full.StatusCode != http.StatusServiceUnavailable ||
		!strings.Contains(body, `"code":"engine_unavailable"`) || full.Header.Get("Retry-After") == "" {
		t.Errorf("past the queue: %d %s (Retry-After %q)", full.StatusCode, body, full.Header.Get("Retry-After"))
	}
	ids[full.Header.Get("X-Inference-Id")] = "rejected/engine_unavailable"

	// Back within the TTL: both queued requests are served.
	e.engine.start()
	for range 2 {
		a := <-queued
		if a.status != http.StatusOK {
			t.Fatalf("a queued request after the restart: %d %s", a.status, a.body)
		}
		if strings.HasPrefix(a.body, "data: ") && (sseContent(a.body) != "queued stream" || !strings.HasSuffix(a.body, "data: [DONE]\n\n")) {
			t.Errorf("the queued stream: %q", tail(a.body))
		}
		ids[a.id] = "success/"
	}

	// Down again, for longer than the TTL: the queued request fails.
	waitFor(t, "the link to be back", 10*time.Second, func() bool { return engineGauge("moonji_engine_connected") == 1 })
	e.engine.kill()
	waitFor(t, "the link to notice", 5*time.Second, func() bool { return engineGauge("moonji_engine_connected") == 0 })
	began := time.Now()
	late := e.post(`{"model":"m1","messages":[{"role":"user","content":"too late"}]}`)
	waited := time.Since(began)
	if body := readAll(t, late.Body); late.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"engine_unavailable"`) {
		t.Errorf("past the TTL: %d %s", late.StatusCode, body)
	}
	if waited < 3*time.Second || waited > 6*time.Second {
		t.Errorf("the expired request was answered after %v; its TTL is 3s", waited)
	}
	ids[late.Header.Get("X-Inference-Id")] = "rejected/engine_unavailable"

	// The engine is back: served again; nothing left held.
	e.engine.start()
	waitFor(t, "the link to be back", 15*time.Second, func() bool { return engineGauge("moonji_engine_connected") == 1 })
	again := e.post(`{"model":"m1","messages":[{"role":"user","content":"again"}],"mock":{"tokens":3}}`)
	if body := readAll(t, again.Body); again.StatusCode != http.StatusOK {
		t.Fatalf("after the second restart: %d %s", again.StatusCode, body)
	}
	ids[again.Header.Get("X-Inference-Id")] = "success/"

	for id, want := range ids {
		row := e.final(id)
		if got := string(row.Outcome) + "/" + row.Reason; got != want {
			t.Errorf("row %s: %s, want %s", id, got, want)
		}
	}
	if n := e.countRows(); n != int64(len(ids)) {
		t.Errorf("%d rows for %d requests", n, len(ids))
	}
	waitFor(t, "no slot or session held", 5*time.Second, func() bool {
		for _, b := range e.srv.Gateway.Backends() {
			if b.Name == "e1" && (b.InFlight != 0 || b.Queued != 0) {
				return false
			}
		}
		return engineGauge("moonji_engine_sessions") == 0 && engineGauge("moonji_engine_queued_messages") == 0
	})
	for reason, want := range map[string]float64{"queue_full": 1, "expired": 1} {
		if got := metricValue(t, e.testEnv, "moonji_engine_messages_dropped_total", `backend="e1",reason="`+reason+`"`); got != want {
			t.Errorf("dropped %s = %v, want %v", reason, got, want)
		}
	}
	if got := metricValue(t, e.testEnv, "moonji_rejections_total", `reason="engine_unavailable"`); got != 2 {
		t.Errorf("rejections engine_unavailable = %v, want 2", got)
	}
}

// A Stop sent to another replica reaches the engine backend's stream on
// the replica that owns it, and through the engine its upstream request.
func TestEngineBackendStopFromAnotherReplica(t *testing.T) {
	c := startCluster(t, 2, false, withEngineBackend(t))
	a, b := c.replicas[0], c.replicas[1]
	s := startStream(t, a, a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"far","tps":50,"tokens":1000}}`)
	waitContent(t, s, 3)
	ans := cancelVia(t, b, b.Key, s.id)
	if ans.status != http.StatusOK || ans.body["state"] != "stopped" || ans.body["acknowledged"] != true {
		t.Fatalf("stop through B: %d %v", ans.status, ans.body)
	}
	body := s.wait(t)
	if !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("the stopped stream does not end cleanly: %q", tail(body))
	}
	if n := s.contentAfter(ans.at); n != 0 {
		t.Errorf("%d content chunks reached the client after the stop's 200", n)
	}
	if _, err := c.mock.WaitFor(ctxTimeout(t, 10*time.Second), "far", func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
		t.Fatalf("the engine's upstream request was not cancelled: %v", err)
	}
	if row := a.final(s.id); row.Outcome != models.OutcomeStopped || row.Backend != "mock" {
		t.Errorf("row = %+v", row)
	}
}
