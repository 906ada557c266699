package responses

import (
	"strings"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
	"moonji/internal/proxy"
)

// head is what every response object of one request shares: its id, its
// creation time, its item ids and the request parameters it echoes. It is
// built once per request, so a stream writes its three response objects
// (created, in_progress, the closing one) without reading the request again.
type head struct {
	id      string
	created int64
	// model is the request's model as a JSON string, "" when it has none.
	model []byte
	// msgID is the message item's id as a JSON string; suffix is the
	// escaped id without its "resp_" prefix, which item ids share.
	msgID  []byte
	suffix []byte
	// params are the echoed members, each preceded by a comma.
	params []byte
}

// newHead reads the parameters to echo from the request body. A body that
// is not valid JSON (ToChat would have refused it) echoes the defaults.
func newHead(req []byte, id string, created int64) head {
	h := head{id: id, created: created}
	// Item ids share the response's suffix: msg_X and fc_X_n for resp_X,
	// unique per response and predictable for tests.
	suffix := strings.TrimPrefix(id, "resp_")
	h.msgID = jsonguard.AppendString(nil, "msg_"+suffix)
	h.suffix = jsonguard.AppendString(nil, suffix)
	h.suffix = h.suffix[1 : len(h.suffix)-1]

	var r gjson.Result
	if jsonguard.Validate(req, nil) == nil {
		r = gjson.ParseBytes(req)
	}
	if !isObject(r) {
		r = gjson.Result{}
	}
	var v struct {
		model, instructions, maxOutput, maxToolCalls, metadata, parallel, reasoning gjson.Result
		temperature, text, toolChoice, tools, topLogprobs, topP, user               gjson.Result
		promptCacheKey, safetyIdentifier                                            gjson.Result
	}
	r.ForEach(func(k, x gjson.Result) bool {
		switch k.Str {
		case "model":
			v.model = x
		case "instructions":
			v.instructions = x
		case "max_output_tokens":
			v.maxOutput = x
		case "max_tool_calls":
			v.maxToolCalls = x
		case "metadata":
			v.metadata = x
		case "parallel_tool_calls":
			v.parallel = x
		case "reasoning":
			v.reasoning = x
		case "temperature":
			v.temperature = x
		case "text":
			v.text = x
		case "tool_choice":
			v.toolChoice = x
		case "tools":
			v.tools = x
		case "top_logprobs":
			v.topLogprobs = x
		case "top_p":
			v.topP = x
		case "user":
			v.user = x
		case "prompt_cache_key":
			v.promptCacheKey = x
		case "safety_identifier":
			v.safetyIdentifier = x
		}
		return true
	})
	if v.model.Type == gjson.String {
		h.model = []byte(v.model.Raw)
	}
	p := make([]byte, 0, 384+len(v.tools.Raw)+len(v.text.Raw)+len(v.instructions.Raw)+len(v.metadata.Raw))
	member := func(name, raw string) {
		p = append(p, `,"`...)
		p = append(p, name...)
		p = append(p, `":`...)
		p = append(p, raw...)
	}
	// Unset parameters echo as OpenAI's defaults, but sampling parameters
	// echo as null: the engine's default is not known here (a model's
	// generation config may set its own).
	// The penalties are not Responses parameters, but OpenAI's response
	// objects carry them (and Ollama's copy them): 0, their default.
	member("frequency_penalty", "0")
	member("presence_penalty", "0")
	member("instructions", rawOr(v.instructions, "null", gjson.String))
	member("max_output_tokens", rawOr(v.maxOutput, "null", gjson.Number))
	member("max_tool_calls", rawOr(v.maxToolCalls, "null", gjson.Number))
	member("metadata", objectOr(v.metadata, "{}"))
	member("parallel_tool_calls", rawOr(v.parallel, "true", gjson.True, gjson.False))
	member("previous_response_id", "null")
	member("prompt_cache_key", rawOr(v.promptCacheKey, "null", gjson.String))
	member("reasoning", objectOr(v.reasoning, "null"))
	member("safety_identifier", rawOr(v.safetyIdentifier, "null", gjson.String))
	member("service_tier", `"default"`)
	// Nothing is stored, whatever the request asked.
	member("store", "false")
	member("temperature", rawOr(v.temperature, "null", gjson.Number))
	member("text", objectOr(v.text, `{"format":{"type":"text"}}`))
	member("tool_choice", rawOr(v.toolChoice, `"auto"`, gjson.String, gjson.JSON))
	member("tools", arrayOr(v.tools, "[]"))
	member("top_logprobs", rawOr(v.topLogprobs, "0", gjson.Number))
	member("top_p", rawOr(v.topP, "null", gjson.Number))
	member("truncation", `"disabled"`)
	member("background", "false")
	if v.user.Type == gjson.String {
		member("user", v.user.Raw)
	}
	h.params = p
	return h
}

func objectOr(v gjson.Result, def string) string {
	if isObject(v) {
		return v.Raw
	}
	return def
}

func arrayOr(v gjson.Result, def string) string {
	if isArray(v) {
		return v.Raw
	}
	return def
}

