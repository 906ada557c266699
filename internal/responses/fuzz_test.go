package responses

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
	"moonji/internal/proxy"
)

// FuzzToChat: ToChat never panics; it refuses with a *Refusal that says
// why, or writes a chat body that the gateway's own chat parser accepts
// (valid JSON, no repeated keys, a model, the stream settings ToChat
// reported), with a message, and without the sampling parameters the
// request set to null.
//
//	go test ./internal/responses -run '^$' -fuzz FuzzToChat -fuzztime 2m
func FuzzToChat(f *testing.F) {
	files, _ := filepath.Glob("testdata/tochat/*.json")
	for _, file := range files {
		doc, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(gjson.GetBytes(doc, "request").Raw))
	}
	for _, b := range []string{
		`{"model":"m","input":"x","temperature":null,"top_p":null,"max_output_tokens":null}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"a","name":"f","arguments":"{}"},{"role":"assistant","content":[]}]}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"\ud83d"}]}],"stream":true}`,
		`{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":{"a":` + strings.Repeat("[", 120) + strings.Repeat("]", 120) + `}}]}`,
		`{"model":"m","input":"x","model":"n"}`,
	} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		chat, stream, err := ToChat(body)
		if err != nil {
			var r *Refusal
			if !errors.As(err, &r) || r.Message == "" || r.Error() == "" {
				t.Fatalf("ToChat = %#v, want a *Refusal", err)
			}
			return
		}
		if err := jsonguard.Validate(chat, nil); err != nil || !json.Valid(chat) {
			t.Fatalf("ToChat wrote invalid JSON (%v):\n%s\nfrom %q", err, chat, body)
		}
		r, err := proxy.ParseRequest(chat)
		if err != nil {
			t.Fatalf("the gateway refuses ToChat's body: %v\n%s\nfrom %q", err, chat, body)
		}
		if r.Model != gjson.GetBytes(body, "model").Str || r.Stream != stream || r.ClientWantsUsage != stream {
			t.Fatalf("the gateway reads %+v, ToChat said stream %v\n%s", r, stream, chat)
		}
		if gjson.GetBytes(chat, "messages.#").Int() == 0 {
			t.Fatalf("no messages: %s", chat)
		}
		for in, out := range map[string]string{"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"} {
			if v := gjson.GetBytes(body, in); v.Type == gjson.Null && gjson.GetBytes(chat, out).Exists() {
				t.Fatalf("%s was not set, yet the chat body has %s: %s", in, out, chat)
			}
		}
	})
}

// FuzzStreamFrame feeds arbitrary frames (the input split at blank lines)
// through a Stream, then ends it: it never panics, and what it writes is
// a well-formed Responses event stream whatever the engine sent. Every
// frame is "event: T\ndata: {…}\n\n" with a JSON object of type T; the
// sequence numbers count from 0; response.created and response.in_progress
// open it; exactly one closing event (response.completed, .incomplete or
// .failed) ends it; and the text deltas add up to the text of every done
// event and of the closing response.
//
//	go test ./internal/responses -run '^$' -fuzz FuzzStreamFrame -fuzztime 2m
func FuzzStreamFrame(f *testing.F) {
	for _, name := range []string{"chat_stream.sse", "chat_stream_stop.sse", "chat_stream_no_usage.sse"} {
		b := recording(f, name)
		f.Add(b, false)
		f.Add(b[:len(b)/2], true)
	}
	for _, s := range []string{
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\\ud83d\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\ude00\"}}]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\ndata: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n",
		"data: {\"error\":{\"message\":\"boom\"}}\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"late\"}}]}\n\n",
		"data: " + strings.Repeat("[", 200) + "\n\n",
		": ping\n\nevent: x\ndata: 1\n\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, stream []byte, stop bool) {
		s := NewStream([]byte(`{"model":"m","input":"x","stream":true}`), "resp_f", 1)
		var out []byte
		for _, frame := range bytes.SplitAfter(stream, []byte("\n\n")) {
			out = append(out, s.Frame(frame)...)
		}
		reason := "the engine closed the connection"
		if stop {
			reason = Stopped
		}
		out = append(out, s.End(reason)...)
		if s.End(reason) != nil || s.Frame([]byte("data: [DONE]\n\n")) != nil {
			t.Fatal("the stream went on after its end")
		}
		evs := parseEvents(t, out)
		checkSequence(t, evs)
		text := checkText(t, evs)
		if len(evs) < 3 || evs[0].typ != "response.created" || evs[1].typ != "response.in_progress" {
			t.Fatalf("events %v", types(evs))
		}
		closing := 0
		for i, e := range evs {
			switch e.typ {
			case "response.completed", "response.incomplete", "response.failed":
				closing++
				if i != len(evs)-1 {
					t.Fatalf("%s is not last: %v", e.typ, types(evs))
				}
				if id := e.data.Get("response.id").Str; id != "resp_f" {
					t.Fatalf("closing response id %q", id)
				}
			}
		}
		if closing != 1 {
			t.Fatalf("%d closing events: %v", closing, types(evs))
		}
		if text != s.Text() {
			t.Fatalf("Text() = %q, the events say %q", s.Text(), text)
		}
	})
}
