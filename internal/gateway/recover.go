package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
	"moonji/internal/proxy"
	"moonji/models"
)

// What an engine sends is input, and a bug is one request's: the process
// serves every user's streams, so neither may take it down.

// Recovered answers a request whose handler panicked before the gateway
// had it (authentication, reading its body): a 500 and its one row.
func (g *Gateway) Recovered(call Call, p any) *Response { return g.recovered(call, nil, p) }

// recovered answers a request whose serving panicked: it alone fails, with
// a 500 in OpenAI's shape and an error row (unless its row was already
// written, which then stays the one row).
func (g *Gateway) recovered(call Call, x *exchange, p any) *Response {
	g.log.Error("request panicked; it alone fails", "panic", fmt.Sprint(p), "inference_id", call.ID,
		"stack", string(debug.Stack()))
	g.metrics.Panics.Inc()
	const msg = "The gateway failed while serving this request."
	if x == nil {
		// Refused or failed before it had an exchange: its row is the
		// only thing it holds.
		row := g.row(call, "", "")
		row.Outcome, row.Status, row.Reason = models.OutcomeError, http.StatusInternalServerError, "internal_panic"
		row.UsageSource = models.UsageNone
		row.DurationMs = time.Since(call.Start).Milliseconds()
		call.endStop(row.Outcome)
		g.ledger.Record(row)
		g.traced(&call)
		endSpan(call.span, &row, "")
		return errorResponse(http.StatusInternalServerError, msg, "server_error", "internal_error", nil)
	}
	x.panicked()
	return x.reply(http.StatusInternalServerError, msg, "server_error", "internal_error")
}

// panicked ends an exchange that panicked wherever it was: everything it
// holds is freed (each step may run twice) and it gets its one row, an
// error, unless that was already queued. Its registration for Stop ends
// with the row's outcome, so that a stop just after it is answered with
// that outcome, as after any end.
func (x *exchange) panicked() {
	x.finished = true // nothing after this finishes it again
	x.release()
	if !x.recorded {
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, "internal_panic", http.StatusInternalServerError
		x.row.DurationMs = time.Since(x.call.Start).Milliseconds()
		x.row.Cost = x.route.cost(&x.row)
		x.record()
	}
	x.settle()
	if x.stopRun != nil {
		x.stopRun.EndWith(x.row.Outcome)
	}
}

// guardedStream is a relayed stream as the server pulls it, outside any
// handler: a panic while a frame is relayed ends this stream alone, with
// the API's error frames when its end had not been decided yet.
type guardedStream struct {
	s    *proxy.Stream
	x    *exchange
	body io.Closer // the engine's answer
	// tail, after a panic, is what is left to hand out before the end.
	tail   []byte
	failed bool
}

func (gs *guardedStream) Read(p []byte) (n int, err error) {
	if gs.failed {
		n = copy(p, gs.tail)
		gs.tail = gs.tail[n:]
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
	defer func() {
		if r := recover(); r != nil {
			gs.fail(r)
			n, err = 0, nil
		}
	}()
	return gs.s.Read(p)
}

// MidFrame reports whether the last Read handed out only part of a frame.
func (gs *guardedStream) MidFrame() bool {
	if gs.failed {
		return len(gs.tail) > 0
	}
	return gs.s.MidFrame()
}

func (gs *guardedStream) Close() (err error) {
	if gs.failed {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			gs.fail(r)
			err = nil
		}
	}()
	return gs.s.Close()
}

// fail ends the stream after a panic: the engine's answer is closed, the
// request freed and given its row; the client gets an error event unless
// the stream's closing bytes were already decided (then what it has is
// whole).
func (gs *guardedStream) fail(p any) {
	x := gs.x
	gs.failed = true
	x.g.log.Error("stream relay panicked; it alone fails", "panic", fmt.Sprint(p), "inference_id", x.call.ID,
		"stack", string(debug.Stack()))
	x.g.metrics.Panics.Inc()
	decided := x.finished
	_ = gs.body.Close()
	x.panicked()
	if !decided {
		seq := int64(0)
		if x.relay != nil {
			seq = x.relay.Seq + 1
		}
		gs.tail = proxy.ErrorFrames(x.req.API, seq, "The gateway failed while relaying this answer.", "server_error", "internal_error")
	}
}

// isJSONObject tells whether an engine's whole answer is a JSON object
// (jsonguard: bounded depth, no recursion), as every API's answer is.
func isJSONObject(data []byte) bool {
	t := bytes.TrimLeft(data, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && jsonguard.Validate(data, nil) == nil
}

// wholeUsage sets the row's tokens from a whole answer's usage object: the
// engine's counts when they can be true; when it sent counts that cannot
// (negative, fractional, absurd), an estimate of the prompt and of the
// answer's text; when it sent none, none.
func (x *exchange) wholeUsage(data []byte) {
	prompt, completion := "prompt_tokens", "completion_tokens"
	if x.up == proxy.APIResponses {
		prompt, completion = "input_tokens", "output_tokens"
	}
	v := gjson.GetBytes(data, "usage")
	if !v.Exists() || v.Type == gjson.Null {
		x.row.UsageSource = models.UsageNone
		return
	}
	if u, ok := proxy.ReadUsage(v, prompt, completion); ok {
		x.row.PromptTokens, x.row.CompletionTokens, x.row.CachedTokens = u.PromptTokens, u.CompletionTokens, u.CachedTokens
		x.row.UsageSource = models.UsageFromEngine
		return
	}
	x.badUsage(proxy.UsageText(v.Raw))
	x.row.CompletionTokens = proxy.EstimateCompletionTokensFor(x.up, data)
	x.row.UsageSource = models.UsageNone
	x.estimatePrompt()
}

// badUsage logs usage counts an engine sent that cannot be true.
func (x *exchange) badUsage(raw string) {
	x.g.log.Warn("backend reported token counts that cannot be true; counting and estimating instead",
		"backend", x.backendName(), "usage", raw, "inference_id", x.call.ID)
}
