package mockllm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// maxBodyBytes bounds request bodies; real prompts are far smaller and a
// runaway client should not exhaust the test process.
const maxBodyBytes = 32 << 20

// knobs are the per-request test controls from the "mock" body object.
type knobs struct {
	tag             string
	tps             float64
	hasTPS          bool
	ttft            time.Duration
	hasTTFT         bool
	tokens          int // 0 = unset
	failStatus      int // 0 = unset
	failMessage     string
	failType        string
	disconnectAfter int // -1 = unset
	// streamErrorAfter writes an error frame after that many content
	// tokens, then [DONE], as vLLM does when generation fails mid-stream;
	// -1 = unset.
	streamErrorAfter int
	hang             bool
	replay           string
	// pauseAfter tokens, the stream goes silent for pause (a reasoning
	// model thinking between two tokens); 0 = no pause.
	pauseAfter int
	pause      time.Duration
}

func parseKnobs(m gjson.Result) knobs {
	k := knobs{disconnectAfter: -1, streamErrorAfter: -1}
	if !m.IsObject() {
		return k
	}
	k.tag = m.Get("tag").String()
	if v := m.Get("tps"); v.Type == gjson.Number {
		k.tps, k.hasTPS = max(v.Float(), 0), true
	}
	if v := m.Get("ttft_ms"); v.Type == gjson.Number {
		k.ttft, k.hasTTFT = time.Duration(max(v.Float(), 0)*float64(time.Millisecond)), true
	}
	if v := m.Get("tokens"); v.Type == gjson.Number && v.Int() > 0 {
		k.tokens = int(v.Int())
	}
	if v := m.Get("fail_status"); v.Type == gjson.Number {
		k.failStatus = int(v.Int())
	}
	k.failMessage = m.Get("fail_message").String()
	k.failType = m.Get("fail_type").String()
	if v := m.Get("disconnect_after"); v.Type == gjson.Number && v.Int() >= 0 {
		k.disconnectAfter = int(v.Int())
	}
	if v := m.Get("stream_error_after"); v.Type == gjson.Number && v.Int() >= 0 {
		k.streamErrorAfter = int(v.Int())
	}
	k.hang = m.Get("hang").Bool()
	if v := m.Get("pause_ms"); v.Type == gjson.Number && v.Float() > 0 {
		k.pause = time.Duration(v.Float() * float64(time.Millisecond))
		k.pauseAfter = max(int(m.Get("pause_after").Int()), 1)
	}
	k.replay = m.Get("replay").String()
	return k
}

// pacing is when tokens are due: token i (1-based) at TTFT + i/TPS after the
// request started, so a stream of n tokens takes about TTFT + n/TPS.
type pacing struct {
	ttft     time.Duration
	interval time.Duration
	// pause delays the tokens after the first pauseAfter.
	pauseAfter int
	pause      time.Duration
}

func (p pacing) due(start time.Time, i int) time.Time {
	t := start.Add(p.ttft + time.Duration(i)*p.interval)
	if p.pause > 0 && i > p.pauseAfter {
		t = t.Add(p.pause)
	}
	return t
}

func (s *Server) pacing(k knobs) pacing {
	p := pacing{ttft: s.opts.TTFT, pauseAfter: k.pauseAfter, pause: k.pause}
	if k.hasTTFT {
		p.ttft = k.ttft
	}
	tps := s.opts.TokensPerSecond
	if k.hasTPS {
		tps = k.tps
	}
	if tps > 0 {
		p.interval = time.Duration(float64(time.Second) / tps)
	}
	return p
}

// gen is everything needed to produce one validated completion.
type gen struct {
	id      string
	created int64
	model   string
	// tokens is the answer (every choice's; completionGen has one per
	// choice instead).
	tokens       []string
	finish       string
	promptTokens int
	includeUsage bool
	pace         pacing
	start        time.Time
	// disconnectAfter is the number of content tokens after which the
	// connection is torn down; -1 disables it.
	disconnectAfter int
	// streamErrorAfter: see knobs.
	streamErrorAfter int
	// choices is n: each choice gets the same tokens, interleaved one
	// frame per choice and token as vLLM streams them.
	choices int
}

