package web_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// headerLog keeps the traceparent headers an engine received.
type headerLog struct {
	mu   sync.Mutex
	seen []string
}

func (h *headerLog) add(v string) {
	h.mu.Lock()
	h.seen = append(h.seen, v)
	h.mu.Unlock()
}

func (h *headerLog) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}

// startTracedEnv is a gateway in front of the mock engine, with tracing as
// given (nil: off); the engine notes each request's traceparent ("" when
// it had none). opts change the configuration (withEngineBackend: the mock
// behind a `moonji engine` link).
func startTracedEnv(t *testing.T, dbURL string, tr *config.Tracing, opts ...envOption) (*testEnv, *headerLog) {
	t.Helper()
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	log := &headerLog{}
	ms := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/chat/completions") {
			log.add(r.Header.Get("traceparent"))
		}
		mock.ServeHTTP(w, r)
	}))
	t.Cleanup(ms.Close)
	cfg := &config.Config{
		Listen:      "127.0.0.1:0",
		DatabaseURL: dbURL,
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends:    []config.Backend{{Name: "mock", URL: ms.URL + "/v1", MaxConcurrency: 8, MaxQueue: 8, QueueTimeout: 5 * time.Second}},
		Models:      []config.Model{{Name: "m1", Backend: "mock"}},
	}
	if tr != nil {
		cfg.Tracing = *tr
	}
	for _, o := range opts {
		o(cfg)
	}
	return startWithConfig(t, cfg, mock, ms.URL), log
}

