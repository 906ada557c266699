package mockllm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// respObject is the part of a response object the tests read.
type respObject struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Instructions    *string `json:"instructions"`
	MaxOutputTokens *int    `json:"max_output_tokens"`
	Output          []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Status  string `json:"status"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Usage *respUsage `json:"usage"`
}

type respUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// text is the response's output text, as SDKs' output_text joins it.
func (r respObject) text() string {
	var b strings.Builder
	for _, o := range r.Output {
		for _, c := range o.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// respEvent is the part of a Responses stream event the tests read.
type respEvent struct {
	Type           string     `json:"type"`
	SequenceNumber *int       `json:"sequence_number"`
	Response       respObject `json:"response"`
	Delta          string     `json:"delta"`
	Text           string     `json:"text"`
	ItemID         string     `json:"item_id"`
	Part           struct {
		Text string `json:"text"`
	} `json:"part"`
	Item struct {
		ID      string `json:"id"`
		Status  string `json:"status"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"item"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// respEvents parses a Responses stream; each event's "event:" line must
// name its type.
func respEvents(t *testing.T, body string) ([]sseEvent, []respEvent) {
	t.Helper()
	raw := parseSSE(t, body)
	events := make([]respEvent, len(raw))
	for i, e := range raw {
		if err := json.Unmarshal([]byte(e.data), &events[i]); err != nil {
			t.Fatalf("event %d: %v: %s", i, err, e.data)
		}
		if e.event == "" || e.event != events[i].Type {
			t.Errorf("event %d: \"event: %s\" line for type %q", i, e.event, events[i].Type)
		}
	}
	return raw, events
}

// eventTypes lists the types, a run of deltas counted as one.
func eventTypes(events []sseEvent) []string {
	var types []string
	for _, e := range events {
		if len(types) > 0 && e.event == "response.output_text.delta" && types[len(types)-1] == e.event {
			continue
		}
		types = append(types, e.event)
	}
	return types
}

