// Package gateway decides what happens to one inference request: which
// backend serves it (from configuration only), whether it is admitted (rate
// limit, backend slot), how the engine's answer is relayed, and the one
// usage row it leaves whatever happens. It knows nothing of Fiber: handlers
// hand it a Call and write out the Response it returns.
package gateway

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"moonji/internal/admission"
	"moonji/internal/budget"
	"moonji/internal/fairshare"
	"moonji/internal/ledger"
	"moonji/internal/metrics"
	"moonji/internal/proxy"
	"moonji/internal/ratelimit"
	"moonji/internal/spending"
	"moonji/internal/stop"
	"moonji/internal/tracing"
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

// Gateway serves inference requests.
type Gateway struct {
	// tab is the routing table: swapped whole by Reconfigure (a
	// configuration reload), read without a lock. A request keeps the
	// route it looked up to its end.
	tab     atomic.Pointer[table]
	client  *proxy.Client
	ledger  *ledger.Ledger
	metrics *metrics.Metrics
	limiter *ratelimit.Limiter
	stops   *stop.Service
	replica string
	stall   time.Duration
	// keepalive: a silent stream's comment interval (keepalive package).
	keepalive time.Duration
	log       *slog.Logger
	sched     *admission.Scheduler
	// running maps the engine's response id of a passed-through Responses
	// stream to its inference id while it runs on this replica, so that
	// POST /v1/responses/{id}/cancel finds it.
	running sync.Map
	// policies tell what each sender may use and spend; budgets hold their
	// spending (nil: no budgets, every model for everyone).
	policies *spending.Resolver
	budgets  *budget.Store
	currency string
	// people holds the requests running or queued here by person, so
	// that a person whose access is withdrawn loses them (EndPerson).
	people *fairshare.Holds
	// tracer makes the requests' spans (nil: tracing is off; trace.go).
	tracer *tracing.Tracer
}

// table is what a configuration decides: the routes by model, the models in
// order, the backends in order with the models each serves, and the default
// rate limit. Never changed once made.
type table struct {
	routes   map[string]*Route
	order    []string
	backends []backendInfo
	limit    ratelimit.Limit
}

func newTable(routes []*Route, backends []*Backend, limit ratelimit.Limit) *table {
	t := &table{routes: map[string]*Route{}, limit: limit}
	for _, r := range routes {
		t.routes[r.Model] = r
		t.order = append(t.order, r.Model)
	}
	t.backends = backendInfos(backends, routes)
	return t
}

// Reconfigure swaps the routes, backends and default rate limit for those of
// a reloaded configuration. Requests that already looked up their route
// (running, or queued for a slot) finish on it; new ones use the new table.
// The routes' pools must be the scheduler's (admission.Scheduler.Update).
func (g *Gateway) Reconfigure(routes []*Route, backends []*Backend, limit ratelimit.Limit) {
	g.tab.Store(newTable(routes, backends, limit))
}

// route looks up model's route and counts a request on it (Route.InUse),
// or returns nil. The count is taken, then the table read again: a route
// counted after a reload replaced its table is given back and the new one
// taken, so that once an old route reads 0 no request can start on it.
func (g *Gateway) route(model string) *Route {
	for {
		t := g.tab.Load()
		r := t.routes[model]
		if r == nil {
			return nil
		}
		r.users.Add(1)
		if g.tab.Load() == t {
			return r
		}
		r.users.Add(-1)
	}
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
	// Keepalive is the interval of a silent stream's keep-alive comments
	// to a client on a socket (0: none).
	Keepalive time.Duration
	Log       *slog.Logger
	// Policies and Budgets enforce model lists and budgets (nil: none);
	// Currency names the unit of refusals' messages.
	Policies *spending.Resolver
	Budgets  *budget.Store
	Currency string
	// Tracer, when set, traces each request (nil: off).
	Tracer *tracing.Tracer
}

// New returns a Gateway.
func New(o Options) *Gateway {
	g := &Gateway{client: o.Client, ledger: o.Ledger, metrics: o.Metrics,
		limiter: o.Limiter, stops: o.Stops, replica: o.Replica, stall: o.StreamWriteTimeout, keepalive: o.Keepalive, log: o.Log,
		sched: o.Scheduler, people: fairshare.New(0), policies: o.Policies, budgets: o.Budgets, currency: o.Currency,
		tracer: o.Tracer}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.tab.Store(newTable(o.Routes, o.Backends, o.Limit))
	return g
}

// Vision tells whether model is sent images (Route.Vision).
func (g *Gateway) Vision(model string) bool {
	r := g.tab.Load().routes[model]
	return r != nil && r.Vision
}

// Models lists the public model names in configuration order.
func (g *Gateway) Models() []string { return g.tab.Load().order }

// ModelsFor lists the models p may use, in configuration order: a model
// outside their key's or teams' lists does not exist for them.
func (g *Gateway) ModelsFor(ctx context.Context, p Principal) ([]string, error) {
	order := g.tab.Load().order
	if g.policies == nil || p.UserID == 0 {
		return order, nil
	}
	pol, err := g.policies.For(ctx, p.UserID, p.KeyID)
	if err != nil {
		return nil, err
	}
	if !pol.Restricted() {
		return order, nil
	}
	var out []string
	for _, m := range order {
		if pol.Allows(m) {
			out = append(out, m)
		}
	}
	return out, nil
}

// Call is one inference request.
type Call struct {
	// API is the endpoint it came to (chat unless set).
	API proxy.API
	ID  string
	// FreshID says ID was minted for this call and given to nobody before
	// it: no stop can be waiting for it (stop.Service.BeginFresh).
	FreshID bool
	// Stop, when set, is the request's registration for Stop, made by the
	// caller before the id left it (BeginStop): the chat's reply is
	// registered before its page has the id, so that a stop sent at once
	// finds the replica running it. The gateway takes it over with the
	// call (Serve or Reject): it watches it for the request and ends it
	// with the request's outcome, on every path. Nil: the gateway
	// registers the request itself when it starts.
	Stop      *stop.Run
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
	// TraceParent and TraceState are the client's W3C trace-context
	// headers, read only when the gateway traces (Tracing): its span is
	// then their child. Not kept once the span has started.
	TraceParent, TraceState string
	// span is the request's trace, from Serve (or the refusal) on.
	span *tracing.Request
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

// EndPerson cancels every request of person running or queued on this
// replica (an admin disabled them): each ends cancelled, person_disabled.
// It returns how many there were.
func (g *Gateway) EndPerson(person uint) int { return g.people.EndPerson(person) }

// People returns the people with requests running or queued here.
func (g *Gateway) People() []uint { return g.people.People() }

// NewInferenceID returns a fresh id for a request.
func NewInferenceID() string { return newID() }

// BeginStop registers inference id, minted by the caller and given to
// nobody yet, for Stop on behalf of p, before the id leaves the caller
// (nil when the gateway has no stop service). Hand it over as Call.Stop:
// Serve or Reject then ends it. A caller that hands it to neither ends it
// itself (Run.EndWith).
func (g *Gateway) BeginStop(id string, p Principal) *stop.Run {
	if g.stops == nil {
		return nil
	}
	return g.stops.BeginFresh(id, p.UserID, nil)
}

// endStop ends the call's own registration for Stop, if it has one, for a
// request that ends without an exchange to end it.
func (c Call) endStop(outcome string) {
	if c.Stop != nil {
		c.Stop.EndWith(outcome)
	}
}
