// Package gateway decides what happens to one inference request: which
// backend serves it (from configuration only), whether it is admitted (rate
// limit, backend slot), how the engine's answer is relayed, and the one
// usage row it leaves whatever happens. It knows nothing of Fiber: handlers
// hand it a Call and write out the Response it returns.
package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"moonji/internal/admission"
	"moonji/internal/ledger"
	"moonji/internal/metrics"
	"moonji/internal/proxy"
	"moonji/internal/ratelimit"
	"moonji/internal/stop"
	"moonji/models"
)

// Sources of a request.
const (
	SourceAPI = "api" // a program with an API key
	SourceWeb = "web" // a logged-in person (the chat page)
)

// Principal is who sends a request.
type Principal struct {
	UserID uint
	Email  string
	Admin  bool
	KeyID  *uint // nil for a login session
	Source string
	// RPM overrides the default requests-per-minute limit when > 0.
	RPM int
}

// RateKey is the rate-limit bucket: per key for programs, per user for people.
func (p Principal) RateKey() string {
	if p.KeyID != nil {
		return "key:" + strconv.FormatUint(uint64(*p.KeyID), 10)
	}
	return "user:" + strconv.FormatUint(uint64(p.UserID), 10)
}

// Backend is one engine with its admission gate.
type Backend struct {
	Name     string
	Upstream proxy.Upstream
	Gate     *admission.Gate
	Timeout  time.Duration
}

// Route maps a public model name to a backend.
type Route struct {
	Model         string
	UpstreamModel string
	Backend       *Backend
}

// Gateway serves inference requests.
type Gateway struct {
	routes  map[string]*Route
	order   []string
	client  *proxy.Client
	ledger  *ledger.Ledger
	metrics *metrics.Metrics
	limiter *ratelimit.Limiter
	limit   ratelimit.Limit
	stops   *stop.Service
	replica string
	log     *slog.Logger
}

// Options wire a Gateway.
type Options struct {
	Routes  []*Route
	Client  *proxy.Client
	Ledger  *ledger.Ledger
	Metrics *metrics.Metrics
	Limiter *ratelimit.Limiter
	Limit   ratelimit.Limit // default per key / per user
	Stops   *stop.Service
	// Replica names this replica in the rows it writes.
	Replica string
	Log     *slog.Logger
}

// New returns a Gateway.
func New(o Options) *Gateway {
	g := &Gateway{routes: map[string]*Route{}, client: o.Client, ledger: o.Ledger, metrics: o.Metrics,
		limiter: o.Limiter, limit: o.Limit, stops: o.Stops, replica: o.Replica, log: o.Log}
	if g.log == nil {
		g.log = slog.Default()
	}
	for _, r := range o.Routes {
		g.routes[r.Model] = r
		g.order = append(g.order, r.Model)
	}
	return g
}

// Models lists the public model names in configuration order.
func (g *Gateway) Models() []string { return g.order }

// Call is one request to /v1/chat/completions.
type Call struct {
	ID        string
	Start     time.Time
	Principal Principal
	// Body is the raw JSON body; the gateway owns it from here on.
	Body []byte
	// Watch arranges for onClose to run when the client hangs up, and
	// returns a function that ends the watch. Nil: not watched.
	Watch func(onClose func()) (stop func())
}

// Response is what the handler writes back.
type Response struct {
	Status      int
	ContentType string
	Header      http.Header
	Body        []byte
	// BodyStream, when set, is the body, pulled by the server after the
	// headers are out; the server closes it when done.
	BodyStream io.ReadCloser
}

// Cancellation causes, told apart when the upstream call ends early.
var (
	errClientLeft = errors.New("client disconnected")
	errStopped    = errors.New("stopped by request")
)

// NewInferenceID returns a fresh id for a request.
func NewInferenceID() string { return newID() }

