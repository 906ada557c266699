package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"moonji/internal/admission"
	"moonji/internal/proxy"
	"moonji/internal/responses"
	"moonji/models"
)

// Outcomes: how a request ends — its outcome and reason, the bytes that
// close a stream cut short, the answer to a failure — and its one final
// row.

// Cancellation causes, told apart when the upstream call ends early.
var (
	errClientLeft     = errors.New("client disconnected")
	errClientStalled  = errors.New("client stopped reading")
	errStopped        = errors.New("stopped by request")
	errPersonDisabled = errors.New("the person's access was withdrawn")
)

// Reject answers a request refused before it reached a backend (bad key, bad
// body, unknown model, limits), leaving its rejected ledger row.
func (g *Gateway) Reject(call Call, model string, status int, reason, message, typ, code string, hdr http.Header) *Response {
	return g.reject(call, model, status, reason, apiError{message: message, typ: typ, code: code}, hdr)
}

func (g *Gateway) reject(call Call, model string, status int, reason string, e apiError, hdr http.Header) *Response {
	row := g.row(call, model, "")
	row.Outcome = models.OutcomeRejected
	row.Status = status
	row.Reason = reason
	row.UsageSource = models.UsageNone
	row.DurationMs = time.Since(call.Start).Milliseconds()
	g.count(model, models.OutcomeRejected)
	g.metrics.Rejections.WithLabelValues(reason).Inc()
	call.endStop(row.Outcome)
	// The row last: a panic before it leaves the request without one,
	// which recovered then writes, never two.
	g.ledger.Record(row)
	g.traced(&call) // refused before Serve (a bad key, a body too large)
	endSpan(call.span, &row, "")
	return e.response(status, hdr)
}

func (g *Gateway) row(call Call, model, backend string) models.Usage {
	p := call.Principal
	row := models.Usage{
		InferenceID: call.ID, CreatedAt: call.Start.UTC(), User: p.Email, KeyID: p.KeyID,
		Source: p.Source, Model: model, Backend: backend, Replica: g.replica, API: call.API.String(),
	}
	if p.UserID != 0 {
		uid := p.UserID
		row.UserID = &uid
	}
	return row
}

func (g *Gateway) count(model, outcome string) {
	if _, ok := g.tab.Load().routes[model]; !ok {
		model = "unknown"
	}
	g.metrics.Model(model).Requests(outcome).Inc()
}

// personDisabledMessage answers a request whose person was disabled while
// it ran.
const personDisabledMessage = "Your access was withdrawn by an administrator while this request ran."

// closing decides the outcome of a relayed stream and returns the bytes
// that end it for the client.
func (x *exchange) closing(res *proxy.RelayResult) []byte {
	out := x.closingFrames(res)
	if x.tr == nil {
		return out
	}
	// A translated stream: the outcome is decided as for chat, and the
	// translation writes its own end.
	reason, end := translatedEnd(x.row.Outcome, x.row.Reason, res.ClientErr != nil, res.EngineError != "")
	if !end {
		return nil
	}
	if x.row.Outcome == models.OutcomeStopped {
		x.tr.SetUsage(x.row.PromptTokens, x.row.CompletionTokens)
	}
	return x.tr.End(reason)
}

// closingFrames decides the outcome of a relayed stream and returns the
// bytes that end it for the client.
func (x *exchange) closingFrames(res *proxy.RelayResult) []byte {
	x.row.Status = http.StatusOK
	if x.req.API == proxy.APIResponses {
		x.row.ResponseID = res.ID
		if x.translate || res.ID == "" {
			x.row.ResponseID = x.answerID()
		}
	}
	x.row.CompletionTokens = res.ContentChunks
	x.row.UsageSource = models.UsageFromCounted
	if res.HasUsage {
		x.row.PromptTokens, x.row.CachedTokens = res.Usage.PromptTokens, res.Usage.CachedTokens
		if res.Done {
			x.row.CompletionTokens = res.Usage.CompletionTokens
			x.row.UsageSource = models.UsageFromEngine
		}
	}
	if res.BadUsage != "" {
		x.badUsage(res.BadUsage)
		if !res.HasUsage {
			x.estimatePrompt() // the completion is counted from the chunks
		}
	}
	cause := context.Cause(x.ctx)
	if res.ClientErr != nil && cause == nil {
		cause = x.clientErrCause()
		x.cancel(cause)
	}
	e := streamEndingOf(x.req.API, res, cause, errors.Is(x.ctx.Err(), context.DeadlineExceeded))
	x.row.Outcome, x.row.Reason = e.outcome, e.reason
	switch e.close {
	case closeDone:
		return proxy.DoneFrame
	case closeStopped:
		return x.stoppedEnding(res)
	case closeError:
		return proxy.ErrorFrames(x.req.API, res.Seq+1, e.message, e.typ, e.reason)
	}
	return nil
}

