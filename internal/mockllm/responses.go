package mockllm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// respGen is one Responses API answer being produced.
type respGen struct {
	gen
	req   gjson.Result
	msgID string
	// cut is set when a token limit cut the text (max_output_tokens, or the
	// mock's own length mid-sentence: finish "length"): the response is
	// then "incomplete", as vLLM and OpenAI say. (Ollama 0.17.4 says "completed"
	// even then; see testdata/ollama-0.17.4/responses_stream.sse.)
	cut bool
}

// respState is what changes in the response object as it goes.
type respState struct {
	status      string // in_progress, completed, incomplete or failed
	completedAt int64  // 0 until the response is over
	output      string // JSON array of output items
	usage       string // JSON: usage or null
	err         string // JSON: the error or null
}

// responses serves POST /v1/responses, OpenAI's Responses API, with the
// objects and typed events Ollama 0.17.4 sends (the shapes of OpenAI's
// own): a text answer as one assistant message. The knobs, pacing,
// cancellation and records work as for chat. Responses are not stored, as
// in vLLM by default, so previous_response_id is refused with vLLM's 404.
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	req, rec, k, ok := s.begin(w, r, APIResponses)
	if !ok {
		return
	}
	model, ok := s.servedModel(w, rec)
	if !ok {
		return
	}
	if prev := req.Get("previous_response_id"); prev.Type == gjson.String && prev.String() != "" {
		s.fail(w, rec, http.StatusNotFound, "invalid_request_error",
			fmt.Sprintf("Response with id '%s' not found.", prev.String()))
		return
	}
	prompt, last, err := responsesPrompt(req)
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	l, err := s.completionLength(req, k, "max_output_tokens")
	if err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	if err := contextTooLong(prompt, l.n, "input"); err != nil {
		s.fail(w, rec, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}

	g := respGen{gen: s.newGen(rec, k, model), req: req, msgID: newID("msg_")}
	g.id = newID("resp_")
	g.tokens, g.finish = s.answerTokens(last, l)
	g.promptTokens = prompt
	g.cut = g.finish == "length"
	if rec.Stream {
		s.streamResponse(r.Context(), w, rec, &g)
	} else {
		s.completeResponse(r.Context(), w, rec, &g)
	}
}

// responsesPrompt reads "input" (a string, which is one user message, or a
// list of input items) and "instructions". It returns the prompt length,
// counted as for chat messages, and the text of the last user message,
// which picks the story.
func responsesPrompt(req gjson.Result) (int, string, error) {
	prompt, last := 0, ""
	switch in := req.Get("input"); {
	case in.Type == gjson.String:
		prompt, last = 1+len(strings.Fields(in.String())), in.String()
	case in.IsArray() && len(in.Array()) > 0:
		prompt, last = promptTokens(in), lastUserText(in)
	default:
		return 0, "", errors.New("'input' must be a string or a non-empty array of input items")
	}
	if inst := req.Get("instructions"); inst.Type == gjson.String {
		prompt += 1 + len(strings.Fields(inst.String()))
	}
	return prompt, last, nil
}

// completeResponse paces the tokens as a stream would, then writes the
// response object.
func (s *Server) completeResponse(ctx context.Context, w http.ResponseWriter, rec *Record, g *respGen) {
	if !s.generate(ctx, rec, g.gen, len(g.tokens), nil, nil) {
		return
	}
	s.answer(w, rec, g.object(g.final()))
}

// streamResponse writes the Responses API's typed events in the order
// OpenAI, vLLM and Ollama send them: response.created and
// response.in_progress at once, the message and its text part once the TTFT
// has passed, a delta per token, the .done events, then
// response.completed with the usage (also when the response is incomplete,
// as vLLM does; OpenAI would send response.incomplete). No [DONE] follows.
func (s *Server) streamResponse(ctx context.Context, w http.ResponseWriter, rec *Record, g *respGen) {
	out := s.startSSE(w, rec)
	if out == nil {
		return
	}
	seq := 0
	send := func(typ string, fields ...string) error {
		head := []string{"type", jstr(typ), "sequence_number", strconv.Itoa(seq)}
		seq++
		return out.event(typ, jsonObject(append(head, fields...)...))
	}
	started := g.object(respState{status: "in_progress", output: "[]", usage: "null", err: "null"})
	for _, typ := range []string{"response.created", "response.in_progress"} {
		if err := send(typ, "response", started); err != nil {
			s.cancelled(rec, "headers", err)
			return
		}
	}
	if !waitUntil(ctx, g.start.Add(g.pace.ttft)) {
		s.cancelled(rec, "ttft", context.Cause(ctx))
		return
	}

	// Where the text goes: the first content part of the first output item.
	at := func(fields ...string) []string {
		return slices.Concat([]string{"item_id", jstr(g.msgID), "output_index", "0", "content_index", "0"}, fields)
	}
	if err := send("response.output_item.added", "output_index", "0", "item", messageItem(g.msgID, "in_progress", "")); err != nil {
		s.cancelled(rec, "ttft", err)
		return
	}
	if err := send("response.content_part.added", at("part", textPart(""))...); err != nil {
		s.cancelled(rec, "ttft", err)
		return
	}
	emit := func(i int) error {
		return send("response.output_text.delta", at("delta", jstr(g.tokens[i]), "logprobs", "[]")...)
	}
	streamErr := func() {
		// OpenAI's way to end a stream that failed: an error event, then
		// response.failed with the text so far.
		const msg = "The engine failed while generating."
		_ = send("error", "code", `"server_error"`, "message", jstr(msg), "param", "null")
		partial := strings.Join(g.tokens[:g.streamErrorAfter], "")
		_ = send("response.failed", "response", g.object(respState{
			status: "failed",
			output: "[" + messageItem(g.msgID, "incomplete", textPart(partial)) + "]",
			usage:  "null",
			err:    `{"code":"server_error","message":` + jstr(msg) + `}`,
		}))
	}
	if !s.generate(ctx, rec, g.gen, len(g.tokens), emit, streamErr) {
		return
	}

	text := strings.Join(g.tokens, "")
	events := []struct {
		typ    string
		fields []string
	}{
		{"response.output_text.done", at("text", jstr(text), "logprobs", "[]")},
		{"response.content_part.done", at("part", textPart(text))},
		{"response.output_item.done", []string{"output_index", "0", "item", messageItem(g.msgID, "completed", textPart(text))}},
		{"response.completed", []string{"response", g.object(g.final())}},
	}
	for _, e := range events {
		if err := send(e.typ, e.fields...); err != nil {
			s.cancelled(rec, "finishing", err)
			return
		}
	}
	s.completed(rec)
}

