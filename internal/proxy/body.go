package proxy

import (
	"bytes"
	"fmt"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"moonji/internal/jsonguard"
)

// Request is what the gateway needs to know of a request.
type Request struct {
	// API is the endpoint the request came to.
	API   API
	Model string
	// Stream is true for "stream": true; null or missing means false.
	Stream bool
	// ClientWantsUsage is the client's own stream_options.include_usage.
	ClientWantsUsage bool
	// MaxTokens is max_completion_tokens or max_tokens, 0 when unset.
	MaxTokens int
	// PromptBytes is the size of the messages, for token estimates (an
	// image counted as ImageTokens, not its bytes).
	PromptBytes int
	// Images are the image parts of the body, and ImageBytes their size.
	Images, ImageBytes int
	// noStreamOptions tells that ParseRequest found no stream_options
	// member (not even a null): RewriteBody then adds one without looking.
	noStreamOptions bool
}

// BadRequestError is a client error in the request body.
type BadRequestError struct {
	Message string
	Param   string
}

func (e *BadRequestError) Error() string { return e.Message }

// requestWatch lists the fields of a chat request the gateway reads or writes. A
// repeat of one is refused: gjson and sjson take the first of repeated keys,
// the engines (vLLM's pydantic, Ollama, llama.cpp) the last, so the gateway
// would route, meter and patch one request and the engine run another.
//
// n is read to close every choice of a stopped stream; tools and each
// message's role, content and tool_calls to estimate the prompt of a
// request cut short (EstimatePromptTokens). Deeper members (a content
// part's type and text) are beyond the guard's one flat pass: the estimate
// reads every repeat of those, so it never counts less than an engine reads.
var requestWatch = jsonguard.Watch{
	{Name: "model"},
	{Name: "stream"},
	{Name: "stream_options", Inner: []string{"include_usage"}},
	{Name: "max_tokens"},
	{Name: "max_completion_tokens"},
	{Name: "messages", Each: []string{"role", "content", "tool_calls"}},
	{Name: "n"},
	{Name: "tools"},
}

// ParseRequest reads the fields the gateway needs and checks their types.
func ParseRequest(body []byte) (Request, error) {
	var r Request
	if len(body) == 0 {
		return r, &BadRequestError{Message: "request body is empty; expected a JSON object"}
	}
	// The guard runs first: bounded in depth and time, it makes the body
	// safe for gjson (which recurses per nesting level) and unambiguous.
	if err := jsonguard.Validate(body, requestWatch); err != nil {
		return r, guardError(err)
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return r, &BadRequestError{Message: "request body must be a JSON object"}
	}
	model := root.Get("model")
	if model.Type != gjson.String || model.Str == "" {
		return r, &BadRequestError{Message: "you must provide a model parameter", Param: "model"}
	}
	r.Model = model.Str
	switch s := root.Get("stream"); s.Type {
	case gjson.True:
		r.Stream = true
	case gjson.False, gjson.Null:
	default:
		return r, &BadRequestError{Message: fmt.Sprintf("stream must be a boolean, got %s", s.Raw), Param: "stream"}
	}
	switch so := root.Get("stream_options"); so.Type {
	case gjson.Null:
		r.noStreamOptions = !so.Exists()
	case gjson.JSON:
		if !so.IsObject() {
			return r, &BadRequestError{Message: "stream_options must be an object", Param: "stream_options"}
		}
		r.ClientWantsUsage = so.Get("include_usage").Type == gjson.True
	default:
		return r, &BadRequestError{Message: "stream_options must be an object", Param: "stream_options"}
	}
	for _, name := range []string{"max_completion_tokens", "max_tokens"} {
		if v := root.Get(name); v.Type == gjson.Number && v.Int() > 0 {
			r.MaxTokens = int(v.Int())
			break
		}
	}
	r.PromptBytes = len(root.Get("messages").Raw)
	r.weighImages(body)
	return r, nil
}

// guardError words a jsonguard refusal for the client.
func guardError(err error) *BadRequestError {
	msg, param := jsonguard.Refusal(err)
	return &BadRequestError{Message: msg, Param: param}
}

// RewriteBody prepares the body for the engine: the model renamed when the
// configuration maps it to another upstream name, and, for streams,
// stream_options.include_usage forced on so the gateway always learns the
// token counts. Every other byte stays as the client sent it.
func RewriteBody(body []byte, r Request, upstreamModel string) ([]byte, error) {
	var err error
	if upstreamModel != "" && upstreamModel != r.Model {
		if body, err = sjson.SetBytes(body, "model", upstreamModel); err != nil {
			return nil, fmt.Errorf("set model: %w", err)
		}
	}
	// Only chat and completions streams carry usage on request; a
	// Responses stream always ends with it.
	if !r.Stream || r.ClientWantsUsage || (r.API != APIChat && r.API != APICompletions) {
		return body, nil
	}
	if r.noStreamOptions {
		return appendMember(body, `"stream_options":{"include_usage":true}`), nil
	}
	if gjson.GetBytes(body, "stream_options").Type == gjson.JSON {
		body, err = sjson.SetBytes(body, "stream_options.include_usage", true)
	} else {
		// Missing or an explicit null: replace it with an object.
		body, err = sjson.SetRawBytes(body, "stream_options", []byte(`{"include_usage":true}`))
	}
	if err != nil {
		return nil, fmt.Errorf("set stream_options.include_usage: %w", err)
	}
	return body, nil
}

// appendMember returns a copy of the JSON object obj with member added
// last, as sjson adds a missing key, without parsing obj again: the caller
// knows obj is an object (ParseRequest checked it) without that key.
func appendMember(obj []byte, member string) []byte {
	end := bytes.LastIndexByte(obj, '}')
	before := bytes.TrimRight(obj[:end], " \t\r\n")
	out := make([]byte, 0, len(obj)+1+len(member))
	out = append(out, obj[:end]...)
	if before[len(before)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, member...)
	return append(out, obj[end:]...)
}

// LimitOutput sets the output limit of a request that set none to n:
// max_tokens for chat and completions, max_output_tokens for Responses (an
// embedding has no output). jsonguard refused repeats of those members, so
// the one sjson sets is the one the engine reads.
func LimitOutput(body []byte, api API, n int) ([]byte, error) {
	field := "max_tokens"
	switch api {
	case APIEmbeddings:
		return body, nil
	case APIResponses:
		field = "max_output_tokens"
	}
	out, err := sjson.SetBytes(body, field, n)
	if err != nil {
		return nil, fmt.Errorf("set %s: %w", field, err)
	}
	return out, nil
}