// maxModelLen is the context window the mock claims. Like vLLM it refuses
// longer requests, which also keeps a max_tokens typo from spinning forever.
const maxModelLen = 131072

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	req, rec, k, ok := s.begin(w, r, APIChat)
	if !ok {
		return
	}
	model, ok := s.servedModel(w, rec)
	if !ok {
		return
	}
	msgs := req.Get("messages")
	if !msgs.IsArray() || len(msgs.Array()) == 0 {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", "'messages' must be a non-empty array")
		return
	}
	l, err := s.completionLength(req, k, "max_completion_tokens", "max_tokens")
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	choices, err := choiceCount(req.Get("n"))
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	prompt := promptTokens(msgs)
	if err := contextTooLong(prompt, l.n, "messages"); err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}

	g := s.newGen(rec, k, model)
	g.id = newID("chatcmpl-")
	g.tokens, g.finish = s.answerTokens(contextOrPrompt(msgs), l)
	if strings.HasPrefix(lastUserText(msgs), DescribePrefix) {
		g.tokens, g.finish = EchoTokens(describeImages(msgs)), "stop"
	}
	g.choices = choices
	g.promptTokens = prompt
	if rec.Stream {
		s.stream(r.Context(), w, rec, g)
	} else {
		s.complete(r.Context(), w, rec, g)
	}
}

// answerLength is how long an answer is to be, and who said so.
type answerLength struct {
	n int
	// limited is set when the request's limit (max_tokens, or its API's
	// name for it) set n: an answer that reaches n was cut by it.
	limited bool
	// byDefault is set when n is Options.Tokens: neither the request nor
	// its tokens knob chose it.
	byDefault bool
}

// completionLength returns how many tokens to generate: the first of fields
// that the request sets, else the tokens knob, else Options.Tokens.
func (s *Server) completionLength(req gjson.Result, k knobs, fields ...string) (answerLength, error) {
	for _, field := range fields {
		v := req.Get(field)
		switch v.Type {
		case gjson.Null: // Missing or explicit null: unset.
			continue
		case gjson.Number:
			if v.Float() != float64(v.Int()) {
				return answerLength{}, fmt.Errorf("%s must be an integer, got %s", field, v.Raw)
			}
			if v.Int() < 1 {
				return answerLength{}, fmt.Errorf("%s must be at least 1, got %d", field, v.Int())
			}
			return answerLength{n: int(min(v.Int(), maxModelLen+1)), limited: true}, nil
		default:
			return answerLength{}, fmt.Errorf("%s must be an integer, got %s", field, v.Raw)
		}
	}
	if k.tokens > 0 {
		return answerLength{n: k.tokens}, nil
	}
	return answerLength{n: s.opts.Tokens, byDefault: true}, nil
}

// maxChoices bounds n: every choice costs the mock a frame per token.
const maxChoices = 64

// choiceCount reads n, the number of choices: 1 when missing or null.
func choiceCount(v gjson.Result) (int, error) {
	switch {
	case v.Type == gjson.Null:
		return 1, nil
	case v.Type != gjson.Number || v.Float() != float64(v.Int()):
		return 0, fmt.Errorf("n must be an integer, got %s", v.Raw)
	case v.Int() < 1 || v.Int() > maxChoices:
		return 0, fmt.Errorf("n must be between 1 and %d, got %d", maxChoices, v.Int())
	}
	return int(v.Int()), nil
}

