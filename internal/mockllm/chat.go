package mockllm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
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
	k.replay = m.Get("replay").String()
	return k
}

// pacing is when tokens are due: token i (1-based) at TTFT + i/TPS after the
// request started, so a stream of n tokens takes about TTFT + n/TPS.
type pacing struct {
	ttft     time.Duration
	interval time.Duration
}

func (p pacing) due(start time.Time, i int) time.Time {
	return start.Add(p.ttft + time.Duration(i)*p.interval)
}

func (s *Server) pacing(k knobs) pacing {
	p := pacing{ttft: s.opts.TTFT}
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
	id           string
	created      int64
	model        string
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
	start := time.Now()
	ctx := r.Context()
	body, readErr := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	req := gjson.ParseBytes(body)
	// jsonguard, not gjson.ValidBytes: that recurses once per nesting level
	// and a few MB of "[" overflow the stack, ending the process (the demo
	// engine runs inside the gateway's).
	valid := readErr == nil && jsonguard.Validate(body, nil) == nil && req.IsObject()

	rec := &Record{Body: body, Started: start}
	k := knobs{disconnectAfter: -1, streamErrorAfter: -1}
	if valid {
		k = parseKnobs(req.Get("mock"))
		rec.Tag = k.tag
		rec.Model = req.Get("model").String()
		rec.Stream = req.Get("stream").Bool()
		rec.IncludeUsage = rec.Stream && req.Get("stream_options.include_usage").Bool()
	}
	s.add(rec)
	s.log.Info("request", "tag", rec.Tag, "model", rec.Model, "stream", rec.Stream,
		"include_usage", rec.IncludeUsage, "bytes", len(body), "remote", r.RemoteAddr)

	if !valid {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", invalidBodyMessage(body, readErr))
		return
	}

	// The knobs that replace the answer come before validation: a test that
	// asks for a failure, a hang or a recording gets exactly that.
	switch {
	case k.failStatus != 0:
		if k.failStatus < 400 || k.failStatus > 599 {
			s.fail(w, rec, http.StatusBadRequest, "invalid_request_error",
				fmt.Sprintf("mock.fail_status must be between 400 and 599, got %d", k.failStatus))
			return
		}
		typ, msg := k.failType, k.failMessage
		if typ == "" {
			typ = errorType(k.failStatus)
		}
		if msg == "" {
			msg = fmt.Sprintf("mock failure: %s", http.StatusText(k.failStatus))
		}
		s.fail(w, rec, k.failStatus, typ, msg)
		return
	case k.hang:
		<-ctx.Done()
		s.cancelled(rec, "hang", context.Cause(ctx))
		return
	case k.replay != "":
		s.replay(ctx, w, rec, k)
		return
	}

	model := rec.Model
	if model == "" {
		// vLLM falls back to its first served model when none is named.
		model = s.opts.Models[0]
	}
	if !s.serves(model) {
		s.fail(w, rec, http.StatusNotFound, "NotFoundError", notFoundMessage(model))
		return
	}
	msgs := req.Get("messages")
	if !msgs.IsArray() || len(msgs.Array()) == 0 {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", "'messages' must be a non-empty array")
		return
	}
	n, finish, err := s.completionLength(req, k)
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
	if prompt+n > maxModelLen {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			maxModelLen, prompt+n, prompt, n))
		return
	}

	last := lastUserText(msgs)
	tokens := CompletionTokens(last, n)
	if echo, ok := strings.CutPrefix(last, EchoPrefix); ok {
		if tokens = EchoTokens(echo); finish == "length" && len(tokens) > n {
			tokens = tokens[:n]
		}
	}
	g := gen{
		id:               newID(),
		created:          start.Unix(),
		model:            model,
		tokens:           tokens,
		finish:           finish,
		choices:          choices,
		promptTokens:     prompt,
		includeUsage:     rec.IncludeUsage,
		pace:             s.pacing(k),
		start:            start,
		disconnectAfter:  k.disconnectAfter,
		streamErrorAfter: k.streamErrorAfter,
	}
	if rec.Stream {
		s.stream(ctx, w, rec, g)
	} else {
		s.complete(ctx, w, rec, g)
	}
}