// streamClose is what the gateway writes to end a relayed stream.
type streamClose int

const (
	closeNothing streamClose = iota // the stream is whole, or nobody is left to read more
	closeDone                       // [DONE], after the engine's own error event
	closeStopped                    // a complete stream's end (stoppedEnding)
	closeError                      // the API's error event, its code the reason
)

// streamEnding is how a relayed stream ended: its row's outcome and reason,
// and what closes it for the client (for closeError, the error's message
// and type).
type streamEnding struct {
	outcome, reason string
	close           streamClose
	message, typ    string
}

// streamEndingOf decides how a relayed stream of api ended, from what the
// relay saw (res) and why the request's context ended (cause, nil while it
// runs; timedOut: its own timeout passed). The first that applies decides:
// the engine's error event, its [DONE], a stop, the client not reading,
// the person's access withdrawn, the timeout, the client gone, the
// engine's link lost, the engine's stream cut. Nothing is written to a
// client that is gone.
func streamEndingOf(api proxy.API, res *proxy.RelayResult, cause error, timedOut bool) streamEnding {
	clientGone := res.ClientErr != nil
	failed := func(outcome, reason, message, typ string) streamEnding {
		e := streamEnding{outcome: outcome, reason: reason, close: closeError, message: message, typ: typ}
		if clientGone {
			e.close = closeNothing
		}
		return e
	}
	switch {
	case res.EngineError != "":
		// The engine reported an error inside its 200 stream; the client's
		// SDK raises it, so the request failed whatever came after.
		e := streamEnding{outcome: models.OutcomeError, reason: "upstream_stream_error"}
		if !res.Done && !clientGone && api != proxy.APIResponses {
			e.close = closeDone
		}
		return e
	case res.Done:
		return streamEnding{outcome: models.OutcomeSuccess}
	case res.Stopped || errors.Is(cause, errStopped):
		return streamEnding{outcome: models.OutcomeStopped, reason: "stop_requested", close: closeStopped}
	case errors.Is(cause, errClientStalled):
		return streamEnding{outcome: models.OutcomeCancelled, reason: "client_stalled"}
	case errors.Is(cause, errPersonDisabled):
		return failed(models.OutcomeCancelled, "person_disabled", personDisabledMessage, "invalid_request_error")
	case errors.Is(cause, context.DeadlineExceeded) || timedOut:
		return failed(models.OutcomeError, "upstream_timeout", "The backend took too long to answer.", "upstream_error")
	case clientGone || errors.Is(cause, errClientLeft):
		return streamEnding{outcome: models.OutcomeCancelled, reason: "client_disconnected"}
	case errors.Is(res.UpstreamErr, proxy.ErrEngineDisconnected):
		return failed(models.OutcomeError, "engine_disconnected", "The engine's connection was lost before the stream was complete.", "upstream_error")
	default:
		return failed(models.OutcomeError, "upstream_disconnected", "The backend closed the stream before it was complete.", "upstream_error")
	}
}

// translatedEnd tells how a stream translated to Responses events ends
// once its chat stream ended with outcome and reason: with the
// translation's own end for reason (end), or with nothing more (the
// translation ended it, or nobody is left to read).
func translatedEnd(outcome, reason string, clientGone, engineError bool) (endReason string, end bool) {
	switch {
	case outcome == models.OutcomeStopped:
		return responses.Stopped, true
	case reason == "person_disabled" && !clientGone:
		return personDisabledMessage, true
	case outcome == models.OutcomeSuccess, outcome == models.OutcomeCancelled, clientGone, engineError:
		return "", false
	default:
		return reason, true
	}
}

