package mockllm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// A completions chunk carries choices; the usage chunk has none.
type completionChunk struct {
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

// completionFrames sorts a completions stream's frames into token frames,
// finish frames and usage frames, and checks that [DONE] comes last and
// alone.
func completionFrames(t *testing.T, events []sseEvent) (tokens, finishes, usages []string) {
	t.Helper()
	if len(events) == 0 || events[len(events)-1].data != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %+v", events)
	}
	for _, e := range events[:len(events)-1] {
		var ch completionChunk
		if err := json.Unmarshal([]byte(e.data), &ch); err != nil || e.event != "" {
			t.Fatalf("frame %q (event %q): %v", e.data, e.event, err)
		}
		switch {
		case len(ch.Choices) == 0:
			usages = append(usages, e.data)
		case ch.Choices[0].FinishReason != nil:
			finishes = append(finishes, e.data)
		default:
			if len(finishes)+len(usages) > 0 {
				t.Errorf("token frame after the finish: %s", e.data)
			}
			tokens = append(tokens, e.data)
		}
	}
	return tokens, finishes, usages
}

func TestCompletionsStreamExactFrames(t *testing.T) {
	_, ts := start(t, Options{})
	for _, usage := range []bool{true, false} {
		t.Run(fmt.Sprintf("include_usage=%t", usage), func(t *testing.T) {
			body := `{"model":"mock","prompt":"hi","stream":true,"max_tokens":3`
			if usage {
				body += `,"stream_options":{"include_usage":true}}`
			} else {
				body += `}`
			}
			status, ctype, got := doAt(t, ts.URL, "/v1/completions", body)
			if status != http.StatusOK || ctype != "text/event-stream; charset=utf-8" {
				t.Fatalf("status %d, Content-Type %q: %s", status, ctype, got)
			}
			m := regexp.MustCompile(`^data: \{"id":"(cmpl-[0-9a-f]{32})","object":"text_completion","created":(\d+),`).FindStringSubmatch(got)
			if m == nil {
				t.Fatalf("first frame does not look like a vLLM completion chunk:\n%s", got)
			}
			head := `data: {"id":"` + m[1] + `","object":"text_completion","created":` + m[2] + `,"model":"mock","choices":[`
			want := head + `{"index":0,"text":"Once","logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n" +
				head + `{"index":0,"text":" upon","logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n" +
				head + `{"index":0,"text":" a","logprobs":null,"finish_reason":null,"stop_reason":null}]}` + "\n\n" +
				head + `{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}` + "\n\n"
			if usage {
				want += head + `],"usage":{"prompt_tokens":1,"total_tokens":4,"completion_tokens":3}}` + "\n\n"
			}
			want += "data: [DONE]\n\n"
			if got != want {
				t.Errorf("stream mismatch\n got: %q\nwant: %q", got, want)
			}
		})
	}
}

// The mock's chunks have the recording's keys, less Ollama's per-chunk
// system_fingerprint and zero usage, plus vLLM's logprobs and stop_reason;
// the frames come in the recording's order: tokens, finish, usage, [DONE].
func TestCompletionsShapeMatchesOllama(t *testing.T) {
	_, ts := start(t, Options{})
	rt, rf, ru := completionFrames(t, parseSSE(t, recording(t, "completions_stream.sse")))
	if len(rt) == 0 || len(rf) != 1 || len(ru) != 1 {
		t.Fatalf("recording has %d token, %d finish, %d usage frames", len(rt), len(rf), len(ru))
	}
	status, _, got := doAt(t, ts.URL, "/v1/completions", `{"model":"mock","prompt":"Once upon a time","stream":true,"max_tokens":16,"stream_options":{"include_usage":true}}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, got)
	}
	mt, mf, mu := completionFrames(t, parseSSE(t, got))
	if len(mt) != 16 || len(mf) != 1 || len(mu) != 1 {
		t.Fatalf("mock sent %d token, %d finish, %d usage frames", len(mt), len(mf), len(mu))
	}
	ollamaOnly := []string{"$.system_fingerprint", "$.usage", "$.choices[].logprobs", "$.choices[].stop_reason"}
	for i, f := range mt {
		sameShape(t, fmt.Sprintf("token frame %d", i), f, rt[0], ollamaOnly...)
	}
	sameShape(t, "finish frame", mf[0], rf[0], ollamaOnly...)
	sameShape(t, "usage frame", mu[0], ru[0], "$.system_fingerprint")

	status, _, got = doAt(t, ts.URL, "/v1/completions", `{"model":"mock","prompt":"Once upon a time","max_tokens":16}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, got)
	}
	sameShape(t, "non-streaming", got, recording(t, "completions_nonstream.json"),
		"$.choices[].logprobs", "$.choices[].stop_reason", "$.choices[].prompt_logprobs")
}

