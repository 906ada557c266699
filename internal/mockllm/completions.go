package mockllm

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// completionGen is a legacy completion: like a chat completion, except that
// several prompts give several answers, so each choice has its own tokens.
type completionGen struct {
	gen
	// texts holds each choice's tokens: choice c answers prompt c/n, as
	// vLLM numbers them; finishes, each choice's finish reason.
	texts    [][]string
	finishes []string
	// steps is the longest answer's length, the number of tokens to pace.
	steps int
}

// completions serves POST /v1/completions, the legacy text completion API,
// in vLLM's format: the same knobs, pacing and records as chat, "text"
// instead of "delta", and no role chunk.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	req, rec, k, ok := s.begin(w, r, APICompletions)
	if !ok {
		return
	}
	model, ok := s.servedModel(w, rec)
	if !ok {
		return
	}
	prompts, err := textInputs(req.Get("prompt"), "prompt")
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	l, err := s.completionLength(req, k, "max_tokens")
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	perPrompt, err := choiceCount(req.Get("n"))
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	if len(prompts)*perPrompt > maxChoices {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", fmt.Sprintf(
			"the number of prompts times n must be at most %d, got %d * %d", maxChoices, len(prompts), perPrompt))
		return
	}

	g := completionGen{gen: s.newGen(rec, k, model)}
	g.id = newID("cmpl-")
	g.choices = len(prompts) * perPrompt
	for _, p := range prompts {
		if err := contextTooLong(p.tokens, l.n, "prompt"); err != nil {
			s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		g.promptTokens += p.tokens
		tokens, finish := s.answerTokens(p.text, l)
		for range perPrompt {
			g.texts = append(g.texts, tokens)
			g.finishes = append(g.finishes, finish)
		}
		g.steps = max(g.steps, len(tokens))
	}
	if rec.Stream {
		s.streamCompletion(r.Context(), w, rec, g)
	} else {
		s.completeCompletion(r.Context(), w, rec, g)
	}
}

// completionTokens is the usage's completion_tokens: every choice's tokens.
func (g completionGen) completionTokens() int {
	n := 0
	for _, t := range g.texts {
		n += len(t)
	}
	return n
}

// streamCompletion writes vLLM's text_completion chunks: each token as one
// chunk per choice, then each choice's finish chunk, the usage chunk when
// asked, and [DONE].
func (s *Server) streamCompletion(ctx context.Context, w http.ResponseWriter, rec *Record, g completionGen) {
	out := s.startSSE(w, rec)
	if out == nil {
		return
	}
	if !waitUntil(ctx, g.start.Add(g.pace.ttft)) {
		s.cancelled(rec, "ttft", context.Cause(ctx))
		return
	}
	prefix := fmt.Sprintf(`{"id":%s,"object":"text_completion","created":%d,"model":%s,"choices":[`,
		jstr(g.id), g.created, jstr(g.model))
	choice := func(c int, text, finish string) string {
		return prefix + `{"index":` + strconv.Itoa(c) + `,"text":` + jstr(text) + `,"logprobs":null,"finish_reason":` + finish + `,"stop_reason":null}]}`
	}
	emit := func(i int) error {
		for c, tokens := range g.texts {
			if i >= len(tokens) {
				continue // A shorter echo answer is over.
			}
			if err := out.data(choice(c, tokens[i], "null")); err != nil {
				return err
			}
		}
		return nil
	}
	if !s.generate(ctx, rec, g.gen, g.steps, emit, out.engineError) {
		return
	}

	var frames []string
	for c := range g.texts {
		frames = append(frames, choice(c, "", jstr(g.finishes[c])))
	}
	if g.includeUsage {
		frames = append(frames, prefix+`],"usage":`+usageJSON(g.promptTokens, g.completionTokens())+`}`)
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

// completeCompletion paces the tokens as a stream would, then writes one
// text_completion object.
func (s *Server) completeCompletion(ctx context.Context, w http.ResponseWriter, rec *Record, g completionGen) {
	if !s.generate(ctx, rec, g.gen, g.steps, nil, nil) {
		return
	}
	choices := make([]string, len(g.texts))
	for c, tokens := range g.texts {
		choices[c] = fmt.Sprintf(`{"index":%d,"text":%s,"logprobs":null,"finish_reason":%s,"stop_reason":null,"prompt_logprobs":null}`,
			c, jstr(strings.Join(tokens, "")), jstr(g.finishes[c]))
	}
	body := fmt.Sprintf(`{"id":%s,"object":"text_completion","created":%d,"model":%s,"choices":[%s],"system_fingerprint":null,"usage":%s}`,
		jstr(g.id), g.created, jstr(g.model), strings.Join(choices, ","), usageJSON(g.promptTokens, g.completionTokens()))
	s.answer(w, rec, body)
}