// Reject answers a request refused before it reached a backend (bad key, bad
// body, unknown model, limits), leaving its rejected ledger row.
func (g *Gateway) Reject(call Call, model string, status int, reason, message, typ, code string, hdr http.Header) *Response {
	row := g.row(call, model, "")
	row.Outcome = models.OutcomeRejected
	row.Status = status
	row.Reason = reason
	row.UsageSource = models.UsageNone
	row.DurationMs = time.Since(call.Start).Milliseconds()
	g.ledger.Record(row)
	g.count(model, models.OutcomeRejected)
	g.metrics.Rejections.WithLabelValues(reason).Inc()
	return errorResponse(status, message, typ, code, hdr)
}

func (g *Gateway) row(call Call, model, backend string) models.Usage {
	p := call.Principal
	row := models.Usage{
		InferenceID: call.ID, CreatedAt: call.Start.UTC(), User: p.Email, KeyID: p.KeyID,
		Source: p.Source, Model: model, Backend: backend, Replica: g.replica,
	}
	if p.UserID != 0 {
		uid := p.UserID
		row.UserID = &uid
	}
	return row
}

func (g *Gateway) count(model, outcome string) {
	if _, ok := g.routes[model]; !ok {
		model = "unknown"
	}
	g.metrics.Requests.WithLabelValues(model, outcome).Inc()
}

// ChatCompletions serves one chat request from parsing to the final ledger row.
func (g *Gateway) ChatCompletions(call Call) *Response {
	req, err := proxy.ParseRequest(call.Body)
	if err != nil { // always a *proxy.BadRequestError
		return g.Reject(call, "", http.StatusBadRequest, "invalid_request", err.Error(), "invalid_request_error", "invalid_request", nil)
	}
	route, ok := g.routes[req.Model]
	if !ok {
		return g.Reject(call, req.Model, http.StatusNotFound, "model_not_found",
			fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", req.Model),
			"invalid_request_error", "model_not_found", nil)
	}

	hdr := http.Header{}
	var tokens *ratelimit.Reservation
	if g.limiter != nil {
		if resp := g.admitRate(call, req, hdr, &tokens); resp != nil {
			return resp
		}
	}

	body, err := proxy.RewriteBody(call.Body, req, route.UpstreamModel)
	if err != nil {
		return g.Reject(call, req.Model, http.StatusBadRequest, "invalid_request", err.Error(), "invalid_request_error", "invalid_request", hdr)
	}

	x := &exchange{g: g, call: call, req: req, route: route, hdr: hdr, tokens: tokens,
		row: g.row(call, req.Model, route.Backend.Name)}
	return x.run(body)
}