// stoppedEnding closes a stopped stream as a complete one: a chunk giving
// every unfinished choice its finish_reason, the usage chunk if the client
// asked for one, then [DONE] — so that SDK helpers that assemble the whole
// completion (openai-node's finalChatCompletion, the AI SDK's streamText)
// end cleanly. The usage counts what was generated and delivered; what the
// person saw (seen) decides only what a saved answer keeps.
func (x *exchange) stoppedEnding(res *proxy.RelayResult) []byte {
	x.row.UsageSource = models.UsageFromCounted
	id, model, created := res.ID, res.Model, res.Created
	if id == "" {
		id, created = x.answerID(), x.call.Start.Unix()
	}
	if model == "" {
		model = x.req.Model
	}
	wantUsage := x.req.ClientWantsUsage || x.req.API == proxy.APIResponses
	if wantUsage {
		x.estimatePrompt()
	}
	return proxy.StopFrames(x.req.API, res, id, model, created, res.Unfinished(x.choices()), wantUsage,
		proxy.Usage{PromptTokens: x.row.PromptTokens, CompletionTokens: x.row.CompletionTokens})
}

// estimatePrompt fills in the prompt's token count when the engine may have
// read the prompt but never said how long it was (a stream cut short, a
// request stopped before its answer): billing must not count it as free.
func (x *exchange) estimatePrompt() {
	if !x.sent || x.row.PromptTokens > 0 || x.row.UsageSource == models.UsageFromEngine {
		return
	}
	x.row.PromptTokens = proxy.EstimatePromptTokensFor(x.req.API, x.call.Body)
	x.row.UsageSource = models.UsageEstimated
}

func (x *exchange) admissionFailed(err error) *Response {
	var rej *admission.Rejected
	if errors.As(err, &rej) {
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeRejected, rej.Reason, http.StatusServiceUnavailable
		x.row.UsageSource = models.UsageNone
		x.row.QueueMs = rej.Waited.Milliseconds()
		x.header().Set("Retry-After", strconv.Itoa(rej.RetryAfterSeconds()))
		x.g.metrics.Rejections.WithLabelValues(rej.Reason).Inc()
		x.finish()
		who := "Backend " + x.route.Pool.Name() + " is"
		if len(x.route.Backends) > 1 {
			who = "Every backend of model " + x.route.Model + " is"
		}
		msg := fmt.Sprintf("%s at capacity (%s). Retry after %ds.", who, strings.ReplaceAll(rej.Reason, "_", " "), rej.RetryAfterSeconds())
		return x.reply(http.StatusServiceUnavailable, msg, "server_error", rej.Reason)
	}
	return x.upstreamFailed(err)
}

// upstreamFailed ends a request whose engine call failed or was cut short
// before any answer was relayed.
func (x *exchange) upstreamFailed(err error) *Response {
	f := failureOf(context.Cause(x.ctx), err, x.backendName())
	x.row.Outcome, x.row.Reason, x.row.Status = f.outcome, f.reason, f.status
	x.row.UsageSource = models.UsageNone
	if f.billPrompt {
		x.estimatePrompt()
	}
	if f.retryAfter != "" {
		x.header().Set("Retry-After", f.retryAfter)
	}
	if f.outcome == models.OutcomeRejected {
		x.g.metrics.Rejections.WithLabelValues(f.reason).Inc()
	}
	x.finish()
	if f.warn != "" {
		x.g.log.Warn(f.warn, "backend", x.backendName(), "err", err, "inference_id", x.call.ID)
	}
	if f.outcome == models.OutcomeStopped {
		return x.stoppedBeforeAnswer()
	}
	return x.reply(f.status, f.message, f.typ, f.code)
}

// failure is how a request ends that got no answer to relay: its row's
// outcome, reason and status, and the error the client gets. billPrompt:
// the engine may have read the prompt, which is billed; retryAfter: the
// Retry-After header's value, if any; warn: the line logged, if any.
type failure struct {
	outcome, reason    string
	status             int
	message, typ, code string
	billPrompt         bool
	retryAfter         string
	warn               string
}

