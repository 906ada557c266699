package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/admission"
	"moonji/internal/budget"
	"moonji/internal/connwatch"
	"moonji/internal/keepalive"
	"moonji/internal/proxy"
	"moonji/internal/ratelimit"
	"moonji/internal/responses"
	"moonji/internal/stop"
	"moonji/models"
)

// The exchange with the engine: the request sent on the slot's backend,
// and its answer relayed, whole or as a stream.

// exchange is one admitted request on its way through a backend.
type exchange struct {
	g     *Gateway
	call  Call
	req   proxy.Request
	route *Route
	// up is the API the engine is asked for: the client's own, or chat
	// when a Responses request is translated (translate), tr then turning
	// the chat stream into Responses events.
	up        proxy.API
	translate bool
	tr        *responses.Stream
	// relay is the stream's result while it is relayed; responseID the
	// engine's response id registered in Gateway.running.
	relay      *proxy.RelayResult
	responseID string
	// backend is the backend of the slot the request holds.
	backend *Backend
	hdr     http.Header
	tokens  *ratelimit.Reservation
	// budget is what the request holds against its budgets, settled with
	// its cost at finish.
	budget *budget.Reservation
	row    models.Usage
	// responseModel is the model the engine's answer names (traces).
	responseModel string
	// begun receives the result of the pending row's write; start sets it.
	// A request refused before it ever waited has no pending row: its one
	// row is written final (Record) at finish.
	begun    <-chan error
	hasBegun bool
	queuedAt time.Time

	ctx      context.Context
	cancel   context.CancelCauseFunc
	watch    *connwatch.Watcher
	untrack  func() // ends the request's place among its person's (Gateway.people)
	slot     *admission.Slot
	stopRun  *stop.Run
	firstTok time.Time
	finished bool
	// routeLet is set once the request gave back its count on route.
	routeLet bool
	// recorded is set once the final row is queued: a request that
	// panicked after it keeps that row (recovered).
	recorded bool
	// sent is set once the body went to the engine: from then on the engine
	// may have read the prompt, and a request cut short is billed for it.
	sent bool
	// writeDeadline is the client connection's write deadline while a
	// stream is relayed; deadlineIsTimeout tells that it is the request's
	// own timeout rather than the stall limit.
	writeDeadline     time.Time
	deadlineSet       time.Time
	deadlineIsTimeout bool
}

