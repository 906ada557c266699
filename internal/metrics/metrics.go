// Package metrics defines the Prometheus metrics the gateway exports. Every
// label combination that is known at start (model × outcome, rejection
// reasons, backends) is created at zero, so the first error of a kind shows
// up in rate() instead of appearing from nowhere at 1.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Outcomes, rejection reasons and stop results known in advance.
var (
	Outcomes         = []string{"success", "error", "cancelled", "stopped", "rejected"}
	RejectionReasons = []string{"unauthorized", "auth_blocked", "invalid_request", "model_not_found", "rate_limited", "queue_full", "queue_timeout", "engine_unavailable", "api_not_supported", "too_many_generations"}
	StopResults      = []string{"acked", "local", "timeout", "finished", "not_found", "unavailable"}
)

// Metrics holds every collector, on a registry of its own so that several
// gateways can live in one test process.
type Metrics struct {
	Registry *prometheus.Registry

	Requests        *prometheus.CounterVec   // model, outcome
	Rejections      *prometheus.CounterVec   // reason
	TTFT            *prometheus.HistogramVec // model
	QueueWait       *prometheus.HistogramVec // backend
	Duration        *prometheus.HistogramVec // model
	PromptTokens    *prometheus.CounterVec   // model
	CompletionToks  *prometheus.CounterVec   // model
	DecodeSpeed     *prometheus.HistogramVec // model
	InFlight        *prometheus.GaugeVec     // backend
	Queued          *prometheus.GaugeVec     // backend
	RateLimitDegrad prometheus.Gauge
	BackendUp       *prometheus.GaugeVec   // backend
	Retries         *prometheus.CounterVec // backend (the one that failed)
	SharedDegraded  prometheus.Gauge
	Stops           *prometheus.CounterVec // result
	StopLatency     prometheus.Histogram
	// Panics counts requests (and streams) that panicked and failed alone.
	Panics prometheus.Counter
	// RetentionDeleted counts rows retention deleted, by table
	// (internal/retention).
	RetentionDeleted *prometheus.CounterVec

	// The children of the vectors for every model and backend known at
	// start, looked up once: WithLabelValues hashes its labels and takes the
	// vector's lock on every call, and a request made eight such calls
	// (~5 µs, 2–3 % of the gateway's CPU at 1,000 req/s). Read-only after
	// New.
	models   map[string]*Model
	backends map[string]*Backend
}

// Model is one model's metrics.
type Model struct {
	requests                       map[string]prometheus.Counter // by outcome
	TTFT, Duration, DecodeSpeed    prometheus.Observer
	PromptTokens, CompletionTokens prometheus.Counter
	m                              *Metrics
	name                           string
}

// Backend is one backend's metrics.
type Backend struct {
	InFlight, Queued prometheus.Gauge
	QueueWait        prometheus.Observer
}

