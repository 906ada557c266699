package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"moonji/internal/admission"
	"moonji/internal/connwatch"
	"moonji/internal/proxy"
	"moonji/internal/ratelimit"
	"moonji/internal/responses"
)

// Serving: a request's path from its body to a backend's slot — parsing,
// the model's route, rate limits, admission (and one retry on another
// backend), and what is set up once it starts (its pending row, the watch on
// its client, its registration for Stop).

// ChatCompletions serves one chat request from parsing to the final ledger row.
func (g *Gateway) ChatCompletions(call Call) *Response { return g.Serve(proxy.APIChat, call) }

// Serve serves one request to api from parsing to the final ledger row: every
// API goes through the same admission, ledger, cancellation and Stop.
func (g *Gateway) Serve(api proxy.API, call Call) (resp *Response) {
	call.API = api
	g.traced(&call)
	// A panic while this request is served fails it alone (recovered).
	var x *exchange
	defer func() {
		if p := recover(); p != nil {
			resp = g.recovered(call, x, p)
		}
	}()
	req, err := proxy.ParseFor(api, call.Body)
	if err != nil {
		return g.reject(call, "", http.StatusBadRequest, "invalid_request", badRequest(err), nil)
	}
	call.span.SetModel(req.Model)
	policy, refused := g.policy(call, req.Model)
	if refused != nil {
		return refused
	}
	route := g.route(req.Model)
	if route != nil {
		// The exchange gives the count back when it ends; a request that
		// ends before it has one gives it back here.
		defer func() {
			if x == nil {
				route.users.Add(-1)
			}
		}()
	}
	if route == nil || !policy.Allows(req.Model) {
		return g.reject(call, req.Model, http.StatusNotFound, "model_not_found", apiError{
			message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", req.Model),
			typ:     "invalid_request_error", code: "model_not_found", param: "model"}, nil)
	}
	// A Responses request to a model served by chat alone is translated.
	translate := api == proxy.APIResponses && !route.serves(api) && route.serves(proxy.APIChat)
	if !route.serves(api) && !translate {
		return g.reject(call, req.Model, http.StatusNotFound, "api_not_supported", apiError{
			message: fmt.Sprintf("The model `%s` is not served with the %s API (%s): its backends serve %s.",
				req.Model, api, api.Endpoint(), route.apiList()),
			typ: "invalid_request_error", code: "api_not_supported", param: "model"}, nil)
	}

	if !route.Vision {
		if param := proxy.ImagePart(api, call.Body); param != "" {
			return g.reject(call, req.Model, http.StatusBadRequest, "invalid_request", apiError{
				message: fmt.Sprintf("The model `%s` cannot see images, and %s is an image: send text only, or choose a model with vision.",
					req.Model, param),
				typ: "invalid_request_error", code: "model_cannot_see_images", param: param}, nil)
		}
	}

	hdr := http.Header{}
	// The budgets' check runs beside the rate limit's: each is one Redis
	// round trip, and neither needs the other's answer. Whatever ends the
	// request before its exchange takes the reservation over (a refusal, a
	// bad body, a panic) gives it back.
	check := g.beginReserve(call, req, route, policy.Limits)
	handedOver := false
	defer func() {
		if !handedOver {
			check.giveBack()
		}
	}()
	var tokens *ratelimit.Reservation
	if g.limiter != nil {
		if resp := g.admitRate(call, req, hdr, &tokens); resp != nil {
			return resp
		}
	}

	upBody, upReq := call.Body, req
	if translate {
		chat, _, err := responses.ToChat(call.Body)
		if err != nil {
			return g.reject(call, req.Model, http.StatusBadRequest, "invalid_request", badRequest(refusal(err)), hdr)
		}
		if upReq, err = proxy.ParseRequest(chat); err != nil {
			return g.reject(call, req.Model, http.StatusBadRequest, "invalid_request", badRequest(err), hdr)
		}
		upBody = chat
	}
	body, err := proxy.RewriteBody(upBody, upReq, route.UpstreamModel)
	if err == nil && route.MaxOutput > 0 && upReq.MaxTokens <= 0 {
		// The output a budget reserved for is the most the engine makes.
		body, err = proxy.LimitOutput(body, upReq.API, route.MaxOutput)
	}
	if err != nil {
		return g.reject(call, req.Model, http.StatusBadRequest, "invalid_request", badRequest(err), hdr)
	}
	held, refused := g.reserved(call, req, check, hdr)
	if refused != nil {
		if tokens != nil {
			tokens.Reconcile(context.Background(), 0)
		}
		return refused
	}
	handedOver = true // the exchange settles it on every path

	x = &exchange{g: g, call: call, req: req, up: upReq.API, translate: translate, route: route, hdr: hdr, tokens: tokens,
		budget: held, row: g.row(call, req.Model, route.Pool.Name()), stopRun: call.Stop}
	return x.run(body)
}

