package mockllm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
)

// begin does what every inference endpoint does first: it reads and records
// the request, then applies the knobs that replace the answer (fail_status,
// hang, replay). It reports false when the request has been answered
// already; otherwise the endpoint takes over with the parsed body, its record
// and its knobs.
func (s *Server) begin(w http.ResponseWriter, r *http.Request, api string) (gjson.Result, *Record, knobs, bool) {
	start := time.Now()
	ctx := r.Context()
	body, readErr := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	req := gjson.ParseBytes(body)
	// jsonguard, not gjson.ValidBytes: that recurses once per nesting level
	// and a few MB of "[" overflow the stack, ending the process (the demo
	// engine runs inside the gateway's).
	valid := readErr == nil && jsonguard.Validate(body, nil) == nil && req.IsObject()

	rec := &Record{Endpoint: api, Body: body, Started: start}
	k := knobs{disconnectAfter: -1, streamErrorAfter: -1}
	if valid {
		k = parseKnobs(req.Get("mock"))
		rec.Tag = k.tag
		rec.Model = req.Get("model").String()
		rec.Stream = req.Get("stream").Bool()
		rec.IncludeUsage = rec.Stream && req.Get("stream_options.include_usage").Bool()
	}
	s.add(rec)
	s.log.Info("request", "endpoint", api, "tag", rec.Tag, "model", rec.Model, "stream", rec.Stream,
		"include_usage", rec.IncludeUsage, "bytes", len(body), "remote", r.RemoteAddr)

	if !valid {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", invalidBodyMessage(body, readErr))
		return req, rec, k, false
	}

	// The knobs that replace the answer come before validation: a test that
	// asks for a failure, a hang or a recording gets exactly that.
	switch {
	case k.failStatus != 0:
		if k.failStatus < 400 || k.failStatus > 599 {
			s.fail(w, rec, http.StatusBadRequest, "invalid_request_error",
				fmt.Sprintf("mock.fail_status must be between 400 and 599, got %d", k.failStatus))
			return req, rec, k, false
		}
		typ, msg := k.failType, k.failMessage
		if typ == "" {
			typ = errorType(k.failStatus)
		}
		if msg == "" {
			msg = fmt.Sprintf("mock failure: %s", http.StatusText(k.failStatus))
		}
		s.fail(w, rec, k.failStatus, typ, msg)
		return req, rec, k, false
	case k.hang:
		<-ctx.Done()
		s.cancelled(rec, "hang", context.Cause(ctx))
		return req, rec, k, false
	case k.replay != "":
		s.replay(ctx, w, rec, k)
		return req, rec, k, false
	}
	return req, rec, k, true
}

// servedModel returns the model the request names, or the first served one
// when it names none, as vLLM does. It answers 404 and reports false for a
// model that is not served.
func (s *Server) servedModel(w http.ResponseWriter, rec *Record) (string, bool) {
	model := rec.Model
	if model == "" {
		model = s.opts.Models[0]
	}
	if !s.serves(model) {
		s.fail(w, rec, http.StatusNotFound, "NotFoundError", notFoundMessage(model))
		return "", false
	}
	return model, true
}

// newGen starts the generation parameters shared by every endpoint: pacing
// and the knobs that act while tokens flow.
func (s *Server) newGen(rec *Record, k knobs, model string) gen {
	return gen{
		created:          rec.Started.Unix(),
		model:            model,
		includeUsage:     rec.IncludeUsage,
		pace:             s.pacing(k),
		start:            rec.Started,
		disconnectAfter:  k.disconnectAfter,
		streamErrorAfter: k.streamErrorAfter,
		choices:          1,
	}
}

// answerTokens returns the tokens that answer prompt and their finish
// reason. A prompt that starts with EchoPrefix gets the rest of it verbatim:
// cut to l.n tokens when the request's limit applies ("length"), whole
// otherwise ("stop"). Any other prompt gets its story, l.n tokens long — or,
// with Options.WholeSentences and no length set by the request or a knob,
// up to the sentence end SentenceLength finds — which finishes "stop" only
// when the request's limit did not cut it and its last token ends a
// sentence: otherwise "length", as a real engine says of an answer cut by
// max_tokens or by its own limit.
func (s *Server) answerTokens(prompt string, l answerLength) ([]string, string) {
	if text, ok := strings.CutPrefix(prompt, EchoPrefix); ok {
		tokens := EchoTokens(text)
		if l.limited && len(tokens) >= l.n {
			return tokens[:l.n], "length"
		}
		return tokens, "stop"
	}
	n := l.n
	if s.opts.WholeSentences && l.byDefault {
		n = SentenceLength(prompt, n)
	}
	tokens := CompletionTokens(prompt, n)
	if l.limited || len(tokens) == 0 || !EndsSentence(tokens[len(tokens)-1]) {
		return tokens, "length"
	}
	return tokens, "stop"
}

// contextTooLong refuses, as vLLM does, a request whose prompt and
// completion do not fit in maxModelLen; what names the prompt ("messages",
// "prompt", "input").
func contextTooLong(prompt, n int, what string) error {
	if prompt+n <= maxModelLen {
		return nil
	}
	return fmt.Errorf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
		maxModelLen, prompt+n, prompt, what, n, what)
}