// failureOf decides how a request ends whose call to backend failed (err)
// or was cut short (cause: why its context ended, nil if it did not)
// before any answer was relayed. Why the context ended comes first: a
// stop (answered as if the engine had said nothing, stoppedBeforeAnswer),
// the client gone, the person's access withdrawn, the timeout; then what
// the call met: the engine not connected, the backend unreachable, its
// answer failing.
func failureOf(cause, err error, backend string) failure {
	var ue *proxy.UpstreamError
	switch {
	case errors.Is(cause, errStopped):
		return failure{outcome: models.OutcomeStopped, reason: "stop_requested", status: 499, billPrompt: true}
	case errors.Is(cause, errClientLeft):
		return failure{outcome: models.OutcomeCancelled, reason: "client_disconnected", status: 499, billPrompt: true,
			message: "The client closed the request.", typ: "invalid_request_error", code: "client_closed_request"}
	case errors.Is(cause, errPersonDisabled):
		return failure{outcome: models.OutcomeCancelled, reason: "person_disabled", status: http.StatusForbidden, billPrompt: true,
			message: personDisabledMessage, typ: "invalid_request_error", code: "person_disabled"}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(cause, context.DeadlineExceeded):
		return failure{outcome: models.OutcomeError, reason: "upstream_timeout", status: http.StatusGatewayTimeout,
			message: fmt.Sprintf("Backend %s did not answer in time.", backend), typ: "server_error", code: "upstream_timeout"}
	case errors.Is(err, proxy.ErrEngineUnavailable):
		// Never sent: the engine was away and its link's queue was full or
		// the request outwaited its TTL. Like a full admission queue, a
		// refusal to retry later.
		return failure{outcome: models.OutcomeRejected, reason: "engine_unavailable", status: http.StatusServiceUnavailable,
			message: fmt.Sprintf("Backend %s is not connected. Retry after 1s.", backend), typ: "server_error", code: "engine_unavailable",
			retryAfter: "1", warn: "engine not connected: request refused"}
	case errors.As(err, &ue):
		reason := "upstream_unreachable"
		switch {
		case errors.Is(err, proxy.ErrEngineDisconnected):
			reason = "engine_disconnected"
		case ue.Status == http.StatusGatewayTimeout:
			reason = "upstream_timeout"
		}
		return failure{outcome: models.OutcomeError, reason: reason, status: ue.Status,
			message: fmt.Sprintf("Backend %s is unreachable.", backend), typ: "server_error", code: reason, warn: "backend unreachable"}
	default:
		return failure{outcome: models.OutcomeError, reason: "upstream_read_failed", status: http.StatusBadGateway,
			message: fmt.Sprintf("Backend %s failed while answering.", backend), typ: "server_error", code: "upstream_read_failed",
			warn: "backend answer failed"}
	}
}

// answerEnding decides how a request ends whose engine answered it whole
// with status (a 200's body being the API's JSON), given why its context
// ended meanwhile (cause): the engine's status decides, unless the client
// left (the answer came too late: cancelled) or the person's access was
// withdrawn (cancelled, and a 403 instead of the answer).
func answerEnding(status int, cause error) (outcome, reason string, rowStatus int) {
	outcome, rowStatus = models.OutcomeSuccess, status
	if status != http.StatusOK {
		outcome, reason = models.OutcomeError, "upstream_"+strconv.Itoa(status)
	}
	switch {
	case errors.Is(cause, errClientLeft):
		outcome, reason = models.OutcomeCancelled, "client_disconnected"
	case errors.Is(cause, errPersonDisabled):
		outcome, reason, rowStatus = models.OutcomeCancelled, "person_disabled", http.StatusForbidden
	}
	return outcome, reason, rowStatus
}

// stoppedBeforeAnswer answers a request stopped before the engine said
// anything: a stream gets a well-formed stream with one closing chunk, a
// plain request an empty completion, so clients end normally.
func (x *exchange) stoppedBeforeAnswer() *Response {
	id, created := x.answerID(), x.call.Start.Unix()
	u := proxy.Usage{PromptTokens: x.row.PromptTokens, CompletionTokens: x.row.CompletionTokens}
	if x.req.Stream {
		wantUsage := x.req.ClientWantsUsage || x.req.API == proxy.APIResponses
		var b []byte
		if x.req.API == proxy.APIResponses {
			// The stream never began: it opens and closes at once.
			b = proxy.ResponseCreated(id, x.req.Model, created)
			b = append(b, proxy.StopFrames(x.req.API, &proxy.RelayResult{}, id, x.req.Model, created, nil, true, u)...)
		} else {
			b = proxy.StopFrames(x.req.API, &proxy.RelayResult{}, id, x.req.Model, created,
				(&proxy.RelayResult{}).Unfinished(x.choices()), wantUsage, u)
		}
		return &Response{Status: http.StatusOK, ContentType: "text/event-stream; charset=utf-8", Header: x.streamHeader(),
			BodyStream: io.NopCloser(bytes.NewReader(b))}
	}
	var body string
	switch x.req.API {
	case proxy.APIEmbeddings:
		return x.reply(499, "The request was stopped before the engine answered.", "invalid_request_error", "stopped")
	case proxy.APIResponses:
		body = fmt.Sprintf(`{"id":%q,"object":"response","created_at":%d,"status":"incomplete","incomplete_details":{"reason":"stopped"},"error":null,"model":%q,"output":[],"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":0},"output_tokens":0,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}`,
			id, created, x.req.Model, u.PromptTokens, u.PromptTokens)
	default:
		// One empty choice for each of the n asked for: a client reads them by index.
		object, empty := "chat.completion", `"message":{"role":"assistant","content":""}`
		if x.req.API == proxy.APICompletions {
			object, empty = "text_completion", `"text":"","logprobs":null`
		}
		choices := make([]string, x.choices())
		for i := range choices {
			choices[i] = `{"index":` + strconv.Itoa(i) + `,` + empty + `,"finish_reason":"stop"}`
		}
		body = fmt.Sprintf(`{"id":%q,"object":%q,"created":%d,"model":%q,"choices":[%s],"usage":{"prompt_tokens":%d,"completion_tokens":0,"total_tokens":%d}}`,
			id, object, created, x.req.Model, strings.Join(choices, ","), u.PromptTokens, u.PromptTokens)
	}
	return &Response{Status: http.StatusOK, ContentType: "application/json", Header: x.header(), Body: []byte(body)}
}

