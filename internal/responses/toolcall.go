package responses

import "github.com/tidwall/gjson"

// toolCall is a function call item being streamed.
type toolCall struct {
	index  int64  // the chat tool call's index
	output int    // its output_index
	id     []byte // the item's id, a JSON string
	// callID, name and args are escaped string bodies.
	callID, name, args []byte
}

// toolDelta translates one tool call delta. The first delta of a call
// (a new index; engines that give none, a new id) opens its item; the
// arguments of every delta go out as they come.
func (s *Stream) toolDelta(tc gjson.Result) {
	var idx, id, fn gjson.Result
	tc.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "index":
			idx = v
		case "id":
			id = v
		case "function":
			fn = v
		}
		return true
	})
	var name, args gjson.Result
	fn.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "name":
			name = v
		case "arguments":
			args = v
		}
		return true
	})
	c := s.findCall(idx, id)
	if c == nil {
		c = s.openCall(idx, id, name)
	} else if len(c.name) == 0 && name.Type == gjson.String {
		c.name = append(c.name, body(name)...)
	}
	var a string
	if args.Type == gjson.String {
		a = body(args)
	} else if isObject(args) {
		// Not OpenAI's shape, but some engines send the arguments as an
		// object: its text is the arguments.
		a = argumentsBody(args)
	}
	if a == "" {
		return
	}
	a = loneSurrogates(a)
	c.args = append(c.args, a...)
	s.event("response.function_call_arguments.delta")
	s.itemRef(c.id, c.output, false)
	s.out = append(s.out, `,"delta":"`...)
	s.out = append(s.out, a...)
	s.out = append(s.out, '"')
	s.endEvent()
}

// findCall returns the call a delta continues, or nil for a new one.
func (s *Stream) findCall(idx, id gjson.Result) *toolCall {
	if idx.Type == gjson.Number {
		for i := range s.calls {
			if s.calls[i].index == idx.Int() {
				return &s.calls[i]
			}
		}
		return nil
	}
	if len(s.calls) == 0 {
		return nil
	}
	last := &s.calls[len(s.calls)-1]
	if id.Type == gjson.String && id.Str != "" && string(last.callID) != body(id) {
		return nil
	}
	return last
}

// openCall opens a function_call item.
func (s *Stream) openCall(idx, id, name gjson.Result) *toolCall {
	n := len(s.calls)
	c := toolCall{index: int64(n), output: s.items}
	if idx.Type == gjson.Number {
		c.index = idx.Int()
	}
	s.items++
	c.id = append(c.id, '"')
	c.id = s.h.appendItemID(c.id, "fc_", n)
	c.id = append(c.id, '"')
	if id.Type == gjson.String && id.Str != "" {
		c.callID = append(c.callID, body(id)...)
	} else {
		// The client needs a call id to answer the call.
		c.callID = s.h.appendItemID(c.callID, "call_", n)
	}
	c.name = append(c.name, body(name)...)
	s.calls = append(s.calls, c)

	s.event("response.output_item.added")
	s.out = append(s.out, `,"output_index":`...)
	s.out = appendInt(s.out, int64(c.output))
	s.out = append(s.out, `,"item":`...)
	s.out = s.h.appendCall(s.out, n, "in_progress", c.callID, c.name, nil)
	s.endEvent()
	return &s.calls[n]
}
