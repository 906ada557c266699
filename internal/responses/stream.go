package responses

import (
	"encoding/json"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
	"moonji/internal/proxy"
)

// Stopped is the reason End takes for a stream the user stopped.
const Stopped = "stopped"

// Stream translates a chat completions SSE stream into the Responses event
// stream, one chat frame at a time. It keeps the answer's text once, as the
// escaped text the engine sent, in one growing buffer: the closing events
// repeat the whole text, and copying escaped text needs no re-encoding.
// A Stream is not safe for concurrent use.
type Stream struct {
	h    head
	out  []byte // the events of the current call; reused
	text []byte // the text so far, an escaped JSON string body
	// calls are the function call items, in output order.
	calls []toolCall
	seq   int64
	// items counts the output items opened; msg is the message item's
	// output index, -1 until it is opened.
	items, msg int
	// finish is the engine's finish_reason, normalized: "" until one
	// came, then "stop", "length" or "content_filter".
	finish string
	u      usage
	// lastAt is the latest chunk's creation time (the completion time).
	lastAt          int64
	started, closed bool
}

// NewStream returns a Stream for the Responses request req, answered as the
// response id created at created (Unix seconds).
func NewStream(req []byte, id string, created int64) *Stream {
	return &Stream{h: newHead(req, id, created), msg: -1, out: make([]byte, 0, 1024), text: make([]byte, 0, 1024)}
}

// Frame returns the Responses events (zero or more complete "event: X\n
// data: {…}\n\n" frames) for one chat frame: the bytes of one "data: …\n\n"
// frame, or "data: [DONE]\n\n". The returned bytes are reused by the next
// call to Frame or End: write them out (or copy them) before.
//
// The first call emits response.created and response.in_progress. Text
// opens the message item (output_item.added, content_part.added) and goes
// out as response.output_text.delta; a tool call opens a function_call item
// and its arguments go out as response.function_call_arguments.delta. The
// response closes (every item's done events, then response.completed, or
// response.incomplete for a finish_reason of "length" or "content_filter")
// once the finish_reason and the usage have both come, or at [DONE],
// whichever is first: the translated request always asks for the usage,
// which engines send after the finish_reason, and the closing event
// carries it. An error the engine writes into its stream, or a frame that
// is not JSON, fails the response: an error event, then response.failed.
// After the close, frames are ignored. Frame(nil) returns just the opening
// events, for a caller that answers before the engine's first chunk.
func (s *Stream) Frame(frame []byte) []byte {
	if s.closed {
		return nil
	}
	s.out = s.out[:0]
	s.start()
	switch payload := proxy.DataPayload(frame); {
	case payload == nil:
		// A comment or a keep-alive.
	case string(payload) == "[DONE]":
		s.close()
	default:
		s.chunk(payload)
	}
	return s.out
}

// End closes a stream cut short, and returns the closing events (nil when
// the stream is already closed). A stream the user stopped (reason
// Stopped), or one whose finish_reason had come, closes like a finished
// one: every open item done, then response.completed with the text so far.
// That is the close both official helpers accept: openai-node's
// responses.stream().finalResponse() and openai-python's
// get_final_response() take the response of response.completed; the
// Python one raises without it, and the Node one, on response.incomplete,
// resolves with the snapshot of response.created (status "in_progress", no
// usage). It is also what the gateway does for a stopped chat stream
// (finish_reason "stop"). Any other reason is a failure (the engine gone):
// an error event with reason as its message, then response.failed, which
// both SDKs raise.
func (s *Stream) End(reason string) []byte {
	if s.closed {
		return nil
	}
	s.out = s.out[:0]
	s.start()
	if reason == Stopped || s.finish != "" {
		s.close()
	} else {
		if reason == "" {
			reason = "the engine's stream ended before the answer was complete"
		}
		s.fail(reason)
	}
	return s.out
}

// Usage returns the engine's token counts and whether it sent them (or
// SetUsage gave them).
func (s *Stream) Usage() (in, out int, ok bool) { return int(s.u.in), int(s.u.out), s.u.ok }

// SetUsage sets the usage the closing event reports, for a stream whose
// engine sent none (a stop cuts it off before the usage chunk): the
// gateway's estimate. Call it before End.
func (s *Stream) SetUsage(in, out int) {
	s.u = usage{in: int64(in), out: int64(out), ok: true}
}

