package handlers

import (
	"math"
	"strconv"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
)

// The JSON bodies of the chat API and of the stop endpoint are read by the
// pure functions below, apart from the handlers, so that they can be fuzzed
// and so that every refusal names the field at fault in OpenAI's param.

// bodyError is a JSON body the API refuses with 400: what is wrong, and the
// field at fault ("" when the body as a whole is).
type bodyError struct {
	Message string
	Param   string
}

func (e *bodyError) Error() string { return e.Message }

// guardRefusal words a jsonguard refusal for the client, with param naming
// the repeated field when there is one.
func guardRefusal(err error) *bodyError {
	msg, param := jsonguard.Refusal(err)
	return &bodyError{Message: msg, Param: param}
}

// guardedObject checks body with jsonguard before gjson reads it — gjson
// recurses once per nesting level, and only a bounded depth keeps that safe;
// a repeat of a field read would be read first-wins by gjson, last-wins by
// most other readers — and that it is a JSON object.
func guardedObject(body []byte, watch jsonguard.Watch) (gjson.Result, error) {
	if err := jsonguard.Validate(body, watch); err != nil {
		return gjson.Result{}, guardRefusal(err)
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return gjson.Result{}, &bodyError{Message: "the request body must be a JSON object"}
	}
	return root, nil
}

// parseStringBody reads the one string field of a chat API body:
// {"model"} to create a conversation, {"title"} to rename one, {"content"}
// to send a message. The field is required; other members are ignored.
func parseStringBody(body []byte, field string) (string, error) {
	root, err := guardedObject(body, jsonguard.Watch{{Name: field}})
	if err != nil {
		return "", err
	}
	v := root.Get(field)
	if v.Type != gjson.String {
		return "", &bodyError{Message: field + " must be a string", Param: field}
	}
	return v.Str, nil
}

// stopWatch lists the fields StopInference reads. A repeat is refused: gjson
// reads the first, most other JSON readers (a log pipeline, a proxy's
// filter) the last, and they should not disagree on which inference was
// stopped.
var stopWatch = jsonguard.Watch{{Name: "inference_id"}, {Name: "seen"}}

// stopBody is the stop endpoint's body.
type stopBody struct {
	InferenceID string
	// Seen is how many content chunks the page had shown, -1 when the body
	// does not say.
	Seen int
}

// parseStopBody reads {"inference_id": "...", "seen": N}: the id is
// required, seen optional (missing or null), a non-negative integer.
func parseStopBody(body []byte) (stopBody, error) {
	out := stopBody{Seen: -1}
	root, err := guardedObject(body, stopWatch)
	if err != nil {
		return out, err
	}
	id := root.Get("inference_id")
	if id.Type != gjson.String || id.Str == "" {
		return out, &bodyError{Message: "inference_id is required", Param: "inference_id"}
	}
	out.InferenceID = id.Str
	switch v := root.Get("seen"); v.Type {
	case gjson.Null:
	case gjson.Number:
		// The raw number, not gjson's float: 1e2 is 100, 1.5 and -1 are
		// refused, and a count past int64 is refused rather than cut.
		n, ok := wholeNumber(v)
		if !ok {
			return out, &bodyError{Message: "seen must be a non-negative integer", Param: "seen"}
		}
		out.Seen = n
	default:
		return out, &bodyError{Message: "seen must be a non-negative integer", Param: "seen"}
	}
	return out, nil
}

// wholeNumber reads a JSON number as a non-negative int, when it is one
// exactly.
func wholeNumber(v gjson.Result) (int, bool) {
	if n, err := strconv.ParseInt(v.Raw, 10, 0); err == nil {
		return int(n), n >= 0
	}
	// 1e2, 3.0: whole, though written as floats.
	f := v.Num
	if f < 0 || f >= float64(math.MaxInt) || f != math.Trunc(f) {
		return 0, false
	}
	return int(f), true
}

// conversationPatchWatch lists the fields a conversation's PATCH reads.
var conversationPatchWatch = jsonguard.Watch{{Name: "title"}, {Name: "system_prompt"}, {Name: "temperature"}, {Name: "max_tokens"},
	{Name: "pinned"}, {Name: "folder"}}

// conversationPatch is what a PATCH of a conversation changes: each field
// is set when its member is present (a null temperature or max_tokens, or
// an empty system prompt, clears it; an empty or null folder takes the
// conversation out of its folder).
type conversationPatch struct {
	Title, SystemPrompt       *string
	HasTemperature, HasTokens bool
	Temperature               *float64
	MaxTokens                 *int
	Pinned                    *bool
	Folder                    *string
}

// parseConversationPatch reads {"title", "system_prompt", "temperature",
// "max_tokens", "pinned", "folder"}, each optional, at least one present;
// other members are ignored. The values are only typed here: their bounds
// are the chat's (chat.Change).
func parseConversationPatch(body []byte) (conversationPatch, error) {
	var p conversationPatch
	root, err := guardedObject(body, conversationPatchWatch)
	if err != nil {
		return p, err
	}
	for _, f := range []struct {
		name string
		to   **string
	}{{"title", &p.Title}, {"system_prompt", &p.SystemPrompt}} {
		switch v := root.Get(f.name); {
		case !v.Exists():
		case v.Type == gjson.String:
			s := v.Str
			*f.to = &s
		default:
			return p, &bodyError{Message: f.name + " must be a string", Param: f.name}
		}
	}
	switch v := root.Get("temperature"); {
	case !v.Exists():
	case v.Type == gjson.Null:
		p.HasTemperature = true
	case v.Type == gjson.Number:
		t := v.Num
		p.HasTemperature, p.Temperature = true, &t
	default:
		return p, &bodyError{Message: "temperature must be a number or null", Param: "temperature"}
	}
	switch v := root.Get("max_tokens"); {
	case !v.Exists():
	case v.Type == gjson.Null:
		p.HasTokens = true
	case v.Type == gjson.Number:
		n, ok := wholeNumber(v)
		if !ok {
			return p, &bodyError{Message: "max_tokens must be a positive integer or null", Param: "max_tokens"}
		}
		p.HasTokens, p.MaxTokens = true, &n
	default:
		return p, &bodyError{Message: "max_tokens must be a positive integer or null", Param: "max_tokens"}
	}
	switch v := root.Get("pinned"); {
	case !v.Exists():
	case v.Type == gjson.True || v.Type == gjson.False:
		b := v.Bool()
		p.Pinned = &b
	default:
		return p, &bodyError{Message: "pinned must be true or false", Param: "pinned"}
	}
	switch v := root.Get("folder"); {
	case !v.Exists():
	case v.Type == gjson.String || v.Type == gjson.Null:
		s := v.Str // "" for null: no folder
		p.Folder = &s
	default:
		return p, &bodyError{Message: "folder must be a string or null", Param: "folder"}
	}
	if p.Title == nil && p.SystemPrompt == nil && !p.HasTemperature && !p.HasTokens && p.Pinned == nil && p.Folder == nil {
		return p, &bodyError{Message: "give title, system_prompt, temperature, max_tokens, pinned or folder"}
	}
	return p, nil
}