// admitRate applies the per-key (or per-user) limits and fills the
// x-ratelimit-* headers. It returns a response when the request is refused.
func (g *Gateway) admitRate(call Call, req proxy.Request, hdr http.Header, tokens **ratelimit.Reservation) *Response {
	lim := g.limit
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
		if req.MaxTokens > 0 {
			estimate += req.MaxTokens
		} else {
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

// exchange is one admitted request on its way through a backend.
type exchange struct {
	g      *Gateway
	call   Call
	req    proxy.Request
	route  *Route
	hdr    http.Header
	tokens *ratelimit.Reservation
	row    models.Usage
	// begun receives the result of the pending row's write; start sets it.
	// A request refused before it ever waited has no pending row: its one
	// row is written final (Record) at finish.
	begun    <-chan error
	hasBegun bool

	ctx       context.Context
	cancel    context.CancelCauseFunc
	stopWatch func()
	slot      *admission.Slot
	stopRun   *stop.Run
	firstTok  time.Time
	finished  bool
}

func (x *exchange) run(body []byte) *Response {
	g := x.g
	x.ctx, x.cancel = context.WithCancelCause(context.Background())
	if t := x.route.Backend.Timeout; t > 0 {
		var cancelT context.CancelFunc
		x.ctx, cancelT = context.WithTimeout(x.ctx, t)
		_ = cancelT // released by x.cancel: the timeout context is a child
	}
	x.stopWatch = func() {}
	// Everything a request needs while it waits or runs — its pending row,
	// the watch on its client, its registration for Stop — is set up when
	// it starts to wait in the queue or once it holds its slot. A request
	// refused at once needs none of it.
	slot, err := x.route.Backend.Gate.AcquireNotify(x.ctx, x.start)
	if err != nil {
		return x.admissionFailed(err)
	}
	x.start()
	x.slot = slot
	x.row.QueueMs = slot.Waited().Milliseconds()
	g.metrics.QueueWait.WithLabelValues(x.route.Backend.Name).Observe(slot.Waited().Seconds())

	resp, err := g.client.ChatCompletions(x.ctx, x.route.Backend.Upstream, body)
	if err != nil {
		return x.upstreamFailed(err)
	}
	ct := resp.Header.Get("Content-Type")
	if resp.StatusCode == http.StatusOK && x.req.Stream && strings.HasPrefix(ct, "text/event-stream") {
		if err := x.waitBegun(); err != nil {
			resp.Body.Close()
			return x.internalError(err)
		}
		return &Response{Status: http.StatusOK, ContentType: ct, Header: x.streamHeader(), BodyStream: x.stream(resp)}
	}
	return x.whole(resp)
}

// start queues the pending ledger row, watches the client's connection and
// registers the inference for Stop, once.
func (x *exchange) start() {
	if x.hasBegun {
		return
	}
	x.hasBegun = true
	x.begun = x.g.ledger.Begin(x.row)
	if x.call.Watch != nil {
		x.stopWatch = x.call.Watch(func() { x.cancel(errClientLeft) })
	}
	if x.g.stops != nil {
		x.stopRun = x.g.stops.Begin(x.ctx, x.call.ID, func() { x.cancel(errStopped) })
	}
}

func (x *exchange) streamHeader() http.Header {
	h := x.hdr
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx in front must not buffer the stream
	return h
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
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return x.upstreamFailed(err)
	}
	if perr := x.waitBegun(); perr != nil {
		return x.internalError(perr)
	}
	if resp.StatusCode == http.StatusOK {
		x.row.Outcome = models.OutcomeSuccess
		if u, ok := usageOf(data); ok {
			x.row.PromptTokens, x.row.CompletionTokens = u.PromptTokens, u.CompletionTokens
			x.row.UsageSource = models.UsageFromEngine
		} else {
			x.row.UsageSource = models.UsageNone
		}
	} else {
		x.row.Outcome = models.OutcomeError
		x.row.Reason = "upstream_" + strconv.Itoa(resp.StatusCode)
		x.row.UsageSource = models.UsageNone
	}
	if cause := context.Cause(x.ctx); errors.Is(cause, errClientLeft) {
		// The answer came, but the client had left before it.
		x.row.Outcome, x.row.Reason = models.OutcomeCancelled, "client_disconnected"
	}
	x.row.Status = resp.StatusCode
	x.finish()
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/json"
	}
	return &Response{Status: resp.StatusCode, ContentType: ct, Header: x.hdr, Body: data}
}

// stream relays the engine's SSE answer to the client. The server pulls
// frames from it; the request is finished once the closing bytes have been
// written to the client's socket (or the client has gone), so that a stop is
// acknowledged only when nothing more can follow it.
func (x *exchange) stream(resp *http.Response) *proxy.Stream {
	opts := proxy.RelayOptions{
		StripUsage: !x.req.ClientWantsUsage,
		OnContent: func(n int) {
			if n == 1 {
				x.firstTok = time.Now()
			}
		},
	}
	if x.stopRun != nil {
		opts.Stopped = x.stopRun.Stopped
	}
	s := proxy.NewStream(bufio.NewReaderSize(resp.Body, 32<<10), opts)
	decided := false
	s.End = func(res *proxy.RelayResult) []byte {
		decided = true
		return x.closing(res)
	}
	s.Done = func(res *proxy.RelayResult, delivered bool) {
		resp.Body.Close()
		if !decided {
			x.closing(res) // the client left mid-stream
		}
		x.finish()
	}
	return s
}