// postTraced sends an official-shaped streaming chat request with the
// given traceparent ("" for none) and reads its whole answer.
func postTraced(t *testing.T, e *testEnv, traceparent string) (inferenceID, body string) {
	t.Helper()
	const reqBody = `{"model":"m1","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello."}],` +
		`"stream":true,"stream_options":{"include_usage":true},"max_tokens":16,"temperature":0.2}`
	req, err := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions", strings.NewReader(reqBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.Key)
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("tracestate", "vendor=abc")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body = readAll(t, resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "data: [DONE]") {
		t.Fatalf("status %d, body %q", resp.StatusCode, body)
	}
	return resp.Header.Get("X-Inference-Id"), body
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// A streamed chat request with a client's traceparent is one trace in a
// real Jaeger: the gateway's server span is the child of the client's
// span, with the GenAI and Moonji attributes of its usage row, and the
// queue wait, the engine call and the stream as its children; the engine
// got a traceparent naming the engine call's span; the key's secret is
// nowhere in what was exported.
func TestTracesReachJaeger(t *testing.T) {
	// Spans are exported within 100 ms rather than the SDK's 5 s.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	otlp, query := startJaeger(t)
	for name, mk := range databases(t) {
		t.Run(name, func(t *testing.T) {
			e, engine := startTracedEnv(t, mk(t), &config.Tracing{OTLPEndpoint: otlp})
			traceID, parentID := randomHex(t, 16), randomHex(t, 8)
			id, _ := postTraced(t, e, "00-"+traceID+"-"+parentID+"-01")
			row := e.final(id)

			var tr *jaegerTrace
			var raw string
			waitFor(t, "the trace in jaeger", 30*time.Second, func() bool {
				tr, raw = fetchTrace(t, query, traceID, 4)
				return tr != nil
			})
			checkTrace(t, tr, raw, traceID, parentID, row, e.Key)

			seen := engine.all()
			if len(seen) != 1 {
				t.Fatalf("the engine got %d requests, want 1", len(seen))
			}
			var engineSpan string
			for _, s := range tr.Spans {
				if s.OperationName == "moonji.engine" {
					engineSpan = s.SpanID
				}
			}
			if want := "00-" + traceID + "-" + engineSpan + "-01"; seen[0] != want {
				t.Errorf("the engine's traceparent = %q, want %q (the engine call's span)", seen[0], want)
			}
		})
	}
}

func checkTrace(t *testing.T, tr *jaegerTrace, raw, traceID, parentID string, row *models.Usage, secret string) {
	t.Helper()
	if strings.Contains(raw, secret) || strings.Contains(raw, secret[len(secret)-12:]) {
		t.Errorf("the key's secret is in the exported trace: %s", raw)
	}
	byName := map[string]int{}
	for i, s := range tr.Spans {
		byName[s.OperationName] = i
		if p := tr.Processes[s.ProcessID]; p.ServiceName != "moonji" {
			t.Errorf("span %s: service %q, want moonji", s.OperationName, p.ServiceName)
		}
	}
	si, ok := byName["chat m1"]
	if !ok {
		t.Fatalf("no server span named \"chat m1\" among %v: %s", byName, raw)
	}
	server := tr.Spans[si]
	if len(server.References) != 1 || server.References[0].TraceID != traceID || server.References[0].SpanID != parentID {
		t.Errorf("server span's parent = %+v, want the client's span %s of trace %s", server.References, parentID, traceID)
	}
	tags := map[string]string{}
	for _, tag := range server.Tags {
		tags[tag.Key] = fmt.Sprint(tag.Value)
	}
	want := map[string]string{
		"span.kind":                  "server",
		"gen_ai.operation.name":      "chat",
		"gen_ai.request.model":       "m1",
		"gen_ai.response.model":      "m1",
		"gen_ai.usage.input_tokens":  fmt.Sprint(row.PromptTokens),
		"gen_ai.usage.output_tokens": fmt.Sprint(row.CompletionTokens),
		"moonji.inference_id":        row.InferenceID,
		"moonji.outcome":             models.OutcomeSuccess,
		"moonji.key_id":              fmt.Sprint(*row.KeyID),
		"moonji.backend":             "mock",
		"http.response.status_code":  "200",
	}
	for k, v := range want {
		if tags[k] != v {
			t.Errorf("server span tag %s = %q, want %q (tags %v)", k, tags[k], v, tags)
		}
	}
	if row.CompletionTokens == 0 || row.PromptTokens == 0 {
		t.Errorf("the row has no usage to compare: %+v", row)
	}
	for _, name := range []string{"moonji.queue", "moonji.engine", "moonji.stream"} {
		i, ok := byName[name]
		if !ok {
			t.Errorf("no %s span: %v", name, byName)
			continue
		}
		refs := tr.Spans[i].References
		if len(refs) != 1 || refs[0].SpanID != server.SpanID {
			t.Errorf("%s's parent = %+v, want the server span %s", name, refs, server.SpanID)
		}
	}
}

// Off (the default), no span is made, the engine gets no traceparent even
// when the client sent one, and nothing is exported — not even to an
// endpoint the OpenTelemetry environment variables name.
func TestTracingOffSendsNothing(t *testing.T) {
	var exported sync.Map
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		exported.Store(r.URL.Path, true)
	}))
	defer sink.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.URL)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	e, engine := startTracedEnv(t, "sqlite://"+t.TempDir()+"/m.db", nil)
	if e.srv.Tracer != nil {
		t.Fatal("a tracer without tracing.otlp_endpoint")
	}
	id, _ := postTraced(t, e, "00-"+randomHex(t, 16)+"-"+randomHex(t, 8)+"-01")
	e.final(id)
	postTraced(t, e, "")
	for _, tp := range engine.all() {
		if tp != "" {
			t.Errorf("the engine got traceparent %q with tracing off", tp)
		}
	}
	e.srv.Shutdown(2 * time.Second) // a tracer would flush here
	exported.Range(func(k, _ any) bool {
		t.Errorf("something was exported to %v with tracing off", k)
		return true
	})
}

// Through an engine link (`moonji engine`), the engine's upstream gets the
// traceparent of the gateway's engine-call span: the client's trace id, a
// span id of the gateway's own. The link carries it in chat.request.
func TestTraceparentCrossesTheEngineLink(t *testing.T) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer sink.Close()
	e, engine := startTracedEnv(t, "sqlite://"+t.TempDir()+"/m.db",
		&config.Tracing{OTLPEndpoint: sink.URL}, withEngineBackend(t)) // sample_ratio: 1.0 by default
	trace, parent := randomHex(t, 16), randomHex(t, 8)
	id, _ := postTraced(t, e, "00-"+trace+"-"+parent+"-01")
	if row := e.final(id); row.Backend != "mock" || row.Outcome != models.OutcomeSuccess {
		t.Fatalf("row %+v: want a success on the engine backend", row)
	}
	got := engine.all()
	if len(got) != 1 {
		t.Fatalf("the upstream behind the link got %d requests (%q), want 1", len(got), got)
	}
	if tp := got[0]; !strings.HasPrefix(tp, "00-"+trace+"-") || strings.Contains(tp, parent) || !strings.HasSuffix(tp, "-01") {
		t.Errorf("the upstream behind the link got traceparent %q; want the trace %s with the gateway's span, sampled", tp, trace)
	}
}
