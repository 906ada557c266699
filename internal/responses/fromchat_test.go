package responses

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// The recorded Ollama chat completion (finish_reason "length") becomes an
// incomplete response with every field of Ollama's own /v1/responses
// answer.
func TestFromChatOllamaRecording(t *testing.T) {
	chat := recording(t, "chat_nonstream.json")
	req := `{"model":"tiny","input":[{"role":"user","content":"Once upon a time"}],"max_output_tokens":64,"instructions":"Tell stories.","temperature":0.5,"metadata":{"k":"v"},"store":true}`
	out, err := FromChat([]byte(req), chat, "resp_n1", 1796101578)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(out) {
		t.Fatalf("not JSON: %s", out)
	}
	r := gjson.ParseBytes(out)
	for path, want := range map[string]string{
		"id": "resp_n1", "object": "response", "created_at": "1796101578", "completed_at": "1796101578",
		"status": "incomplete", "incomplete_details.reason": "max_output_tokens", "error": "", "model": "tiny",
		"output.#": "1", "output.0.type": "message", "output.0.id": "msg_n1", "output.0.role": "assistant",
		"output.0.status": "incomplete", "output.0.content.0.type": "output_text", "output.0.content.0.annotations": "[]",
		"usage.input_tokens": "5", "usage.output_tokens": "64", "usage.total_tokens": "69",
		"usage.input_tokens_details.cached_tokens": "0", "usage.output_tokens_details.reasoning_tokens": "0",
		// Echoed from the request.
		"instructions": "Tell stories.", "max_output_tokens": "64", "temperature": "0.5", "metadata": `{"k":"v"}`,
		"top_p": "", "tools": "[]", "tool_choice": "auto", "parallel_tool_calls": "true", "text": `{"format":{"type":"text"}}`,
		// Nothing is stored, whatever the request asked.
		"store": "false", "previous_response_id": "",
	} {
		if got := r.Get(path).String(); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	if got, want := outputText(r), gjson.GetBytes(chat, "choices.0.message.content").Str; got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	hasKeys(t, "response", r, gjson.ParseBytes(recording(t, "responses_nonstream.json")))
}

func TestFromChatToolCalls(t *testing.T) {
	// vLLM's shape: no text, two calls.
	chat := `{"id":"chatcmpl-9","object":"chat.completion","created":1796101580,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[` +
		`{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},` +
		`{"type":"function","function":{"name":"get_time","arguments":"{}"}}]},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null}],` +
		`"usage":{"prompt_tokens":80,"total_tokens":100,"completion_tokens":20,"prompt_tokens_details":null}}`
	req := `{"model":"qwen","input":"Weather and time in Paris?","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"},"strict":true},{"type":"function","name":"get_time"}],"tool_choice":"required","parallel_tool_calls":true}`
	out, err := FromChat([]byte(req), []byte(chat), "resp_n2", 1796101580)
	if err != nil {
		t.Fatal(err)
	}
	r := gjson.ParseBytes(out)
	for path, want := range map[string]string{
		"status": "completed", "incomplete_details": "", "model": "qwen", "output.#": "2",
		"output.0.type": "function_call", "output.0.id": "fc_n2_0", "output.0.call_id": "chatcmpl-tool-1",
		"output.0.name": "get_weather", "output.0.arguments": `{"city": "Paris"}`, "output.0.status": "completed",
		"output.1.call_id": "call_n2_1", "output.1.name": "get_time", "output.1.arguments": "{}",
		"tool_choice": "required", "tools.#": "2", "tools.0.strict": "true",
		"usage.input_tokens": "80", "usage.output_tokens": "20", "usage.total_tokens": "100", "usage.input_tokens_details.cached_tokens": "0",
	} {
		if got := r.Get(path).String(); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}

	// Text and a call: the message first.
	chat = `{"choices":[{"index":0,"message":{"role":"assistant","content":"Checking.","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}}]},"finish_reason":"tool_calls"}]}`
	out, err = FromChat([]byte(`{"model":"m"}`), []byte(chat), "resp_n3", 1)
	if err != nil {
		t.Fatal(err)
	}
	r = gjson.ParseBytes(out)
	if r.Get("output.0.type").Str != "message" || outputText(r) != "Checking." || r.Get("output.1.arguments").Str != `{"a":1}` || r.Get("usage").Type != gjson.Null {
		t.Errorf("response %s", out)
	}
}

func TestFromChatEdges(t *testing.T) {
	for _, c := range []struct{ name, chat, check string }{
		{"empty answer still has a message", `{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"stop"}]}`,
			`{"status":"completed","output.#":"1","output.0.content.0.text":"","model":"m"}`},
		{"null content", `{"choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":"stop"}]}`,
			`{"output.#":"1","output.0.content.#":"1"}`},
		{"refusal", `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I can't."},"finish_reason":"stop"}]}`,
			`{"output.0.content.#":"1","output.0.content.0.type":"refusal","output.0.content.0.refusal":"I can't."}`},
		{"content filter", `{"choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"content_filter"}]}`,
			`{"status":"incomplete","incomplete_details.reason":"content_filter"}`},
		{"escapes kept", `{"choices":[{"index":0,"message":{"role":"assistant","content":"a\"b\n\u00e9"},"finish_reason":"stop"}]}`,
			`{"output.0.content.0.text":"a\"b\n\u00e9"}`},
	} {
		out, err := FromChat([]byte(`{"input":"x"}`), []byte(c.chat), "resp_e", 1)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !json.Valid(out) {
			t.Errorf("%s: not JSON: %s", c.name, out)
			continue
		}
		gjson.Parse(c.check).ForEach(func(k, v gjson.Result) bool {
			if got := gjson.GetBytes(out, k.Str).String(); got != v.Str {
				t.Errorf("%s: %s = %q, want %q\n%s", c.name, k.Str, got, v.Str, out)
			}
			return true
		})
	}
	for _, bad := range []string{
		``, `[]`, `{"choices":[]}`, `{"choices":[{"index":0`,
		`{"error":{"message":"model 'nope' not found","type":"api_error","param":null,"code":null}}`,
		`{"object":"error","message":"boom","type":"BadRequestError","code":400}`,
	} {
		if out, err := FromChat([]byte(`{}`), []byte(bad), "resp_e", 1); err == nil {
			t.Errorf("%s: FromChat = %s, want an error", bad, out)
		} else if strings.Contains(bad, "nope") && !strings.Contains(err.Error(), "model 'nope' not found") {
			t.Errorf("error %v does not carry the engine's message", err)
		}
	}
}
