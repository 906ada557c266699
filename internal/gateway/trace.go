package gateway

import (
	"context"
	"net/http"
	"net/url"

	"moonji/internal/proxy"
	"moonji/internal/tracing"
	"moonji/models"
)

// Traces: the request's span (tracing.Request) begins when the gateway has
// the request and ends where its one usage row is queued — reject,
// recovered, exchange.record — so that every path that writes the row ends
// the span, and with the row's own values. Off, Call.span is nil and each
// call below is a nil check.

// Tracing tells whether requests are traced: handlers then pass the
// client's traceparent (Call.TraceParent).
func (g *Gateway) Tracing() bool { return g.tracer != nil }

// operation is the GenAI conventions' gen_ai.operation.name of api. The
// Responses API generates a chat turn.
func operation(api proxy.API) string {
	switch api {
	case proxy.APICompletions:
		return "text_completion"
	case proxy.APIEmbeddings:
		return "embeddings"
	}
	return "chat"
}

// traced gives call its span, if tracing is on and it has none yet.
func (g *Gateway) traced(call *Call) {
	if g.tracer == nil || call.span != nil {
		return
	}
	call.span = g.tracer.Start(call.TraceParent, call.TraceState, call.Start, operation(call.API))
	// What the client sent is not kept past the span's start.
	call.TraceParent, call.TraceState = "", ""
}

// endSpan ends call's span with what its usage row says.
func endSpan(span *tracing.Request, row *models.Usage, responseModel string) {
	if span == nil {
		return
	}
	e := tracing.Ending{
		InferenceID: row.InferenceID, API: row.API, Source: row.Source, Outcome: row.Outcome, Reason: row.Reason,
		Status: row.Status, KeyID: row.KeyID, Backend: row.Backend, Model: row.Model, ResponseModel: responseModel,
		RetriedFrom: row.RetriedFrom, UsageSource: row.UsageSource,
		Failed: row.Outcome == models.OutcomeError || row.Status >= http.StatusInternalServerError,
	}
	if row.UsageSource != "" && row.UsageSource != models.UsageNone {
		e.UsageKnown, e.InputTokens, e.OutputTokens = true, row.PromptTokens, row.CompletionTokens
	}
	span.End(e)
}

// beginEngine opens the span of the call to the exchange's backend and
// returns the traceparent for the engine ("" untraced).
func (x *exchange) beginEngine() string {
	span := x.call.span
	if span == nil {
		return ""
	}
	server := ""
	if x.backend.Link == nil {
		if u, err := url.Parse(x.backend.Upstream.BaseURL); err == nil {
			server = u.Host
		}
	}
	return span.BeginEngine(x.backend.Name, server)
}

// endEngine ends the engine call's span with its answer's status, or the
// error that came instead.
func (x *exchange) endEngine(resp *http.Response, err error) {
	if x.call.span == nil {
		return
	}
	status, failure := 0, ""
	if resp != nil {
		status = resp.StatusCode
	}
	if err != nil {
		failure = failureOf(context.Cause(x.ctx), err, x.backendName()).reason
	}
	x.call.span.EndEngine(status, failure)
}

// statusOf is an answer's status, 0 when none came.
func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}
