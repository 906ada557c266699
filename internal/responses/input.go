package responses

import (
	"github.com/tidwall/gjson"
)

// appendMessages appends the chat messages array: instructions as a leading
// system message, then the input (a string is one user message; a list of
// items is translated item by item).
func appendMessages(b []byte, instructions, input gjson.Result) ([]byte, *Refusal) {
	w := messageWriter{b: append(b, '[')}
	if instructions.Type == gjson.String {
		w.begin()
		w.b = append(w.b, `{"role":"system","content":`...)
		w.b = append(w.b, instructions.Raw...)
		w.b = append(w.b, '}')
	}
	switch {
	case input.Type == gjson.String:
		w.begin()
		w.b = append(w.b, `{"role":"user","content":`...)
		w.b = append(w.b, input.Raw...)
		w.b = append(w.b, '}')
	case isArray(input):
		var bad *Refusal
		i := 0
		input.ForEach(func(_, item gjson.Result) bool {
			bad = w.item(i, item)
			i++
			return bad == nil
		})
		if bad != nil {
			return nil, bad
		}
		w.closeAssistant()
	case isNull(input):
		return nil, refuse("input", "you must provide an input parameter")
	default:
		return nil, mustBe("input", "a string or an array of input items")
	}
	if w.n == 0 {
		return nil, refuse("input", "input has no messages to send")
	}
	return append(w.b, ']'), nil
}

// messageWriter appends chat messages. An assistant message is left open
// (its closing brace unwritten) so that the function_call items that follow
// it, which are the same turn in the Responses API, become its tool_calls.
type messageWriter struct {
	b     []byte
	n     int  // messages begun
	open  bool // an assistant message is open
	calls int  // tool calls written into the open assistant message
}

// inputItem holds the members of an input item the translation reads,
// gathered in one pass over the item.
type inputItem struct {
	typ, role, content, callID, name, arguments, output gjson.Result
}

func (w *messageWriter) begin() {
	w.closeAssistant()
	if w.n > 0 {
		w.b = append(w.b, ',')
	}
	w.n++
}

func (w *messageWriter) closeAssistant() {
	if !w.open {
		return
	}
	if w.calls > 0 {
		w.b = append(w.b, ']')
	}
	w.b = append(w.b, '}')
	w.open, w.calls = false, 0
}

// item translates input[i].
func (w *messageWriter) item(i int, item gjson.Result) *Refusal {
	param := index("input", i)
	if !isObject(item) {
		return mustBe(param, "an object")
	}
	var f inputItem
	item.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "type":
			f.typ = v
		case "role":
			f.role = v
		case "content":
			f.content = v
		case "call_id":
			f.callID = v
		case "name":
			f.name = v
		case "arguments":
			f.arguments = v
		case "output":
			f.output = v
		}
		return true
	})
	switch {
	case f.typ.Str == "message" || (isNull(f.typ) && f.role.Exists()):
		return w.message(param, f)
	case f.typ.Str == "function_call":
		return w.functionCall(param, f)
	case f.typ.Str == "function_call_output":
		return w.functionOutput(param, f)
	case f.typ.Str == "reasoning":
		// Chat has no field for reasoning items: they are left out. This
		// backend never returns them, so only a conversation begun
		// elsewhere carries them.
		return nil
	case f.typ.Str == "item_reference":
		return refuse(param, "item references need stored responses; this backend serves only chat completions and nothing is stored: send the items themselves")
	case f.typ.Type != gjson.String:
		return mustBe(param+".type", "a string")
	default:
		return refuse(param+".type", "input items of type %q cannot be translated for a chat completions backend (only message, function_call and function_call_output can)", f.typ.Str)
	}
}

// message translates a message item.
func (w *messageWriter) message(param string, f inputItem) *Refusal {
	role := f.role.Str
	if f.role.Type != gjson.String {
		return mustBe(param+".role", `one of "user", "system", "developer" or "assistant"`)
	}
	switch role {
	case "assistant":
		w.begin()
		w.b = append(w.b, `{"role":"assistant","content":`...)
		var bad *Refusal
		if w.b, bad = appendAssistantContent(w.b, param+".content", f.content); bad != nil {
			return bad
		}
		w.open = true
		return nil
	case "user", "system", "developer":
		w.begin()
		// Chat engines and their templates know "system"; OpenAI treats a
		// developer message as the system message of older models too.
		if role == "user" {
			w.b = append(w.b, `{"role":"user","content":`...)
		} else {
			w.b = append(w.b, `{"role":"system","content":`...)
		}
		var bad *Refusal
		if w.b, bad = appendContent(w.b, param+".content", f.content, role == "user"); bad != nil {
			return bad
		}
		w.b = append(w.b, '}')
		return nil
	default:
		return refuse(param+".role", `role %q cannot be translated: use "user", "system", "developer" or "assistant" (tool results are function_call_output items)`, role)
	}
}