// closing decides the outcome of a relayed stream and returns the bytes
// that end it for the client.
func (x *exchange) closing(res *proxy.RelayResult) []byte {
	x.row.Status = http.StatusOK
	x.row.CompletionTokens = res.ContentChunks
	x.row.UsageSource = models.UsageFromCounted
	if res.HasUsage {
		x.row.PromptTokens = res.Usage.PromptTokens
		if res.Done {
			x.row.CompletionTokens = res.Usage.CompletionTokens
			x.row.UsageSource = models.UsageFromEngine
		}
	}
	cause := context.Cause(x.ctx)
	switch {
	case res.Done:
		x.row.Outcome = models.OutcomeSuccess
		return nil
	case res.Stopped || errors.Is(cause, errStopped):
		x.row.Outcome, x.row.Reason = models.OutcomeStopped, "stop_requested"
		return x.stoppedEnding(res)
	case res.ClientErr != nil || errors.Is(cause, errClientLeft):
		x.row.Outcome, x.row.Reason = models.OutcomeCancelled, "client_disconnected"
		return nil
	case errors.Is(cause, context.DeadlineExceeded) || errors.Is(x.ctx.Err(), context.DeadlineExceeded):
		x.row.Outcome, x.row.Reason = models.OutcomeError, "upstream_timeout"
		return proxy.ErrorFrame("The backend took too long to answer.", "upstream_error", "upstream_timeout")
	default:
		x.row.Outcome, x.row.Reason = models.OutcomeError, "upstream_disconnected"
		return proxy.ErrorFrame("The backend closed the stream before it was complete.", "upstream_error", "upstream_disconnected")
	}
}

// stopSeen is what the person who stopped the inference had seen, if said.
func (x *exchange) stopSeen() (int, bool) {
	if x.stopRun == nil {
		return 0, false
	}
	return x.stopRun.Seen()
}

// stoppedEnding closes a stopped stream cleanly: the usage chunk if the
// client asked for one (with what was delivered, or what the person saw),
// then [DONE].
func (x *exchange) stoppedEnding(res *proxy.RelayResult) []byte {
	if seen, ok := x.stopSeen(); ok && seen < x.row.CompletionTokens {
		x.row.CompletionTokens = seen
	}
	x.row.UsageSource = models.UsageFromCounted
	var b []byte
	if x.req.ClientWantsUsage {
		model := res.Model
		if model == "" {
			model = x.req.Model
		}
		b = proxy.UsageChunk(res.ID, model, res.Created,
			proxy.Usage{PromptTokens: x.row.PromptTokens, CompletionTokens: x.row.CompletionTokens})
	}
	return append(b, proxy.DoneFrame...)
}

func (x *exchange) admissionFailed(err error) *Response {
	var rej *admission.Rejected
	if errors.As(err, &rej) {
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeRejected, rej.Reason, http.StatusServiceUnavailable
		x.row.UsageSource = models.UsageNone
		x.row.QueueMs = rej.Waited.Milliseconds()
		x.hdr.Set("Retry-After", strconv.Itoa(rej.RetryAfterSeconds()))
		x.g.metrics.Rejections.WithLabelValues(rej.Reason).Inc()
		x.finish()
		msg := fmt.Sprintf("Backend %s is at capacity (%s). Retry after %ds.", x.route.Backend.Name, strings.ReplaceAll(rej.Reason, "_", " "), rej.RetryAfterSeconds())
		return x.reply(http.StatusServiceUnavailable, msg, "server_error", rej.Reason)
	}
	return x.upstreamFailed(err)
}

