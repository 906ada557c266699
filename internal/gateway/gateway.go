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
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/admission"
	"moonji/internal/connwatch"
	"moonji/internal/fairshare"
	"moonji/internal/ledger"
	"moonji/internal/metrics"
	"moonji/internal/proxy"
	"moonji/internal/ratelimit"
	"moonji/internal/responses"
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

// EngineLink carries chat requests to an engine over the engine protocol
// (enginelink.Link): the same answer as proxy.Client.ChatCompletions, for a
// session named by the request's inference id.
type EngineLink interface {
	ChatCompletions(ctx context.Context, session, model string, body []byte) (*http.Response, error)
}

// Health is a backend's passive health (health.Checker): told of every
// failure before an answer started, it takes the backend out of traffic
// until a probe passes.
type Health interface {
	Up() bool
	Failed(reason string)
}

// Backend is one engine.
type Backend struct {
	Name string
	// Kind is the configured kind (openai, builtin, engine), for the dashboard.
	Kind     string
	Upstream proxy.Upstream
	// Link, when set, is how requests reach an `engine` backend; Upstream
	// is then unused.
	Link EngineLink
	// Health, when set, is told of the backend's failures.
	Health Health
}

// Route maps a public model name to the backends that serve it and the
// admission pool its requests wait in.
type Route struct {
	Model         string
	UpstreamModel string
	Backends      []*Backend
	Pool          *admission.Pool
	// APIs are the APIs the route's backends serve (default: chat).
	APIs proxy.APISet
	// Timeout bounds a request from its arrival to its end (0: none).
	Timeout time.Duration
}

// serves reports whether the route's backends serve api.
func (r *Route) serves(api proxy.API) bool {
	if r.APIs == 0 {
		return api == proxy.APIChat
	}
	return r.APIs.Has(api)
}