// functionCall translates a function_call item into a tool call of the
// assistant message before it, or of a new one.
func (w *messageWriter) functionCall(param string, f inputItem) *Refusal {
	for _, m := range [...]struct {
		name string
		v    gjson.Result
	}{{"call_id", f.callID}, {"name", f.name}, {"arguments", f.arguments}} {
		if m.v.Type != gjson.String {
			return mustBe(param+"."+m.name, "a string")
		}
	}
	if !w.open {
		w.begin()
		w.b = append(w.b, `{"role":"assistant","content":null`...)
		w.open = true
	}
	if w.calls == 0 {
		w.b = append(w.b, `,"tool_calls":[`...)
	} else {
		w.b = append(w.b, ',')
	}
	w.calls++
	w.b = append(w.b, `{"id":`...)
	w.b = append(w.b, f.callID.Raw...)
	w.b = append(w.b, `,"type":"function","function":{"name":`...)
	w.b = append(w.b, f.name.Raw...)
	w.b = append(w.b, `,"arguments":`...)
	w.b = append(w.b, f.arguments.Raw...)
	w.b = append(w.b, `}}`...)
	return nil
}

// functionOutput translates a function_call_output item into a tool message.
func (w *messageWriter) functionOutput(param string, f inputItem) *Refusal {
	if f.callID.Type != gjson.String {
		return mustBe(param+".call_id", "a string")
	}
	w.begin()
	w.b = append(w.b, `{"role":"tool","tool_call_id":`...)
	w.b = append(w.b, f.callID.Raw...)
	w.b = append(w.b, `,"content":`...)
	var bad *Refusal
	if isNull(f.output) {
		return mustBe(param+".output", "a string or an array of content parts")
	}
	// Chat tool messages carry text only.
	if w.b, bad = appendContent(w.b, param+".output", f.output, false); bad != nil {
		return bad
	}
	w.b = append(w.b, '}')
	return nil
}

// appendContent appends the content of a user, system or tool message: a
// string as it is, a list of parts as chat parts (images only where images
// is true). A list of one text part becomes a string, the form every chat
// engine and template accepts.
func appendContent(b []byte, param string, content gjson.Result, images bool) ([]byte, *Refusal) {
	if content.Type == gjson.String {
		return append(b, content.Raw...), nil
	}
	if !isArray(content) {
		return nil, mustBe(param, "a string or an array of content parts")
	}
	parts := content.Array()
	if len(parts) == 1 && parts[0].Get("type").Str == "input_text" {
		if t := parts[0].Get("text"); t.Type == gjson.String {
			return append(b, t.Raw...), nil
		}
	}
	b = append(b, '[')
	for j, p := range parts {
		pp := index(param, j)
		if j > 0 {
			b = append(b, ',')
		}
		var bad *Refusal
		if b, bad = appendPart(b, pp, p, images); bad != nil {
			return nil, bad
		}
	}
	return append(b, ']'), nil
}

// appendPart appends one input content part as a chat content part.
func appendPart(b []byte, param string, p gjson.Result, images bool) ([]byte, *Refusal) {
	if !isObject(p) {
		return nil, mustBe(param, "an object")
	}
	typ := p.Get("type")
	switch typ.Str {
	case "input_text":
		t := p.Get("text")
		if t.Type != gjson.String {
			return nil, mustBe(param+".text", "a string")
		}
		b = append(b, `{"type":"text","text":`...)
		b = append(b, t.Raw...)
		return append(b, '}'), nil
	case "input_image":
		if !images {
			return nil, refuse(param+".type", "images cannot be translated here: chat system and tool messages carry text only")
		}
		if id := p.Get("file_id"); !isNull(id) {
			return nil, refuse(param+".file_id", "file_id needs OpenAI's file storage; send the image as image_url (a URL or a data: URL)")
		}
		u := p.Get("image_url")
		if u.Type != gjson.String {
			return nil, mustBe(param+".image_url", "a string")
		}
		b = append(b, `{"type":"image_url","image_url":{"url":`...)
		b = append(b, u.Raw...)
		if d := p.Get("detail"); d.Type == gjson.String {
			b = append(b, `,"detail":`...)
			b = append(b, d.Raw...)
		}
		return append(b, `}}`...), nil
	case "input_file":
		return nil, refuse(param+".type", "file inputs cannot be translated for a chat completions backend")
	default:
		if typ.Type != gjson.String {
			return nil, mustBe(param+".type", "a string")
		}
		return nil, refuse(param+".type", "content parts of type %q cannot be translated here (only input_text and input_image can)", typ.Str)
	}
}

// appendAssistantContent appends an assistant message's content as one
// string: the texts of its output_text (or input_text) and refusal parts,
// joined. Chat engines read assistant content as a string; some refuse
// parts there.
func appendAssistantContent(b []byte, param string, content gjson.Result) ([]byte, *Refusal) {
	switch {
	case content.Type == gjson.String:
		return append(b, content.Raw...), nil
	case isNull(content):
		return append(b, "null"...), nil
	case !isArray(content):
		return nil, mustBe(param, "a string or an array of content parts")
	}
	b = append(b, '"')
	var bad *Refusal
	j := 0
	content.ForEach(func(_, p gjson.Result) bool {
		pp := index(param, j)
		j++
		if !isObject(p) {
			bad = mustBe(pp, "an object")
			return false
		}
		var field string
		switch t := p.Get("type"); t.Str {
		case "output_text", "input_text":
			field = "text"
		case "refusal":
			field = "refusal"
		default:
			bad = refuse(pp+".type", "assistant content parts of type %q cannot be translated (only output_text and refusal can)", t.Str)
			return false
		}
		v := p.Get(field)
		if v.Type != gjson.String {
			bad = mustBe(pp+"."+field, "a string")
			return false
		}
		b = append(b, body(v)...)
		return true
	})
	if bad != nil {
		return nil, bad
	}
	return append(b, '"'), nil
}