func (x *exchange) internalError(err error) *Response {
	x.g.log.Error("request failed inside the gateway", "err", err, "inference_id", x.call.ID)
	x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, "internal_error", http.StatusInternalServerError
	x.row.UsageSource = models.UsageNone
	x.finish()
	return x.reply(http.StatusInternalServerError, "The gateway could not record this request.", "server_error", "internal_error")
}

func (x *exchange) reply(status int, message, typ, code string) *Response {
	if x.begun != nil {
		<-x.begun
		x.begun = nil
	}
	return errorResponse(status, message, typ, code, x.header())
}

// finish releases everything the request held and queues its final row.
// It runs exactly once per admitted request.
func (x *exchange) finish() {
	if x.finished {
		return
	}
	x.finished = true
	end := time.Now()
	x.release()
	if x.row.Outcome == models.OutcomeStopped || x.row.Outcome == models.OutcomeCancelled {
		x.estimatePrompt()
	}
	g, row := x.g, &x.row
	mm := g.metrics.Model(row.Model)
	row.DurationMs = end.Sub(x.call.Start).Milliseconds()
	if !x.firstTok.IsZero() {
		ttft := x.firstTok.Sub(x.call.Start)
		ms := ttft.Milliseconds()
		row.TTFTMs = &ms
		mm.TTFT.Observe(ttft.Seconds())
		if row.CompletionTokens > 1 {
			if decode := end.Sub(x.firstTok).Seconds(); decode > 0 {
				mm.DecodeSpeed.Observe(float64(row.CompletionTokens-1) / decode)
			}
		}
	}
	if x.tokens != nil {
		x.tokens.Reconcile(context.Background(), row.PromptTokens+row.CompletionTokens)
	}
	row.Cost = x.route.cost(row)
	x.settle()
	x.record()
	if x.call.OnEnd != nil {
		end := End{Row: *row}
		if x.stopRun != nil {
			end.Seen, end.SeenOK = x.stopRun.Seen()
		}
		x.call.OnEnd(end)
	}
	if x.stopRun != nil {
		if row.Outcome == models.OutcomeStopped {
			x.stopRun.Ack()
		}
		x.stopRun.EndWith(row.Outcome)
	}
	g.count(row.Model, row.Outcome)
	mm.Duration.Observe(end.Sub(x.call.Start).Seconds())
	// A counter panics on a negative value; no count here can be one, but
	// a mistake must not take the process down with it.
	mm.PromptTokens.Add(float64(max(row.PromptTokens, 0)))
	mm.CompletionTokens.Add(float64(max(row.CompletionTokens, 0)))
}

// release frees what the request holds — its registration by response id,
// the watch on its client, its slot, its context — and may run more than
// once.
func (x *exchange) release() {
	if x.responseID != "" {
		x.g.running.Delete(x.responseID)
	}
	x.watch.Stop()
	if x.slot != nil {
		x.slot.Release()
	}
	if !x.routeLet {
		x.routeLet = true
		x.route.users.Add(-1)
	}
	if x.untrack != nil {
		x.untrack()
	}
	x.cancel(nil)
}

// record queues the request's final row, once.
func (x *exchange) record() {
	if x.recorded {
		return
	}
	x.recorded = true
	if x.hasBegun {
		x.g.ledger.Finish(x.row)
	} else {
		x.g.ledger.Record(x.row)
	}
	endSpan(x.call.span, &x.row, x.responseModel)
}
