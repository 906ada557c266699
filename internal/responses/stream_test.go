package responses

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

const fixtures = "../../testdata/ollama-0.17.4/"

// recording reads a recorded engine answer.
func recording(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(fixtures + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// chatFrames splits a chat SSE stream into its frames, as the gateway's
// relay hands them over.
func chatFrames(stream []byte) [][]byte {
	var out [][]byte
	for _, f := range bytes.SplitAfter(stream, []byte("\n\n")) {
		if len(bytes.TrimSpace(f)) > 0 {
			out = append(out, f)
		}
	}
	return out
}

// event is one Responses event.
type event struct {
	typ  string
	data gjson.Result
}

// parseEvents reads Responses SSE output, checking its framing: each frame
// is "event: T\ndata: J\n\n" where J is one JSON object of type T.
func parseEvents(t testing.TB, out []byte) []event {
	t.Helper()
	var evs []event
	rest := out
	for len(rest) > 0 {
		frame, after, ok := bytes.Cut(rest, []byte("\n\n"))
		if !ok {
			t.Fatalf("unterminated frame %q", rest)
		}
		rest = after
		typ, data, ok := bytes.Cut(frame, []byte("\n"))
		name, isEvent := bytes.CutPrefix(typ, []byte("event: "))
		payload, isData := bytes.CutPrefix(data, []byte("data: "))
		if !ok || !isEvent || !isData || bytes.ContainsAny(payload, "\n\r") {
			t.Fatalf("malformed frame %q", frame)
		}
		if !json.Valid(payload) {
			t.Fatalf("not JSON: %s", payload)
		}
		d := gjson.ParseBytes(payload)
		if d.Get("type").Str != string(name) {
			t.Fatalf("event %s carries type %s", name, d.Get("type").Str)
		}
		evs = append(evs, event{string(name), d})
	}
	return evs
}

// translate runs a whole chat stream through a Stream.
func translate(t testing.TB, req string, stream []byte) ([]event, *Stream) {
	t.Helper()
	s := NewStream([]byte(req), "resp_t1", 1796101578)
	var out []byte
	for _, f := range chatFrames(stream) {
		out = append(out, s.Frame(f)...)
	}
	return parseEvents(t, out), s
}

func types(evs []event) []string {
	var ts []string
	for _, e := range evs {
		ts = append(ts, e.typ)
	}
	return ts
}

// checkSequence checks sequence_number counts 0, 1, 2, … over the stream.
func checkSequence(t testing.TB, evs []event) {
	t.Helper()
	for i, e := range evs {
		if n := e.data.Get("sequence_number"); n.Type != gjson.Number || n.Int() != int64(i) {
			t.Fatalf("event %d (%s) has sequence_number %s", i, e.typ, n.Raw)
		}
	}
}

// checkText checks that the text deltas add up to the text of every done
// event and of the closing response, and returns it.
func checkText(t testing.TB, evs []event) string {
	t.Helper()
	var deltas strings.Builder
	var done []string
	for _, e := range evs {
		switch e.typ {
		case "response.output_text.delta":
			deltas.WriteString(e.data.Get("delta").Str)
		case "response.output_text.done":
			done = append(done, e.data.Get("text").Str)
		case "response.content_part.done":
			done = append(done, e.data.Get("part.text").Str)
		case "response.output_item.done":
			if e.data.Get("item.type").Str == "message" {
				done = append(done, e.data.Get("item.content.0.text").Str)
			}
		case "response.completed", "response.incomplete", "response.failed":
			done = append(done, outputText(e.data.Get("response")))
		}
	}
	for _, d := range done {
		if d != deltas.String() {
			t.Fatalf("deltas add up to %q, a done event says %q", deltas.String(), d)
		}
	}
	return deltas.String()
}

// outputText joins a response's output_text parts, as the SDKs'
// output_text does.
func outputText(r gjson.Result) string {
	var b strings.Builder
	r.Get("output").ForEach(func(_, item gjson.Result) bool {
		if item.Get("type").Str == "message" {
			item.Get("content").ForEach(func(_, p gjson.Result) bool {
				if p.Get("type").Str == "output_text" {
					b.WriteString(p.Get("text").Str)
				}
				return true
			})
		}
		return true
	})
	return b.String()
}

// keysOf lists an object's keys.
func keysOf(v gjson.Result) []string {
	var ks []string
	v.ForEach(func(k, _ gjson.Result) bool {
		ks = append(ks, k.Str)
		return true
	})
	slices.Sort(ks)
	return ks
}

// hasKeys fails when got lacks a key of want, recursing into objects.
func hasKeys(t testing.TB, where string, got, want gjson.Result) {
	t.Helper()
	want.ForEach(func(k, w gjson.Result) bool {
		g := got.Get(gjson.Escape(k.Str))
		if !g.Exists() {
			t.Errorf("%s: no %q (the engine's has it; ours has %v)", where, k.Str, keysOf(got))
		} else if w.IsObject() && g.IsObject() {
			hasKeys(t, where+"."+k.Str, g, w)
		}
		return true
	})
}

// The recorded Ollama chat stream (finish_reason "length", then the usage
// chunk, then [DONE]) becomes the event sequence of Ollama's own
// /v1/responses recording, closed by response.incomplete as OpenAI closes
// an answer cut at max_output_tokens.
func TestStreamOllamaRecording(t *testing.T) {
	evs, s := translate(t, `{"model":"tiny","input":"Once upon a time","max_output_tokens":64,"stream":true}`, recording(t, "chat_stream.sse"))
	checkSequence(t, evs)
	text := checkText(t, evs)
	ts := types(evs)
	deltas := 0
	for _, typ := range ts {
		if typ == "response.output_text.delta" {
			deltas++
		}
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	for range deltas {
		want = append(want, "response.output_text.delta")
	}
	want = append(want, "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete")
	if !slices.Equal(ts, want) {
		t.Fatalf("events %v\nwant %v", ts, want)
	}
	if deltas != 64 || !strings.HasPrefix(text, ", there was a kind man.") || text != s.Text() {
		t.Errorf("%d deltas, text %q, Text() %q", deltas, text, s.Text())
	}
	last := evs[len(evs)-1].data.Get("response")
	for path, want := range map[string]string{
		"status": "incomplete", "incomplete_details.reason": "max_output_tokens", "model": "tiny", "id": "resp_t1",
		"usage.input_tokens": "5", "usage.output_tokens": "64", "usage.total_tokens": "69",
		"usage.input_tokens_details.cached_tokens": "0", "usage.output_tokens_details.reasoning_tokens": "0",
		"output.0.status": "incomplete", "output.0.id": "msg_t1", "max_output_tokens": "64", "store": "false",
		"created_at": "1796101578", "object": "response", "error": "",
	} {
		if got := last.Get(path).String(); got != want {
			t.Errorf("response %s = %q, want %q", path, got, want)
		}
	}
	if in, out, ok := s.Usage(); in != 5 || out != 64 || !ok {
		t.Errorf("Usage() = %d, %d, %v", in, out, ok)
	}
	if first := evs[0].data.Get("response"); first.Get("usage").Type != gjson.Null || first.Get("status").Str != "in_progress" || first.Get("output").Raw != "[]" {
		t.Errorf("response.created: %s", first.Raw)
	}
	// Every field of Ollama's /v1/responses events is in ours.
	ollama := parseEvents(t, recording(t, "responses_stream.sse"))
	mine := map[string]gjson.Result{}
	for _, e := range evs {
		mine[e.typ] = e.data
	}
	mine["response.completed"] = mine["response.incomplete"]
	for _, e := range ollama {
		hasKeys(t, e.typ, mine[e.typ], e.data)
	}
	// And after the close nothing more is said.
	if out := s.Frame([]byte("data: [DONE]\n\n")); out != nil {
		t.Errorf("a frame after the close gave %q", out)
	}
	if out := s.End(Stopped); out != nil {
		t.Errorf("End after the close gave %q", out)
	}
}

// finish_reason "stop" closes with response.completed; a stream without a
// usage chunk closes at [DONE], with usage null.
func TestStreamCompletedAndNoUsage(t *testing.T) {
	evs, s := translate(t, `{"model":"tiny-t1","input":"x","stream":true}`, recording(t, "chat_stream_stop.sse"))
	checkSequence(t, evs)
	checkText(t, evs)
	last := evs[len(evs)-1]
	if last.typ != "response.completed" || last.data.Get("response.status").Str != "completed" ||
		last.data.Get("response.output.0.status").Str != "completed" || last.data.Get("response.incomplete_details").Type != gjson.Null ||
		last.data.Get("response.usage.output_tokens").Int() != 10 {
		t.Errorf("closing event %s", last.data.Raw)
	}
	if s.Text() == "" {
		t.Error("no text")
	}

	evs, s = translate(t, `{"model":"tiny","input":"x","stream":true}`, recording(t, "chat_stream_no_usage.sse"))
	checkSequence(t, evs)
	checkText(t, evs)
	last = evs[len(evs)-1]
	if last.typ != "response.incomplete" || last.data.Get("response.usage").Type != gjson.Null {
		t.Errorf("closing event %s", last.data.Raw)
	}
	if _, _, ok := s.Usage(); ok {
		t.Error("Usage() ok without a usage chunk")
	}
}

// vLLM streams a tool call as a first delta with the id and name, then the
// arguments in pieces; Ollama sends each call whole in one delta.
func TestStreamToolCalls(t *testing.T) {
	chunk := func(delta, finish string) string {
		return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796101579,"model":"m","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + "}]}\n\n"
	}
	vllm := chunk(`{"role":"assistant","content":""}`, "null") +
		chunk(`{"content":"Let me check."}`, "null") +
		chunk(`{"tool_calls":[{"id":"chatcmpl-tool-a1","type":"function","index":0,"function":{"name":"get_weather"}}]}`, "null") +
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]}`, "null") +
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}`, "null") +
		chunk(`{"tool_calls":[{"id":"chatcmpl-tool-b2","type":"function","index":1,"function":{"name":"get_time","arguments":""}}]}`, "null") +
		chunk(`{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}`, "null") +
		chunk(`{"content":""}`, `"tool_calls"`) +
		`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796101579,"model":"m","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":30,"total_tokens":70,"prompt_tokens_details":{"cached_tokens":16}}}` + "\n\n" +
		"data: [DONE]\n\n"
	evs, s := translate(t, `{"model":"m","input":"Weather?","stream":true,"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}},{"type":"function","name":"get_time"}]}`, []byte(vllm))
	checkSequence(t, evs)
	if text := checkText(t, evs); text != "Let me check." {
		t.Errorf("text %q", text)
	}
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.completed",
	}
	if ts := types(evs); !slices.Equal(ts, want) {
		t.Fatalf("events %v\nwant %v", ts, want)
	}
	added := evs[5].data
	if added.Get("output_index").Int() != 1 || added.Get("item.type").Str != "function_call" || added.Get("item.call_id").Str != "chatcmpl-tool-a1" ||
		added.Get("item.name").Str != "get_weather" || added.Get("item.arguments").Str != "" || added.Get("item.status").Str != "in_progress" {
		t.Errorf("output_item.added: %s", added.Raw)
	}
	if d := evs[6].data; d.Get("item_id").Str != "fc_t1_0" || d.Get("output_index").Int() != 1 || d.Get("delta").Str != `{"city": ` {
		t.Errorf("arguments delta: %s", d.Raw)
	}
	if d := evs[13].data; d.Get("name").Str != "get_weather" || d.Get("arguments").Str != `{"city": "Paris"}` || d.Get("item_id").Str != "fc_t1_0" {
		t.Errorf("arguments done: %s", d.Raw)
	}
	r := evs[len(evs)-1].data.Get("response")
	if n := r.Get("output.#").Int(); n != 3 {
		t.Fatalf("%d output items: %s", n, r.Raw)
	}
	for i, want := range []string{
		`{"type":"message","text":"Let me check."}`,
		`{"type":"function_call","call_id":"chatcmpl-tool-a1","name":"get_weather","arguments":"{\"city\": \"Paris\"}","status":"completed"}`,
		`{"type":"function_call","call_id":"chatcmpl-tool-b2","name":"get_time","arguments":"{}","status":"completed"}`,
	} {
		item := r.Get("output." + string(rune('0'+i)))
		gjson.Parse(want).ForEach(func(k, v gjson.Result) bool {
			got := item.Get(k.Str)
			if k.Str == "text" {
				got = item.Get("content.0.text")
			}
			if got.String() != v.String() {
				t.Errorf("output[%d].%s = %s, want %s", i, k.Str, got.Raw, v.Raw)
			}
			return true
		})
	}
	if r.Get("usage.input_tokens_details.cached_tokens").Int() != 16 || r.Get("tools.#").Int() != 2 {
		t.Errorf("usage or echoed tools: %s", r.Raw)
	}
	if in, out, _ := s.Usage(); in != 40 || out != 30 {
		t.Errorf("Usage() = %d, %d", in, out)
	}

	// Ollama: the whole call in one delta, no text, no usage requested.
	ollama := chunk(`{"role":"assistant","content":"","tool_calls":[{"id":"call_x9","index":0,"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]}`, "null") +
		chunk(`{"role":"assistant","content":""}`, `"tool_calls"`) + "data: [DONE]\n\n"
	evs, _ = translate(t, `{"model":"m","input":"x","stream":true}`, []byte(ollama))
	checkSequence(t, evs)
	want = []string{"response.created", "response.in_progress", "response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done", "response.completed"}
	if ts := types(evs); !slices.Equal(ts, want) {
		t.Fatalf("events %v\nwant %v", ts, want)
	}
	if item := evs[len(evs)-1].data.Get("response.output.0"); item.Get("arguments").Str != `{"city":"Rome"}` || item.Get("call_id").Str != "call_x9" {
		t.Errorf("output: %s", item.Raw)
	}
}

