package tracing

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys: the OpenTelemetry GenAI semantic conventions' (the Go
// semconv packages do not define them yet) and Moonji's own.
const (
	AttrOperation     = attribute.Key("gen_ai.operation.name")
	AttrRequestModel  = attribute.Key("gen_ai.request.model")
	AttrResponseModel = attribute.Key("gen_ai.response.model")
	AttrInputTokens   = attribute.Key("gen_ai.usage.input_tokens")
	AttrOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")
	AttrStatusCode    = attribute.Key("http.response.status_code")
	AttrServerAddress = attribute.Key("server.address")
	AttrErrorType     = attribute.Key("error.type")

	AttrInferenceID = attribute.Key("moonji.inference_id")
	AttrOutcome     = attribute.Key("moonji.outcome")
	AttrReason      = attribute.Key("moonji.reason")
	AttrKeyID       = attribute.Key("moonji.key_id")
	AttrBackend     = attribute.Key("moonji.backend")
	AttrAPI         = attribute.Key("moonji.api")
	AttrSource      = attribute.Key("moonji.source")
	AttrUsageSource = attribute.Key("moonji.usage_source")
	AttrRetriedFrom = attribute.Key("moonji.retried_from")
	AttrQueueMs     = attribute.Key("moonji.queue_ms")
	AttrChunks      = attribute.Key("moonji.stream.chunks")
)

// Names of the phases' spans, children of the request's span.
const (
	SpanQueue  = "moonji.queue"
	SpanEngine = "moonji.engine"
	SpanStream = "moonji.stream"
)

// Request is the trace of one inference request: its server span and the
// phase (child span) open now. Its methods are called by the request's
// path, one at a time (the stream's relay goroutine takes over from the
// handler's); every method of a nil *Request does nothing.
type Request struct {
	t         *Tracer
	ctx       context.Context
	span      trace.Span
	operation string
	phase     trace.Span
	phaseName string
	ended     bool
}

// Recording tells whether the request is sampled.
func (r *Request) Recording() bool { return r != nil && r.span.IsRecording() }

// TraceID is the request's trace id in hex ("" when off).
func (r *Request) TraceID() string {
	if r == nil {
		return ""
	}
	return r.span.SpanContext().TraceID().String()
}

// SetModel names the request's span as the GenAI conventions do
// ("{operation} {model}") once the model is read from the body.
func (r *Request) SetModel(model string) {
	if r == nil || model == "" {
		return
	}
	r.span.SetName(r.operation + " " + model)
	r.span.SetAttributes(AttrRequestModel.String(model))
}

// BeginQueue opens the queue-wait phase: the request waits for a slot.
func (r *Request) BeginQueue(pool string) {
	if r == nil {
		return
	}
	r.begin(SpanQueue, trace.SpanKindInternal, AttrBackend.String(pool))
}

// EndQueue ends the queue-wait phase; backend is the slot's ("" when none
// was had: refused or left while waiting).
func (r *Request) EndQueue(backend string, waited time.Duration) {
	if r == nil || r.phaseName != SpanQueue {
		return
	}
	r.phase.SetAttributes(AttrQueueMs.Int64(waited.Milliseconds()))
	if backend == "" {
		r.phase.SetStatus(codes.Error, "no slot")
	} else {
		r.phase.SetAttributes(AttrBackend.String(backend))
	}
	r.endPhase()
}

// BeginEngine opens the engine call on backend (server: the engine's
// host:port, "" for an engine link) and returns the traceparent to send
// with it, naming this call's span as the parent of the engine's own. A
// previous engine call still open (a retry) ends as failed.
func (r *Request) BeginEngine(backend, server string) string {
	if r == nil {
		return ""
	}
	if r.phaseName == SpanEngine {
		r.phase.SetStatus(codes.Error, "retried on another backend")
	}
	r.begin(SpanEngine, trace.SpanKindClient, AttrBackend.String(backend))
	if server != "" {
		r.phase.SetAttributes(AttrServerAddress.String(server))
	}
	c := carrier{}
	r.t.prop.Inject(trace.ContextWithSpan(r.ctx, r.phase), &c)
	return c.traceparent
}