// stream writes the answer as Server-Sent Events in vLLM's chunk format:
// with n > 1, a role chunk for every choice first, then each token as one
// chunk per choice, then each choice's finish chunk.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, rec *Record, g gen) {
	out := s.startSSE(w, rec)
	if out == nil {
		return
	}
	if !waitUntil(ctx, g.start.Add(g.pace.ttft)) {
		s.cancelled(rec, "ttft", context.Cause(ctx))
		return
	}

	prefix := fmt.Sprintf(`{"id":%s,"object":"chat.completion.chunk","created":%d,"model":%s,"choices":[`,
		jstr(g.id), g.created, jstr(g.model))
	for c := range g.choices {
		if err := out.data(prefix + `{"index":` + strconv.Itoa(c) + `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`); err != nil {
			s.cancelled(rec, "ttft", err)
			return
		}
	}
	emit := func(i int) error {
		for c := range g.choices {
			if err := out.data(prefix + `{"index":` + strconv.Itoa(c) + `,"delta":{"content":` + jstr(g.tokens[i]) + `},"logprobs":null,"finish_reason":null}]}`); err != nil {
				return err
			}
		}
		return nil
	}
	if !s.generate(ctx, rec, g, len(g.tokens), emit, out.engineError) {
		return
	}

	var frames []string
	for c := range g.choices {
		frames = append(frames, prefix+`{"index":`+strconv.Itoa(c)+`,"delta":{"content":""},"logprobs":null,"finish_reason":`+jstr(g.finish)+`,"stop_reason":null}]}`)
	}
	if g.includeUsage {
		frames = append(frames, prefix+`],"usage":`+usageJSON(g.promptTokens, g.choices*len(g.tokens))+`}`)
	}
	frames = append(frames, "[DONE]")
	for _, f := range frames {
		if err := out.data(f); err != nil {
			s.cancelled(rec, "finishing", err)
			return
		}
	}
	s.completed(rec)
}

// complete generates at the same pace as a stream, so that cancellation and
// latency behave alike, then writes one chat.completion object.
func (s *Server) complete(ctx context.Context, w http.ResponseWriter, rec *Record, g gen) {
	if !s.generate(ctx, rec, g, len(g.tokens), nil, nil) {
		return
	}
	choices := make([]string, g.choices)
	for c := range choices {
		choices[c] = fmt.Sprintf(`{"index":%d,"message":{"role":"assistant","content":%s,"tool_calls":[]},"logprobs":null,"finish_reason":%s,"stop_reason":null}`,
			c, jstr(strings.Join(g.tokens, "")), jstr(g.finish))
	}
	body := fmt.Sprintf(`{"id":%s,"object":"chat.completion","created":%d,"model":%s,"choices":[%s],"usage":%s,"prompt_logprobs":null}`,
		jstr(g.id), g.created, jstr(g.model), strings.Join(choices, ","), usageJSON(g.promptTokens, g.choices*len(g.tokens)))
	s.answer(w, rec, body)
}

// usageJSON renders usage with vLLM's field order.
func usageJSON(prompt, completion int) string {
	return fmt.Sprintf(`{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}`, prompt, prompt+completion, completion)
}

// answer writes a whole 200 JSON answer and records it.
func (s *Server) answer(w http.ResponseWriter, rec *Record, body string) {
	s.update(rec, func(r *Record) { r.Status = http.StatusOK })
	if err := writeJSON(w, http.StatusOK, []byte(body)); err != nil {
		s.cancelled(rec, "writing", err)
		return
	}
	s.completed(rec)
}

// fail answers an OpenAI-format error and records it.
func (s *Server) fail(w http.ResponseWriter, rec *Record, status int, typ, msg string) {
	s.log.Info("answering error", "tag", rec.Tag, "status", status, "type", typ, "message", msg)
	s.update(rec, func(r *Record) { r.Status = status })
	if err := writeError(w, status, typ, msg); err != nil {
		s.cancelled(rec, "writing error", err)
		return
	}
	s.completed(rec)
}

func (s *Server) completed(rec *Record) {
	s.update(rec, func(r *Record) { r.Completed = true })
}

// cancelled records that the client went away; cause says how it was noticed.
func (s *Server) cancelled(rec *Record, phase string, cause error) {
	now := time.Now()
	var chunks int
	s.update(rec, func(r *Record) {
		r.Cancelled = true
		r.CancelledAt = now
		chunks = r.ChunksSent
	})
	s.log.Info("request cancelled by client", "tag", rec.Tag, "model", rec.Model, "phase", phase,
		"chunks_sent", chunks, "after", now.Sub(rec.Started), "cause", cause)
}

