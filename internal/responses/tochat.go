package responses

import (
	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
	"moonji/internal/proxy"
)

// requestWatch lists the members of a Responses request ToChat reads; a
// repeat of one is refused. gjson reads the first of repeated keys, the
// client's SDK meant the last (JSON libraries keep the last), so the
// engine would run another request than the one the client wrote.
// Members of an input item are watched one level down (their content
// parts are beyond jsonguard's flat pass).
var requestWatch = jsonguard.Watch{
	{Name: "model"}, {Name: "input", Each: []string{"type", "role", "content", "call_id", "name", "arguments", "output"}},
	{Name: "instructions"}, {Name: "max_output_tokens"}, {Name: "temperature"}, {Name: "top_p"},
	{Name: "stream"}, {Name: "stream_options"}, {Name: "tools"}, {Name: "tool_choice"},
	{Name: "parallel_tool_calls"}, {Name: "text", Inner: []string{"format", "verbosity"}},
	{Name: "user"}, {Name: "metadata"}, {Name: "store"}, {Name: "reasoning", Inner: []string{"effort", "summary", "generate_summary"}},
	{Name: "truncation"}, {Name: "previous_response_id"}, {Name: "background"}, {Name: "conversation"},
	{Name: "prompt"}, {Name: "include"}, {Name: "top_logprobs"}, {Name: "max_tool_calls"},
	{Name: "service_tier"}, {Name: "prompt_cache_key"}, {Name: "prompt_cache_retention"},
	{Name: "safety_identifier"}, {Name: "context_management"},
}

// request holds the members of a Responses request that translate.
type request struct {
	model, input, instructions           gjson.Result
	maxOutput, temperature, topP, stream gjson.Result
	tools, toolChoice, parallel          gjson.Result
	text, reasoning, user                gjson.Result
}

