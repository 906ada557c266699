package responses

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// goSDKServer answers every request with body, and keeps the last request
// body it got.
func goSDKServer(t *testing.T, contentType string, body []byte) (*openai.Client, func() []byte) {
	t.Helper()
	var mu sync.Mutex
	var last []byte
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		last = b
		mu.Unlock()
		w.Header().Set("Content-Type", contentType)
		_, _ = w.Write(body)
	}))
	t.Cleanup(ts.Close)
	c := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	return &c, func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// The official Go SDK (openai-go, already a dependency) reads the
// translation too: a stream event by event, a stopped stream, a failed
// one, and a plain response. And the body it sends translates.
func TestGoSDKReadsTranslation(t *testing.T) {
	params := responses.ResponseNewParams{
		Model:           shared.ResponsesModel("tiny"),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Once upon a time")},
		Instructions:    openai.String("Tell stories."),
		MaxOutputTokens: openai.Int(64),
	}
	frames := chatFrames(recording(t, "chat_stream.sse"))
	for _, c := range []struct {
		name     string
		frames   [][]byte
		end      string
		terminal string
		fails    bool
	}{
		{"whole", frames, "", "response.incomplete", false},
		{"stopped", frames[:8], Stopped, "response.completed", false},
		{"engine gone", frames[:8], "engine gone", "", true},
	} {
		s := NewStream(nil, "resp_go", 1796101578)
		var body []byte
		for _, f := range c.frames {
			body = append(body, s.Frame(f)...)
		}
		body = append(body, s.End(c.end)...)
		client, sent := goSDKServer(t, "text/event-stream", body)
		stream := client.Responses.NewStreaming(t.Context(), params)
		var last responses.ResponseStreamEventUnion
		var deltas string
		n := 0
		for stream.Next() {
			last = stream.Current()
			if last.SequenceNumber != int64(n) {
				t.Errorf("%s: event %d has sequence_number %d", c.name, n, last.SequenceNumber)
			}
			if last.Type == "response.output_text.delta" {
				deltas += last.Delta
			}
			n++
		}
		if c.fails {
			// The Go SDK hands the error event over as an event; the
			// response.failed that follows carries the error.
			if last.Type != "response.failed" || last.Response.Error.Message != "engine gone" {
				t.Errorf("%s: last event %s, error %+v", c.name, last.Type, last.Response.Error)
			}
			continue
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if last.Type != c.terminal || last.Response.OutputText() != deltas || deltas != s.Text() || deltas == "" {
			t.Errorf("%s: last event %s, text %q, deltas %q", c.name, last.Type, last.Response.OutputText(), deltas)
		}
		if _, _, err := ToChat(sent()); err != nil {
			t.Errorf("the Go SDK's request does not translate: %v\n%s", err, sent())
		}
	}

	chat := recording(t, "chat_nonstream.json")
	body, err := FromChat(nil, chat, "resp_go", 1796101578)
	if err != nil {
		t.Fatal(err)
	}
	client, sent := goSDKServer(t, "application/json", body)
	r, err := client.Responses.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != responses.ResponseStatusIncomplete || r.IncompleteDetails.Reason != "max_output_tokens" || r.Usage.OutputTokens != 64 ||
		r.OutputText() == "" || r.OutputText() != r.Output[0].Content[0].Text {
		t.Errorf("response %+v", r)
	}
	chatBody, _, err := ToChat(sent())
	if err != nil {
		t.Fatalf("the Go SDK's request does not translate: %v\n%s", err, sent())
	}
	if want := `{"model":"tiny","messages":[{"role":"system","content":"Tell stories."},{"role":"user","content":"Once upon a time"}],"max_tokens":64}`; !sameJSON(t, chatBody, []byte(want)) {
		t.Errorf("ToChat(%s) = %s, want %s", sent(), chatBody, want)
	}

}