func (x *exchange) run(body []byte) *Response {
	g := x.g
	x.ctx, x.cancel = context.WithCancelCause(context.Background())
	if t := x.route.Timeout; t > 0 {
		var cancelT context.CancelFunc
		x.ctx, cancelT = context.WithTimeout(x.ctx, t)
		_ = cancelT // released by x.cancel: the timeout context is a child
	}
	if x.stopRun != nil {
		// Registered by the caller before the id was out (Call.Stop):
		// watched from here, so that a stop that came first ends the
		// request before it takes a slot.
		x.stopRun.Watch(func() { x.cancel(errStopped) })
	}
	// Everything a request needs while it waits or runs — its pending row,
	// the watch on its client, its registration for Stop — is set up when
	// it starts to wait in the queue or once it holds its slot. A request
	// refused at once needs none of it.
	x.call.span.BeginQueue(x.route.Pool.Name())
	slot, err := x.route.Pool.Acquire(x.ctx, admission.AcquireOptions{Queued: x.start})
	if err != nil {
		if x.hasBegun {
			// It waited in the queue until it was refused or left.
			x.row.QueueMs = time.Since(x.queuedAt).Milliseconds()
		}
		x.call.span.EndQueue("", time.Duration(x.row.QueueMs)*time.Millisecond)
		return x.admissionFailed(err)
	}
	x.take(slot) // before start: a pending row names the backend it runs on
	for {
		x.sent = true
		var resp *http.Response
		written := false
		traceparent := x.beginEngine()
		if link := x.backend.Link; link != nil {
			x.start()
			written = true // handed to the link, which sends it or fails it
			model := gjson.GetBytes(body, "model").String()
			resp, err = link.ChatCompletions(x.ctx, x.call.ID, model, body, traceparent)
		} else {
			// The request is started once the engine has it: its row,
			// watch and Stop registration run while the engine works
			// rather than before, so that they do not delay a stream's
			// first byte. They are in place before the answer is read, so
			// before the client can see the inference id.
			resp, err = g.client.PostSentTraced(x.ctx, x.backend.Upstream, x.up, body, traceparent, func() {
				written = true
				x.start()
			})
		}
		x.start() // a request that could not be written is started all the same: its row
		if err != nil {
			x.silentPastTimeout(written)
		}
		if reason := x.failedBeforeAnswer(resp, err); reason != "" {
			if x.call.span != nil {
				x.call.span.EndEngine(statusOf(resp), reason)
			}
			retried, refused := x.retry(reason, resp)
			if refused != nil {
				return refused // the retry got no slot
			}
			if retried {
				continue
			}
		}
		if err != nil {
			x.endEngine(nil, err)
			return x.upstreamFailed(err)
		}
		ct := resp.Header.Get("Content-Type")
		if resp.StatusCode == http.StatusOK && x.req.Stream && strings.HasPrefix(ct, "text/event-stream") {
			if err := x.waitBegun(); err != nil {
				resp.Body.Close()
				return x.internalError(err)
			}
			// From here the server writes the answer: its bytes, not a
			// probe, tell a half-closed client that still reads from one
			// that left.
			x.watch.StopProbing()
			// An open stream holds its exchange for as long as it runs:
			// the engine's headers are read, so they go now.
			resp.Header = nil
			if x.call.span != nil {
				x.call.span.EndEngine(resp.StatusCode, "")
				x.call.span.BeginStream()
			}
			ready := frameBuffered(resp.Body)
			return &Response{Status: http.StatusOK, ContentType: ct, Header: x.streamHeader(),
				BodyStream: x.keptAlive(&guardedStream{s: x.stream(resp), x: x, body: resp.Body}), HeaderWithFirstFrame: ready}
		}
		return x.whole(resp)
	}
}

// keptAlive gives a stream to a client on a socket its keep-alive comments
// while the engine is silent. A client that left while the engine was
// silent is noticed when a comment cannot be written: the engine's read is
// then ended as for any client that left.
func (x *exchange) keptAlive(gs *guardedStream) io.ReadCloser {
	if x.g.keepalive <= 0 || x.call.Conn == nil {
		return gs // the chat reads its replies itself, and has its own
	}
	var armWrite func()
	if x.g.stall > 0 {
		// The comment's own write deadline, on the connection alone: the
		// relay's goroutine may be arming one for a frame (armWriteDeadline)
		// at the same moment, and both are "now + stall".
		conn, stall := x.call.Conn, x.g.stall
		armWrite = func() { _ = conn.SetWriteDeadline(time.Now().Add(stall)) }
	}
	return keepalive.New(gs, x.g.keepalive, func() { x.cancel(errClientLeft) }, armWrite)
}

// frameBuffered tells whether an engine's answer body already holds its
// first whole event (proxy's engine connections know; other bodies say no).
func frameBuffered(body io.Reader) bool {
	b, ok := body.(interface{ FrameBuffered() bool })
	return ok && b.FrameBuffered()
}

// backendName names the backend of the request's slot, or its pool while
// it holds none.
func (x *exchange) backendName() string {
	if x.backend != nil {
		return x.backend.Name
	}
	return x.route.Pool.Name()
}

// streamHeader hands the exchange's header to the stream's response: the
// answer has started, so nothing adds to it after this, and an open stream
// should not keep it (the server has copied it by the time it reads the
// body). A reply written after that gets a header of its own (header).
func (x *exchange) streamHeader() http.Header {
	h := x.header()
	x.hdr = nil
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx in front must not buffer the stream
	return h
}

// header is the header of the exchange's response.
func (x *exchange) header() http.Header {
	if x.hdr == nil {
		x.hdr = http.Header{}
	}
	return x.hdr
}

// waitBegun waits for the pending row, so that the inference id the client
// is about to see always has its row (and a crash leaves a closable one).
func (x *exchange) waitBegun() error {
	if x.begun == nil {
		return nil
	}
	err := <-x.begun
	x.begun = nil
	if err != nil {
		return fmt.Errorf("write usage row: %w", err)
	}
	return nil
}