// New creates and registers the metrics, pre-registering every known label
// combination at zero.
func New(models, backends []string) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	latency := []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := &Metrics{
		Registry: reg,
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moonji_requests_total", Help: "Inference requests by model and outcome.",
		}, []string{"model", "outcome"}),
		Rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moonji_rejections_total", Help: "Rejected inference requests by reason.",
		}, []string{"reason"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "moonji_time_to_first_token_seconds", Help: "Time from the request's arrival to its first content chunk.",
			Buckets: latency,
		}, []string{"model"}),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "moonji_queue_wait_seconds", Help: "Time spent waiting for a backend slot.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"backend"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "moonji_request_duration_seconds", Help: "Time from the request's arrival to its end.",
			Buckets: latency,
		}, []string{"model"}),
		PromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moonji_prompt_tokens_total", Help: "Prompt tokens processed.",
		}, []string{"model"}),
		CompletionToks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moonji_completion_tokens_total", Help: "Completion tokens delivered.",
		}, []string{"model"}),
		DecodeSpeed: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "moonji_decode_tokens_per_second", Help: "Completion tokens per second after the first token.",
			Buckets: []float64{1, 5, 10, 20, 30, 50, 75, 100, 150, 200, 500, 1000},
		}, []string{"model"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "moonji_backend_in_flight", Help: "Requests holding a backend slot.",
		}, []string{"backend"}),
		Queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "moonji_backend_queued", Help: "Requests waiting for a backend slot.",
		}, []string{"backend"}),
		RateLimitDegrad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "moonji_ratelimit_degraded", Help: "1 while Redis is unreachable and rate limits are per replica.",
		}),
		BackendUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "moonji_backend_up", Help: "1 while the backend takes traffic; 0 after a failure, until a probe passes.",
		}, []string{"backend"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moonji_backend_retries_total", Help: "Requests the backend failed before answering that were retried on another backend.",
		}, []string{"backend"}),
		SharedDegraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "moonji_concurrency_limit_degraded", Help: "1 while Redis is unreachable and each backend's max_concurrency is shared out per replica.",
		}),
		Stops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moonji_stops_total", Help: "Stop requests by result.",
		}, []string{"result"}),
		StopLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "moonji_stop_latency_seconds", Help: "Time from a stop request to the owner's acknowledgement.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .02, .05, .1, .25, .5, 1, 2},
		}),
		Panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moonji_panics_total", Help: "Requests whose handling panicked: each failed alone, the process went on.",
		}),
		RetentionDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moonji_retention_deleted_rows_total", Help: "Rows deleted by retention, by table (conversations: conversations, with their messages).",
		}, []string{"table"}),
	}
	reg.MustRegister(m.Requests, m.Rejections, m.TTFT, m.QueueWait, m.Duration, m.PromptTokens,
		m.CompletionToks, m.DecodeSpeed, m.InFlight, m.Queued, m.RateLimitDegrad, m.BackendUp, m.Retries, m.SharedDegraded, m.Stops, m.StopLatency, m.Panics,
		m.RetentionDeleted)
	m.models = make(map[string]*Model, len(models))
	for _, model := range models {
		m.models[model] = m.newModel(model)
	}
	for _, r := range RejectionReasons {
		m.Rejections.WithLabelValues(r)
	}
	m.backends = make(map[string]*Backend, len(backends))
	for _, b := range backends {
		m.backends[b] = m.newBackend(b)
		m.BackendUp.WithLabelValues(b).Set(1)
		m.Retries.WithLabelValues(b)
	}
	for _, r := range StopResults {
		m.Stops.WithLabelValues(r)
	}
	for _, t := range []string{"usage", "conversations"} {
		m.RetentionDeleted.WithLabelValues(t)
	}
	return m
}

func (m *Metrics) newModel(name string) *Model {
	mm := &Model{
		requests: make(map[string]prometheus.Counter, len(Outcomes)),
		TTFT:     m.TTFT.WithLabelValues(name), Duration: m.Duration.WithLabelValues(name),
		DecodeSpeed: m.DecodeSpeed.WithLabelValues(name), PromptTokens: m.PromptTokens.WithLabelValues(name),
		CompletionTokens: m.CompletionToks.WithLabelValues(name), m: m, name: name,
	}
	for _, o := range Outcomes {
		mm.requests[o] = m.Requests.WithLabelValues(name, o)
	}
	return mm
}

func (m *Metrics) newBackend(name string) *Backend {
	return &Backend{InFlight: m.InFlight.WithLabelValues(name), Queued: m.Queued.WithLabelValues(name),
		QueueWait: m.QueueWait.WithLabelValues(name)}
}

// Model returns the metrics of the model name: looked up once for a model
// known at start, made anew (and as correct, only slower) for another.
func (m *Metrics) Model(name string) *Model {
	if mm, ok := m.models[name]; ok {
		return mm
	}
	return m.newModel(name)
}

// Backend returns the metrics of the backend name, as Model does.
func (m *Metrics) Backend(name string) *Backend {
	if b, ok := m.backends[name]; ok {
		return b
	}
	return m.newBackend(name)
}

// Requests returns the counter of the model's requests that ended with
// outcome.
func (mm *Model) Requests(outcome string) prometheus.Counter {
	if c, ok := mm.requests[outcome]; ok {
		return c
	}
	return mm.m.Requests.WithLabelValues(mm.name, outcome)
}

// Handler serves the metrics in Prometheus' text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}
