package responses

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// decode reads JSON with numbers kept as written, for comparing documents
// by meaning rather than by bytes.
func decode(t testing.TB, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("invalid JSON: %v\n%s", err, b)
	}
	return v
}

func sameJSON(t testing.TB, got, want []byte) bool {
	t.Helper()
	return reflect.DeepEqual(decode(t, got), decode(t, want))
}

// Each file of testdata/tochat is a request body as a client sent it
// (captured from openai-node and LangChain JS, or written after
// openai-python's serialization), with the chat body it must become or the
// param its refusal must name.
func TestToChatClientBodies(t *testing.T) {
	files, _ := filepath.Glob("testdata/tochat/*.json")
	if len(files) == 0 {
		t.Fatal("no cases in testdata/tochat")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			doc, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			req := []byte(gjson.GetBytes(doc, "request").Raw)
			chat, stream, err := ToChat(req)
			if want := gjson.GetBytes(doc, "refused"); want.Exists() {
				var r *Refusal
				if !errors.As(err, &r) || r.Param != want.Str || r.Message == "" {
					t.Fatalf("ToChat = %s, %v; want a refusal of %q", chat, err, want.Str)
				}
				return
			}
			if err != nil {
				t.Fatalf("ToChat: %v", err)
			}
			if !json.Valid(chat) {
				t.Fatalf("not JSON: %s", chat)
			}
			if want := []byte(gjson.GetBytes(doc, "chat").Raw); !sameJSON(t, chat, want) {
				t.Errorf("ToChat =\n%s\nwant\n%s", chat, want)
			}
			if want := gjson.GetBytes(req, "stream").Bool(); stream != want {
				t.Errorf("stream = %v, want %v", stream, want)
			}
		})
	}
}