// ToChat translates a Responses API request body into a chat completions
// request body for a backend that serves only chat. stream is whether the
// client asked to stream. What cannot be translated is refused with a
// *Refusal naming the field; every other error is one too (the body is the
// client's). The package documentation lists what translates, what is
// refused and what is ignored.
func ToChat(body []byte) (chat []byte, stream bool, err error) {
	if len(body) == 0 {
		return nil, false, &Refusal{Message: "request body is empty; expected a JSON object"}
	}
	// The guard runs first: it bounds the nesting gjson recurses through
	// and makes every Raw copied below a well-formed JSON value.
	if err := jsonguard.Validate(body, requestWatch); err != nil {
		msg, param := jsonguard.Refusal(err)
		return nil, false, &Refusal{Param: param, Message: msg}
	}
	root := gjson.ParseBytes(body)
	if !isObject(root) {
		return nil, false, &Refusal{Message: "request body must be a JSON object"}
	}
	var r request
	var bad *Refusal
	root.ForEach(func(k, v gjson.Result) bool {
		bad = r.set(k.Str, v)
		return bad == nil
	})
	if bad != nil {
		return nil, false, bad
	}
	if r.model.Type != gjson.String || r.model.Str == "" {
		return nil, false, &Refusal{Param: "model", Message: "you must provide a model parameter"}
	}
	stream = r.stream.Type == gjson.True

	b := make([]byte, 0, len(body)+160)
	b = append(b, `{"model":`...)
	b = append(b, r.model.Raw...)
	b = append(b, `,"messages":`...)
	if b, bad = appendMessages(b, r.instructions, r.input); bad != nil {
		return nil, false, bad
	}
	for _, f := range [...]struct {
		name string
		v    gjson.Result
	}{{"max_tokens", r.maxOutput}, {"temperature", r.temperature}, {"top_p", r.topP}} {
		// An explicit null means "not set": it is left out, never 0.
		if !isNull(f.v) {
			b = append(b, ',', '"')
			b = append(b, f.name...)
			b = append(b, '"', ':')
			b = append(b, f.v.Raw...)
		}
	}
	if stream {
		// Always: the usage chunk is how the Responses usage is known.
		b = append(b, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	var tools int
	if b, tools, bad = appendTools(b, r.tools); bad != nil {
		return nil, false, bad
	}
	if b, bad = appendToolChoice(b, r.toolChoice, tools); bad != nil {
		return nil, false, bad
	}
	if tools > 0 && !isNull(r.parallel) {
		// Without tools OpenAI's chat API refuses the flag; it means
		// nothing then, so it is left out.
		b = append(b, `,"parallel_tool_calls":`...)
		b = append(b, r.parallel.Raw...)
	}
	if b, bad = appendText(b, r.text); bad != nil {
		return nil, false, bad
	}
	if effort := r.reasoning.Get("effort"); effort.Type == gjson.String {
		b = append(b, `,"reasoning_effort":`...)
		b = append(b, effort.Raw...)
	}
	if r.user.Type == gjson.String {
		b = append(b, `,"user":`...)
		b = append(b, r.user.Raw...)
	}
	return append(b, '}'), stream, nil
}

// set records or checks one top-level member of the request.
func (r *request) set(name string, v gjson.Result) *Refusal {
	switch name {
	// Translated.
	case "model":
		r.model = v
	case "input":
		r.input = v
	case "instructions":
		if !isNull(v) && v.Type != gjson.String {
			return mustBe(name, "a string")
		}
		r.instructions = v
	case "max_output_tokens":
		return tokensOrNull(name, v, &r.maxOutput)
	case "temperature":
		return numberOrNull(name, v, 0, 2, &r.temperature)
	case "top_p":
		return numberOrNull(name, v, 0, 1, &r.topP)
	case "stream":
		if !isNull(v) && v.Type != gjson.True && v.Type != gjson.False {
			return mustBe(name, "a boolean")
		}
		r.stream = v
	case "parallel_tool_calls":
		if !isNull(v) && v.Type != gjson.True && v.Type != gjson.False {
			return mustBe(name, "a boolean")
		}
		r.parallel = v
	case "tools":
		if !isNull(v) && !isArray(v) {
			return mustBe(name, "an array")
		}
		r.tools = v
	case "tool_choice":
		r.toolChoice = v
	case "text":
		if !isNull(v) && !isObject(v) {
			return mustBe(name, "an object")
		}
		r.text = v
	case "user":
		if !isNull(v) && v.Type != gjson.String {
			return mustBe(name, "a string")
		}
		r.user = v
	case "reasoning":
		return r.setReasoning(v)

	// Refused unless unset: they need state or tools only OpenAI has.
	case "previous_response_id":
		if !isNull(v) {
			return refuse(name, "previous_response_id needs stored responses; this backend serves only chat completions and nothing is stored: send the whole conversation in input")
		}
	case "conversation":
		if !isNull(v) {
			return refuse(name, "conversations need stored responses; this backend serves only chat completions and nothing is stored: send the whole conversation in input")
		}
	case "prompt":
		if !isNull(v) {
			return refuse(name, "prompt templates are stored by OpenAI and cannot be used with a chat completions backend")
		}
	case "background":
		if v.Type == gjson.True {
			return refuse(name, "background responses need stored responses; this backend serves only chat completions")
		}
		if !isNull(v) && v.Type != gjson.False {
			return mustBe(name, "a boolean")
		}
	case "context_management":
		if !isNull(v) && (!isArray(v) || len(v.Array()) > 0) {
			return refuse(name, "context management (compaction) is not available with a chat completions backend")
		}
	case "truncation":
		switch {
		case isNull(v), v.Type == gjson.String && v.Str == "disabled":
		case v.Type == gjson.String && v.Str == "auto":
			return refuse(name, `truncation "auto" is not available with a chat completions backend: it does not drop input to fit the context; use "disabled"`)
		default:
			return mustBe(name, `"disabled" or "auto"`)
		}
	case "top_logprobs":
		if !isNull(v) && !(v.Type == gjson.Number && v.Num == 0) {
			return refuse(name, "log probabilities are not translated from a chat completions backend")
		}
	case "include":
		return checkInclude(v)

	// Ignored: they change nothing the client gets back (see the package
	// documentation).
	case "metadata", "stream_options":
		if !isNull(v) && !isObject(v) {
			return mustBe(name, "an object")
		}
	case "store":
		if !isNull(v) && v.Type != gjson.True && v.Type != gjson.False {
			return mustBe(name, "a boolean")
		}
	case "service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier":
		if !isNull(v) && v.Type != gjson.String {
			return mustBe(name, "a string")
		}
	case "max_tool_calls":
		if !isNull(v) && v.Type != gjson.Number {
			return mustBe(name, "a number")
		}

	default:
		// Dropping it would answer a request the client did not send;
		// OpenAI refuses unknown parameters too.
		return refuse(name, "unknown parameter %q: it cannot be translated for a chat completions backend", name)
	}
	return nil
}

// numberOrNull keeps v in dst when it is null or a number from lo to hi
// (OpenAI's ranges): the engine would get it as the chat field, and its
// refusal would name a field the client never sent.
func numberOrNull(name string, v gjson.Result, lo, hi float64, dst *gjson.Result) *Refusal {
	if isNull(v) {
		*dst = v
		return nil
	}
	if v.Type != gjson.Number {
		return mustBe(name, "a number")
	}
	if f := v.Float(); !(f >= lo && f <= hi) {
		return refuse(name, "%s must be a number from %g to %g, got %s", name, lo, hi, v.Raw)
	}
	*dst = v
	return nil
}

// tokensOrNull keeps v in dst when it is null or a whole number of tokens
// from 1 to proxy.MaxReportedTokens (no -1, no 1e30: an engine echoing it
// back as usage made negative and absurd bills).
func tokensOrNull(name string, v gjson.Result, dst *gjson.Result) *Refusal {
	if isNull(v) {
		*dst = v
		return nil
	}
	if n, ok := proxy.TokenCount(v); !ok || n < 1 {
		return refuse(name, "%s must be an integer from 1 to %d, got %s", name, proxy.MaxReportedTokens, v.Raw)
	}
	*dst = v
	return nil
}

// setReasoning checks the reasoning object: its effort translates, a
// summary is never produced (the stream has no reasoning items), which
// OpenAI allows too: a summary is not guaranteed.
func (r *request) setReasoning(v gjson.Result) *Refusal {
	if isNull(v) {
		return nil
	}
	if !isObject(v) {
		return mustBe("reasoning", "an object")
	}
	if e := v.Get("effort"); !isNull(e) && e.Type != gjson.String {
		return mustBe("reasoning.effort", "a string")
	}
	r.reasoning = v
	return nil
}

// checkInclude refuses only what would change the answer: logprobs are not
// translated. The other includables name outputs of built-in tools or of
// stored or encrypted reasoning items, which a chat backend never produces.
func checkInclude(v gjson.Result) *Refusal {
	if isNull(v) {
		return nil
	}
	if !isArray(v) {
		return mustBe("include", "an array")
	}
	var bad *Refusal
	i := 0
	v.ForEach(func(_, e gjson.Result) bool {
		switch {
		case e.Type != gjson.String:
			bad = mustBe(index("include", i), "a string")
		case e.Str == "message.output_text.logprobs":
			bad = refuse(index("include", i), "log probabilities are not translated from a chat completions backend")
		}
		i++
		return bad == nil
	})
	return bad
}