// An error the engine writes into its stream fails the response: an error
// event, then response.failed with the text so far. Both shapes engines
// use, and a frame that is not JSON.
func TestStreamErrorFrame(t *testing.T) {
	text := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n"
	for _, c := range []struct{ frame, msg string }{
		{`data: {"error":{"message":"CUDA out of memory","type":"InternalServerError","param":null,"code":500}}`, "CUDA out of memory"},
		{`data: {"object":"error","message":"context too long","type":"BadRequestError","param":null,"code":400}`, "context too long"},
		{`data: {"error":"model unloaded"}`, "model unloaded"},
		{`data: {"choices":[{"index":0,"delta":{"content":"lo`, "the engine sent a stream frame that is not valid JSON"},
	} {
		evs, s := translate(t, `{"model":"m","input":"x","stream":true}`, []byte(text+c.frame+"\n\ndata: [DONE]\n\n"))
		checkSequence(t, evs)
		checkText(t, evs)
		want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
			"response.output_text.delta", "error", "response.failed"}
		if ts := types(evs); !slices.Equal(ts, want) {
			t.Fatalf("%s: events %v\nwant %v", c.frame, ts, want)
		}
		e, f := evs[5].data, evs[6].data.Get("response")
		if e.Get("message").Str != c.msg || e.Get("code").Str != "server_error" || !e.Get("param").Exists() {
			t.Errorf("error event: %s", e.Raw)
		}
		if f.Get("status").Str != "failed" || f.Get("error.message").Str != c.msg || f.Get("error.code").Str != "server_error" ||
			outputText(f) != "Hel" || f.Get("output.0.status").Str != "incomplete" {
			t.Errorf("response.failed: %s", f.Raw)
		}
		if s.End("gone") != nil {
			t.Error("End after a failure said more")
		}
	}
}