// EndEngine ends the engine call: its answer's status (0: none came) and,
// when it failed, why.
func (r *Request) EndEngine(status int, failure string) {
	if r == nil || r.phaseName != SpanEngine {
		return
	}
	if status != 0 {
		r.phase.SetAttributes(AttrStatusCode.Int(status))
	}
	if failure != "" || status >= 400 {
		if failure == "" {
			failure = strconv.Itoa(status)
		}
		r.phase.SetAttributes(AttrErrorType.String(failure))
		r.phase.SetStatus(codes.Error, failure)
	}
	r.endPhase()
}

// BeginStream opens the relay of the engine's stream to the client.
func (r *Request) BeginStream() {
	if r == nil {
		return
	}
	r.begin(SpanStream, trace.SpanKindInternal)
}

// EndStream ends the relay after chunks content chunks; firstToken, when
// not zero, is marked as an event.
func (r *Request) EndStream(chunks int, firstToken time.Time) {
	if r == nil || r.phaseName != SpanStream {
		return
	}
	if !firstToken.IsZero() {
		r.phase.AddEvent("first_token", trace.WithTimestamp(firstToken))
	}
	r.phase.SetAttributes(AttrChunks.Int(chunks))
	r.endPhase()
}

func (r *Request) begin(name string, kind trace.SpanKind, attrs ...attribute.KeyValue) {
	if r.phase != nil {
		r.endPhase()
	}
	_, r.phase = r.t.tracer.Start(r.ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	r.phaseName = name
}

func (r *Request) endPhase() {
	r.phase.End()
	r.phase, r.phaseName = nil, ""
}

// Ending is how a request ended, as its usage row says.
type Ending struct {
	InferenceID   string
	API           string
	Source        string
	Outcome       string
	Reason        string
	Status        int
	KeyID         *uint // the key's numeric id; never its secret
	Backend       string
	Model         string
	ResponseModel string
	RetriedFrom   string
	// InputTokens and OutputTokens are set when UsageKnown.
	InputTokens, OutputTokens int
	UsageKnown                bool
	UsageSource               string
	// Failed marks the span as an error (the request failed, not the
	// client who left or stopped it).
	Failed bool
}

// End ends the request's span (and a phase still open, as cut short) with
// the attributes of its ending, once: later calls do nothing.
func (r *Request) End(e Ending) {
	if r == nil || r.ended {
		return
	}
	r.ended = true
	if r.phase != nil {
		r.phase.SetStatus(codes.Error, errNoAnswer.Error())
		r.endPhase()
	}
	s := r.span
	if !s.IsRecording() {
		s.End()
		return
	}
	s.SetAttributes(AttrInferenceID.String(e.InferenceID), AttrOutcome.String(e.Outcome), AttrAPI.String(e.API))
	if e.Model != "" {
		s.SetName(r.operation + " " + e.Model)
		s.SetAttributes(AttrRequestModel.String(e.Model))
	}
	if e.Source != "" {
		s.SetAttributes(AttrSource.String(e.Source))
	}
	if e.Reason != "" {
		s.SetAttributes(AttrReason.String(e.Reason))
	}
	if e.Status != 0 {
		s.SetAttributes(AttrStatusCode.Int(e.Status))
	}
	if e.KeyID != nil {
		s.SetAttributes(AttrKeyID.Int64(int64(*e.KeyID)))
	}
	if e.Backend != "" {
		s.SetAttributes(AttrBackend.String(e.Backend))
	}
	if e.ResponseModel != "" {
		s.SetAttributes(AttrResponseModel.String(e.ResponseModel))
	}
	if e.RetriedFrom != "" {
		s.SetAttributes(AttrRetriedFrom.String(e.RetriedFrom))
	}
	if e.UsageKnown {
		s.SetAttributes(AttrInputTokens.Int(e.InputTokens), AttrOutputTokens.Int(e.OutputTokens))
	}
	if e.UsageSource != "" {
		s.SetAttributes(AttrUsageSource.String(e.UsageSource))
	}
	if e.Failed {
		reason := e.Reason
		if reason == "" {
			reason = e.Outcome
		}
		s.SetAttributes(AttrErrorType.String(reason))
		s.SetStatus(codes.Error, reason)
	}
	s.End()
}