// completionLength returns how many tokens to generate and the finish reason:
// "length" when the client's limit cut the text, "stop" when the mock chose.
func (s *Server) completionLength(req gjson.Result, k knobs) (int, string, error) {
	for _, field := range []string{"max_completion_tokens", "max_tokens"} {
		v := req.Get(field)
		switch v.Type {
		case gjson.Null: // Missing or explicit null: unset.
			continue
		case gjson.Number:
			if v.Float() != float64(v.Int()) {
				return 0, "", fmt.Errorf("%s must be an integer, got %s", field, v.Raw)
			}
			if v.Int() < 1 {
				return 0, "", fmt.Errorf("%s must be at least 1, got %d", field, v.Int())
			}
			return int(min(v.Int(), maxModelLen+1)), "length", nil
		default:
			return 0, "", fmt.Errorf("%s must be an integer, got %s", field, v.Raw)
		}
	}
	if k.tokens > 0 {
		return k.tokens, "stop", nil
	}
	return s.opts.Tokens, "stop", nil
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
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	s.update(rec, func(r *Record) { r.Status = http.StatusOK })
	send := func(payload string) error {
		if _, err := io.WriteString(w, "data: "+payload+"\n\n"); err != nil {
			return fmt.Errorf("writing SSE frame: %w", err)
		}
		if err := rc.Flush(); err != nil {
			return fmt.Errorf("flushing SSE frame: %w", err)
		}
		return nil
	}
	// Headers go out at once, as with vLLM, so a client can tell "accepted,
	// waiting for the first token" from "not answering".
	if err := rc.Flush(); err != nil {
		s.cancelled(rec, "headers", err)
		return
	}
	if !waitUntil(ctx, g.start.Add(g.pace.ttft)) {
		s.cancelled(rec, "ttft", context.Cause(ctx))
		return
	}

	prefix := fmt.Sprintf(`{"id":%s,"object":"chat.completion.chunk","created":%d,"model":%s,"choices":[`,
		jstr(g.id), g.created, jstr(g.model))
	for c := range g.choices {
		if err := send(prefix + `{"index":` + strconv.Itoa(c) + `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`); err != nil {
			s.cancelled(rec, "ttft", err)
			return
		}
	}
	for i, tok := range g.tokens {
		if i == g.disconnectAfter {
			s.abort(rec)
		}
		if i == g.streamErrorAfter {
			// vLLM's streaming error: an error frame, then [DONE], in a 200.
			_ = send(`{"error":{"message":"The engine failed while generating.","type":"InternalServerError","param":null,"code":500}}`)
			_ = send("[DONE]")
			s.completed(rec)
			return
		}
		if !waitUntil(ctx, g.pace.due(g.start, i+1)) {
			s.cancelled(rec, "streaming", context.Cause(ctx))
			return
		}
		for c := range g.choices {
			if err := send(prefix + `{"index":` + strconv.Itoa(c) + `,"delta":{"content":` + jstr(tok) + `},"logprobs":null,"finish_reason":null}]}`); err != nil {
				s.cancelled(rec, "streaming", err)
				return
			}
		}
		s.update(rec, func(r *Record) { r.ChunksSent = i + 1 })
	}
	if g.disconnectAfter >= len(g.tokens) {
		s.abort(rec)
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
		if err := send(f); err != nil {
			s.cancelled(rec, "finishing", err)
			return
		}
	}
	s.completed(rec)
}

// complete generates at the same pace as a stream, so that cancellation and
// latency behave alike, then writes one chat.completion object.
func (s *Server) complete(ctx context.Context, w http.ResponseWriter, rec *Record, g gen) {
	for i := range g.tokens {
		if i == g.disconnectAfter {
			s.abort(rec)
		}
		if !waitUntil(ctx, g.pace.due(g.start, i+1)) {
			phase := "generating"
			if i == 0 {
				phase = "ttft"
			}
			s.cancelled(rec, phase, context.Cause(ctx))
			return
		}
		s.update(rec, func(r *Record) { r.ChunksSent = i + 1 })
	}
	if g.disconnectAfter >= len(g.tokens) {
		s.abort(rec)
	}
	choices := make([]string, g.choices)
	for c := range choices {
		choices[c] = fmt.Sprintf(`{"index":%d,"message":{"role":"assistant","content":%s,"tool_calls":[]},"logprobs":null,"finish_reason":%s,"stop_reason":null}`,
			c, jstr(strings.Join(g.tokens, "")), jstr(g.finish))
	}
	body := fmt.Sprintf(`{"id":%s,"object":"chat.completion","created":%d,"model":%s,"choices":[%s],"usage":%s,"prompt_logprobs":null}`,
		jstr(g.id), g.created, jstr(g.model), strings.Join(choices, ","), usageJSON(g.promptTokens, g.choices*len(g.tokens)))
	s.update(rec, func(r *Record) { r.Status = http.StatusOK })
	if err := writeJSON(w, http.StatusOK, []byte(body)); err != nil {
		s.cancelled(rec, "writing", err)
		return
	}
	s.completed(rec)
}

// usageJSON renders usage with vLLM's field order.
func usageJSON(prompt, completion int) string {
	return fmt.Sprintf(`{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}`, prompt, prompt+completion, completion)
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

// newID returns a vLLM-style completion id.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails since Go 1.24.
	return "chatcmpl-" + hex.EncodeToString(b[:])
}