// A stop mid-stream closes like a finished answer: response.completed with
// the text so far, the usage the gateway estimated. The engine gone is a
// failure.
func TestStreamEnd(t *testing.T) {
	frames := chatFrames(recording(t, "chat_stream.sse"))
	s := NewStream([]byte(`{"model":"tiny","input":"x","stream":true}`), "resp_t1", 1796101578)
	var out []byte
	for _, f := range frames[:10] {
		out = append(out, s.Frame(f)...)
	}
	s.SetUsage(5, 10)
	closing := s.End(Stopped)
	evs := parseEvents(t, append(out, closing...))
	checkSequence(t, evs)
	text := checkText(t, evs)
	if text != ", there was a kind man." || s.Text() != text {
		t.Errorf("text %q, Text() %q", text, s.Text())
	}
	tail := types(evs)[len(evs)-4:]
	if want := []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}; !slices.Equal(tail, want) {
		t.Errorf("closing events %v, want %v", tail, want)
	}
	r := evs[len(evs)-1].data.Get("response")
	if r.Get("status").Str != "completed" || r.Get("usage.output_tokens").Int() != 10 || r.Get("output.0.status").Str != "completed" {
		t.Errorf("closing response %s", r.Raw)
	}
	if s.End(Stopped) != nil || s.Frame(frames[10]) != nil {
		t.Error("the stream went on after End")
	}

	// Stopped before the engine said anything: a well-formed empty answer.
	s = NewStream([]byte(`{"model":"tiny","input":"x"}`), "resp_t2", 1796101578)
	evs = parseEvents(t, s.End(Stopped))
	checkSequence(t, evs)
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if ts := types(evs); !slices.Equal(ts, want) {
		t.Errorf("events %v\nwant %v", ts, want)
	}

	// The engine gone mid-answer.
	s = NewStream([]byte(`{"model":"tiny","input":"x"}`), "resp_t3", 1796101578)
	out = nil
	for _, f := range frames[:3] {
		out = append(out, s.Frame(f)...)
	}
	evs = parseEvents(t, append(out, s.End("the engine closed the connection")...))
	checkSequence(t, evs)
	checkText(t, evs)
	if ts := types(evs); !slices.Equal(ts[len(ts)-2:], []string{"error", "response.failed"}) {
		t.Errorf("events %v", ts)
	}
	if m := evs[len(evs)-1].data.Get("response.error.message").Str; m != "the engine closed the connection" {
		t.Errorf("error message %q", m)
	}

	// Cut after the finish_reason but before the usage: the answer was
	// whole, so it completes, whatever the reason.
	s = NewStream([]byte(`{"model":"tiny","input":"x"}`), "resp_t4", 1796101578)
	out = nil
	for _, f := range frames[:len(frames)-2] {
		out = append(out, s.Frame(f)...)
	}
	evs = parseEvents(t, append(out, s.End("")...))
	if last := evs[len(evs)-1]; last.typ != "response.incomplete" || last.data.Get("response.usage").Type != gjson.Null {
		t.Errorf("closing event %s %s", last.typ, last.data.Raw)
	}
}