func TestCompletionsNonStream(t *testing.T) {
	n := SentenceLength("Tell me", 7) // A whole sentence: finish "stop".
	s, ts := start(t, Options{Tokens: n})
	status, ctype, got := doAt(t, ts.URL, "/v1/completions", `{"model":"mock","prompt":"Tell me","mock":{"tag":"c"}}`)
	if status != http.StatusOK || ctype != "application/json" {
		t.Fatalf("status %d Content-Type %q: %s", status, ctype, got)
	}
	m := regexp.MustCompile(`^\{"id":"(cmpl-[0-9a-f]{32})","object":"text_completion","created":(\d+),`).FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("unexpected body %s", got)
	}
	want := `{"id":"` + m[1] + `","object":"text_completion","created":` + m[2] + `,"model":"mock","choices":[{"index":0,"text":` +
		jstr(CompletionText("Tell me", n)) + `,"logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null}],` +
		fmt.Sprintf(`"system_fingerprint":null,"usage":{"prompt_tokens":2,"total_tokens":%d,"completion_tokens":%d}}`, 2+n, n)
	if got != want {
		t.Errorf("body mismatch\n got: %s\nwant: %s", got, want)
	}
	rec, err := s.WaitFor(waitCtx(t), "c", func(r Record) bool { return r.Completed })
	if err != nil || rec.Endpoint != APICompletions || rec.ChunksSent != n || rec.Stream || rec.Status != 200 {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

// Several prompts give several answers, n each, numbered as vLLM does,
// each with its own finish reason (the echo fits in max_tokens: "stop");
// token id prompts count their ids.
func TestCompletionsSeveralPrompts(t *testing.T) {
	_, ts := start(t, Options{})
	var resp struct {
		completionChunk
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	status, _, got := doAt(t, ts.URL, "/v1/completions", `{"model":"mock","prompt":["Tell me a story","/echo Hi!"],"n":2,"max_tokens":4}`)
	if status != http.StatusOK || json.Unmarshal([]byte(got), &resp) != nil || len(resp.Choices) != 4 {
		t.Fatalf("status %d: %s", status, got)
	}
	finishes := []string{"length", "length", "stop", "stop"}
	for c, want := range []string{CompletionText("Tell me a story", 4), CompletionText("Tell me a story", 4), "Hi!", "Hi!"} {
		if ch := resp.Choices[c]; ch.Index != c || ch.Text != want || *ch.FinishReason != finishes[c] {
			t.Errorf("choice %d = %+v, want text %q", c, ch, want)
		}
	}
	if resp.Usage.PromptTokens != 4+2 || resp.Usage.CompletionTokens != 4+4+1+1 {
		t.Errorf("usage %+v", resp.Usage)
	}

	// Streamed: the shorter echo answer stops early, every choice finishes.
	status, _, got = doAt(t, ts.URL, "/v1/completions", `{"model":"mock","prompt":[[1,2,3],[4]],"stream":true,"max_tokens":2,"stream_options":{"include_usage":true}}`)
	tokens, finishes, usages := completionFrames(t, parseSSE(t, got))
	if status != http.StatusOK || len(tokens) != 4 || len(finishes) != 2 || len(usages) != 1 {
		t.Fatalf("status %d, %d token, %d finish, %d usage frames:\n%s", status, len(tokens), len(finishes), len(usages), got)
	}
	if !strings.Contains(usages[0], `"usage":{"prompt_tokens":4,"total_tokens":8,"completion_tokens":4}`) {
		t.Errorf("usage frame %s", usages[0])
	}
	for i, f := range finishes {
		if !strings.Contains(f, fmt.Sprintf(`{"index":%d,"text":"","logprobs":null,"finish_reason":"length"`, i)) {
			t.Errorf("finish frame %d: %s", i, f)
		}
	}
}

func TestCompletionsErrors(t *testing.T) {
	_, ts := start(t, Options{})
	cases := []struct {
		body   string
		status int
		msg    string
	}{
		{`{"model":"mock"}`, 400, "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids"},
		{`{"model":"mock","prompt":""}`, 400, "'prompt' must not be empty"},
		{`{"model":"mock","prompt":[]}`, 400, "'prompt' must not be empty"},
		{`{"model":"mock","prompt":["a",""]}`, 400, "'prompt[1]' must not be empty"},
		{`{"model":"mock","prompt":["a",[1]]}`, 400, "'prompt[1]' must be a string, like 'prompt[0]'"},
		{`{"model":"mock","prompt":[1,-2]}`, 400, "'prompt[1]' must be a token id (an integer of at least 0), got -2"},
		{`{"model":"mock","prompt":[[1],[]]}`, 400, "'prompt[1]' must not be empty"},
		{`{"model":"mock","prompt":[{"a":1}]}`, 400, "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids"},
		{`{"model":"mock","prompt":"x","max_tokens":0}`, 400, "max_tokens must be at least 1, got 0"},
		{`{"model":"mock","prompt":["a","b","c"],"n":30}`, 400, "the number of prompts times n must be at most 64, got 3 * 30"},
		{`{"model":"nope","prompt":"x"}`, 404, "The model `nope` does not exist."},
	}
	for _, c := range cases {
		status, ctype, got := doAt(t, ts.URL, "/v1/completions", c.body)
		if status != c.status || ctype != "application/json" || !strings.Contains(got, `"message":`+jstr(c.msg)+`,`) {
			t.Errorf("%s: %d %q %s\nwant %d with message %q", c.body, status, ctype, got, c.status, c.msg)
		}
	}
}

func TestCompletionsStreamError(t *testing.T) {
	s, ts := start(t, Options{})
	_, _, got := doAt(t, ts.URL, "/v1/completions", `{"model":"mock","prompt":"x","stream":true,"mock":{"tag":"e","stream_error_after":2}}`)
	events := parseSSE(t, got)
	if len(events) != 4 || !strings.HasPrefix(events[2].data, `{"error":{"message":"The engine failed while generating."`) || events[3].data != "[DONE]" {
		t.Errorf("stream %q", got)
	}
	rec, err := s.WaitFor(waitCtx(t), "e", func(r Record) bool { return r.Completed })
	if err != nil || rec.ChunksSent != 2 {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

func TestCompletionsCancelMidStream(t *testing.T) {
	s, ts := start(t, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := postTo(t, ctx, ts.URL, "/v1/completions", `{"model":"mock","prompt":"x","stream":true,"mock":{"tag":"cmid","tps":20,"tokens":200}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	seen := 0
	for seen < 3 && sc.Scan() {
		if strings.Contains(sc.Text(), `"finish_reason":null`) {
			seen++
		}
	}
	if seen != 3 {
		t.Fatalf("read %d token frames: %v", seen, sc.Err())
	}
	cancel()
	rec := cancelCheck(t, s, "cmid", time.Now())
	generationStopped(t, s, rec, 3)
	if rec.Endpoint != APICompletions {
		t.Errorf("record %+v", rec)
	}
}

func TestCompletionsOpenAISDK(t *testing.T) {
	_, ts := start(t, Options{})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	stream := client.Completions.NewStreaming(t.Context(), openai.CompletionNewParams{
		Model:         "mock",
		Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("Tell me a story")},
		MaxTokens:     openai.Int(12),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()
	var text strings.Builder
	finish, usage := "", openai.CompletionUsage{}
	for stream.Next() {
		ch := stream.Current()
		for _, c := range ch.Choices {
			text.WriteString(c.Text)
			if c.FinishReason != "" {
				finish = string(c.FinishReason)
			}
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if text.String() != CompletionText("Tell me a story", 12) || finish != "length" || usage.CompletionTokens != 12 || usage.PromptTokens != 4 {
		t.Errorf("text %q finish %q usage %+v", text.String(), finish, usage)
	}

	c, err := client.Completions.New(t.Context(), openai.CompletionNewParams{
		Model:  "mock",
		Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"a", "b"}},
	})
	if err != nil || len(c.Choices) != 2 || c.Choices[1].Text != CompletionText("b", 16) || c.Choices[1].Index != 1 {
		t.Errorf("completion %+v, err %v", c, err)
	}
}
