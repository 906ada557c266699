package web_test

import (
	"bufio"
	"fmt"
	"io"
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
	"moonji/internal/faultproxy"
	"moonji/internal/mockllm"
	"moonji/models"
)

// An engine that hangs or resets, behind a real fault injector
// (faultproxy) or a server that stalls or resets on purpose: every request
// ends within the backend's timeout with a well-formed answer, leaves one
// row saying how it ended, frees its slot, and the backend's health says
// what the engine did.

// faultTimeout is the backend's timeout in these tests; faultMargin what a
// request may take past it on a busy machine.
const (
	faultTimeout = time.Second
	faultMargin  = 2 * time.Second
)

// startFaultyEnv is a gateway whose one backend, "mock", has the given
// timeout, one slot, and fast health probes; via, when set, gives the URL
// it reaches its engine at from the mock engine's (/v1) URL.
func startFaultyEnv(t *testing.T, timeout time.Duration, via func(mockURL string) string) *testEnv {
	t.Helper()
	return startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) {
		if via != nil {
			c.Backends[0].URL = via(c.Backends[0].URL)
		}
		c.Backends[0].Timeout = timeout
		c.Backends[0].MaxConcurrency = 1
		c.StreamWriteTimeout = time.Minute
		c.Health = config.Health{Backoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, ProbeTimeout: 300 * time.Millisecond}
	})
}

// throughProxy puts a faultproxy in front of the mock engine.
func throughProxy(t *testing.T, p **faultproxy.Proxy) func(string) string {
	return func(mockURL string) string {
		host := strings.TrimSuffix(strings.TrimPrefix(mockURL, "http://"), "/v1")
		*p = faultproxy.Start(t, host)
		return "http://" + (*p).Addr() + "/v1"
	}
}

// at replaces the engine's URL.
func at(url string) func(string) string { return func(string) string { return url } }

// badEngine answers like an OpenAI engine until the answer's first bytes —
// the header and one SSE frame, or the start of a whole answer's body —
// then either stalls (reads nothing more, writes nothing more, until the
// gateway closes the connection) or resets the connection (RST). A request
// whose last message is "fine" gets a whole, normal answer; GET /models
// answers, so the backend's probe passes.
type badEngine struct {
	ln    net.Listener
	reset bool
	// closed receives one value per stalled answer whose connection the
	// gateway closed: the engine learns its client left.
	closed chan struct{}
	mu     sync.Mutex
	conns  []net.Conn
}

func startBadEngine(t *testing.T, reset bool) *badEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &badEngine{ln: ln, reset: reset, closed: make(chan struct{}, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			go b.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			c.Close()
		}
	})
	return b
}

func (b *badEngine) url() string { return "http://" + b.ln.Addr().String() + "/v1" }

const badFrame = `data: {"id":"chatcmpl-bad","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}` + "\n\n"

func (b *badEngine) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		if strings.HasSuffix(req.URL.Path, "/models") {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 27\r\n\r\n{\"object\":\"list\",\"data\":[]}")
			continue
		}
		stream := gjson.GetBytes(body, "stream").Bool()
		if gjson.GetBytes(body, "messages.@reverse.0.content").Str == "fine" {
			answer := `{"id":"chatcmpl-ok","object":"chat.completion","created":1,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
			continue
		}
		if stream {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(badFrame), badFrame)
		} else {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n%s",
				`{"id":"chatcmpl-bad","object":"chat.completion","created":1,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"Hel`)
		}
		if b.reset {
			// What was written is in the gateway's socket already (loopback);
			// the RST comes after it.
			_ = c.(*net.TCPConn).SetLinger(0)
			return
		}
		_, _ = io.Copy(io.Discard, br) // stalls until the gateway closes
		b.closed <- struct{}{}
		return
	}
}

// faultCase is one request against a faulty engine and how it must end.
type faultCase struct {
	stream bool
	// status and code: the answer's status and its error's code (for a
	// stream, the code of the error event that ends it).
	status int
	code   string
	// sawFirst: a stream relays the engine's first frame before its end.
	sawFirst bool
}

