// Package mockllm is a fake OpenAI-compatible inference engine that answers
// like vLLM's OpenAI server, byte for byte where it matters to clients.
//
// It serves POST /v1/chat/completions, /v1/completions and /v1/responses
// (streaming and not), POST /v1/embeddings, GET /v1/models and
// GET /v1/models/{id}. The completion is a deterministic English story (see
// CompletionTokens), paced by TokensPerSecond and TTFT, so that the gateway's
// demo model and its tests can run without a GPU. As with a real engine, an
// answer finishes "stop" only when it ends at a sentence, and "length" when
// max_tokens, or the mock's own length, cut it; the demo model's answers
// (WholeSentences) end at a sentence. Options.APIs turns the
// inference endpoints off one by one, to play an engine that lacks some.
//
// Tests steer a single request with an optional "mock" object in the request
// body, which the gateway passes through untouched:
//
//	"mock": {"tag": "t1", "tps": 200, "ttft_ms": 500, "tokens": 40,
//	         "fail_status": 503, "fail_message": "…", "fail_type": "…",
//	         "disconnect_after": 5, "stream_error_after": 3, "hang": true,
//	         "replay": "chat_stream.sse", "pause_after": 3, "pause_ms": 2000}
//
// pause_ms makes the stream silent that long after pause_after content
// tokens (default 1): a reasoning model thinking between two tokens.
//
// stream_error_after writes, after that many content tokens, an error frame
// and then [DONE] into the 200 stream, as vLLM does when generation fails
// (on /v1/responses: an "error" event, then "response.failed").
//
// Every inference request is recorded (see Record); a request whose client
// goes away before the response is complete is marked Cancelled, which is how
// gateway tests prove that an upstream request was cancelled.
//
// Errors use OpenAI's shape {"error":{"message","type","param","code"}} with
// code set to the HTTP status as vLLM does. Malformed requests are 400
// "invalid_request_error"; an unknown model is 404 "NotFoundError" with
// vLLM's message "The model `x` does not exist.". Unknown routes answer
// FastAPI's {"detail":"Not Found"}, again like vLLM, and so do the endpoints
// turned off by Options.APIs.
package mockllm

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// DemoModel is the model id of the gateway's built-in demo model.
const DemoModel = "moonji-demo"

// Options configures a Server. The zero value is usable.
type Options struct {
	// Models are the served model ids; default []string{"mock"}. Any other
	// requested model gets a 404.
	Models []string
	// TokensPerSecond is the default pacing between content chunks; 0 means
	// as fast as possible.
	TokensPerSecond float64
	// TTFT is the delay before the first content chunk (for embeddings,
	// before the answer). Headers are sent immediately, as vLLM does.
	TTFT time.Duration
	// Tokens is the default completion length in chunks when the request has
	// no max_tokens; default 16. The answer finishes "stop" when its last
	// token ends a sentence, "length" when it stops mid-sentence.
	Tokens int
	// WholeSentences makes an answer whose length is Tokens (the request
	// sets no max_tokens, nor the tokens knob) end at a sentence, so that it
	// finishes "stop": see SentenceLength. The demo model sets it.
	WholeSentences bool
	// ReplayDir is the directory of recorded transcripts for the "replay" knob.
	ReplayDir string
	// Logger logs each request seen and each cancellation; nil means
	// slog.Default().
	Logger *slog.Logger
	// MaxRecords bounds the request history kept for Requests and WaitFor;
	// 0 keeps everything (fine for tests), a long-running demo should set it
	// so that memory does not grow with traffic.
	MaxRecords int
	// APIs are the inference endpoints served, among APIChat, APICompletions,
	// APIEmbeddings and APIResponses; empty means all of them. The others
	// answer 404 as unknown routes do, which is how tests play a chat-only
	// engine. New panics on a name it does not know: a typo here would
	// otherwise turn into a puzzling 404.
	APIs []string
	// EmbeddingDims is the length of the vectors /v1/embeddings returns when
	// the request sets no "dimensions"; default 16.
	EmbeddingDims int
}

// DemoOptions returns the options of the gateway's demo model: DemoModel,
// about 30 tokens per second, answers of whole sentences up to 120 tokens by
// default, and a bounded history.
func DemoOptions() Options {
	return Options{
		Models:          []string{DemoModel},
		TokensPerSecond: 30,
		Tokens:          120,
		WholeSentences:  true,
		MaxRecords:      100,
	}
}

// Record describes one inference request seen by the server and what became
// of it.
type Record struct {
	// Endpoint is the API the request was sent to: APIChat, APICompletions,
	// APIEmbeddings or APIResponses.
	Endpoint     string
	Tag, Model   string
	Body         []byte
	Stream       bool
	IncludeUsage bool
	Started      time.Time
	// ChunksSent counts content tokens sent so far (for a streaming answer,
	// content chunks or text deltas; for a replayed stream, frames). The
	// role, finish and usage chunks, and the Responses API's other events,
	// are not counted. Embeddings leave it at 0.
	ChunksSent int
	// Cancelled is set when the client went away before the response was
	// complete; CancelledAt is when the server noticed.
	Cancelled   bool
	Completed   bool
	CancelledAt time.Time
	// Status is the HTTP status answered, 0 until headers are sent.
	Status int
	// Aborted is set when the disconnect_after knob tore the connection down.
	Aborted bool
}

// Server is the fake engine; it is an http.Handler.
type Server struct {
	opts    Options
	log     *slog.Logger
	created int64

	mu      sync.Mutex
	records []*Record
	// changed is closed and replaced on every record change so that WaitFor
	// can sleep until something happens instead of polling.
	changed chan struct{}
}