// admitRate applies the per-key (or per-user) limits and fills the
// x-ratelimit-* headers. It returns a response when the request is refused.
func (g *Gateway) admitRate(call Call, req proxy.Request, hdr http.Header, tokens **ratelimit.Reservation) *Response {
	lim := g.tab.Load().limit
	if call.Principal.RPM > 0 {
		lim.RequestsPerMinute = call.Principal.RPM
	}
	ctx := context.Background()
	key := call.Principal.RateKey()
	rd, err := g.limiter.AllowRequest(ctx, key, lim)
	if err != nil {
		// The limiter falls back to memory on its own; an error here is a
		// bug, and refusing service for it would be worse than admitting.
		g.log.Error("rate limit check failed; admitting", "err", err)
		return nil
	}
	var td ratelimit.Decision
	if rd.Allowed && lim.TokensPerMinute > 0 {
		estimate := req.PromptBytes/4 + 1
		switch {
		case req.API == proxy.APIEmbeddings:
			// An embedding has no completion to reserve for.
		case req.MaxTokens > 0:
			estimate += req.MaxTokens
		default:
			estimate += defaultCompletionEstimate
		}
		var res *ratelimit.Reservation
		td, res, err = g.limiter.ReserveTokens(ctx, key, lim, estimate)
		if err != nil {
			g.log.Error("token limit check failed; admitting", "err", err)
		}
		*tokens = res
	}
	ratelimit.SetHeaders(hdr.Set, rd, td)
	switch {
	case !rd.Allowed:
		return g.Reject(call, req.Model, http.StatusTooManyRequests, "rate_limited",
			fmt.Sprintf("Rate limit reached: %d requests per minute. Retry after %ss.", rd.Limit, hdr.Get("Retry-After")),
			"requests", "rate_limit_exceeded", hdr)
	case lim.TokensPerMinute > 0 && err == nil && !td.Allowed:
		return g.Reject(call, req.Model, http.StatusTooManyRequests, "rate_limited",
			fmt.Sprintf("Rate limit reached: %d tokens per minute. Retry after %ss.", td.Limit, hdr.Get("Retry-After")),
			"tokens", "rate_limit_exceeded", hdr)
	}
	return nil
}

// defaultCompletionEstimate is reserved against a tokens-per-minute limit
// when a request sets no max_tokens; the reservation is reconciled with the
// real count when the request ends.
const defaultCompletionEstimate = 512

// take makes slot the request's: its backend serves the request.
func (x *exchange) take(slot *admission.Slot) {
	x.slot = slot
	x.backend = x.route.backend(slot.Backend())
	x.row.Backend = x.backend.Name
	x.row.QueueMs += slot.Waited().Milliseconds()
	x.call.span.EndQueue(x.backend.Name, slot.Waited())
	x.g.metrics.Backend(x.backend.Name).QueueWait.Observe(slot.Waited().Seconds())
}

// failedBeforeAnswer tells why the backend failed the request before its
// answer started — it refused the connection, was unreachable or not
// connected, or answered 5xx — or "" when it did not. A request the client
// left, stopped or outlived is no failure of the backend's.
func (x *exchange) failedBeforeAnswer(resp *http.Response, err error) string {
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	return backendFailure(context.Cause(x.ctx), err, status)
}

// backendFailure tells why a backend failed a request before its answer
// started, from the call's error or else the answer's status, or "" when it
// did not; cause is why the request's context ended (nil if it did not).
func backendFailure(cause, err error, status int) string {
	if cause != nil {
		return ""
	}
	if err != nil {
		var ue *proxy.UpstreamError
		switch {
		case errors.Is(err, proxy.ErrEngineUnavailable):
			return "engine not connected"
		case errors.Is(err, proxy.ErrEngineDisconnected):
			return "engine disconnected"
		case errors.As(err, &ue) && ue.Status != http.StatusGatewayTimeout:
			return "unreachable"
		}
		return ""
	}
	if status >= 500 {
		return "status " + strconv.Itoa(status)
	}
	return ""
}