// runFault sends c's request, checks the answer and its row, and returns
// how long it took.
func runFault(t *testing.T, e *testEnv, c faultCase, body string) time.Duration {
	t.Helper()
	start := time.Now()
	resp := e.post(body)
	got := readAll(t, resp.Body)
	took := time.Since(start)
	id := resp.Header.Get("X-Inference-Id")
	if resp.StatusCode != c.status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, got)
	}
	if c.stream && resp.StatusCode == http.StatusOK {
		// A stream that began ends with the API's error event, the last
		// data frame; comments (keep-alives) may come between.
		var data []string
		for _, line := range strings.Split(got, "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				data = append(data, d)
			}
		}
		if len(data) == 0 {
			t.Fatalf("stream with no frame: %q", got)
		}
		last := data[len(data)-1]
		if gjson.Get(last, "error.code").Str != c.code || gjson.Get(last, "error.message").Str == "" {
			t.Errorf("the stream's last frame is not the %s error event: %q", c.code, last)
		}
		if c.sawFirst && !strings.Contains(got, `"content":"Hello"`) {
			t.Errorf("the engine's first frame was not relayed: %q", got)
		}
	} else {
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("Content-Type %q", ct)
		}
		if gjson.Get(got, "error.code").Str != c.code || gjson.Get(got, "error.message").Str == "" || !gjson.Get(got, "error.type").Exists() {
			t.Errorf("not OpenAI's error shape with code %s: %s", c.code, got)
		}
	}
	row := e.final(id)
	if row.Outcome != models.OutcomeError || row.Reason != c.code {
		t.Errorf("row %s/%s, want error/%s", row.Outcome, row.Reason, c.code)
	}
	if n := e.countRows(); n != 1 {
		t.Errorf("%d rows for one request", n)
	}
	return took
}