// ending is how a response object stands.
type ending struct {
	status string // in_progress, completed, incomplete or failed
	// completedAt is the completion time, 0 while there is none.
	completedAt int64
	// incomplete is incomplete_details.reason ("" for null).
	incomplete string
	// errMsg is error.message of a failed response ("" for null).
	errMsg string
}

// openResponse appends a response object up to and including the opening
// bracket of its output; closeResponse ends it after the output items.
func (h *head) openResponse(b []byte, model []byte, e ending) []byte {
	b = append(b, `{"id":`...)
	b = jsonguard.AppendString(b, h.id)
	b = append(b, `,"object":"response","created_at":`...)
	b = appendInt(b, h.created)
	b = append(b, `,"status":"`...)
	b = append(b, e.status...)
	b = append(b, `","completed_at":`...)
	if e.completedAt > 0 {
		b = appendInt(b, e.completedAt)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"error":`...)
	if e.errMsg != "" {
		b = append(b, `{"code":"server_error","message":`...)
		b = jsonguard.AppendString(b, e.errMsg)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"incomplete_details":`...)
	if e.incomplete != "" {
		b = append(b, `{"reason":"`...)
		b = append(b, e.incomplete...)
		b = append(b, `"}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"model":`...)
	if len(model) == 0 {
		model = []byte(`""`)
	}
	b = append(b, model...)
	b = append(b, h.params...)
	return append(b, `,"output":[`...)
}

// usage is the token count of a response.
type usage struct {
	in, out, cached, reasoning int64
	ok                         bool
}

func closeResponse(b []byte, u usage) []byte {
	b = append(b, `],"usage":`...)
	b = appendUsage(b, u)
	return append(b, '}')
}

// appendUsage appends a Responses usage object, or null when the engine
// sent none.
func appendUsage(b []byte, u usage) []byte {
	if !u.ok {
		return append(b, "null"...)
	}
	b = append(b, `{"input_tokens":`...)
	b = appendInt(b, u.in)
	b = append(b, `,"input_tokens_details":{"cached_tokens":`...)
	b = appendInt(b, u.cached)
	b = append(b, `},"output_tokens":`...)
	b = appendInt(b, u.out)
	b = append(b, `,"output_tokens_details":{"reasoning_tokens":`...)
	b = appendInt(b, u.reasoning)
	b = append(b, `},"total_tokens":`...)
	b = appendInt(b, u.in+u.out)
	return append(b, '}')
}

// readUsage reads a chat usage object: prompt_tokens → input_tokens,
// completion_tokens → output_tokens, and the cached and reasoning details
// when the engine gives them. Counts that cannot be true (negative,
// fractional, absurd: proxy.TokenCount) make it no usage at all: the
// response says null rather than pass them on.
func readUsage(v gjson.Result) usage {
	u := usage{ok: true}
	count := func(x gjson.Result) int64 {
		n, ok := proxy.TokenCount(x)
		u.ok = u.ok && ok
		return int64(n)
	}
	v.ForEach(func(k, x gjson.Result) bool {
		switch k.Str {
		case "prompt_tokens":
			u.in = count(x)
		case "completion_tokens":
			u.out = count(x)
		case "prompt_tokens_details":
			u.cached = count(x.Get("cached_tokens"))
		case "completion_tokens_details":
			u.reasoning = count(x.Get("reasoning_tokens"))
		}
		return true
	})
	if !u.ok {
		return usage{}
	}
	return u
}

// appendMessageOpen appends a message item up to its content list's
// opening bracket; "]}" closes it.
func (h *head) appendMessageOpen(b []byte, status string) []byte {
	b = append(b, `{"id":`...)
	b = append(b, h.msgID...)
	b = append(b, `,"type":"message","status":"`...)
	b = append(b, status...)
	return append(b, `","role":"assistant","content":[`...)
}

// appendTextPart appends an output_text part; text is an escaped string
// body.
func appendTextPart[T string | []byte](b []byte, text T) []byte {
	b = append(b, `{"type":"output_text","text":"`...)
	b = append(b, text...)
	return append(b, `","annotations":[],"logprobs":[]}`...)
}

// appendItemID appends the escaped body of the n-th id with the given
// prefix: fc_X_n for a function call item, call_X_n for a call id an engine
// did not give.
func (h *head) appendItemID(b []byte, prefix string, n int) []byte {
	b = append(b, prefix...)
	b = append(b, h.suffix...)
	b = append(b, '_')
	return appendInt(b, int64(n))
}

// appendCall appends a function_call item; callID, name and args are
// escaped string bodies.
func (h *head) appendCall(b []byte, n int, status string, callID, name, args []byte) []byte {
	b = append(b, `{"id":"`...)
	b = h.appendItemID(b, "fc_", n)
	b = append(b, `","type":"function_call","status":"`...)
	b = append(b, status...)
	b = append(b, `","call_id":`...)
	b = appendQuoted(b, callID)
	b = append(b, `,"name":`...)
	b = appendQuoted(b, name)
	b = append(b, `,"arguments":`...)
	b = appendQuoted(b, args)
	return append(b, '}')
}

// incompleteReason maps a chat finish_reason to the Responses
// incomplete_details.reason, "" when the answer is complete.
func incompleteReason(finish string) string {
	switch finish {
	case "length":
		return "max_output_tokens"
	case "content_filter":
		return "content_filter"
	}
	return ""
}
