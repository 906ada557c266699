// Package tracing exports OpenTelemetry traces of inference requests over
// OTLP/HTTP: one server span per request, carrying the GenAI semantic
// conventions' attributes and Moonji's own, with a child span for each
// phase of its path (the queue wait, the engine call, the stream). It knows
// nothing of HTTP servers: the gateway hands it the incoming traceparent
// and gets back the one to send to the engine.
//
// Off, there is no Tracer: a nil *Tracer starts nil *Requests, and every
// method of a nil *Request does nothing, so the request path pays a nil
// check and allocates nothing.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Options configure a Tracer.
type Options struct {
	// Endpoint is the collector's OTLP/HTTP base URL (http://host:4318);
	// spans are posted to its /v1/traces. Empty: tracing is off.
	Endpoint string
	// Ratio is the share of requests without a parent that are sampled
	// (0–1); a request with a traceparent follows its sampled flag.
	Ratio float64
	// Replica names this gateway replica (service.instance.id).
	Replica string
	// BatchTimeout is the longest a finished span waits before it is
	// exported (0: the SDK's default, 5 s, or OTEL_BSP_SCHEDULE_DELAY).
	BatchTimeout time.Duration
	Log          *slog.Logger
}

// Tracer makes the spans of inference requests. A nil *Tracer is off.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TraceContext
}

// New returns the Tracer of o, or nil (off) when o has no endpoint. The
// exporter connects lazily: a collector that is down costs dropped spans
// and a logged error, never a failed start or a waiting request (the batch
// processor drops spans when its queue is full rather than block).
func New(ctx context.Context, o Options) (*Tracer, error) {
	if o.Endpoint == "" {
		return nil, nil
	}
	if o.Ratio < 0 || o.Ratio > 1 {
		return nil, fmt.Errorf("tracing: sample ratio %v outside 0–1", o.Ratio)
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	exp, err := otlptracehttp.New(ctx,
		otlptracehttp.WithEndpointURL(strings.TrimRight(o.Endpoint, "/")+"/v1/traces"),
		otlptracehttp.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", o.Endpoint, err)
	}
	// The SDK reports export failures through the global handler; without
	// one they go to the standard logger, outside slog.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("trace export failed", "endpoint", o.Endpoint, "err", err)
	}))
	var bopts []sdktrace.BatchSpanProcessorOption
	if o.BatchTimeout > 0 {
		bopts = append(bopts, sdktrace.WithBatchTimeout(o.BatchTimeout))
	}
	return newTracer(sdktrace.NewBatchSpanProcessor(exp, bopts...), o), nil
}

// newTracer is the Tracer of o whose spans go to sp.
func newTracer(sp sdktrace.SpanProcessor, o Options) *Tracer {
	res := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName("moonji"), semconv.ServiceVersion(version()), semconv.ServiceInstanceID(o.Replica))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(sp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.Ratio))),
		sdktrace.WithResource(res),
	)
	return &Tracer{tp: tp, tracer: tp.Tracer("moonji/internal/tracing")}
}

// version is the gateway's module version as the build recorded it.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// Shutdown exports the spans still queued and stops the exporter; the
// server calls it once its requests have ended. A nil Tracer has nothing
// to flush.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flush spans: %w", err)
	}
	return nil
}

// ForceFlush exports the spans ended so far (tests and benchmarks).
func (t *Tracer) ForceFlush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.ForceFlush(ctx)
}

// carrier holds the two W3C trace-context headers of one request.
type carrier struct{ traceparent, tracestate string }

func (c *carrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.traceparent
	case "tracestate":
		return c.tracestate
	}
	return ""
}

func (c *carrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.traceparent = value
	case "tracestate":
		c.tracestate = value
	}
}

func (c *carrier) Keys() []string { return []string{"traceparent", "tracestate"} }

// maxHeader bounds the trace-context headers read from a client: a
// traceparent is 55 characters, and W3C bounds tracestate to 32 members.
const maxHeader = 512

// Start begins the server span of a request that arrived at start, for
// the API operation (a gen_ai.operation.name: chat, text_completion,
// embeddings), as the child of the client's traceparent when it sent a
// valid one (tracestate is kept with it). A malformed or oversized header
// is ignored: the span is a new trace's root. A nil Tracer returns nil.
func (t *Tracer) Start(traceparent, tracestate string, start time.Time, operation string) *Request {
	if t == nil {
		return nil
	}
	ctx := context.Background()
	if traceparent != "" && len(traceparent) <= maxHeader {
		if len(tracestate) > maxHeader {
			tracestate = ""
		}
		ctx = t.prop.Extract(ctx, &carrier{traceparent: traceparent, tracestate: tracestate})
	}
	ctx, span := t.tracer.Start(ctx, operation, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start),
		trace.WithAttributes(AttrOperation.String(operation)))
	return &Request{t: t, ctx: ctx, span: span, operation: operation}
}

// errNoAnswer marks a phase that ended without its work done.
var errNoAnswer = errors.New("ended before it was done")