// final is the state of a response whose every token was produced.
func (g *respGen) final() respState {
	status := "completed"
	if g.cut {
		status = "incomplete"
	}
	out := len(g.tokens)
	return respState{
		status:      status,
		completedAt: time.Now().Unix(),
		output:      "[" + messageItem(g.msgID, "completed", textPart(strings.Join(g.tokens, ""))) + "]",
		usage: fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,"total_tokens":%d,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}`,
			g.promptTokens, out, g.promptTokens+out),
		err: "null",
	}
}

// object renders the response object with the keys, and in the order, of
// Ollama's (which are OpenAI's). The settings the request made are repeated
// as OpenAI and vLLM repeat them; the others take Ollama's defaults.
func (g *respGen) object(st respState) string {
	completedAt, incomplete := "null", "null"
	if st.completedAt != 0 {
		completedAt = strconv.FormatInt(st.completedAt, 10)
	}
	if st.status == "incomplete" {
		incomplete = `{"reason":"max_output_tokens"}`
	}
	r := g.req
	return jsonObject(
		"id", jstr(g.id),
		"object", `"response"`,
		"created_at", strconv.FormatInt(g.created, 10),
		"completed_at", completedAt,
		"status", jstr(st.status),
		"incomplete_details", incomplete,
		"model", jstr(g.model),
		"previous_response_id", "null",
		"instructions", echo(r, "instructions", isString, "null"),
		"output", st.output,
		"error", st.err,
		"tools", echo(r, "tools", gjson.Result.IsArray, "[]"),
		"tool_choice", echo(r, "tool_choice", isStringOrObject, `"auto"`),
		"truncation", echo(r, "truncation", isString, `"disabled"`),
		"parallel_tool_calls", echo(r, "parallel_tool_calls", gjson.Result.IsBool, "true"),
		"text", echo(r, "text", gjson.Result.IsObject, `{"format":{"type":"text"}}`),
		"top_p", echo(r, "top_p", isNumber, "1"),
		"presence_penalty", echo(r, "presence_penalty", isNumber, "0"),
		"frequency_penalty", echo(r, "frequency_penalty", isNumber, "0"),
		"top_logprobs", echo(r, "top_logprobs", isNumber, "0"),
		"temperature", echo(r, "temperature", isNumber, "1"),
		"reasoning", echo(r, "reasoning", gjson.Result.IsObject, "null"),
		"usage", st.usage,
		"max_output_tokens", echo(r, "max_output_tokens", isNumber, "null"),
		"max_tool_calls", echo(r, "max_tool_calls", isNumber, "null"),
		// Not stored (see responses), whatever the request asked.
		"store", "false",
		"background", "false",
		"service_tier", `"default"`,
		"metadata", echo(r, "metadata", gjson.Result.IsObject, "{}"),
		"safety_identifier", echo(r, "safety_identifier", isString, "null"),
		"prompt_cache_key", echo(r, "prompt_cache_key", isString, "null"),
	)
}

// messageItem is the assistant message output item; part is its one
// content part, or "" for none yet.
func messageItem(id, status, part string) string {
	content := "[]"
	if part != "" {
		content = "[" + part + "]"
	}
	return `{"id":` + jstr(id) + `,"type":"message","status":` + jstr(status) + `,"role":"assistant","content":` + content + `}`
}

func textPart(text string) string {
	return `{"type":"output_text","text":` + jstr(text) + `,"annotations":[],"logprobs":[]}`
}

// jsonObject renders an object from alternating keys and JSON values.
func jsonObject(kv ...string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(jstr(kv[i]))
		b.WriteByte(':')
		b.WriteString(kv[i+1])
	}
	b.WriteByte('}')
	return b.String()
}

// echo returns the request's field as it was sent when it has a type that
// ok accepts, else def.
func echo(req gjson.Result, field string, ok func(gjson.Result) bool, def string) string {
	if v := req.Get(field); v.Exists() && v.Type != gjson.Null && ok(v) {
		return v.Raw
	}
	return def
}

func isString(v gjson.Result) bool         { return v.Type == gjson.String }
func isNumber(v gjson.Result) bool         { return v.Type == gjson.Number }
func isStringOrObject(v gjson.Result) bool { return v.Type == gjson.String || v.IsObject() }