// apiList names the APIs the route serves, for an error message.
func (r *Route) apiList() string {
	var names []string
	for _, n := range proxy.APINames() {
		if a, _ := proxy.ParseAPI(n); r.serves(a) {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

// backend returns the route's backend of that name.
func (r *Route) backend(name string) *Backend {
	for _, b := range r.Backends {
		if b.Name == name {
			return b
		}
	}
	return nil
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
	stall   time.Duration
	log     *slog.Logger
	sched   *admission.Scheduler
	// running maps the engine's response id of a passed-through Responses
	// stream to its inference id while it runs on this replica, so that
	// POST /v1/responses/{id}/cancel finds it.
	running sync.Map
	// people holds the requests running or queued here by person, so
	// that a person whose access is withdrawn loses them (EndPerson).
	people *fairshare.Holds

	// backends are the backends in configuration order, with the models
	// each serves; fixed at New, so Backends reads them without a lock.
	backends []backendInfo
}

// Options wire a Gateway.
type Options struct {
	Routes []*Route
	// Backends lists the backends in configuration order, so that one no
	// model routes to is listed too; when empty, the routes' backends in
	// order of first use.
	Backends []*Backend
	// Scheduler hands out the backends' slots; its pools are the routes'.
	Scheduler *admission.Scheduler
	Client    *proxy.Client
	Ledger    *ledger.Ledger
	Metrics   *metrics.Metrics
	Limiter   *ratelimit.Limiter
	Limit     ratelimit.Limit // default per key / per user
	Stops     *stop.Service
	// Replica names this replica in the rows it writes.
	Replica string
	// StreamWriteTimeout cancels a stream whose client makes no write
	// progress for this long (0: never).
	StreamWriteTimeout time.Duration
	Log                *slog.Logger
}

// New returns a Gateway.
func New(o Options) *Gateway {
	g := &Gateway{routes: map[string]*Route{}, client: o.Client, ledger: o.Ledger, metrics: o.Metrics,
		limiter: o.Limiter, limit: o.Limit, stops: o.Stops, replica: o.Replica, stall: o.StreamWriteTimeout, log: o.Log,
		sched: o.Scheduler, people: fairshare.New(0)}
	if g.log == nil {
		g.log = slog.Default()
	}
	for _, r := range o.Routes {
		g.routes[r.Model] = r
		g.order = append(g.order, r.Model)
	}
	g.backends = backendInfos(o.Backends, o.Routes)
	return g
}

// Models lists the public model names in configuration order.
func (g *Gateway) Models() []string { return g.order }

// backendInfo is one backend and the public models routed to it.
type backendInfo struct {
	b      *Backend
	models []string
}

func backendInfos(backends []*Backend, routes []*Route) []backendInfo {
	var out []backendInfo
	index := map[*Backend]int{}
	add := func(b *Backend) int {
		if i, ok := index[b]; ok {
			return i
		}
		index[b] = len(out)
		out = append(out, backendInfo{b: b})
		return len(out) - 1
	}
	for _, b := range backends {
		if b != nil {
			add(b)
		}
	}
	for _, r := range routes {
		for _, b := range r.Backends {
			i := add(b)
			out[i].models = append(out[i].models, r.Model)
		}
	}
	return out
}

// BackendState is one backend as the live dashboard shows it.
type BackendState struct {
	Name string
	Kind string
	// Models are the public model names it serves, in configuration
	// order; shared with the gateway, so callers must not change them.
	Models []string
	// Up tells whether it takes traffic (false: down after a failure, until
	// a probe passes).
	Up bool
	admission.Snapshot
}

// Backends returns every backend's live state in configuration order: one
// slice, and one short hold of each gate's lock.
func (g *Gateway) Backends() []BackendState {
	out := make([]BackendState, len(g.backends))
	for i, bi := range g.backends {
		out[i] = BackendState{Name: bi.b.Name, Kind: bi.b.Kind, Models: bi.models, Up: bi.b.Health == nil || bi.b.Health.Up()}
		if g.sched != nil {
			out[i].Snapshot = g.sched.Snapshot(bi.b.Name)
		}
	}
	return out
}

// Call is one inference request.
type Call struct {
	// API is the endpoint it came to (chat unless set).
	API proxy.API
	ID  string
	// FreshID says ID was minted for this call and given to nobody before
	// it: no stop can be waiting for it (stop.Service.BeginFresh). The
	// chat's generations are not fresh: their page has the id first.
	FreshID   bool
	Start     time.Time
	Principal Principal
	// Body is the raw JSON body; the gateway owns it from here on.
	Body []byte
	// Conn is the client's connection: watched for a hang-up while the
	// request runs, and given a write deadline per frame while a stream is
	// relayed. Nil: neither.
	Conn net.Conn
	// Probe may be written to Conn before the answer starts, to learn
	// whether a client that half-closed still reads (connwatch). Nil: a
	// half-closed client counts as gone.
	Probe []byte
	// OnEnd, when set, is called once when an admitted request has ended,
	// with its final usage row and, for a stopped one, what the person who
	// stopped it had seen (the chat keeps exactly that). A request refused
	// before admission (bad body, unknown model, rate limit) does not call
	// it: its Response says everything.
	OnEnd func(End)
}

// End is how an admitted request ended.
type End struct {
	Row models.Usage
	// Seen is the number of content chunks the person who stopped the
	// request had applied, when the stop said (SeenOK).
	Seen   int
	SeenOK bool
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
	// HeaderWithFirstFrame says the stream's first frame came with the
	// engine's header and is at hand: the server may send the header with
	// it, in one write. Otherwise the header goes out at once, on its own,
	// so that a client can stop before the first token.
	HeaderWithFirstFrame bool
}

// Cancellation causes, told apart when the upstream call ends early.
var (
	errClientLeft     = errors.New("client disconnected")
	errClientStalled  = errors.New("client stopped reading")
	errStopped        = errors.New("stopped by request")
	errPersonDisabled = errors.New("the person's access was withdrawn")
)

// EndPerson cancels every request of person running or queued on this
// replica (an admin disabled them): each ends cancelled, person_disabled.
// It returns how many there were.
func (g *Gateway) EndPerson(person uint) int { return g.people.EndPerson(person) }

// People returns the people with requests running or queued here.
func (g *Gateway) People() []uint { return g.people.People() }

// NewInferenceID returns a fresh id for a request.
func NewInferenceID() string { return newID() }

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
	// The row last: a panic before it leaves the request without one,
	// which recovered then writes, never two.
	g.ledger.Record(row)
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
	if _, ok := g.routes[model]; !ok {
		model = "unknown"
	}
	g.metrics.Model(model).Requests(outcome).Inc()
}

// ChatCompletions serves one chat request from parsing to the final ledger row.
func (g *Gateway) ChatCompletions(call Call) *Response { return g.Serve(proxy.APIChat, call) }

// Serve serves one request to api from parsing to the final ledger row: every
// API goes through the same admission, ledger, cancellation and Stop.
func (g *Gateway) Serve(api proxy.API, call Call) (resp *Response) {
	call.API = api
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
	route, ok := g.routes[req.Model]
	if !ok {
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

	hdr := http.Header{}
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
	if err != nil {
		return g.reject(call, req.Model, http.StatusBadRequest, "invalid_request", badRequest(err), hdr)
	}

	x = &exchange{g: g, call: call, req: req, up: upReq.API, translate: translate, route: route, hdr: hdr, tokens: tokens,
		row: g.row(call, req.Model, route.Pool.Name())}
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
	row     models.Usage
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
	// Everything a request needs while it waits or runs — its pending row,
	// the watch on its client, its registration for Stop — is set up when
	// it starts to wait in the queue or once it holds its slot. A request
	// refused at once needs none of it.
	slot, err := x.route.Pool.Acquire(x.ctx, admission.AcquireOptions{Queued: x.start})
	if err != nil {
		if x.hasBegun {
			// It waited in the queue until it was refused or left.
			x.row.QueueMs = time.Since(x.queuedAt).Milliseconds()
		}
		return x.admissionFailed(err)
	}
	x.take(slot) // before start: a pending row names the backend it runs on
	for {
		x.sent = true
		var resp *http.Response
		if link := x.backend.Link; link != nil {
			x.start()
			model := gjson.GetBytes(body, "model").String()
			resp, err = link.ChatCompletions(x.ctx, x.call.ID, model, body)
		} else {
			// The request is started once the engine has it: its row,
			// watch and Stop registration run while the engine works
			// rather than before, off a stream's first byte (BENCHMARKS.md
			// §37). They are in place before the answer is read, so before
			// the client can see the inference id.
			resp, err = g.client.PostSent(x.ctx, x.backend.Upstream, x.up, body, x.start)
		}
		x.start() // a request that could not be written is started all the same: its row
		if reason := x.failedBeforeAnswer(resp, err); reason != "" {
			retried, refused := x.retry(reason, resp)
			if refused != nil {
				return refused // the retry got no slot
			}
			if retried {
				continue
			}
		}
		if err != nil {
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
			ready := frameBuffered(resp.Body)
			return &Response{Status: http.StatusOK, ContentType: ct, Header: x.streamHeader(),
				BodyStream: &guardedStream{s: x.stream(resp), x: x, body: resp.Body}, HeaderWithFirstFrame: ready}
		}
		return x.whole(resp)
	}
}

// frameBuffered tells whether an engine's answer body already holds its
// first whole event (proxy's engine connections know; other bodies say no).
func frameBuffered(body io.Reader) bool {
	b, ok := body.(interface{ FrameBuffered() bool })
	return ok && b.FrameBuffered()
}

// take makes slot the request's: its backend serves the request.
func (x *exchange) take(slot *admission.Slot) {
	x.slot = slot
	x.backend = x.route.backend(slot.Backend())
	x.row.Backend = x.backend.Name
	x.row.QueueMs += slot.Waited().Milliseconds()
	x.g.metrics.Backend(x.backend.Name).QueueWait.Observe(slot.Waited().Seconds())
}

// backendName names the backend of the request's slot, or its pool while
// it holds none.
func (x *exchange) backendName() string {
	if x.backend != nil {
		return x.backend.Name
	}
	return x.route.Pool.Name()
}

// failedBeforeAnswer tells why the backend failed the request before its
// answer started — it refused the connection, was unreachable or not
// connected, or answered 5xx — or "" when it did not. A request the client
// left, stopped or outlived is no failure of the backend's.
func (x *exchange) failedBeforeAnswer(resp *http.Response, err error) string {
	if context.Cause(x.ctx) != nil {
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
	if resp.StatusCode >= 500 {
		return "status " + strconv.Itoa(resp.StatusCode)
	}
	return ""
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
	slot, err := x.route.Pool.Acquire(x.ctx, admission.AcquireOptions{Exclude: failed, Arrival: x.call.Start})
	if err != nil {
		return false, x.admissionFailed(err)
	}
	x.take(slot)
	return true, nil
}

// personDisabledMessage answers a request whose person was disabled while
// it ran.
const personDisabledMessage = "Your access was withdrawn by an administrator while this request ran."

// clientWatchDelay is how long a request for a whole answer runs before
// its client's connection is watched (connwatch.WatchAfter). Most requests
// of a busy gateway with a fast engine are answered sooner and never pay
// for a watch (a goroutine, a system call and the wake-ups to start and end
// it: ~4 % of the CPU samples at 1,000 req/s, BENCHMARKS.md §20); a client
// that leaves meanwhile is noticed when the watch starts, so its engine
// works at most this much longer (and a tick) for nobody.
const clientWatchDelay = 50 * time.Millisecond

// start queues the pending ledger row, watches the client's connection and
// registers the inference for Stop, once.
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
	if x.g.stops != nil {
		onStop := func() { x.cancel(errStopped) }
		if x.call.FreshID {
			x.stopRun = x.g.stops.BeginFresh(x.call.ID, onStop)
		} else {
			x.stopRun = x.g.stops.Begin(x.ctx, x.call.ID, onStop)
		}
	}
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
	if err != nil {
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
		x.row.Outcome = models.OutcomeSuccess
		if x.req.API == proxy.APIResponses {
			x.row.ResponseID = gjson.GetBytes(data, "id").Str
			if x.translate {
				x.row.ResponseID = x.answerID()
			}
		}
		x.wholeUsage(data)
	} else {
		x.row.Outcome = models.OutcomeError
		x.row.Reason = "upstream_" + strconv.Itoa(resp.StatusCode)
		x.row.UsageSource = models.UsageNone
	}
	switch cause := context.Cause(x.ctx); {
	case errors.Is(cause, errClientLeft):
		// The answer came, but the client had left before it.
		x.row.Outcome, x.row.Reason = models.OutcomeCancelled, "client_disconnected"
	case errors.Is(cause, errPersonDisabled):
		// The answer came, but its person lost their access meanwhile.
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeCancelled, "person_disabled", http.StatusForbidden
		x.finish()
		return x.reply(http.StatusForbidden, personDisabledMessage, "invalid_request_error", "person_disabled")
	}
	x.row.Status = resp.StatusCode
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
		// The deadline stays for the closing bytes; the next request on the
		// connection starts without it (web's clearWriteDeadline).
		if !decided {
			x.closing(res) // the client left mid-stream
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

// closing decides the outcome of a relayed stream and returns the bytes
// that end it for the client.
func (x *exchange) closing(res *proxy.RelayResult) []byte {
	out := x.closingFrames(res)
	if x.tr == nil {
		return out
	}
	// A translated stream: the outcome is decided as for chat, and the
	// translation writes its own end.
	switch {
	case x.row.Outcome == models.OutcomeStopped:
		x.tr.SetUsage(x.row.PromptTokens, x.row.CompletionTokens)
		return x.tr.End(responses.Stopped)
	case x.row.Reason == "person_disabled" && res.ClientErr == nil:
		return x.tr.End(personDisabledMessage)
	case x.row.Outcome == models.OutcomeSuccess, x.row.Outcome == models.OutcomeCancelled,
		res.ClientErr != nil, res.EngineError != "":
		return nil // ended by the translation, or nobody left to tell
	default:
		return x.tr.End(x.row.Reason)
	}
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
		x.row.PromptTokens = res.Usage.PromptTokens
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
	switch {
	case res.EngineError != "":
		// The engine reported an error inside its 200 stream; the client's
		// SDK raises it, so the request failed whatever came after.
		x.row.Outcome, x.row.Reason = models.OutcomeError, "upstream_stream_error"
		if !res.Done && res.ClientErr == nil && x.req.API != proxy.APIResponses {
			return proxy.DoneFrame
		}
		return nil
	case res.Done:
		x.row.Outcome = models.OutcomeSuccess
		return nil
	case res.Stopped || errors.Is(cause, errStopped):
		x.row.Outcome, x.row.Reason = models.OutcomeStopped, "stop_requested"
		return x.stoppedEnding(res)
	case errors.Is(cause, errClientStalled):
		x.row.Outcome, x.row.Reason = models.OutcomeCancelled, "client_stalled"
		return nil
	case errors.Is(cause, errPersonDisabled):
		x.row.Outcome, x.row.Reason = models.OutcomeCancelled, "person_disabled"
		if res.ClientErr != nil {
			return nil
		}
		return proxy.ErrorFrames(x.req.API, res.Seq+1, personDisabledMessage, "invalid_request_error", "person_disabled")
	case errors.Is(cause, context.DeadlineExceeded) || errors.Is(x.ctx.Err(), context.DeadlineExceeded):
		x.row.Outcome, x.row.Reason = models.OutcomeError, "upstream_timeout"
		if res.ClientErr != nil {
			return nil
		}
		return proxy.ErrorFrames(x.req.API, res.Seq+1, "The backend took too long to answer.", "upstream_error", "upstream_timeout")
	case res.ClientErr != nil || errors.Is(cause, errClientLeft):
		x.row.Outcome, x.row.Reason = models.OutcomeCancelled, "client_disconnected"
		return nil
	case errors.Is(res.UpstreamErr, proxy.ErrEngineDisconnected):
		x.row.Outcome, x.row.Reason = models.OutcomeError, "engine_disconnected"
		return proxy.ErrorFrames(x.req.API, res.Seq+1, "The engine's connection was lost before the stream was complete.", "upstream_error", "engine_disconnected")
	default:
		x.row.Outcome, x.row.Reason = models.OutcomeError, "upstream_disconnected"
		return proxy.ErrorFrames(x.req.API, res.Seq+1, "The backend closed the stream before it was complete.", "upstream_error", "upstream_disconnected")
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
func (x *exchange) choices() int {
	n := gjson.GetBytes(x.call.Body, "n").Int()
	if n < 1 {
		return 1
	}
	return int(min(n, 64))
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
	cause := context.Cause(x.ctx)
	x.row.UsageSource = models.UsageNone
	var ue *proxy.UpstreamError
	switch {
	case errors.Is(cause, errStopped):
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeStopped, "stop_requested", 499
		x.estimatePrompt()
		x.finish()
		return x.stoppedBeforeAnswer()
	case errors.Is(cause, errClientLeft):
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeCancelled, "client_disconnected", 499
		x.estimatePrompt()
		x.finish()
		return x.reply(499, "The client closed the request.", "invalid_request_error", "client_closed_request")
	case errors.Is(cause, errPersonDisabled):
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeCancelled, "person_disabled", http.StatusForbidden
		x.estimatePrompt()
		x.finish()
		return x.reply(http.StatusForbidden, personDisabledMessage, "invalid_request_error", "person_disabled")
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(cause, context.DeadlineExceeded):
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, "upstream_timeout", http.StatusGatewayTimeout
		x.finish()
		return x.reply(http.StatusGatewayTimeout, fmt.Sprintf("Backend %s did not answer in time.", x.backendName()), "server_error", "upstream_timeout")
	case errors.Is(err, proxy.ErrEngineUnavailable):
		// Never sent: the engine was away and its link's queue was full or
		// the request outwaited its TTL. Like a full admission queue, a
		// refusal to retry later.
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeRejected, "engine_unavailable", http.StatusServiceUnavailable
		x.header().Set("Retry-After", "1")
		x.g.metrics.Rejections.WithLabelValues("engine_unavailable").Inc()
		x.finish()
		x.g.log.Warn("engine not connected: request refused", "backend", x.backendName(), "err", err, "inference_id", x.call.ID)
		return x.reply(http.StatusServiceUnavailable, fmt.Sprintf("Backend %s is not connected. Retry after 1s.", x.backendName()), "server_error", "engine_unavailable")
	case errors.As(err, &ue):
		reason := "upstream_unreachable"
		switch {
		case errors.Is(err, proxy.ErrEngineDisconnected):
			reason = "engine_disconnected"
		case ue.Status == http.StatusGatewayTimeout:
			reason = "upstream_timeout"
		}
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, reason, ue.Status
		x.finish()
		x.g.log.Warn("backend unreachable", "backend", x.backendName(), "err", err, "inference_id", x.call.ID)
		return x.reply(ue.Status, fmt.Sprintf("Backend %s is unreachable.", x.backendName()), "server_error", reason)
	default:
		x.row.Outcome, x.row.Reason, x.row.Status = models.OutcomeError, "upstream_read_failed", http.StatusBadGateway
		x.finish()
		x.g.log.Warn("backend answer failed", "backend", x.backendName(), "err", err, "inference_id", x.call.ID)
		return x.reply(http.StatusBadGateway, fmt.Sprintf("Backend %s failed while answering.", x.backendName()), "server_error", "upstream_read_failed")
	}
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

// registerResponse lets POST /v1/responses/{id}/cancel find a passed-through
// Responses stream by the engine's response id, once the engine said it.
func (x *exchange) registerResponse() {
	if x.req.API != proxy.APIResponses || x.translate || x.relay == nil || x.relay.ID == "" {
		return
	}
	x.responseID = x.relay.ID
	x.g.running.Store(x.responseID, x.call.ID)
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
		x.stopRun.End()
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
}
