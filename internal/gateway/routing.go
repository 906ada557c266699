package gateway

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"moonji/internal/admission"
	"moonji/internal/money"
	"moonji/internal/proxy"
	"moonji/models"
)

// Routing: which backends serve a public model (from configuration only),
// and the backends as the dashboard lists them.

// EngineLink carries chat requests to an engine over the engine protocol
// (enginelink.Link): the same answer as proxy.Client.ChatCompletions, for a
// session named by the request's inference id.
type EngineLink interface {
	ChatCompletions(ctx context.Context, session, model string, body []byte, traceparent string) (*http.Response, error)
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
	// Price is what the model's tokens cost (zero: free).
	Price money.Price
	// MaxOutput is the output a request that sets no limit may make (the
	// engine is given it when the model has a price; 0: none given) and
	// ReserveOutput what a budget reserves for such a request.
	MaxOutput, ReserveOutput int
	// Vision tells that the model is sent images; a request with an
	// image part to another is refused (proxy.ImagePart).
	Vision bool

	// users counts the requests that looked this route up and have not
	// ended (Gateway.route): after a reload, what only the old routes used
	// (an engine's link, a builtin engine) is closed once they read 0.
	users atomic.Int64
}

// InUse is how many requests hold the route: running, or queued for a slot.
func (r *Route) InUse() int64 { return r.users.Load() }

// cost is what row's tokens cost at the route's price; a rejected request
// costs nothing, whatever it holds.
func (r *Route) cost(row *models.Usage) int64 {
	if r == nil || row.Outcome == models.OutcomeRejected || r.Price.Free() {
		return 0
	}
	return money.Cost(r.Price, money.Tokens{Prompt: int64(row.PromptTokens), Cached: int64(row.CachedTokens),
		Completion: int64(row.CompletionTokens)})
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
	backends := g.tab.Load().backends
	out := make([]BackendState, len(backends))
	for i, bi := range backends {
		out[i] = BackendState{Name: bi.b.Name, Kind: bi.b.Kind, Models: bi.models, Up: bi.b.Health == nil || bi.b.Health.Up()}
		if g.sched != nil {
			out[i].Snapshot = g.sched.Snapshot(bi.b.Name)
		}
	}
	return out
}
