package tracing

import (
	"context"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func testTracer(ratio float64) (*Tracer, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	return newTracer(sdktrace.NewSimpleSpanProcessor(exp), Options{Ratio: ratio, Replica: "r1"}), exp
}

const (
	parentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
)

// Off, there is no Tracer: every call is a nil check, allocating nothing.
func TestOffAllocatesNothing(t *testing.T) {
	tr, err := New(context.Background(), Options{})
	if tr != nil || err != nil {
		t.Fatalf("New without an endpoint = %v, %v; want nil, nil", tr, err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		r := tr.Start("00-"+parentTrace+"-"+parentSpan+"-01", "", time.Now(), "chat")
		r.SetModel("m")
		r.BeginQueue("b")
		r.EndQueue("b", 0)
		if tp := r.BeginEngine("b", "h:1"); tp != "" {
			t.Fatal("a traceparent while off")
		}
		r.EndEngine(200, "")
		r.BeginStream()
		r.EndStream(3, time.Time{})
		r.End(Ending{Outcome: "success"})
	})
	if allocs != 0 {
		t.Errorf("off: %v allocations per request, want 0", allocs)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestSpanTreeAndAttributes(t *testing.T) {
	tr, exp := testTracer(1)
	key := uint(42)
	r := tr.Start("00-"+parentTrace+"-"+parentSpan+"-01", "vendor=x", time.Now(), "chat")
	r.SetModel("qwen")
	r.BeginQueue("pool")
	r.EndQueue("b1", 3*time.Millisecond)
	tp := r.BeginEngine("b1", "127.0.0.1:8000")
	r.EndEngine(200, "")
	r.BeginStream()
	r.EndStream(5, time.Now())
	r.End(Ending{InferenceID: "inf_1", Outcome: "success", KeyID: &key, Backend: "b1", Model: "qwen",
		ResponseModel: "Qwen/Qwen3", UsageKnown: true, InputTokens: 7, OutputTokens: 5, Status: 200})
	r.End(Ending{Outcome: "error"}) // once only

	spans := exp.GetSpans()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4", len(spans))
	}
	byName := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	server, ok := byName["chat qwen"]
	if !ok {
		t.Fatalf("no server span: %v", byName)
	}
	if server.SpanKind != trace.SpanKindServer || server.Parent.TraceID().String() != parentTrace ||
		server.Parent.SpanID().String() != parentSpan || !server.Parent.IsRemote() {
		t.Errorf("server span: kind %v, parent %v", server.SpanKind, server.Parent)
	}
	attrs := map[string]string{}
	for _, kv := range server.Attributes {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	for k, v := range map[string]string{"gen_ai.operation.name": "chat", "gen_ai.request.model": "qwen",
		"gen_ai.response.model": "Qwen/Qwen3", "gen_ai.usage.input_tokens": "7", "gen_ai.usage.output_tokens": "5",
		"moonji.inference_id": "inf_1", "moonji.outcome": "success", "moonji.key_id": "42", "moonji.backend": "b1"} {
		if attrs[k] != v {
			t.Errorf("%s = %q, want %q", k, attrs[k], v)
		}
	}
	for _, name := range []string{SpanQueue, SpanEngine, SpanStream} {
		s, ok := byName[name]
		if !ok || s.Parent.SpanID() != server.SpanContext.SpanID() {
			t.Errorf("%s: missing or not the server span's child (%v)", name, s.Parent)
		}
	}
	engine := byName[SpanEngine]
	if want := "00-" + parentTrace + "-" + engine.SpanContext.SpanID().String() + "-01"; tp != want {
		t.Errorf("engine traceparent %q, want %q", tp, want)
	}
	if engine.SpanKind != trace.SpanKindClient {
		t.Errorf("engine span kind %v", engine.SpanKind)
	}
}

// A client's header is input: a malformed or oversized traceparent starts
// a new trace; a phase open when the request ends is ended with it.
func TestHostileTraceparent(t *testing.T) {
	tr, exp := testTracer(1)
	for _, tp := range []string{"garbage", "00-" + strings.Repeat("0", 32) + "-" + parentSpan + "-01",
		"00-" + parentTrace + "-" + parentSpan + "-01" + strings.Repeat("x", 4096), "ff-" + parentTrace + "-" + parentSpan + "-01",
		"00-" + parentTrace + "-" + parentSpan + "-01\r\nX-Evil: 1"} {
		exp.Reset()
		r := tr.Start(tp, strings.Repeat("a=b,", 1000), time.Now(), "embeddings")
		r.BeginEngine("b", "")
		r.End(Ending{Outcome: "cancelled"})
		spans := exp.GetSpans()
		if len(spans) != 2 {
			t.Fatalf("%q: %d spans, want 2 (the engine call ended with the request)", tp, len(spans))
		}
		for _, s := range spans {
			if s.Name == "embeddings" && (s.Parent.IsValid() || s.SpanContext.TraceID().String() == parentTrace) {
				t.Errorf("%q: taken as a parent: %v", tp, s.Parent)
			}
		}
	}
}

// Sampling: ratio 0 traces only what comes with a sampled parent; the
// engine still gets a traceparent (not sampled) so that the trace goes on.
func TestSampling(t *testing.T) {
	tr, exp := testTracer(0)
	r := tr.Start("", "", time.Now(), "chat")
	tp := r.BeginEngine("b", "")
	r.End(Ending{Outcome: "success"})
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("ratio 0, no parent: %d spans exported", n)
	}
	if !strings.HasSuffix(tp, "-00") || len(tp) != 55 {
		t.Errorf("unsampled traceparent = %q", tp)
	}
	r = tr.Start("00-"+parentTrace+"-"+parentSpan+"-01", "", time.Now(), "chat")
	r.End(Ending{Outcome: "success"})
	if n := len(exp.GetSpans()); n != 1 {
		t.Errorf("ratio 0, sampled parent: %d spans, want 1", n)
	}
}