// An explicit null is "not set": left out of the chat body, never 0.
func TestToChatNullIsNotMissing(t *testing.T) {
	chat, _, err := ToChat([]byte(`{"model":"m","input":"hi","temperature":null,"top_p":null,"max_output_tokens":null,"instructions":null,"tools":null,"tool_choice":null,"parallel_tool_calls":null,"text":null,"reasoning":null,"user":null,"stream":null,"truncation":null,"previous_response_id":null,"background":null,"conversation":null,"include":null,"top_logprobs":null,"metadata":null,"store":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`; string(chat) != want {
		t.Errorf("ToChat = %s, want %s", chat, want)
	}
	// A zero is a value: kept.
	chat, _, err = ToChat([]byte(`{"model":"m","input":"hi","temperature":0,"top_p":0}`))
	if err != nil || !strings.Contains(string(chat), `"temperature":0,"top_p":0`) {
		t.Errorf("ToChat = %s, %v; want temperature and top_p 0", chat, err)
	}
}

// Refusals name the field at fault, the way OpenAI's 400s do.
func TestToChatRefusals(t *testing.T) {
	for _, c := range []struct{ body, param string }{
		{``, ""},
		{`[1]`, ""},
		{`{"model":"m","input":"x"`, ""},
		{`{"input":"hi"}`, "model"},
		{`{"model":"","input":"hi"}`, "model"},
		{`{"model":"m"}`, "input"},
		{`{"model":"m","input":[]}`, "input"},
		{`{"model":"m","input":7}`, "input"},
		{`{"model":"m","input":"x","input":"y"}`, "input"},
		{`{"model":"m","input":"x","MODEL":"y"}`, "model"},
		{`{"model":"m","input":"x","seed":1}`, "seed"},
		{`{"model":"m","input":"x","previous_response_id":"resp_1"}`, "previous_response_id"},
		{`{"model":"m","input":"x","conversation":"conv_1"}`, "conversation"},
		{`{"model":"m","input":"x","conversation":{"id":"conv_1"}}`, "conversation"},
		{`{"model":"m","input":"x","background":true}`, "background"},
		{`{"model":"m","input":"x","prompt":{"id":"pmpt_1"}}`, "prompt"},
		{`{"model":"m","input":"x","truncation":"auto"}`, "truncation"},
		{`{"model":"m","input":"x","top_logprobs":3}`, "top_logprobs"},
		{`{"model":"m","input":"x","include":["message.output_text.logprobs"]}`, "include[0]"},
		{`{"model":"m","input":"x","context_management":[{"type":"compaction"}]}`, "context_management"},
		{`{"model":"m","input":"x","temperature":"hot"}`, "temperature"},
		{`{"model":"m","input":"x","temperature":2.5}`, "temperature"},
		{`{"model":"m","input":"x","temperature":-1}`, "temperature"},
		{`{"model":"m","input":"x","top_p":1.5}`, "top_p"},
		{`{"model":"m","input":"x","max_output_tokens":-1}`, "max_output_tokens"},
		{`{"model":"m","input":"x","max_output_tokens":0}`, "max_output_tokens"},
		{`{"model":"m","input":"x","max_output_tokens":1e30}`, "max_output_tokens"},
		{`{"model":"m","input":"x","max_output_tokens":16.5}`, "max_output_tokens"},
		{`{"model":"m","input":"x","max_output_tokens":9223372036854775807}`, "max_output_tokens"},
		{`{"model":"m","input":"x","max_output_tokens":"64"}`, "max_output_tokens"},
		{`{"model":"m","input":"x","stream":"yes"}`, "stream"},
		{`{"model":"m","input":"x","tools":[{"type":"function","name":"f"},{"type":"file_search","vector_store_ids":["vs_1"]}]}`, "tools[1].type"},
		{`{"model":"m","input":"x","tools":[{"type":"computer_use_preview","display_width":1024,"display_height":768,"environment":"browser"}]}`, "tools[0].type"},
		{`{"model":"m","input":"x","tools":[{"type":"web_search_preview"}]}`, "tools[0].type"},
		{`{"model":"m","input":"x","tools":[{"type":"mcp","server_label":"x"}]}`, "tools[0].type"},
		{`{"model":"m","input":"x","tools":[{"type":"custom","name":"grammar"}]}`, "tools[0].type"},
		{`{"model":"m","input":"x","tools":[{"type":"function"}]}`, "tools[0].name"},
		{`{"model":"m","input":"x","tool_choice":{"type":"file_search"}}`, "tool_choice.type"},
		{`{"model":"m","input":"x","tool_choice":{"type":"allowed_tools","mode":"auto","tools":[]}}`, "tool_choice.type"},
		{`{"model":"m","input":"x","tool_choice":"sometimes"}`, "tool_choice"},
		{`{"model":"m","input":"x","text":{"format":{"type":"grammar"}}}`, "text.format.type"},
		{`{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"a"}}}`, "text.format.schema"},
		{`{"model":"m","input":"x","text":{"style":"terse"}}`, "text.style"},
		{`{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}`, "input[0]"},
		{`{"model":"m","input":[{"type":"web_search_call","id":"ws_1","status":"completed"}]}`, "input[0].type"},
		{`{"model":"m","input":[{"role":"tool","content":"x"}]}`, "input[0].role"},
		{`{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"file-1"}]}]}`, "input[0].content[0].type"},
		{`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","file_id":"file-1"}]}]}`, "input[0].content[1].file_id"},
		{`{"model":"m","input":[{"role":"system","content":[{"type":"input_image","image_url":"https://x/y.png"}]}]}`, "input[0].content[0].type"},
		{`{"model":"m","input":[{"role":"assistant","content":[{"type":"input_image","image_url":"https://x/y.png"}]}]}`, "input[0].content[0].type"},
		{`{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, "input[0].call_id"},
		{`{"model":"m","input":[{"type":"function_call_output","call_id":"c"}]}`, "input[0].output"},
		{`{"model":"m","input":["hi"]}`, "input[0]"},
	} {
		chat, _, err := ToChat([]byte(c.body))
		var r *Refusal
		if !errors.As(err, &r) {
			t.Errorf("%s: ToChat = %s, %v; want a refusal", c.body, chat, err)
			continue
		}
		if r.Param != c.param || r.Message == "" {
			t.Errorf("%s: refusal %+v, want param %q", c.body, r, c.param)
		}
	}
}

// What the package documentation says is ignored is accepted and leaves
// no trace in the chat body.
func TestToChatIgnored(t *testing.T) {
	chat, _, err := ToChat([]byte(`{"model":"m","input":"x","store":true,"metadata":{"a":"b"},"service_tier":"flex","prompt_cache_key":"k","prompt_cache_retention":"24h","safety_identifier":"u1","max_tool_calls":3,"stream_options":{"include_obfuscation":false},"truncation":"disabled","background":false,"include":["reasoning.encrypted_content","file_search_call.results"],"top_logprobs":0,"context_management":[],"reasoning":{"summary":"auto"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"model":"m","messages":[{"role":"user","content":"x"}]}`; string(chat) != want {
		t.Errorf("ToChat = %s, want %s", chat, want)
	}
}

func TestToChatShapes(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"tool_choice function", `{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":null}],"tool_choice":{"type":"function","name":"f"}}`,
			`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`},
		// Without tools "auto" and the parallel flag mean nothing; OpenAI's
		// chat API would refuse them.
		{"no tools", `{"model":"m","input":"x","tools":[],"tool_choice":"auto","parallel_tool_calls":true}`,
			`{"model":"m","messages":[{"role":"user","content":"x"}]}`},
		{"required without tools is the engine's to refuse", `{"model":"m","input":"x","tool_choice":"required"}`,
			`{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`},
		{"text format text is the default", `{"model":"m","input":"x","text":{"format":{"type":"text"},"verbosity":"low"}}`,
			`{"model":"m","messages":[{"role":"user","content":"x"}],"verbosity":"low"}`},
		{"stream false", `{"model":"m","input":"x","stream":false}`, `{"model":"m","messages":[{"role":"user","content":"x"}]}`},
		{"assistant parts joined, refusal kept as text", `{"model":"m","input":[{"role":"assistant","content":[{"type":"output_text","text":"a\"b"},{"type":"refusal","refusal":"\u00e9"}]}]}`,
			`{"model":"m","messages":[{"role":"assistant","content":"a\"b\u00e9"}]}`},
		{"several function calls are one turn", `{"model":"m","input":[{"type":"message","role":"assistant","content":"Checking."},{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"type":"function_call","call_id":"b","name":"g","arguments":"{}"},{"type":"function_call_output","call_id":"a","output":[{"type":"input_text","text":"1"},{"type":"input_text","text":"2"}]},{"type":"function_call_output","call_id":"b","output":"3"}]}`,
			`{"model":"m","messages":[{"role":"assistant","content":"Checking.","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]},{"role":"tool","tool_call_id":"a","content":[{"type":"text","text":"1"},{"type":"text","text":"2"}]},{"role":"tool","tool_call_id":"b","content":"3"}]}`},
		{"image by URL without detail", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://x/y.png","detail":null}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}`},
		{"json_schema with description", `{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"n","description":"d","schema":{"type":"object"},"strict":false}}}`,
			`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"},"description":"d","strict":false}}}`},
	} {
		chat, _, err := ToChat([]byte(c.body))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !sameJSON(t, chat, []byte(c.want)) {
			t.Errorf("%s: ToChat =\n%s\nwant\n%s", c.name, chat, c.want)
		}
	}
}