// whole relays a non-streamed answer (or any error answer) in one piece.
func (x *exchange) whole(resp *http.Response) *Response {
	data, err := readAnswer(resp)
	// Closed now, not deferred: the exchange's context ends before this
	// returns, and a body closed after that cannot give its connection
	// back for reuse.
	resp.Body.Close()
	if x.call.span != nil {
		x.endEngine(resp, err)
		if err == nil && resp.StatusCode == http.StatusOK {
			x.responseModel = gjson.GetBytes(data, "model").Str
		}
	}
	if err != nil {
		if context.Cause(x.ctx) == nil {
			x.backendFailed("the answer broke off")
		}
		return x.upstreamFailed(err)
	}
	if perr := x.waitBegun(); perr != nil {
		return x.internalError(perr)
	}
	if resp.StatusCode == http.StatusOK {
		if !isJSONObject(data) {
			// Not the API's answer (an HTML page, a torn body): the
			// client's SDK could not read it either.
			x.g.log.Warn("backend answered 200 with a body that is not a JSON object", "backend", x.backendName(),
				"bytes", len(data), "inference_id", x.call.ID)
			x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, "upstream_unreadable", http.StatusBadGateway
			x.row.UsageSource = models.UsageNone
			x.finish()
			return x.reply(http.StatusBadGateway, fmt.Sprintf("Backend %s answered with a body that is not the API's JSON.", x.backendName()), "server_error", "upstream_unreadable")
		}
		if x.req.API == proxy.APIResponses {
			x.row.ResponseID = gjson.GetBytes(data, "id").Str
			if x.translate {
				x.row.ResponseID = x.answerID()
			}
		}
		x.wholeUsage(data)
	} else {
		x.row.UsageSource = models.UsageNone
	}
	x.row.Outcome, x.row.Reason, x.row.Status = answerEnding(resp.StatusCode, context.Cause(x.ctx))
	if x.row.Reason == "person_disabled" {
		// The answer came, but its person lost their access meanwhile.
		x.finish()
		return x.reply(http.StatusForbidden, personDisabledMessage, "invalid_request_error", "person_disabled")
	}
	if x.translate && resp.StatusCode == http.StatusOK {
		out, err := responses.FromChat(x.call.Body, data, x.answerID(), x.call.Start.Unix())
		if err != nil {
			x.g.log.Warn("backend answer could not be translated to a response", "backend", x.backendName(), "err", err, "inference_id", x.call.ID)
			x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, "upstream_unreadable", http.StatusBadGateway
			x.finish()
			return x.reply(http.StatusBadGateway, fmt.Sprintf("Backend %s answered with a chat completion that could not be read.", x.backendName()), "server_error", "upstream_unreadable")
		}
		data = out
	}
	x.finish()
	ct := resp.Header.Get("Content-Type")
	if ct == "" || x.translate {
		ct = "application/json"
	}
	return &Response{Status: resp.StatusCode, ContentType: ct, Header: x.header(), Body: data}
}

// maxAnswer bounds a non-streamed answer read from an engine.
const maxAnswer = 64 << 20

// readAnswer reads a non-streamed answer's body, at most maxAnswer bytes.
// One of a known length is read into a buffer of that size: io.ReadAll
// starts at 512 bytes and grows, leaving each smaller buffer to the
// collector, for every request.
func readAnswer(resp *http.Response) ([]byte, error) {
	if n := resp.ContentLength; n >= 0 && n <= maxAnswer {
		data := make([]byte, n)
		_, err := io.ReadFull(resp.Body, data)
		return data, err
	}
	return io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
}