// slotFreed checks that the request left nothing held: the gauges are back
// to zero and the next request is admitted at once (the backend has one
// slot) and served.
func slotFreed(t *testing.T, e *testEnv) {
	t.Helper()
	waitFor(t, "the slot to be freed", 2*time.Second, func() bool {
		b := e.srv.Gateway.Backends()[0]
		return b.InFlight == 0 && b.Queued == 0 && inFlight(t, e) == 0
	})
	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"fine"}],"mock":{"tokens":2}}`)
	if body := readAll(t, resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("the next request: %d %s", resp.StatusCode, body)
	}
	if row := e.final(resp.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeSuccess || row.QueueMs > 500 {
		t.Errorf("the next request: row %+v, want success without a wait in the queue", row)
	}
}

// healthDown waits for the backend to be down for reason, and for a probe
// to have failed while the fault lasts (when probeFails).
func healthDown(t *testing.T, e *testEnv, reason string, probeFails bool) {
	t.Helper()
	h := e.srv.Health["mock"]
	if st := h.State(); st.Up || st.Reason != reason {
		t.Fatalf("health %+v, want down: %s", st, reason)
	}
	if probeFails {
		waitFor(t, "a probe to fail", 3*time.Second, func() bool { return h.State().ProbeError != "" })
		if h.Up() {
			t.Fatal("the backend came back while its engine was still faulty")
		}
	}
	if metricValue(t, e, "moonji_backend_up", `backend="mock"`) != 0 {
		t.Error("moonji_backend_up is not 0")
	}
}

// An engine that accepts the connection and never answers (a silent
// path): the request fails at its timeout, 504 upstream_timeout. A stream
// with no header by then takes the backend down, and the probe keeps it
// down while the path stays silent; a whole answer's header comes only
// with the answer, so its absence leaves the backend up.
func TestEngineThatNeverAnswers(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(map[bool]string{true: "stream", false: "whole"}[stream], func(t *testing.T) {
			var p *faultproxy.Proxy
			e := startFaultyEnv(t, faultTimeout, throughProxy(t, &p))
			p.Blackhole(0)
			took := runFault(t, e, faultCase{stream: stream, status: http.StatusGatewayTimeout, code: "upstream_timeout"},
				fmt.Sprintf(`{"model":"m1","stream":%t,"messages":[{"role":"user","content":"x"}]}`, stream))
			if took < faultTimeout || took > faultTimeout+faultMargin {
				t.Errorf("answered after %v; the timeout is %v", took, faultTimeout)
			}
			if stream {
				healthDown(t, e, "no answer within the timeout", true)
			} else if st := e.srv.Health["mock"].State(); !st.Up {
				t.Errorf("a whole answer's timeout took the backend down: %+v", st)
			}
			p.Clear()
			waitFor(t, "the backend to be up again", 5*time.Second, func() bool { return e.srv.Health["mock"].Up() })
			slotFreed(t, e)
		})
	}
}

// An engine that sends its answer's header (and a stream's first frame)
// and then nothing: the request ends at its timeout — a stream with the
// API's error event after what it relayed, a whole answer with 504 — and
// the engine sees its connection closed. The backend stays up: it
// answered, and its probe would pass.
func TestEngineThatStallsAfterTheHeader(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(map[bool]string{true: "stream", false: "whole"}[stream], func(t *testing.T) {
			b := startBadEngine(t, false)
			e := startFaultyEnv(t, faultTimeout, at(b.url()))
			c := faultCase{stream: stream, status: http.StatusGatewayTimeout, code: "upstream_timeout"}
			if stream {
				c.status, c.sawFirst = http.StatusOK, true
			}
			took := runFault(t, e, c, fmt.Sprintf(`{"model":"m1","stream":%t,"messages":[{"role":"user","content":"x"}]}`, stream))
			if took < faultTimeout || took > faultTimeout+faultMargin {
				t.Errorf("answered after %v; the timeout is %v", took, faultTimeout)
			}
			select {
			case <-b.closed:
			case <-time.After(5 * time.Second):
				t.Error("the engine's connection was not closed")
			}
			if st := e.srv.Health["mock"].State(); !st.Up {
				t.Errorf("health %+v, want up", st)
			}
			slotFreed(t, e)
		})
	}
}

// An engine that resets the connection in the middle of its answer: the
// request ends at once — a stream with the API's error event after what it
// relayed, a whole answer with 502 — and the backend is taken down until
// its probe passes.
func TestEngineThatResetsMidAnswer(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(map[bool]string{true: "stream", false: "whole"}[stream], func(t *testing.T) {
			b := startBadEngine(t, true)
			e := startFaultyEnv(t, faultTimeout, at(b.url()))
			c := faultCase{stream: stream, status: http.StatusBadGateway, code: "upstream_read_failed"}
			if stream {
				c.status, c.code, c.sawFirst = http.StatusOK, "upstream_disconnected", true
			}
			took := runFault(t, e, c, fmt.Sprintf(`{"model":"m1","stream":%t,"messages":[{"role":"user","content":"x"}]}`, stream))
			if took > faultMargin {
				t.Errorf("a reset answer took %v to end", took)
			}
			if st := e.srv.Health["mock"].State(); st.Up || !strings.Contains(st.Reason, "broke off") {
				t.Errorf("health %+v, want down: the answer broke off", st)
			}
			waitFor(t, "the probe to bring the backend back", 5*time.Second, func() bool { return e.srv.Health["mock"].Up() })
			slotFreed(t, e)
		})
	}
}

// The mock engine's stream cut by the fault injector (the proxy in front
// of it goes down, as a crashed engine's host would): the stream ends at
// once with the API's error event, the backend is down while the engine
// is away and up once it is back.
func TestEngineGoesAwayMidStream(t *testing.T) {
	var p *faultproxy.Proxy
	// A timeout of a minute: the cut, not the timeout, ends the stream.
	e := startFaultyEnv(t, time.Minute, throughProxy(t, &p))
	s := startStream(t, e, e.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"cut","tps":50,"tokens":400}}`)
	waitContent(t, s, 3)
	cut := time.Now()
	p.Down()
	body := s.wait(t)
	if d := time.Since(cut); d > faultMargin {
		t.Errorf("the stream ended %v after the cut", d)
	}
	var last string
	for _, line := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			last = d
		}
	}
	if gjson.Get(last, "error.code").Str != "upstream_disconnected" {
		t.Errorf("the stream's last frame: %q", last)
	}
	row := e.final(s.id)
	if row.Outcome != models.OutcomeError || row.Reason != "upstream_disconnected" || row.CompletionTokens < 3 {
		t.Errorf("row %+v", row)
	}
	healthDown(t, e, "the stream broke off", true)
	p.Up()
	waitFor(t, "the backend to be up again", 5*time.Second, func() bool { return e.srv.Health["mock"].Up() })
	slotFreed(t, e)
}