// New returns a Server with defaults filled in.
func New(o Options) *Server {
	if len(o.Models) == 0 {
		o.Models = []string{"mock"}
	} else {
		o.Models = slices.Clone(o.Models)
	}
	if o.Tokens <= 0 {
		o.Tokens = 16
	}
	if o.TokensPerSecond < 0 {
		o.TokensPerSecond = 0
	}
	if o.EmbeddingDims <= 0 {
		o.EmbeddingDims = defaultEmbeddingDims
	}
	if err := checkAPIs(o.APIs); err != nil {
		panic(err)
	}
	o.APIs = slices.Clone(o.APIs)
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{
		opts:    o,
		log:     log.With("component", "mockllm"),
		created: time.Now().Unix(),
		changed: make(chan struct{}),
	}
}

// ServeHTTP routes POST /v1/chat/completions, /v1/completions,
// /v1/embeddings and /v1/responses, GET /v1/models, GET /v1/models/{id} and
// GET /health.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	switch {
	case path == "/v1/chat/completions":
		s.inference(w, r, APIChat, s.chat)
	case path == "/v1/completions":
		s.inference(w, r, APICompletions, s.completions)
	case path == "/v1/embeddings":
		s.inference(w, r, APIEmbeddings, s.embeddings)
	case path == "/v1/responses":
		s.inference(w, r, APIResponses, s.responses)
	case path == "/v1/models":
		if r.Method != http.MethodGet {
			methodNotAllowed(w, http.MethodGet)
			return
		}
		s.listModels(w)
	case strings.HasPrefix(path, "/v1/models/"):
		if r.Method != http.MethodGet {
			methodNotAllowed(w, http.MethodGet)
			return
		}
		// Model ids may contain slashes (e.g. "org/name"), so take the rest.
		s.getModel(w, strings.TrimPrefix(path, "/v1/models/"))
	case path == "/health":
		// vLLM answers an empty 200; load balancers and compose health
		// checks rely on it.
		w.WriteHeader(http.StatusOK)
	default:
		writeJSON(w, http.StatusNotFound, []byte(`{"detail":"Not Found"}`))
	}
}

// inference serves a POST to one of the inference endpoints, unless
// Options.APIs turned it off: then the route does not exist.
func (s *Server) inference(w http.ResponseWriter, r *http.Request, api string, h http.HandlerFunc) {
	if !s.servesAPI(api) {
		s.disabled(w, r, api)
		return
	}
	if r.Method != http.MethodPost {
		methodNotAllowed(w, http.MethodPost)
		return
	}
	h(w, r)
}

// methodNotAllowed answers like FastAPI does for a known path.
func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeJSON(w, http.StatusMethodNotAllowed, []byte(`{"detail":"Method Not Allowed"}`))
}

func (s *Server) serves(model string) bool {
	return slices.Contains(s.opts.Models, model)
}

func (s *Server) modelJSON(id string) string {
	return fmt.Sprintf(`{"id":%s,"object":"model","created":%d,"owned_by":"moonji-mock"}`, jstr(id), s.created)
}

func (s *Server) listModels(w http.ResponseWriter) {
	var b bytes.Buffer
	b.WriteString(`{"object":"list","data":[`)
	for i, m := range s.opts.Models {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.modelJSON(m))
	}
	b.WriteString(`]}`)
	writeJSON(w, http.StatusOK, b.Bytes())
}

func (s *Server) getModel(w http.ResponseWriter, id string) {
	if !s.serves(id) {
		writeError(w, http.StatusNotFound, "NotFoundError", notFoundMessage(id))
		return
	}
	writeJSON(w, http.StatusOK, []byte(s.modelJSON(id)))
}

func notFoundMessage(model string) string {
	return fmt.Sprintf("The model `%s` does not exist.", model)
}

// Requests returns a snapshot of every request seen, in arrival order (only
// the most recent MaxRecords when that option is set).
func (s *Server) Requests() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Record, len(s.records))
	for i, r := range s.records {
		out[i] = *r
		out[i].Body = bytes.Clone(r.Body)
	}
	return out
}

// WaitFor blocks until a request tagged tag satisfies cond (nil cond accepts
// any such request) and returns a snapshot of it. It returns an error when ctx
// is done first; the error names the tag and the last state seen.
func (s *Server) WaitFor(ctx context.Context, tag string, cond func(Record) bool) (Record, error) {
	for {
		s.mu.Lock()
		var last *Record
		for _, r := range s.records {
			if r.Tag != tag {
				continue
			}
			snap := *r
			last = &snap
			if cond == nil || cond(snap) {
				s.mu.Unlock()
				return snap, nil
			}
		}
		ch := s.changed
		s.mu.Unlock()

		select {
		case <-ch:
		case <-ctx.Done():
			if last == nil {
				return Record{}, fmt.Errorf("mockllm: waiting for a request tagged %q: none seen: %w", tag, ctx.Err())
			}
			return *last, fmt.Errorf("mockllm: waiting for request tagged %q (chunks=%d cancelled=%t completed=%t aborted=%t status=%d): %w",
				tag, last.ChunksSent, last.Cancelled, last.Completed, last.Aborted, last.Status, ctx.Err())
		}
	}
}

// add appends a record and wakes waiters.
func (s *Server) add(rec *Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = append(s.records, rec)
	if n := s.opts.MaxRecords; n > 0 && len(s.records) > n {
		// Copy into a fresh slice so that the dropped records can be freed.
		s.records = slices.Clone(s.records[len(s.records)-n:])
	}
	s.notifyLocked()
}

// update applies f to rec under the lock and wakes waiters.
func (s *Server) update(rec *Record, f func(*Record)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(rec)
	s.notifyLocked()
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}