// Text returns the output text so far.
func (s *Stream) Text() string {
	var t string
	if err := json.Unmarshal(appendQuoted(nil, s.text), &t); err != nil {
		return "" // unreachable: the text is copied from validated strings
	}
	return t
}

// start emits response.created and response.in_progress, once.
func (s *Stream) start() {
	if s.started {
		return
	}
	s.started = true
	for _, typ := range [...]string{"response.created", "response.in_progress"} {
		s.event(typ)
		s.out = append(s.out, `,"response":`...)
		s.out = s.h.openResponse(s.out, s.h.model, ending{status: "in_progress"})
		s.out = closeResponse(s.out, usage{})
		s.endEvent()
	}
}

// chunk translates one chat chunk.
func (s *Stream) chunk(payload []byte) {
	// The guard bounds what gjson reads, and makes every string copied
	// out of the frame a well-formed JSON string.
	if jsonguard.Validate(payload, nil) != nil {
		s.fail("the engine sent a stream frame that is not valid JSON")
		return
	}
	// Read in place: nothing that points into the frame outlives this
	// call (every copy goes into the Stream's own buffers).
	root := gjson.Parse(unsafeString(payload))
	if !isObject(root) {
		return
	}
	var choices, usageV, message gjson.Result
	isError := false
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "choices":
			choices = v
		case "usage":
			usageV = v
		case "created":
			if t := v.Int(); t > s.lastAt {
				s.lastAt = t
			}
		case "error":
			if !isNull(v) {
				isError, message = true, v
			}
		case "object":
			isError = isError || v.Str == "error"
		}
		return true
	})
	if isError {
		// {"error": {…}} (OpenAI, Ollama) or {"object": "error", …} (vLLM).
		msg := "the engine reported an error"
		if message.Exists() {
			msg = errorMessage(message)
		} else if m := root.Get("message"); m.Type == gjson.String && m.Str != "" {
			msg = m.Str
		}
		s.fail(msg)
		return
	}
	if isArray(choices) {
		choices.ForEach(func(_, c gjson.Result) bool {
			s.choice(c)
			return true
		})
	}
	if isObject(usageV) {
		s.u = readUsage(usageV)
	}
	if s.finish != "" && s.u.ok {
		s.close()
	}
}

// choice translates the delta of one choice. The translated request asks
// for one choice; any other index is ignored.
func (s *Stream) choice(c gjson.Result) {
	var idx, delta, finish gjson.Result
	c.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "index":
			idx = v
		case "delta":
			delta = v
		case "finish_reason":
			finish = v
		}
		return true
	})
	if idx.Int() != 0 {
		return
	}
	if isObject(delta) {
		delta.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "content":
				if v.Type == gjson.String && len(v.Raw) > 2 {
					s.textDelta(loneSurrogates(body(v)))
				}
			case "tool_calls":
				if isArray(v) {
					v.ForEach(func(_, tc gjson.Result) bool {
						s.toolDelta(tc)
						return true
					})
				}
			}
			// Reasoning text (reasoning_content, reasoning) has no place
			// in the output items translated here.
			return true
		})
	}
	if finish.Type == gjson.String && s.finish == "" {
		// Constants, not finish.Str: that points into the frame.
		switch finish.Str {
		case "length":
			s.finish = "length"
		case "content_filter":
			s.finish = "content_filter"
		default:
			s.finish = "stop"
		}
	}
}

// textDelta sends a piece of text, opening the message item first.
func (s *Stream) textDelta(text string) {
	if s.msg < 0 {
		s.openMessage()
	}
	s.event("response.output_text.delta")
	s.itemRef(s.h.msgID, s.msg, true)
	s.out = append(s.out, `,"delta":"`...)
	s.out = append(s.out, text...)
	s.out = append(s.out, `","logprobs":[]`...)
	s.endEvent()
	s.text = append(s.text, text...)
}

// openMessage opens the message item and its one output_text part.
func (s *Stream) openMessage() {
	s.msg = s.items
	s.items++
	s.event("response.output_item.added")
	s.out = append(s.out, `,"output_index":`...)
	s.out = appendInt(s.out, int64(s.msg))
	s.out = append(s.out, `,"item":`...)
	s.out = s.h.appendMessageOpen(s.out, "in_progress")
	s.out = append(s.out, "]}"...)
	s.endEvent()
	s.event("response.content_part.added")
	s.itemRef(s.h.msgID, s.msg, true)
	s.out = append(s.out, `,"part":`...)
	s.out = appendTextPart(s.out, "")
	s.endEvent()
}
