package responses

import "moonji/internal/jsonguard"

// close ends the response: every item done, then response.completed, or
// response.incomplete when the engine stopped at the token limit or a
// content filter. A response with no item gets an empty message, so that
// clients reading output[0] or output_text find one.
func (s *Stream) close() {
	reason := incompleteReason(s.finish)
	status := "completed"
	if reason != "" {
		status = "incomplete"
	}
	if s.items == 0 {
		s.openMessage()
	}
	next := 0 // the next call, in output order
	for out := 0; out < s.items; out++ {
		if out == s.msg {
			s.closeMessage(status)
			continue
		}
		s.closeCall(&s.calls[next], next, status)
		next++
	}
	typ := "response.completed"
	if reason != "" {
		typ = "response.incomplete"
	}
	completed := max(s.lastAt, s.h.created)
	s.event(typ)
	s.out = append(s.out, `,"response":`...)
	s.appendResponse(ending{status: status, completedAt: completed, incomplete: reason}, status)
	s.endEvent()
	s.closed = true
}

// closeMessage emits the done events of the message item.
func (s *Stream) closeMessage(status string) {
	s.event("response.output_text.done")
	s.itemRef(s.h.msgID, s.msg, true)
	s.out = append(s.out, `,"text":`...)
	s.out = appendQuoted(s.out, s.text)
	s.out = append(s.out, `,"logprobs":[]`...)
	s.endEvent()
	s.event("response.content_part.done")
	s.itemRef(s.h.msgID, s.msg, true)
	s.out = append(s.out, `,"part":`...)
	s.out = appendTextPart(s.out, s.text)
	s.endEvent()
	s.event("response.output_item.done")
	s.out = append(s.out, `,"output_index":`...)
	s.out = appendInt(s.out, int64(s.msg))
	s.out = append(s.out, `,"item":`...)
	s.appendMessage(status)
	s.endEvent()
}

// closeCall emits the done events of the n-th function call item.
func (s *Stream) closeCall(c *toolCall, n int, status string) {
	s.event("response.function_call_arguments.done")
	s.itemRef(c.id, c.output, false)
	s.out = append(s.out, `,"name":`...)
	s.out = appendQuoted(s.out, c.name)
	s.out = append(s.out, `,"arguments":`...)
	s.out = appendQuoted(s.out, c.args)
	s.endEvent()
	s.event("response.output_item.done")
	s.out = append(s.out, `,"output_index":`...)
	s.out = appendInt(s.out, int64(c.output))
	s.out = append(s.out, `,"item":`...)
	s.out = s.h.appendCall(s.out, n, status, c.callID, c.name, c.args)
	s.endEvent()
}

// fail ends the response as failed: an error event, then response.failed
// with the items so far, marked incomplete.
func (s *Stream) fail(msg string) {
	s.event("error")
	s.out = append(s.out, `,"code":"server_error","message":`...)
	s.out = jsonguard.AppendString(s.out, msg)
	s.out = append(s.out, `,"param":null`...)
	s.endEvent()
	s.event("response.failed")
	s.out = append(s.out, `,"response":`...)
	s.appendResponse(ending{status: "failed", errMsg: msg}, "incomplete")
	s.endEvent()
	s.closed = true
}

// appendResponse appends the whole response object, its items with the
// given status.
func (s *Stream) appendResponse(e ending, itemStatus string) {
	s.out = s.h.openResponse(s.out, s.h.model, e)
	next := 0
	for out := 0; out < s.items; out++ {
		if out > 0 {
			s.out = append(s.out, ',')
		}
		if out == s.msg {
			s.appendMessage(itemStatus)
			continue
		}
		c := &s.calls[next]
		s.out = s.h.appendCall(s.out, next, itemStatus, c.callID, c.name, c.args)
		next++
	}
	s.out = closeResponse(s.out, s.u)
}

// appendMessage appends the message item with the whole text.
func (s *Stream) appendMessage(status string) {
	s.out = s.h.appendMessageOpen(s.out, status)
	s.out = appendTextPart(s.out, s.text)
	s.out = append(s.out, "]}"...)
}