// upstreamFailed ends a request whose engine call failed or was cut short
// before any answer was relayed.
func (x *exchange) upstreamFailed(err error) *Response {
	cause := context.Cause(x.ctx)
	x.row.UsageSource = models.UsageNone
	var ue *proxy.UpstreamError
	switch {
	case errors.Is(cause, errStopped):
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeStopped, "stop_requested", 499
		x.finish()
		return x.stoppedBeforeAnswer()
	case errors.Is(cause, errClientLeft):
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeCancelled, "client_disconnected", 499
		x.finish()
		return x.reply(499, "The client closed the request.", "invalid_request_error", "client_closed_request")
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(cause, context.DeadlineExceeded):
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, "upstream_timeout", http.StatusGatewayTimeout
		x.finish()
		return x.reply(http.StatusGatewayTimeout, fmt.Sprintf("Backend %s did not answer in time.", x.route.Backend.Name), "server_error", "upstream_timeout")
	case errors.As(err, &ue):
		reason := "upstream_unreachable"
		if ue.Status == http.StatusGatewayTimeout {
			reason = "upstream_timeout"
		}
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, reason, ue.Status
		x.finish()
		x.g.log.Warn("backend unreachable", "backend", x.route.Backend.Name, "err", err, "inference_id", x.call.ID)
		return x.reply(ue.Status, fmt.Sprintf("Backend %s is unreachable.", x.route.Backend.Name), "server_error", reason)
	default:
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, "upstream_read_failed", http.StatusBadGateway
		x.finish()
		x.g.log.Warn("backend answer failed", "backend", x.route.Backend.Name, "err", err, "inference_id", x.call.ID)
		return x.reply(http.StatusBadGateway, fmt.Sprintf("Backend %s failed while answering.", x.route.Backend.Name), "server_error", "upstream_read_failed")
	}
}

// stoppedBeforeAnswer answers a request stopped before the engine said
// anything: a stream gets a well-formed empty stream, a plain request an
// empty completion, so clients end normally.
func (x *exchange) stoppedBeforeAnswer() *Response {
	if x.req.Stream {
		var b []byte
		if x.req.ClientWantsUsage {
			b = proxy.UsageChunk("chatcmpl-"+x.call.ID, x.req.Model, x.call.Start.Unix(), proxy.Usage{})
		}
		b = append(b, proxy.DoneFrame...)
		return &Response{Status: http.StatusOK, ContentType: "text/event-stream; charset=utf-8", Header: x.streamHeader(),
			BodyStream: io.NopCloser(bytes.NewReader(b))}
	}
	body := fmt.Sprintf(`{"id":"chatcmpl-%s","object":"chat.completion","created":%d,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`,
		x.call.ID, x.call.Start.Unix(), x.req.Model)
	return &Response{Status: http.StatusOK, ContentType: "application/json", Header: x.hdr, Body: []byte(body)}
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
	return errorResponse(status, message, typ, code, x.hdr)
}

// finish releases everything the request held and queues its final row.
// It runs exactly once per admitted request.
func (x *exchange) finish() {
	if x.finished {
		return
	}
	x.finished = true
	end := time.Now()
	x.stopWatch()
	if x.slot != nil {
		x.slot.Release()
	}
	x.cancel(nil)
	g, row := x.g, &x.row
	row.DurationMs = end.Sub(x.call.Start).Milliseconds()
	if !x.firstTok.IsZero() {
		ttft := x.firstTok.Sub(x.call.Start)
		ms := ttft.Milliseconds()
		row.TTFTMs = &ms
		g.metrics.TTFT.WithLabelValues(row.Model).Observe(ttft.Seconds())
		if row.CompletionTokens > 1 {
			if decode := end.Sub(x.firstTok).Seconds(); decode > 0 {
				g.metrics.DecodeSpeed.WithLabelValues(row.Model).Observe(float64(row.CompletionTokens-1) / decode)
			}
		}
	}
	if x.tokens != nil {
		x.tokens.Reconcile(context.Background(), row.PromptTokens+row.CompletionTokens)
	}
	if x.hasBegun {
		g.ledger.Finish(*row)
	} else {
		g.ledger.Record(*row)
	}
	if x.stopRun != nil {
		if row.Outcome == models.OutcomeStopped {
			x.stopRun.Ack()
		}
		x.stopRun.End()
	}
	g.count(row.Model, row.Outcome)
	g.metrics.Duration.WithLabelValues(row.Model).Observe(end.Sub(x.call.Start).Seconds())
	g.metrics.PromptTokens.WithLabelValues(row.Model).Add(float64(row.PromptTokens))
	g.metrics.CompletionToks.WithLabelValues(row.Model).Add(float64(row.CompletionTokens))
}