// abort tears the connection down on purpose (disconnect_after knob). The
// ErrAbortHandler panic makes net/http drop the connection without logging,
// so the client sees a torn chunked body (unexpected EOF), not a clean end.
func (s *Server) abort(rec *Record) {
	var chunks int
	s.update(rec, func(r *Record) {
		r.Aborted = true
		chunks = r.ChunksSent
	})
	s.log.Info("aborting connection as asked by disconnect_after", "tag", rec.Tag, "chunks_sent", chunks)
	panic(http.ErrAbortHandler)
}

// waitUntil sleeps until t and reports whether ctx is still alive. It checks
// ctx even when t has passed, so an unpaced stream still stops at once.
func waitUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// promptTokens approximates the prompt length: whitespace-separated words of
// every text content plus one per message for the chat template.
func promptTokens(msgs gjson.Result) int {
	n := 0
	msgs.ForEach(func(_, m gjson.Result) bool {
		n += 1 + len(strings.Fields(messageText(m.Get("content"))))
		return true
	})
	return n
}

// messageText returns a message content as text: the string itself, or the
// text parts of an array content joined by newlines.
func messageText(c gjson.Result) string {
	if c.Type == gjson.String {
		return c.String()
	}
	if !c.IsArray() {
		return ""
	}
	var parts []string
	c.ForEach(func(_, p gjson.Result) bool {
		if t := p.Get("text"); t.Type == gjson.String {
			parts = append(parts, t.String())
		}
		return true
	})
	return strings.Join(parts, "\n")
}

// ContextCommand is a last message the mock answers with the messages it
// received before it, "role: content" each, in paragraphs: browser tests
// read on the page exactly what the engine was sent.
const ContextCommand = "/context"

// contextOrPrompt is the prompt that picks the answer: the last user
// message, or for ContextCommand an echo of the messages before it.
func contextOrPrompt(msgs gjson.Result) string {
	last := lastUserText(msgs)
	if strings.TrimSpace(last) != ContextCommand {
		return last
	}
	var lines []string
	all := msgs.Array()
	for _, m := range all[:max(0, len(all)-1)] {
		lines = append(lines, m.Get("role").String()+": "+messageText(m.Get("content")))
	}
	if len(lines) == 0 {
		lines = []string{"(nothing before)"}
	}
	return EchoPrefix + strings.Join(lines, "\n\n")
}

// lastUserText is the content of the last user message, which picks the story.
func lastUserText(msgs gjson.Result) string {
	last := ""
	msgs.ForEach(func(_, m gjson.Result) bool {
		if m.Get("role").String() == "user" {
			last = messageText(m.Get("content"))
		}
		return true
	})
	return last
}

func invalidBodyMessage(body []byte, readErr error) string {
	if readErr != nil {
		return fmt.Sprintf("reading request body: %v", readErr)
	}
	// Decoding into an empty interface is only used to get a precise error
	// message; the request itself is always read with gjson.
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Sprintf("invalid JSON body: %v", err)
	}
	return "request body must be a JSON object"
}

// errorType maps a status to an OpenAI-style error type for fail_status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	}
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

func writeError(w http.ResponseWriter, status int, typ, msg string) error {
	body := fmt.Sprintf(`{"error":{"message":%s,"type":%s,"param":null,"code":%d}}`, jstr(msg), jstr(typ), status)
	return writeJSON(w, status, []byte(body))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if _, err := w.Write(body); err != nil {
		return fmt.Errorf("writing %d response: %w", status, err)
	}
	return nil
}

// jstr encodes s as a JSON string the way Python's pydantic does: UTF-8 kept
// as is and no HTML escaping of <, > and &.
func jstr(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // Encoding a string cannot fail.
	return strings.TrimSuffix(b.String(), "\n")
}

// newID returns a vLLM-style id: prefix ("chatcmpl-", "cmpl-", "resp_",
// "msg_") and 32 random hex digits.
func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails since Go 1.24.
	return prefix + hex.EncodeToString(b[:])
}