func TestResponsesNonStreamShapeMatchesOllama(t *testing.T) {
	s, ts := start(t, Options{})
	n := SentenceLength("hi", 5) // A whole sentence: "completed".
	status, ctype, got := doAt(t, ts.URL, "/v1/responses", fmt.Sprintf(`{"model":"mock","input":[{"role":"user","content":"hi"}],"mock":{"tag":"r","tokens":%d}}`, n))
	if status != http.StatusOK || ctype != "application/json" {
		t.Fatalf("status %d Content-Type %q: %s", status, ctype, got)
	}
	sameShape(t, "response", got, recording(t, "responses_nonstream.json"))
	var r respObject
	if err := json.Unmarshal([]byte(got), &r); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Status != "completed" || r.IncompleteDetails != nil ||
		len(r.Output) != 1 || !strings.HasPrefix(r.Output[0].ID, "msg_") || r.Output[0].Role != "assistant" || r.Output[0].Status != "completed" {
		t.Errorf("response %s", got)
	}
	if r.text() != CompletionText("hi", n) || r.Usage == nil || *r.Usage != (respUsage{2, n, 2 + n}) {
		t.Errorf("text %q usage %+v", r.text(), r.Usage)
	}
	rec, err := s.WaitFor(waitCtx(t), "r", func(r Record) bool { return r.Completed })
	if err != nil || rec.Endpoint != APIResponses || rec.ChunksSent != n || rec.Status != 200 || rec.Stream {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

// max_output_tokens cuts the text and makes the response "incomplete", as
// vLLM and OpenAI say, and so does the mock's own length when it stops
// mid-sentence; instructions count in the input and come back; input_text
// parts pick the story as plain content does.
func TestResponsesInputAndLimits(t *testing.T) {
	n := SentenceLength("Tell me a story", 9) // A whole sentence: "completed".
	_, ts := start(t, Options{Tokens: n})
	cases := []struct {
		name, body, text, status string
		input, output            int
	}{
		{"string input", `"input":"Tell me a story"`, CompletionText("Tell me a story", n), "completed", 5, n},
		{"input_text parts and instructions", `"instructions":"Be brief.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Tell me a story"}]}]`,
			CompletionText("Tell me a story", n), "completed", 8, n},
		{"last user message picks", `"input":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"output_text","text":"b c"}]},{"role":"user","content":"Tell me a story"}]`,
			CompletionText("Tell me a story", n), "completed", 2 + 3 + 5, n},
		{"cut by max_output_tokens", `"input":"Tell me a story","max_output_tokens":3`, CompletionText("Tell me a story", 3), "incomplete", 5, 3},
		{"cut mid-sentence by the mock's length", `"input":"Tell me a story","mock":{"tokens":3}`, CompletionText("Tell me a story", 3), "incomplete", 5, 3},
		{"echo shorter than the limit", `"input":"/echo Hi","max_output_tokens":50`, "Hi", "completed", 3, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, _, got := doAt(t, ts.URL, "/v1/responses", `{"model":"mock",`+c.body+`}`)
			var r respObject
			if status != http.StatusOK || json.Unmarshal([]byte(got), &r) != nil {
				t.Fatalf("status %d: %s", status, got)
			}
			if r.text() != c.text || r.Status != c.status || *r.Usage != (respUsage{c.input, c.output, c.input + c.output}) {
				t.Errorf("text %q status %q usage %+v", r.text(), r.Status, r.Usage)
			}
			if (r.Status == "incomplete") != (r.IncompleteDetails != nil && r.IncompleteDetails.Reason == "max_output_tokens") {
				t.Errorf("status %q with incomplete_details %+v", r.Status, r.IncompleteDetails)
			}
			if strings.Contains(c.body, "instructions") && (r.Instructions == nil || *r.Instructions != "Be brief.") {
				t.Errorf("instructions not echoed: %s", got)
			}
			if strings.Contains(c.body, "max_output_tokens") != (r.MaxOutputTokens != nil) {
				t.Errorf("max_output_tokens echo: %s", got)
			}
		})
	}
}

func TestResponsesStreamMatchesOllama(t *testing.T) {
	s, ts := start(t, Options{})
	recRaw, _ := respEvents(t, recording(t, "responses_stream.sse"))
	status, ctype, got := doAt(t, ts.URL, "/v1/responses", `{"model":"mock","input":"Tell me a story","max_output_tokens":24,"stream":true,"mock":{"tag":"rs"}}`)
	if status != http.StatusOK || ctype != "text/event-stream; charset=utf-8" {
		t.Fatalf("status %d Content-Type %q: %s", status, ctype, got)
	}
	raw, events := respEvents(t, got)

	// The same events in the same order, and each with the recording's keys.
	if got, want := eventTypes(raw), eventTypes(recRaw); !slices.Equal(got, want) {
		t.Errorf("event types\n got %q\nwant %q", got, want)
	}
	first := map[string]string{}
	for _, e := range recRaw {
		if _, ok := first[e.event]; !ok {
			first[e.event] = e.data
		}
	}
	for i, e := range raw {
		sameShape(t, e.event, e.data, first[e.event])
		if i > 0 && raw[i-1].event == e.event && e.event != "response.output_text.delta" {
			t.Errorf("event %d: %s repeated", i, e.event)
		}
	}
	if strings.Contains(got, "[DONE]") {
		t.Error("a Responses stream has no [DONE]")
	}

	// sequence_number counts from 0; the deltas make the text that every
	// .done event and the final response carry.
	var deltas strings.Builder
	nDeltas := 0
	for i, e := range events {
		if e.SequenceNumber == nil || *e.SequenceNumber != i {
			t.Errorf("event %d (%s): sequence_number %v", i, e.Type, e.SequenceNumber)
		}
		if e.Type == "response.output_text.delta" {
			deltas.WriteString(e.Delta)
			nDeltas++
		}
	}
	want := CompletionText("Tell me a story", 24)
	done := func(typ string) respEvent {
		i := slices.IndexFunc(events, func(e respEvent) bool { return e.Type == typ })
		if i < 0 {
			t.Fatalf("no %s event", typ)
		}
		return events[i]
	}
	completed := done("response.completed").Response
	if deltas.String() != want || nDeltas != 24 || done("response.output_text.done").Text != want ||
		done("response.content_part.done").Part.Text != want || done("response.output_item.done").Item.Content[0].Text != want ||
		completed.text() != want {
		t.Errorf("deltas %q (%d) do not make the text everywhere:\n%s", deltas.String(), nDeltas, got)
	}
	if completed.Usage == nil || completed.Usage.OutputTokens != 24 || completed.Usage.InputTokens != 5 || completed.Usage.TotalTokens != 29 {
		t.Errorf("usage in response.completed: %+v", completed.Usage)
	}
	created := done("response.created").Response
	if created.Status != "in_progress" || created.Usage != nil || len(created.Output) != 0 || created.ID != completed.ID ||
		completed.Output[0].ID != done("response.output_item.added").Item.ID || done("response.output_text.delta").ItemID != completed.Output[0].ID {
		t.Errorf("ids or states do not line up:\n%s", got)
	}
	if completed.Status != "incomplete" || completed.IncompleteDetails == nil {
		t.Errorf("24 tokens cut by max_output_tokens 24: status %q", completed.Status)
	}
	rec, err := s.WaitFor(waitCtx(t), "rs", func(r Record) bool { return r.Completed })
	if err != nil || rec.ChunksSent != 24 || !rec.Stream || rec.Endpoint != APIResponses {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

func TestResponsesStreamError(t *testing.T) {
	s, ts := start(t, Options{})
	_, _, got := doAt(t, ts.URL, "/v1/responses", `{"model":"mock","input":"x","stream":true,"mock":{"tag":"re","stream_error_after":2}}`)
	raw, events := respEvents(t, got)
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "error", "response.failed"}
	if types := eventTypes(raw); !slices.Equal(types, want) {
		t.Fatalf("events %q, want %q", types, want)
	}
	errEv, failed := events[len(events)-2], events[len(events)-1]
	if errEv.Code != "server_error" || errEv.Message == "" || *errEv.SequenceNumber != len(events)-2 {
		t.Errorf("error event %+v", errEv)
	}
	f := failed.Response
	if f.Status != "failed" || f.Error == nil || f.Error.Code != "server_error" || f.text() != CompletionText("x", 2) || f.Output[0].Status != "incomplete" {
		t.Errorf("response.failed %s", raw[len(raw)-1].data)
	}
	rec, err := s.WaitFor(waitCtx(t), "re", func(r Record) bool { return r.Completed })
	if err != nil || rec.ChunksSent != 2 {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

func TestResponsesDisconnectAfter(t *testing.T) {
	s, ts := start(t, Options{})
	resp, err := postTo(t, t.Context(), ts.URL, "/v1/responses", `{"model":"mock","stream":true,"input":"x","max_output_tokens":10,"mock":{"tag":"rd","disconnect_after":3}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("reading torn stream: err = %v, want unexpected EOF", err)
	}
	if n := strings.Count(string(body), "event: response.output_text.delta\n"); n != 3 || strings.Contains(string(body), "response.completed") {
		t.Errorf("client saw %d deltas:\n%s", n, body)
	}
	rec, err := s.WaitFor(waitCtx(t), "rd", func(r Record) bool { return r.Aborted })
	if err != nil || rec.ChunksSent != 3 || rec.Completed {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

func TestResponsesCancel(t *testing.T) {
	s, ts := start(t, Options{})
	t.Run("mid-stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		resp, err := postTo(t, ctx, ts.URL, "/v1/responses", `{"model":"mock","stream":true,"input":"x","mock":{"tag":"rmid","tps":20,"tokens":200}}`)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		seen := 0
		for seen < 3 && sc.Scan() {
			if sc.Text() == "event: response.output_text.delta" {
				seen++
			}
		}
		if seen != 3 {
			t.Fatalf("read %d deltas: %v", seen, sc.Err())
		}
		cancel()
		generationStopped(t, s, cancelCheck(t, s, "rmid", time.Now()), 3)
	})
	t.Run("during ttft", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		resp, err := postTo(t, ctx, ts.URL, "/v1/responses", `{"model":"mock","stream":true,"input":"x","mock":{"tag":"rttft","ttft_ms":60000}}`)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		// response.created and response.in_progress arrive before the
		// first token, as from a real engine.
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && sc.Text() != "event: response.in_progress" {
		}
		cancel()
		if rec := cancelCheck(t, s, "rttft", time.Now()); rec.ChunksSent != 0 {
			t.Errorf("record %+v", rec)
		}
	})
	t.Run("non-stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			if resp, err := postTo(t, ctx, ts.URL, "/v1/responses", `{"model":"mock","input":"x","mock":{"tag":"rns","tps":20,"tokens":200}}`); err == nil {
				resp.Body.Close()
			}
		}()
		if _, err := s.WaitFor(waitCtx(t), "rns", func(r Record) bool { return r.ChunksSent >= 2 }); err != nil {
			t.Fatal(err)
		}
		cancel()
		cancelCheck(t, s, "rns", time.Now())
	})
}

func TestResponsesKnobsAndErrors(t *testing.T) {
	s, ts := start(t, Options{})
	cases := []struct {
		body   string
		status int
		want   string
	}{
		{`{"model":"mock","input":"x","stream":true,"mock":{"fail_status":503,"fail_message":"busy"}}`, 503, `{"error":{"message":"busy","type":"server_error","param":null,"code":503}}`},
		{`{"model":"mock"}`, 400, `{"error":{"message":"'input' must be a string or a non-empty array of input items","type":"invalid_request_error","param":null,"code":400}}`},
		{`{"model":"mock","input":[]}`, 400, `{"error":{"message":"'input' must be a string or a non-empty array of input items","type":"invalid_request_error","param":null,"code":400}}`},
		{`{"model":"mock","input":"x","max_output_tokens":0}`, 400, `{"error":{"message":"max_output_tokens must be at least 1, got 0","type":"invalid_request_error","param":null,"code":400}}`},
		{`{"model":"nope","input":"x","stream":true}`, 404, `{"error":{"message":"The model ` + "`nope`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}`},
		{`{"model":"mock","input":"x","previous_response_id":"resp_1"}`, 404, `{"error":{"message":"Response with id 'resp_1' not found.","type":"invalid_request_error","param":null,"code":404}}`},
		{`{"model":"mock","input":"x",`, 400, `{"error":{"message":"invalid JSON body: unexpected end of JSON input","type":"invalid_request_error","param":null,"code":400}}`},
	}
	for _, c := range cases {
		if status, _, got := doAt(t, ts.URL, "/v1/responses", c.body); status != c.status || got != c.want {
			t.Errorf("%s: %d %s\nwant %d %s", c.body, status, got, c.status, c.want)
		}
	}

	// hang holds the request until the client goes away.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		if resp, err := postTo(t, ctx, ts.URL, "/v1/responses", `{"input":"x","stream":true,"mock":{"tag":"rh","hang":true}}`); err == nil {
			resp.Body.Close()
		}
	}()
	if _, err := s.WaitFor(waitCtx(t), "rh", nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	if rec := cancelCheck(t, s, "rh", time.Now()); rec.Status != 0 {
		t.Errorf("record %+v", rec)
	}
}

func TestResponsesPacing(t *testing.T) {
	_, ts := start(t, Options{})
	begin := time.Now()
	status, _, _ := doAt(t, ts.URL, "/v1/responses", `{"model":"mock","stream":true,"input":"x","max_output_tokens":20,"mock":{"tps":100,"ttft_ms":50}}`)
	if el := time.Since(begin); status != 200 || el < 200*time.Millisecond {
		t.Errorf("status %d: TTFT 50ms + 20 tokens at 100/s took %v", status, el)
	}
}

func TestResponsesOpenAISDK(t *testing.T) {
	_, ts := start(t, Options{})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	want := CompletionText("Tell me a story", 12)

	r, err := client.Responses.New(t.Context(), responses.ResponseNewParams{
		Model:           "mock",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Tell me a story")},
		Instructions:    openai.String("Be brief."),
		MaxOutputTokens: openai.Int(12),
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.OutputText() != want || r.Status != responses.ResponseStatusIncomplete || r.IncompleteDetails.Reason != "max_output_tokens" ||
		r.Usage.InputTokens != 8 || r.Usage.OutputTokens != 12 || r.Instructions.OfString != "Be brief." {
		t.Errorf("response %s", r.RawJSON())
	}

	stream := client.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{
		Model: "mock",
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("Tell me a story", responses.EasyInputMessageRoleUser),
		}},
		MaxOutputTokens: openai.Int(12),
	})
	defer stream.Close()
	var deltas strings.Builder
	var final responses.Response
	for stream.Next() {
		switch e := stream.Current(); e.Type {
		case "response.output_text.delta":
			deltas.WriteString(e.Delta)
		case "response.completed":
			final = e.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if deltas.String() != want || final.OutputText() != want || final.Usage.OutputTokens != 12 {
		t.Errorf("deltas %q, final %s", deltas.String(), final.RawJSON())
	}
}