// Escapes pass through as the engine wrote them. A surrogate pair split
// across two deltas (an engine's mistake) becomes two U+FFFD in the deltas
// and in the done text alike, so that every client reads the same text
// from both.
func TestStreamEscapes(t *testing.T) {
	var stream string
	for _, d := range []string{`"a\"b"`, `"\n"`, `"é"`, `"\u00e9"`, `"\ud83d"`, `"\ude00"`, `"\\"`, `"</script>"`, `"\ud83d\ude00"`, `"\\ud83d"`} {
		stream += `data: {"choices":[{"index":0,"delta":{"content":` + d + "}}]}\n\n"
	}
	stream += "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	evs, s := translate(t, `{"model":"m","input":"x"}`, []byte(stream))
	checkSequence(t, evs)
	checkText(t, evs)
	want := "a\"b\néé\ufffd\ufffd\\</script>😀\\ud83d"
	if got := outputText(evs[len(evs)-1].data.Get("response")); got != want || s.Text() != want {
		t.Errorf("text %q, Text() %q, want %q", got, s.Text(), want)
	}
}

// Frames that say nothing (a comment, a role-only delta, another choice)
// add nothing but the opening events.
func TestStreamQuietFrames(t *testing.T) {
	s := NewStream(nil, "resp_q", 1)
	evs := parseEvents(t, s.Frame([]byte(": keep-alive\n\n")))
	if ts := types(evs); !slices.Equal(ts, []string{"response.created", "response.in_progress"}) {
		t.Errorf("first frame: %v", ts)
	}
	for _, f := range []string{
		": keep-alive\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
		"data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other\"}}]}\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n",
		"data: 42\n\n",
	} {
		if out := s.Frame([]byte(f)); len(out) != 0 {
			t.Errorf("%q gave %q", f, out)
		}
	}
	// CRLF line ends and no space after "data:".
	out := s.Frame([]byte("data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\r\n\r\n"))
	if !bytes.Contains(out, []byte(`"delta":"x"`)) {
		t.Errorf("CRLF frame gave %q", out)
	}
}

func TestLoneSurrogates(t *testing.T) {
	for in, want := range map[string]string{
		``: ``, `abc`: `abc`, `\u00e9`: `\u00e9`, `\ud83d\ude00`: `\ud83d\ude00`, `\ud83d`: `\ufffd`, `\ude00x`: `\ufffdx`,
		`a\ud83db`: `a\ufffdb`, `\ud83d\u0041`: `\ufffd\u0041`, `\\ud83d`: `\\ud83d`, `\\\ud83d`: `\\\ufffd`,
		`\ud83d\ud83d\ude00`: `\ufffd\ud83d\ude00`, `\n\ud83d\n`: `\n\ufffd\n`,
	} {
		if got := loneSurrogates(in); got != want {
			t.Errorf("loneSurrogates(%s) = %s, want %s", in, got, want)
		}
	}
}
