package responses

import (
	"errors"
	"fmt"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
)

// FromChat translates a non-streamed chat completion into a Responses API
// response object. req is the client's Responses request, whose parameters
// the response echoes; id is the response's id (resp_…) and created its
// creation time (Unix seconds), which is also its completion time.
//
// The status is completed, or incomplete with incomplete_details.reason
// "max_output_tokens" or "content_filter" when the finish_reason is
// "length" or "content_filter". The output is a message item with the
// text (and a refusal part when the engine gave one), followed by a
// function_call item per tool call; a completion with neither text nor tool
// calls still gets a message, with empty text, so output_text is defined.
// An error the engine answered with, or a body that is no chat completion,
// is returned as an error.
func FromChat(req, chatCompletion []byte, id string, created int64) ([]byte, error) {
	if err := jsonguard.Validate(chatCompletion, nil); err != nil {
		return nil, fmt.Errorf("chat completion from the engine: %w", err)
	}
	root := gjson.ParseBytes(chatCompletion)
	if !isObject(root) {
		return nil, errors.New("chat completion from the engine is not a JSON object")
	}
	var choices, usageV, model gjson.Result
	var engineErr string
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "choices":
			choices = v
		case "usage":
			usageV = v
		case "model":
			model = v
		case "error":
			if !isNull(v) {
				engineErr = errorMessage(v)
			}
		case "object":
			if v.Str == "error" {
				engineErr = root.Get("message").String()
			}
		}
		return true
	})
	if engineErr != "" {
		return nil, fmt.Errorf("the engine answered with an error: %s", engineErr)
	}
	// The translated request never asks for n > 1: the first choice is the
	// answer.
	choice := choices.Get("0")
	if !isObject(choice) {
		return nil, errors.New("chat completion from the engine has no choices")
	}
	msg := choice.Get("message")
	content, refusal, toolCalls := msg.Get("content"), msg.Get("refusal"), msg.Get("tool_calls")
	finish := choice.Get("finish_reason").Str

	h := newHead(req, id, created)
	if len(h.model) == 0 && model.Type == gjson.String {
		h.model = []byte(model.Raw)
	}
	e := ending{status: "completed", completedAt: created, incomplete: incompleteReason(finish)}
	itemStatus := "completed"
	if e.incomplete != "" {
		e.status, itemStatus = "incomplete", "incomplete"
	}
	var u usage
	if isObject(usageV) {
		u = readUsage(usageV)
	}

	b := make([]byte, 0, 1024+len(chatCompletion)+len(req))
	b = h.openResponse(b, h.model, e)
	hasText := content.Type == gjson.String && content.Str != ""
	hasRefusal := refusal.Type == gjson.String
	calls := isArray(toolCalls) && toolCalls.Get("#").Int() > 0
	items := 0
	if hasText || hasRefusal || !calls {
		b = h.appendMessageOpen(b, itemStatus)
		if hasText || !hasRefusal {
			b = appendTextPart(b, body(content))
			if hasRefusal {
				b = append(b, ',')
			}
		}
		if hasRefusal {
			b = append(b, `{"type":"refusal","refusal":`...)
			b = append(b, refusal.Raw...)
			b = append(b, '}')
		}
		b = append(b, "]}"...)
		items++
	}
	if calls {
		n := 0
		var callID []byte
		toolCalls.ForEach(func(_, tc gjson.Result) bool {
			fn := tc.Get("function")
			if items > 0 {
				b = append(b, ',')
			}
			if id := tc.Get("id"); id.Type == gjson.String && id.Str != "" {
				callID = append(callID[:0], body(id)...)
			} else {
				// Some engines give no id; the client needs one to
				// answer the call.
				callID = h.appendItemID(callID[:0], "call_", n)
			}
			b = h.appendCall(b, n, itemStatus, callID, []byte(body(fn.Get("name"))), []byte(argumentsBody(fn.Get("arguments"))))
			items++
			n++
			return true
		})
	}
	return closeResponse(b, u), nil
}

// argumentsBody returns a tool call's arguments as an escaped string body.
// Engines send a JSON string; one that sends the arguments as an object
// gets them as that object's text.
func argumentsBody(v gjson.Result) string {
	if v.Type == gjson.String {
		return body(v)
	}
	if isObject(v) {
		s := jsonguard.AppendString(nil, v.Raw)
		return string(s[1 : len(s)-1])
	}
	return ""
}

// errorMessage reads the message of an engine's error member: an object
// with a message, or a bare string.
func errorMessage(v gjson.Result) string {
	if v.Type == gjson.String {
		return v.Str
	}
	if m := v.Get("message"); m.Type == gjson.String && m.Str != "" {
		return m.Str
	}
	return "error"
}