// stream relays the engine's SSE answer to the client. The server pulls
// frames from it; the request is finished once the closing bytes have been
// written to the client's socket (or the client has gone), so that a stop is
// acknowledged only when nothing more can follow it.
func (x *exchange) stream(resp *http.Response) *proxy.Stream {
	opts := proxy.RelayOptions{
		API: x.up,
		// A Responses stream's usage is part of its last event.
		StripUsage: !x.req.ClientWantsUsage && x.req.API != proxy.APIResponses,
		OnContent: func(n int) {
			if n == 1 {
				x.firstTok = time.Now()
				x.registerResponse()
			}
		},
	}
	if x.stopRun != nil {
		opts.Stopped = x.stopRun.Stopped
	}
	if x.call.Conn != nil && x.g.stall > 0 {
		opts.BeforeWrite = x.armWriteDeadline
	}
	if x.translate {
		// The translation reads the chat stream's usage chunk itself.
		x.tr = responses.NewStream(x.call.Body, x.answerID(), x.call.Start.Unix())
		opts.Transform = x.tr.Frame
	}
	// A stream keeps this buffer while it is open. 1 KiB holds a common
	// frame or two; the relay copies each frame out of it anyway, so a
	// larger frame only takes more fills.
	s := proxy.NewStream(bufio.NewReaderSize(resp.Body, 1<<10), opts)
	x.relay = s.Result()
	decided := false
	s.End = func(res *proxy.RelayResult) []byte {
		decided = true
		return x.closing(res)
	}
	s.Done = func(res *proxy.RelayResult, delivered bool) {
		proxy.CloseAnswer(resp.Body, res.Ended)
		if x.call.span != nil {
			x.responseModel = res.Model
			x.call.span.EndStream(res.ContentChunks, x.firstTok)
		}
		// The deadline stays for the closing bytes; the next request on the
		// connection starts without it (web's clearWriteDeadline).
		if !decided {
			x.closing(res) // the client left mid-stream
		}
		if r := x.row.Reason; r == "upstream_disconnected" || r == "engine_disconnected" {
			x.backendFailed("the stream broke off")
		}
		x.finish()
	}
	return s
}

// armWriteDeadline gives the client's connection a write deadline before
// each frame is written: a client that stops reading (but keeps its socket
// open) makes the write fail after the stall limit, or at the request's own
// timeout if that comes first, and the relay ends. Refreshed at most every
// 100 ms: a deadline is a timer update, cheap but not free per token.
func (x *exchange) armWriteDeadline() {
	now := time.Now()
	if now.Sub(x.deadlineSet) < 100*time.Millisecond {
		return
	}
	x.deadlineSet = now
	x.writeDeadline, x.deadlineIsTimeout = now.Add(x.g.stall), false
	// The request's timeout ends the relay by itself when the client reads;
	// the grace lets the closing bytes out after it.
	if d, ok := x.ctx.Deadline(); ok && d.Add(closingGrace).Before(x.writeDeadline) {
		x.writeDeadline, x.deadlineIsTimeout = d.Add(closingGrace), true
	}
	_ = x.call.Conn.SetWriteDeadline(x.writeDeadline)
}

// closingGrace is how long after the request's timeout the closing bytes
// of its stream may still take to be written.
const closingGrace = time.Second

// clientErrCause tells why writing to the client failed: the write
// deadline passed (a stall, or the request's timeout) or the client left.
func (x *exchange) clientErrCause() error {
	if x.writeDeadline.IsZero() || time.Now().Before(x.writeDeadline) {
		return errClientLeft
	}
	if x.deadlineIsTimeout {
		return context.DeadlineExceeded
	}
	return errClientStalled
}

// answerID is the id of an answer the gateway writes itself, in the form
// of the API's own ids.
func (x *exchange) answerID() string {
	switch x.req.API {
	case proxy.APICompletions:
		return "cmpl-" + x.call.ID
	case proxy.APIResponses:
		return "resp_" + x.call.ID
	}
	return "chatcmpl-" + x.call.ID
}

// choices is the number of choices the client asked for (n), 1 by default.
func (x *exchange) choices() int { return choicesOf(x.call.Body) }

// choicesOf reads n from a request body: 1 by default, at most 64.
func choicesOf(body []byte) int {
	n := gjson.GetBytes(body, "n").Int()
	if n < 1 {
		return 1
	}
	return int(min(n, 64))
}

// registerResponse lets POST /v1/responses/{id}/cancel find a passed-through
// Responses stream by the engine's response id, once the engine said it.
func (x *exchange) registerResponse() {
	if x.req.API != proxy.APIResponses || x.translate || x.relay == nil || x.relay.ID == "" {
		return
	}
	x.responseID = x.relay.ID
	x.g.running.Store(x.responseID, x.call.ID)
}