// silentPastTimeout takes the request's backend down when the request's
// timeout passed before the engine said anything: it never took the
// request (written false: the connection hung), or it took a stream and
// sent not even the answer's header, which engines send before the first
// token. Its probe decides whether it is hung (a silent path, a stuck
// server) or was only slow, which brings it back at once. A whole answer's
// header comes with the answer, so its absence says only that the answer
// was long.
func (x *exchange) silentPastTimeout(written bool) {
	if !errors.Is(context.Cause(x.ctx), context.DeadlineExceeded) {
		return
	}
	if !written {
		x.backendFailed("not reachable within the timeout")
	} else if x.req.Stream {
		x.backendFailed("no answer within the timeout")
	}
}

// backendFailed tells the backend's health of a failure no status shows:
// the engine silent past the timeout, or its answer broken off midway.
func (x *exchange) backendFailed(reason string) {
	if x.backend != nil && x.backend.Health != nil {
		x.backend.Health.Failed(reason)
	}
}

// retry marks the request's backend as failed and, once per request and
// only while another backend of the model is up, moves the request to
// another backend: nothing has reached the client yet. retried tells that
// x.slot and x.backend are now the other backend's; refused is the answer
// when the retry got no slot.
func (x *exchange) retry(reason string, resp *http.Response) (retried bool, refused *Response) {
	failed := x.backend.Name
	if x.backend.Health != nil {
		x.backend.Health.Failed(reason)
	}
	if x.row.RetriedFrom != "" || !x.route.Pool.CanRetry(failed) {
		return false, nil
	}
	if resp != nil {
		// The engine's error answer is dropped for the retry's; drain a
		// little so that its connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		resp.Body.Close()
	}
	x.slot.Release()
	x.slot = nil
	x.row.RetriedFrom = failed
	x.g.metrics.Retries.WithLabelValues(failed).Inc()
	x.g.log.Warn("backend failed before answering; retrying on another", "backend", failed, "reason", reason,
		"model", x.route.Model, "inference_id", x.call.ID)
	// The retry keeps the request's place among those that came after it.
	x.call.span.BeginQueue(x.route.Pool.Name())
	slot, err := x.route.Pool.Acquire(x.ctx, admission.AcquireOptions{Exclude: failed, Arrival: x.call.Start})
	if err != nil {
		x.call.span.EndQueue("", 0)
		return false, x.admissionFailed(err)
	}
	x.take(slot)
	return true, nil
}

// clientWatchDelay is how long a request for a whole answer runs before
// its client's connection is watched (connwatch.WatchAfter). Most requests
// of a busy gateway with a fast engine are answered sooner and never pay
// for a watch (a goroutine, a system call and the wake-ups to start and end
// it: ~4 % of the CPU samples at 1,000 req/s); a client
// that leaves meanwhile is noticed when the watch starts, so its engine
// works at most this much longer (and a tick) for nobody.
const clientWatchDelay = 50 * time.Millisecond

// start queues the pending ledger row, watches the client's connection and
// registers the inference for Stop (unless its caller did: Call.Stop),
// once.
func (x *exchange) start() {
	if x.hasBegun {
		return
	}
	x.hasBegun = true
	x.queuedAt = time.Now()
	x.begun = x.g.ledger.Begin(x.row)
	if uid := x.call.Principal.UserID; uid != 0 {
		x.untrack, _ = x.g.people.Take(uid, func() { x.cancel(errPersonDisabled) })
	}
	if x.call.Conn != nil {
		delay := clientWatchDelay
		if x.req.Stream {
			delay = 0 // a stream lasts: its watch would start anyway
		}
		x.watch = connwatch.WatchAfter(delay, x.call.Conn, x.call.Probe, func() { x.cancel(errClientLeft) })
	}
	if x.stopRun == nil && x.g.stops != nil {
		onStop := func() { x.cancel(errStopped) }
		if x.call.FreshID {
			x.stopRun = x.g.stops.BeginFresh(x.call.ID, x.call.Principal.UserID, onStop)
		} else {
			x.stopRun = x.g.stops.Begin(x.ctx, x.call.ID, x.call.Principal.UserID, onStop)
		}
	}
}