// An engine backend whose engine's own upstream never answers: the
// gateway's timeout ends the request (504 upstream_timeout: no answer had
// begun), session.cancel reaches the engine, and the engine holds nothing
// after — no session, no request running.
func TestEngineBackendUpstreamNeverAnswers(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(map[bool]string{true: "stream", false: "whole"}[stream], func(t *testing.T) {
			mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})
			ms := httptest.NewServer(mock)
			t.Cleanup(ms.Close)
			p := faultproxy.Start(t, strings.TrimPrefix(ms.URL, "http://"))
			p.Blackhole(0)
			eng, addr := startLinkedEngine(t, "http://"+p.Addr()+"/v1")
			cfg := &config.Config{
				DatabaseURL: "sqlite://" + t.TempDir() + "/moonji.db",
				RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
				Backends: []config.Backend{{Name: "mock", Kind: config.KindEngine, URL: "ws://" + addr + engine.Path,
					APIKey: "engine-secret", MaxConcurrency: 1, Timeout: faultTimeout, Link: config.Link{PingInterval: time.Second}}},
				Models: []config.Model{{Name: "m1", Backend: "mock"}},
				Health: config.Health{Backoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, ProbeTimeout: 300 * time.Millisecond},
			}
			e := startWithConfig(t, cfg, mock, ms.URL)
			waitFor(t, "the link to connect", 10*time.Second, func() bool {
				return metricValue(t, e, "moonji_engine_connected", `backend="mock"`) == 1
			})
			took := runFault(t, e, faultCase{stream: stream, status: http.StatusGatewayTimeout, code: "upstream_timeout"},
				fmt.Sprintf(`{"model":"m1","stream":%t,"messages":[{"role":"user","content":"x"}]}`, stream))
			if took < faultTimeout || took > faultTimeout+faultMargin {
				t.Errorf("answered after %v; the timeout is %v", took, faultTimeout)
			}
			waitFor(t, "the engine to hold nothing", 5*time.Second, func() bool {
				open, running := eng.Sessions()
				return open == 0 && running == 0 && metricValue(t, e, "moonji_engine_sessions", `backend="mock"`) == 0
			})
			p.Clear()
			waitFor(t, "the backend to be up", 5*time.Second, func() bool { return e.srv.Health["mock"].Up() })
			slotFreed(t, e)
		})
	}
}

// A chat reply whose engine stalls after its first frame, or resets the
// connection after it: the reply is saved as failed, with the text that
// had come and a reason in words, by the backend's timeout; its row says
// how it ended; the slot is free.
func TestChatReplyOfAHungOrResetEngine(t *testing.T) {
	for _, c := range []struct {
		name   string
		reset  bool
		reason string // the row's
		words  string // the message's: the stream's error event's
	}{
		{"stalls", false, "upstream_timeout", "The backend took too long to answer."},
		{"resets", true, "upstream_disconnected", "The backend closed the stream before it was complete."},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := startBadEngine(t, c.reset)
			e := startFaultyEnv(t, faultTimeout, at(b.url()))
			p := e.chatter("ann@example.com")
			conv := p.newConversation()
			start := time.Now()
			s := p.send(conv, "x")
			m := p.reply(conv)
			if took := time.Since(start); took > faultTimeout+faultMargin {
				t.Errorf("the reply ended after %v; the timeout is %v", took, faultTimeout)
			}
			if m.Status != models.MessageError || m.Content != "Hello" || m.Reason != c.words {
				t.Errorf("reply %+v, want an error keeping %q: %s", m, "Hello", c.words)
			}
			if row := e.final(s.InferenceID); row.Outcome != models.OutcomeError || row.Reason != c.reason || row.Source != "web" {
				t.Errorf("row %+v, want error/%s", row, c.reason)
			}
			waitFor(t, "the slot to be freed", 2*time.Second, func() bool { return inFlight(t, e) == 0 })
		})
	}
}
