package responses

import (
	"github.com/tidwall/gjson"
)

// appendTools appends the function tools as chat tools and returns how many
// there are. A Responses function tool is flat ({type, name, description,
// parameters, strict}); a chat tool nests the same under "function". Every
// other tool type is one of OpenAI's built-in tools (web_search,
// file_search, computer_use, code_interpreter, mcp, …), which run on
// OpenAI's side: refused.
func appendTools(b []byte, tools gjson.Result) ([]byte, int, *Refusal) {
	if isNull(tools) {
		return b, 0, nil
	}
	n := 0
	var bad *Refusal
	tools.ForEach(func(_, t gjson.Result) bool {
		param := index("tools", n)
		if !isObject(t) {
			bad = mustBe(param, "an object")
			return false
		}
		var typ, name, description, parameters, strict gjson.Result
		t.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "type":
				typ = v
			case "name":
				name = v
			case "description":
				description = v
			case "parameters":
				parameters = v
			case "strict":
				strict = v
			}
			return true
		})
		if typ.Str != "function" {
			if typ.Type != gjson.String {
				bad = mustBe(param+".type", "a string")
			} else {
				bad = refuse(param+".type", "tools of type %q run on OpenAI's side and cannot be used with a chat completions backend; only function tools can", typ.Str)
			}
			return false
		}
		if name.Type != gjson.String {
			bad = mustBe(param+".name", "a string")
			return false
		}
		if n == 0 {
			b = append(b, `,"tools":[`...)
		} else {
			b = append(b, ',')
		}
		n++
		b = append(b, `{"type":"function","function":{"name":`...)
		b = append(b, name.Raw...)
		// Nulls are left out: chat reads a missing member as its default.
		if description.Type == gjson.String {
			b = append(b, `,"description":`...)
			b = append(b, description.Raw...)
		}
		if isObject(parameters) {
			b = append(b, `,"parameters":`...)
			b = append(b, parameters.Raw...)
		}
		if strict.Type == gjson.True || strict.Type == gjson.False {
			b = append(b, `,"strict":`...)
			b = append(b, strict.Raw...)
		}
		b = append(b, `}}`...)
		return true
	})
	if bad != nil {
		return nil, 0, bad
	}
	if n > 0 {
		b = append(b, ']')
	}
	return b, n, nil
}

// appendToolChoice appends tool_choice. "auto" and "none" without tools
// mean nothing and are left out (OpenAI's chat API refuses a tool_choice
// without tools); "required" without tools is passed on for the engine to
// refuse, as it asks for what cannot be.
func appendToolChoice(b []byte, choice gjson.Result, tools int) ([]byte, *Refusal) {
	switch {
	case isNull(choice):
		return b, nil
	case choice.Type == gjson.String:
		switch choice.Str {
		case "auto", "none":
			if tools == 0 {
				return b, nil
			}
		case "required":
		default:
			return nil, refuse("tool_choice", `tool_choice %q cannot be translated: use "auto", "none", "required" or a function`, choice.Str)
		}
		b = append(b, `,"tool_choice":`...)
		return append(b, choice.Raw...), nil
	case isObject(choice):
		typ := choice.Get("type")
		if typ.Str != "function" {
			return nil, refuse("tool_choice.type", "tool_choice of type %q cannot be translated for a chat completions backend; only a function can be chosen", typ.String())
		}
		name := choice.Get("name")
		if name.Type != gjson.String {
			return nil, mustBe("tool_choice.name", "a string")
		}
		b = append(b, `,"tool_choice":{"type":"function","function":{"name":`...)
		b = append(b, name.Raw...)
		return append(b, `}}`...), nil
	default:
		return nil, mustBe("tool_choice", "a string or an object")
	}
}

// appendText translates text.format into response_format and
// text.verbosity into chat's verbosity. The Responses json_schema format is
// flat ({type, name, schema, description, strict}); chat nests the same
// under "json_schema". A text format is chat's default: left out.
func appendText(b []byte, text gjson.Result) ([]byte, *Refusal) {
	if isNull(text) {
		return b, nil
	}
	var format, verbosity gjson.Result
	var bad *Refusal
	text.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "format":
			format = v
		case "verbosity":
			verbosity = v
		default:
			bad = refuse("text."+k.Str, "unknown parameter %q: it cannot be translated for a chat completions backend", "text."+k.Str)
		}
		return bad == nil
	})
	if bad != nil {
		return nil, bad
	}
	if !isNull(format) {
		if !isObject(format) {
			return nil, mustBe("text.format", "an object")
		}
		switch typ := format.Get("type"); typ.Str {
		case "text":
		case "json_object":
			b = append(b, `,"response_format":{"type":"json_object"}`...)
		case "json_schema":
			var name, schema, description, strict gjson.Result
			format.ForEach(func(k, v gjson.Result) bool {
				switch k.Str {
				case "name":
					name = v
				case "schema":
					schema = v
				case "description":
					description = v
				case "strict":
					strict = v
				}
				return true
			})
			if name.Type != gjson.String {
				return nil, mustBe("text.format.name", "a string")
			}
			if !isObject(schema) {
				return nil, mustBe("text.format.schema", "an object")
			}
			b = append(b, `,"response_format":{"type":"json_schema","json_schema":{"name":`...)
			b = append(b, name.Raw...)
			b = append(b, `,"schema":`...)
			b = append(b, schema.Raw...)
			if description.Type == gjson.String {
				b = append(b, `,"description":`...)
				b = append(b, description.Raw...)
			}
			if strict.Type == gjson.True || strict.Type == gjson.False {
				b = append(b, `,"strict":`...)
				b = append(b, strict.Raw...)
			}
			b = append(b, `}}`...)
		default:
			return nil, refuse("text.format.type", `text format %q cannot be translated: use "text", "json_object" or "json_schema"`, typ.String())
		}
	}
	if verbosity.Type == gjson.String {
		b = append(b, `,"verbosity":`...)
		b = append(b, verbosity.Raw...)
	} else if !isNull(verbosity) {
		return nil, mustBe("text.verbosity", "a string")
	}
	return b, nil
}
