package proxy

import (
	"fmt"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
)

// API is one of the OpenAI endpoints the gateway serves. Every request goes
// through the same lifecycle (admission, one usage row, cancellation, Stop);
// an API decides only the engine path, the fields read from the body, where
// the usage is, and how a stopped stream closes.
type API uint8

// The APIs, in the order of their bit in a Set.
const (
	APIChat API = iota
	APICompletions
	APIEmbeddings
	APIResponses
	apiCount
)

var apiNames = [apiCount]string{"chat", "completions", "embeddings", "responses"}

// apiPaths are the engine paths under a backend's base URL (…/v1).
var apiPaths = [apiCount]string{"/chat/completions", "/completions", "/embeddings", "/responses"}

// String is the API's name in configuration (apis: [chat, …]).
func (a API) String() string {
	if a < apiCount {
		return apiNames[a]
	}
	return fmt.Sprintf("api(%d)", a)
}

// Path is the engine path of the API under a backend's base URL.
func (a API) Path() string { return apiPaths[a] }

// Endpoint is the public path of the API.
func (a API) Endpoint() string { return "/v1" + apiPaths[a] }

// ParseAPI returns the API of a configuration name.
func ParseAPI(name string) (API, bool) {
	for i, n := range apiNames {
		if n == name {
			return API(i), true
		}
	}
	return 0, false
}

// APINames lists the APIs' configuration names.
func APINames() []string { return apiNames[:] }

// APISet is a set of APIs, one bit each.
type APISet uint8

// With returns the set with a added.
func (s APISet) With(a API) APISet { return s | 1<<a }

// Has reports whether a is in the set.
func (s APISet) Has(a API) bool { return s&(1<<a) != 0 }

// watches list, per API, the fields the gateway reads or writes; a repeat
// of one is refused (see requestWatch).
var watches = [apiCount]jsonguard.Watch{
	APIChat: requestWatch,
	APICompletions: {
		{Name: "model"},
		{Name: "stream"},
		{Name: "stream_options", Inner: []string{"include_usage"}},
		{Name: "max_tokens"},
		{Name: "prompt"},
		{Name: "n"},
	},
	APIEmbeddings: {
		{Name: "model"},
		{Name: "input"},
	},
	APIResponses: {
		{Name: "model"},
		{Name: "stream"},
		{Name: "max_output_tokens"},
		{Name: "input"},
		{Name: "instructions"},
		{Name: "tools"},
	},
}

// ParseFor reads the fields the gateway needs from a request to api.
func ParseFor(api API, body []byte) (Request, error) {
	if api == APIChat {
		return ParseRequest(body)
	}
	var r Request
	r.API = api
	if len(body) == 0 {
		return r, &BadRequestError{Message: "request body is empty; expected a JSON object"}
	}
	if err := jsonguard.Validate(body, watches[api]); err != nil {
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
	if api != APIEmbeddings {
		switch s := root.Get("stream"); s.Type {
		case gjson.True:
			r.Stream = true
		case gjson.False, gjson.Null:
		default:
			return r, &BadRequestError{Message: fmt.Sprintf("stream must be a boolean, got %s", s.Raw), Param: "stream"}
		}
	}
	switch api {
	case APICompletions:
		switch so := root.Get("stream_options"); so.Type {
		case gjson.Null:
		case gjson.JSON:
			if !so.IsObject() {
				return r, &BadRequestError{Message: "stream_options must be an object", Param: "stream_options"}
			}
			r.ClientWantsUsage = so.Get("include_usage").Type == gjson.True
		default:
			return r, &BadRequestError{Message: "stream_options must be an object", Param: "stream_options"}
		}
		if v := root.Get("max_tokens"); v.Type == gjson.Number && v.Int() > 0 {
			r.MaxTokens = int(v.Int())
		}
		r.PromptBytes = len(root.Get("prompt").Raw)
	case APIEmbeddings:
		input := root.Get("input")
		if !input.Exists() || input.Type == gjson.Null {
			return r, &BadRequestError{Message: "you must provide an input parameter", Param: "input"}
		}
		r.PromptBytes = len(input.Raw)
	case APIResponses:
		if v := root.Get("max_output_tokens"); v.Type == gjson.Number && v.Int() > 0 {
			r.MaxTokens = int(v.Int())
		}
		r.PromptBytes = len(root.Get("input").Raw) + len(root.Get("instructions").Raw)
		r.weighImages(body)
	}
	return r, nil
}

// EstimatePromptTokensFor estimates the prompt of a request to api that the
// engine never counted: chat by its messages; the others by the text of
// their prompt or input (a Responses input list is counted like messages).
func EstimatePromptTokensFor(api API, body []byte) int {
	var text gjson.Result
	switch api {
	case APIChat:
		return EstimatePromptTokens(body)
	case APICompletions:
		text = gjson.GetBytes(body, "prompt")
	case APIEmbeddings:
		text = gjson.GetBytes(body, "input")
	case APIResponses:
		text = gjson.GetBytes(body, "input")
		if text.IsArray() {
			return EstimatePromptTokens(append([]byte(`{"messages":`), text.Raw+"}"...)) +
				estimateText(gjson.GetBytes(body, "instructions"))
		}
		return tokensReplyPrimer + estimateText(text) + estimateText(gjson.GetBytes(body, "instructions"))
	}
	return tokensReplyPrimer + estimateText(text)
}

// estimateText counts the characters of a string, or of every string in an
// array (token id arrays count one token per id), in tokens.
func estimateText(v gjson.Result) int {
	chars, tokens := 0, 0
	var walk func(v gjson.Result)
	walk = func(v gjson.Result) {
		switch {
		case v.Type == gjson.String:
			chars += utf8.RuneCountInString(v.Str)
		case v.Type == gjson.Number:
			tokens++
		case v.IsArray():
			v.ForEach(func(_, e gjson.Result) bool { walk(e); return true })
		}
	}
	walk(v)
	return tokens + (chars+charsPerToken-1)/charsPerToken
}
