package responses

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sdkCase is one body served to the official openai SDK by
// testdata/sdk_check.mjs, and what the SDK must make of it.
type sdkCase struct {
	Name   string    `json:"name"`
	File   string    `json:"file"`
	Stream bool      `json:"stream"`
	Text   *string   `json:"text,omitempty"`
	Status string    `json:"status,omitempty"`
	Calls  []sdkCall `json:"calls,omitempty"`
	Error  bool      `json:"error,omitempty"`
	body   []byte    // written to File
}

type sdkCall struct {
	Name      string `json:"name"`
	CallID    string `json:"call_id"`
	Arguments string `json:"arguments"`
}

// TestSDKAcceptsTranslation serves translated streams and responses to the
// official openai npm SDK (the project's node_modules), which reads them
// with responses.stream(...).finalResponse() and responses.create(...):
// both must resolve with the expected text, including for a stream stopped
// with End(Stopped), and must raise for a failed one. Skipped without node.
func TestSDKAcceptsTranslation(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not on PATH")
	}
	if _, err := os.Stat("../../node_modules/openai/package.json"); err != nil {
		t.Skip("the openai npm package is not installed (npm ci in the repository root)")
	}
	dir := t.TempDir()
	var cases []sdkCase
	add := func(c sdkCase, text *string) {
		c.File = filepath.Join(dir, c.Name)
		if err := os.WriteFile(c.File, c.body, 0o600); err != nil {
			t.Fatal(err)
		}
		c.Text = text
		cases = append(cases, c)
	}
	str := func(s string) *string { return &s }
	streamOf := func(req string, frames [][]byte, end string) ([]byte, string) {
		s := NewStream([]byte(req), "resp_sdk", 1796101578)
		var out []byte
		for _, f := range frames {
			out = append(out, s.Frame(f)...)
		}
		if end != "" {
			out = append(out, s.End(end)...)
		}
		return out, s.Text()
	}
	req := `{"model":"tiny","input":"hi","stream":true}`

	frames := chatFrames(recording(t, "chat_stream_stop.sse"))
	body, text := streamOf(req, frames, "")
	add(sdkCase{Name: "stream_completed", Stream: true, Status: "completed", body: body}, str(text))

	// Cut at max_output_tokens: response.incomplete. openai-node's
	// finalResponse() resolves with the snapshot it built from the events.
	frames = chatFrames(recording(t, "chat_stream.sse"))
	body, text = streamOf(req, frames, "")
	add(sdkCase{Name: "stream_length", Stream: true, body: body}, str(text))

	body, text = streamOf(req, frames[:12], Stopped)
	if text == "" {
		t.Fatal("no text before the stop")
	}
	add(sdkCase{Name: "stream_stopped", Stream: true, Status: "completed", body: body}, str(text))

	body, _ = streamOf(req, nil, Stopped)
	add(sdkCase{Name: "stream_stopped_at_once", Stream: true, Status: "completed", body: body}, str(""))

	body, _ = streamOf(req, frames[:5], "the engine closed the connection")
	add(sdkCase{Name: "stream_engine_gone", Stream: true, Error: true, body: body}, nil)

	body, _ = streamOf(req, append(frames[:3:3], []byte(`data: {"error":{"message":"boom","type":"InternalServerError","code":500}}`+"\n\n")), "")
	add(sdkCase{Name: "stream_error_frame", Stream: true, Error: true, body: body}, nil)

	tools := []byte(`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Checking."}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}` + "\n\n" +
		"data: [DONE]\n\n")
	body, _ = streamOf(req, chatFrames(tools), "")
	weather := []sdkCall{{Name: "get_weather", CallID: "call_1", Arguments: `{"city":"Paris"}`}}
	add(sdkCase{Name: "stream_tool_call", Stream: true, Status: "completed", Calls: weather, body: body}, str("Checking."))

	chat := recording(t, "chat_nonstream.json")
	body, err = FromChat([]byte(`{"model":"tiny","input":"hi"}`), chat, "resp_sdk", 1796101578)
	if err != nil {
		t.Fatal(err)
	}
	var content struct {
		Choices []struct {
			Message struct{ Content string }
		}
	}
	if err := json.Unmarshal(chat, &content); err != nil {
		t.Fatal(err)
	}
	add(sdkCase{Name: "create", Status: "incomplete", body: body}, str(content.Choices[0].Message.Content))

	body, err = FromChat([]byte(`{"model":"tiny","input":"hi"}`), []byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}]}`), "resp_sdk", 1)
	if err != nil {
		t.Fatal(err)
	}
	add(sdkCase{Name: "create_tool_call", Status: "completed", Calls: weather, body: body}, str(""))

	spec, _ := json.Marshal(cases)
	specFile := filepath.Join(dir, "cases.json")
	if err := os.WriteFile(specFile, spec, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/sdk_check.mjs", specFile)
	out, err := cmd.CombinedOutput()
	t.Logf("sdk_check.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the openai SDK did not accept the translation: %v", err)
	}
	if got := strings.Count(string(out), `"ok":true`); got != len(cases) {
		t.Fatalf("%d of %d cases passed", got, len(cases))
	}
}
