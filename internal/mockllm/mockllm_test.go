package mockllm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

const fixtures = "../../testdata/ollama-0.17.4"

// start serves a mock over real HTTP for one test.
func start(t *testing.T, o Options) (*Server, *httptest.Server) {
	t.Helper()
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	s := New(o)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

func post(t *testing.T, ctx context.Context, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatalf("building request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

// do posts body and returns status, Content-Type and the whole body.
func do(t *testing.T, url, body string) (int, string, string) {
	t.Helper()
	resp, err := post(t, t.Context(), url, body)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var headRE = regexp.MustCompile(`^data: \{"id":"(chatcmpl-[0-9a-f]{32})","object":"chat\.completion\.chunk","created":(\d+),`)

func TestStreamExactFrames(t *testing.T) {
	_, ts := start(t, Options{})
	for _, usage := range []bool{true, false} {
		t.Run(fmt.Sprintf("include_usage=%t", usage), func(t *testing.T) {
			body := `{"model":"mock","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":3`
			if usage {
				body += `,"stream_options":{"include_usage":true}}`
			} else {
				body += `}`
			}
			status, ctype, got := do(t, ts.URL, body)
			if status != http.StatusOK || ctype != "text/event-stream; charset=utf-8" {
				t.Fatalf("status %d, Content-Type %q", status, ctype)
			}
			m := headRE.FindStringSubmatch(got)
			if m == nil {
				t.Fatalf("first frame does not look like a vLLM chunk:\n%s", got)
			}
			head := `data: {"id":"` + m[1] + `","object":"chat.completion.chunk","created":` + m[2] + `,"model":"mock","choices":[`
			want := head + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
				head + `{"index":0,"delta":{"content":"Once"},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
				head + `{"index":0,"delta":{"content":" upon"},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
				head + `{"index":0,"delta":{"content":" a"},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
				head + `{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}` + "\n\n"
			if usage {
				want += head + `],"usage":{"prompt_tokens":2,"total_tokens":5,"completion_tokens":3}}` + "\n\n"
			}
			want += "data: [DONE]\n\n"
			if got != want {
				t.Errorf("stream mismatch\n got: %q\nwant: %q", got, want)
			}
		})
	}
}

func TestNonStreamExact(t *testing.T) {
	_, ts := start(t, Options{})
	status, ctype, got := do(t, ts.URL, `{"model":"mock","messages":[{"role":"system","content":"Be kind."},{"role":"user","content":"hi"}],"max_completion_tokens":2}`)
	if status != http.StatusOK || ctype != "application/json" {
		t.Fatalf("status %d, Content-Type %q", status, ctype)
	}
	m := regexp.MustCompile(`^\{"id":"(chatcmpl-[0-9a-f]{32})","object":"chat\.completion","created":(\d+),`).FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("unexpected body %s", got)
	}
	want := `{"id":"` + m[1] + `","object":"chat.completion","created":` + m[2] + `,"model":"mock","choices":[{"index":0,"message":{"role":"assistant","content":"Once upon","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2},"prompt_logprobs":null}`
	if got != want {
		t.Errorf("body mismatch\n got: %s\nwant: %s", got, want)
	}
}

func TestOpenAISDKStream(t *testing.T) {
	_, ts := start(t, Options{})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:         "mock",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Tell me a story")},
		MaxTokens:     openai.Int(40),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	var content strings.Builder
	var usage openai.CompletionUsage
	finish := ""
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		for _, c := range ch.Choices {
			content.WriteString(c.Delta.Content)
			if c.FinishReason != "" {
				finish = c.FinishReason
			}
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	want := CompletionText("Tell me a story", 40)
	if content.String() != want {
		t.Errorf("content = %q, want %q", content.String(), want)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != want {
		t.Errorf("accumulator = %+v", acc.Choices)
	}
	if finish != "length" {
		t.Errorf("finish_reason = %q, want length", finish)
	}
	// "Be brief." = 2 words + 1, "Tell me a story" = 4 words + 1.
	if usage.PromptTokens != 8 || usage.CompletionTokens != 40 || usage.TotalTokens != 48 {
		t.Errorf("usage = %+v", usage)
	}
}

// The SDK reads a whole answer; with WholeSentences (the demo model's
// option) the story ends at a sentence and finishes "stop".
func TestOpenAISDKNonStream(t *testing.T) {
	_, ts := start(t, Options{Models: []string{"a", "b"}, WholeSentences: true})
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	resp, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model:    "b",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if resp.Model != "b" || !strings.HasPrefix(resp.ID, "chatcmpl-") || len(resp.Choices) != 1 {
		t.Fatalf("unexpected response %+v", resp)
	}
	c := resp.Choices[0]
	n := SentenceLength("hello there", 16)
	if c.Message.Content != CompletionText("hello there", n) || c.FinishReason != "stop" || c.Message.Role != "assistant" {
		t.Errorf("choice = %+v", c)
	}
	if resp.Usage.PromptTokens != 3 || resp.Usage.CompletionTokens != int64(n) || resp.Usage.TotalTokens != int64(3+n) {
		t.Errorf("usage = %+v", resp.Usage)
	}

	// The SDK turns the 404 into a typed error.
	_, err = client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model:    "nope",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: err = %v", err)
	}
}

// The length comes from max_completion_tokens, max_tokens, the tokens knob
// or Options.Tokens, in that order. An answer the request's limit cut
// finishes "length"; one whose length the mock chose finishes "stop" when
// it ends at a sentence and "length" when that length cut it mid-sentence.
func TestLengthSelection(t *testing.T) {
	_, ts := start(t, Options{Tokens: 7})
	whole := SentenceLength("q", 5) // The first sentence of q's story.
	cases := []struct {
		name, extra string
		n           int
		finish      string
	}{
		{"default from options, mid-sentence", ``, 7, "length"},
		{"max_tokens", `,"max_tokens":4`, 4, "length"},
		{"max_completion_tokens wins", `,"max_tokens":4,"max_completion_tokens":6`, 6, "length"},
		{"knob, mid-sentence", `,"mock":{"tokens":5}`, 5, "length"},
		{"knob, a whole sentence", fmt.Sprintf(`,"mock":{"tokens":%d}`, whole), whole, "stop"},
		{"max_tokens at a sentence end", fmt.Sprintf(`,"max_tokens":%d`, whole), whole, "length"},
		{"max_tokens beats knob", `,"max_tokens":3,"mock":{"tokens":5}`, 3, "length"},
		{"repeats past the story", `,"max_tokens":700`, 700, "length"},
		{"explicit nulls and vLLM extras", `,"max_tokens":null,"max_completion_tokens":null,"stream":null,"stream_options":null,` +
			`"chat_template_kwargs":{"enable_thinking":false},"reasoning_effort":null,"tools":null,"mock":null,"top_k":-1`, 7, "length"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, _, got := do(t, ts.URL, `{"model":"mock","messages":[{"role":"user","content":"q"}]`+c.extra+`}`)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, got)
			}
			want := fmt.Sprintf(`"content":%s,"tool_calls":[]},"logprobs":null,"finish_reason":"%s"`, jstr(CompletionText("q", c.n)), c.finish)
			if !strings.Contains(got, want) {
				t.Errorf("body %s\ndoes not contain %s", got, want)
			}
			if !strings.Contains(got, fmt.Sprintf(`"completion_tokens":%d}`, c.n)) {
				t.Errorf("completion_tokens not %d in %s", c.n, got)
			}
		})
	}
}

func TestPromptTokensArrayContent(t *testing.T) {
	_, ts := start(t, Options{})
	body := `{"model":"mock","max_tokens":1,"messages":[
		{"role":"user","content":[{"type":"text","text":"hello  there\nfriend"},{"type":"image_url","image_url":{"url":"data:x"}}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"42"}]}`
	status, _, got := do(t, ts.URL, body)
	// (3 words + 1) + (0 + 1) + (1 + 1) = 7
	if status != http.StatusOK || !strings.Contains(got, `"usage":{"prompt_tokens":7,"total_tokens":8,"completion_tokens":1}`) {
		t.Errorf("status %d body %s", status, got)
	}
}

func TestCompletionTokens(t *testing.T) {
	toks := CompletionTokens("anything", 4)
	if strings.Join(toks, "|") != "Once| upon| a| time," {
		t.Errorf("tokens = %q", toks)
	}
	if CompletionText("x", 50) != CompletionText("x", 50) {
		t.Error("not deterministic")
	}
	seen := map[string]bool{}
	for i := range 30 {
		seen[CompletionText(fmt.Sprintf("prompt %d", i), 8)] = true
	}
	if len(seen) != len(stories) {
		t.Errorf("prompts reached %d stories, want %d", len(seen), len(stories))
	}
	n := len(storyFor(""))
	long := CompletionTokens("", 2*n+1)
	if long[n] != " Once" || long[2*n] != " Once" {
		t.Errorf("repeat does not restart the story with a space: %q %q", long[n], long[2*n])
	}
	for _, w := range storyWords {
		if len(w) < 150 {
			t.Errorf("story too short: %d words", len(w))
		}
	}
}

func TestErrors(t *testing.T) {
	s, ts := start(t, Options{})
	errBody := func(msg, typ string, code int) string {
		return fmt.Sprintf(`{"error":{"message":%s,"type":"%s","param":null,"code":%d}}`, jstr(msg), typ, code)
	}
	cases := []struct {
		name, body string
		status     int
		want       string // exact body, or prefix when it ends with "*"
	}{
		{"invalid JSON", `{"model":"mock",`, 400, `{"error":{"message":"invalid JSON body: *`},
		{"not an object", `[1]`, 400, errBody("request body must be a JSON object", "invalid_request_error", 400)},
		{"missing messages", `{"model":"mock"}`, 400, errBody("'messages' must be a non-empty array", "invalid_request_error", 400)},
		{"empty messages", `{"model":"mock","messages":[],"stream":true}`, 400, errBody("'messages' must be a non-empty array", "invalid_request_error", 400)},
		{"unknown model", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, errBody("The model `nope` does not exist.", "NotFoundError", 404)},
		{"unknown model stream", `{"model":"nope","stream":true,"messages":[{"role":"user","content":"x"}]}`, 404, errBody("The model `nope` does not exist.", "NotFoundError", 404)},
		{"max_tokens zero", `{"model":"mock","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, 400, errBody("max_tokens must be at least 1, got 0", "invalid_request_error", 400)},
		{"max_tokens string", `{"model":"mock","max_tokens":"5","messages":[{"role":"user","content":"x"}]}`, 400, errBody(`max_tokens must be an integer, got "5"`, "invalid_request_error", 400)},
		{"too long", `{"model":"mock","max_tokens":200000,"messages":[{"role":"user","content":"x"}]}`, 400, `{"error":{"message":"This model's maximum context length is 131072 tokens.*`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, ctype, got := do(t, ts.URL, c.body)
			if status != c.status || ctype != "application/json" {
				t.Errorf("status %d Content-Type %q, want %d application/json", status, ctype, c.status)
			}
			if p, ok := strings.CutSuffix(c.want, "*"); ok {
				if !strings.HasPrefix(got, p) {
					t.Errorf("body %s\nwant prefix %s", got, p)
				}
			} else if got != c.want {
				t.Errorf("body %s\nwant %s", got, c.want)
			}
		})
	}
	// Every request, even a broken one, is recorded, in order.
	recs := s.Requests()
	if len(recs) != len(cases) {
		t.Fatalf("recorded %d requests, want %d", len(recs), len(cases))
	}
	for i, r := range recs {
		if string(r.Body) != cases[i].body || r.Status != cases[i].status || !r.Completed {
			t.Errorf("record %d = %+v", i, r)
		}
	}
}

func TestRoutes(t *testing.T) {
	_, ts := start(t, Options{Models: []string{"m1", "org/m2"}})
	get := func(path string) (int, string) {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading %s: %v", path, err)
		}
		return resp.StatusCode, string(b)
	}
	created := regexp.MustCompile(`"created":\d+`)
	norm := func(s string) string { return created.ReplaceAllString(s, `"created":0`) }

	if st, b := get("/v1/models"); st != 200 || norm(b) != `{"object":"list","data":[{"id":"m1","object":"model","created":0,"owned_by":"moonji-mock"},{"id":"org/m2","object":"model","created":0,"owned_by":"moonji-mock"}]}` {
		t.Errorf("/v1/models: %d %s", st, b)
	}
	if st, b := get("/v1/models/org/m2"); st != 200 || norm(b) != `{"id":"org/m2","object":"model","created":0,"owned_by":"moonji-mock"}` {
		t.Errorf("/v1/models/org/m2: %d %s", st, b)
	}
	if st, b := get("/v1/models/nope"); st != 404 || b != `{"error":{"message":"The model `+"`nope`"+` does not exist.","type":"NotFoundError","param":null,"code":404}}` {
		t.Errorf("/v1/models/nope: %d %s", st, b)
	}
	if st, b := get("/v1/chat/completions"); st != 405 || b != `{"detail":"Method Not Allowed"}` {
		t.Errorf("GET chat: %d %s", st, b)
	}
	if st, b := get("/nowhere"); st != 404 || b != `{"detail":"Not Found"}` {
		t.Errorf("/nowhere: %d %s", st, b)
	}
	if st, _ := get("/health"); st != 200 {
		t.Errorf("/health: %d", st)
	}
}

func TestReplay(t *testing.T) {
	_, ts := start(t, Options{ReplayDir: fixtures})
	cases := []struct {
		file, ctype string
		status      int
	}{
		{"chat_stream.sse", "text/event-stream", 200},
		{"chat_nonstream.json", "application/json", 200},
		{"err_unknown_model_stream.body", "application/json", 404},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join(fixtures, c.file))
			if err != nil {
				t.Fatal(err)
			}
			// include_usage is ignored: the recording is what it is.
			status, ctype, got := do(t, ts.URL, `{"model":"tiny","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"x"}],"mock":{"replay":"`+c.file+`","tps":2000}}`)
			if status != c.status || ctype != c.ctype {
				t.Errorf("status %d Content-Type %q, want %d %q", status, ctype, c.status, c.ctype)
			}
			if got != string(want) {
				t.Errorf("replayed %d bytes differ from the %d-byte recording", len(got), len(want))
			}
		})
	}
	for _, bad := range []string{"missing.sse", "../ollama-0.17.4/chat_stream.sse", "/etc/passwd"} {
		if status, _, got := do(t, ts.URL, `{"mock":{"replay":"`+bad+`"}}`); status != 500 || !strings.Contains(got, "replay") {
			t.Errorf("replay %q: %d %s", bad, status, got)
		}
	}
}

func TestReplayIsFramedAndPaced(t *testing.T) {
	s, ts := start(t, Options{ReplayDir: fixtures})
	want, err := os.ReadFile(filepath.Join(fixtures, "chat_stream.sse"))
	if err != nil {
		t.Fatal(err)
	}
	frames := splitFrames(want)
	nFrames := bytes.Count(want, []byte("data: "))
	if len(frames) != nFrames || !bytes.Equal(bytes.Join(frames, nil), want) {
		t.Fatalf("split into %d frames", len(frames))
	}
	begin := time.Now()
	do(t, ts.URL, `{"mock":{"replay":"chat_stream.sse","tps":1000,"tag":"r"}}`)
	if el := time.Since(begin); el < 50*time.Millisecond {
		t.Errorf("%d frames at 1000/s took %v", nFrames, el)
	}
	rec, err := s.WaitFor(waitCtx(t), "r", func(r Record) bool { return r.Completed })
	if err != nil || rec.ChunksSent != nFrames {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

func TestFailStatus(t *testing.T) {
	s, ts := start(t, Options{})
	status, ctype, got := do(t, ts.URL, `{"model":"mock","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"f","fail_status":503,"fail_message":"engine overloaded"}}`)
	if status != 503 || ctype != "application/json" || got != `{"error":{"message":"engine overloaded","type":"server_error","param":null,"code":503}}` {
		t.Errorf("got %d %q %s", status, ctype, got)
	}
	status, _, got = do(t, ts.URL, `{"mock":{"fail_status":429}}`)
	if status != 429 || got != `{"error":{"message":"mock failure: Too Many Requests","type":"rate_limit_error","param":null,"code":429}}` {
		t.Errorf("got %d %s", status, got)
	}
	rec, err := s.WaitFor(waitCtx(t), "f", nil)
	if err != nil || rec.Status != 503 || !rec.Stream || rec.Cancelled {
		t.Errorf("record %+v, err %v", rec, err)
	}
}

func TestDisconnectAfter(t *testing.T) {
	s, ts := start(t, Options{})
	resp, err := post(t, t.Context(), ts.URL, `{"model":"mock","stream":true,"messages":[{"role":"user","content":"x"}],"max_tokens":10,"mock":{"tag":"d","disconnect_after":3}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("reading torn stream: err = %v, want unexpected EOF", err)
	}
	if n := strings.Count(string(body), `"delta":{"content":`); n != 3 {
		t.Errorf("client saw %d content chunks, want 3:\n%s", n, body)
	}
	if strings.Contains(string(body), "[DONE]") {
		t.Error("torn stream has [DONE]")
	}
	rec, err := s.WaitFor(waitCtx(t), "d", func(r Record) bool { return r.Aborted })
	if err != nil || rec.ChunksSent != 3 || rec.Completed {
		t.Errorf("record %+v, err %v", rec, err)
	}

	// Non-streaming: the connection drops before any byte of the answer.
	if _, err := post(t, t.Context(), ts.URL, `{"model":"mock","messages":[{"role":"user","content":"x"}],"mock":{"disconnect_after":2}}`); err == nil {
		t.Error("non-streaming disconnect_after: request succeeded")
	}
}

// cancelCheck waits for tag to be recorded cancelled soon after cancelledAt.
func cancelCheck(t *testing.T, s *Server, tag string, cancelledAt time.Time) Record {
	t.Helper()
	rec, err := s.WaitFor(waitCtx(t), tag, func(r Record) bool { return r.Cancelled })
	if err != nil {
		t.Fatalf("cancellation not recorded: %v", err)
	}
	if d := rec.CancelledAt.Sub(cancelledAt); d > time.Second {
		t.Errorf("cancellation noticed after %v", d)
	}
	if rec.Completed {
		t.Errorf("cancelled request also completed: %+v", rec)
	}
	return rec
}

func TestCancelDuringTTFT(t *testing.T) {
	s, ts := start(t, Options{TTFT: time.Minute})
	t.Run("stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		resp, err := post(t, ctx, ts.URL, `{"model":"mock","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"ttft-s"}}`)
		if err != nil {
			t.Fatalf("headers should arrive before the first token: %v", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		cancel()
		rec := cancelCheck(t, s, "ttft-s", time.Now())
		if rec.ChunksSent != 0 {
			t.Errorf("chunks sent %d", rec.ChunksSent)
		}
	})
	t.Run("non-stream knob", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			// A knob overrides the minute-long default TTFT.
			resp, err := post(t, ctx, ts.URL, `{"model":"mock","messages":[{"role":"user","content":"x"}],"mock":{"tag":"ttft-n","ttft_ms":60000}}`)
			if err == nil {
				resp.Body.Close()
			}
		}()
		if _, err := s.WaitFor(waitCtx(t), "ttft-n", nil); err != nil {
			t.Fatal(err)
		}
		cancel()
		cancelCheck(t, s, "ttft-n", time.Now())
	})
}

func TestCancelMidStream(t *testing.T) {
	s, ts := start(t, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := post(t, ctx, ts.URL, `{"model":"mock","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"mid","tps":20,"tokens":200}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	content := 0
	for content < 3 && sc.Scan() {
		if strings.Contains(sc.Text(), `"delta":{"content":`) {
			content++
		}
	}
	if content != 3 {
		t.Fatalf("read %d content chunks: %v", content, sc.Err())
	}
	cancel()
	rec := cancelCheck(t, s, "mid", time.Now())
	if rec.ChunksSent < 3 || rec.ChunksSent > 10 {
		t.Errorf("chunks sent %d", rec.ChunksSent)
	}
	// Generation stopped: the count no longer moves.
	time.Sleep(150 * time.Millisecond)
	if after := s.Requests()[0].ChunksSent; after != rec.ChunksSent {
		t.Errorf("chunks went on after cancel: %d -> %d", rec.ChunksSent, after)
	}
}

func TestCancelDuringHang(t *testing.T) {
	s, ts := start(t, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		resp, err := post(t, ctx, ts.URL, `{"model":"mock","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"h","hang":true}}`)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	if _, err := s.WaitFor(waitCtx(t), "h", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("hanging request returned early: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if r := s.Requests()[0]; r.Status != 0 || r.Cancelled {
		t.Errorf("during hang: %+v", r)
	}
	cancel()
	cancelCheck(t, s, "h", time.Now())
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("client error = %v", err)
	}
}

func TestPacing(t *testing.T) {
	s, ts := start(t, Options{})
	begin := time.Now()
	status, _, _ := do(t, ts.URL, `{"model":"mock","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"p","tps":100}}`)
	el := time.Since(begin)
	if status != 200 || el < 150*time.Millisecond {
		t.Errorf("status %d, 20 tokens at 100/s took %v, want about 200ms", status, el)
	}
	rec, err := s.WaitFor(waitCtx(t), "p", func(r Record) bool { return r.Completed })
	if err != nil || rec.ChunksSent != 20 || rec.Cancelled {
		t.Errorf("record %+v, err %v", rec, err)
	}

	// Options pacing applies when there is no knob, including TTFT.
	_, ts2 := start(t, Options{TokensPerSecond: 100, TTFT: 100 * time.Millisecond})
	begin = time.Now()
	do(t, ts2.URL, `{"model":"mock","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`)
	if el := time.Since(begin); el < 150*time.Millisecond {
		t.Errorf("TTFT 100ms + 10 tokens at 100/s took %v", el)
	}
}

func TestWaitForTimeoutAndMaxRecords(t *testing.T) {
	s, ts := start(t, Options{MaxRecords: 2})
	for _, tag := range []string{"a", "b", "c"} {
		do(t, ts.URL, `{"model":"mock","max_tokens":1,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"`+tag+`"}}`)
	}
	recs := s.Requests()
	if len(recs) != 2 || recs[0].Tag != "b" || recs[1].Tag != "c" {
		t.Errorf("records %+v", recs)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.WaitFor(ctx, "c", func(r Record) bool { return r.Cancelled }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitFor = %v, want deadline exceeded", err)
	}
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of Run's logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"--listen", "127.0.0.1:0", "--models", "a, b", "--tokens", "3", "--tps", "1000"}, &out)
	}()
	addrRE := regexp.MustCompile(`addr=(http://\S+)`)
	var base string
	for deadline := time.Now().Add(3 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addrRE.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		}
	}
	if base == "" {
		t.Fatalf("no listen address logged:\n%s", out.String())
	}
	status, _, got := do(t, base, `{"model":"b","messages":[{"role":"user","content":"x"}]}`)
	if status != 200 || !strings.Contains(got, `"completion_tokens":3}`) {
		t.Errorf("%d %s", status, got)
	}
	// A hanging request must not hold up shutdown.
	go func() {
		if resp, err := post(t, t.Context(), base, `{"mock":{"hang":true}}`); err == nil {
			resp.Body.Close()
		}
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("Run did not return after cancel")
	}

	if err := Run(t.Context(), []string{"--bogus"}, io.Discard); err == nil {
		t.Error("bad flag accepted")
	}
	if err := Run(t.Context(), []string{"--apis", "chat,bogus"}, io.Discard); err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Errorf("bad --apis: %v", err)
	}
}

func TestDemoOptions(t *testing.T) {
	o := DemoOptions()
	if len(o.Models) != 1 || o.Models[0] != DemoModel || o.TokensPerSecond != 30 {
		t.Errorf("DemoOptions = %+v", o)
	}
}

// A message that starts with EchoPrefix comes back verbatim, every byte,
// in pieces; max_tokens still cuts it.
func TestEchoAnswersTheMessage(t *testing.T) {
	text := "```go\nfmt.Println(\"<b>hi</b>\")\n```\n한국어 <script>alert(1)</script>"
	toks := EchoTokens(text)
	if got := strings.Join(toks, ""); got != text {
		t.Fatalf("echo tokens join to %q", got)
	}
	for _, tok := range toks {
		if n := len([]rune(tok)); n == 0 || n > 4 {
			t.Fatalf("token %q has %d characters", tok, n)
		}
	}
}

// ContextCommand answers with what the engine received before it.
func TestContextCommandEchoesTheMessagesReceived(t *testing.T) {
	_, ts := start(t, Options{})
	status, _, got := do(t, ts.URL, `{"model":"mock","messages":[{"role":"system","content":"Be brief."},`+
		`{"role":"user","content":"one"},{"role":"assistant","content":"two"},{"role":"user","content":"/context"}]}`)
	want := `system: Be brief.\n\nuser: one\n\nassistant: two` // as JSON escapes it
	if status != http.StatusOK || !strings.Contains(got, `"content":"`+want+`"`) {
		t.Fatalf("status %d: %s, want the content %q", status, got, want)
	}
}

// n > 1 streams as vLLM does: a role chunk per choice, then each token as
// one chunk per choice, then each choice's finish; usage sums the choices.
func TestStreamSeveralChoices(t *testing.T) {
	_, ts := start(t, Options{})
	status, _, got := do(t, ts.URL, `{"model":"mock","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":2,"n":2,"stream_options":{"include_usage":true}}`)
	m := headRE.FindStringSubmatch(got)
	if status != http.StatusOK || m == nil {
		t.Fatalf("status %d:\n%s", status, got)
	}
	head := `data: {"id":"` + m[1] + `","object":"chat.completion.chunk","created":` + m[2] + `,"model":"mock","choices":[`
	var want strings.Builder
	for _, c := range []string{"0", "1"} {
		want.WriteString(head + `{"index":` + c + `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	for _, tok := range []string{"Once", " upon"} {
		for _, c := range []string{"0", "1"} {
			want.WriteString(head + `{"index":` + c + `,"delta":{"content":"` + tok + `"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
		}
	}
	for _, c := range []string{"0", "1"} {
		want.WriteString(head + `{"index":` + c + `,"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}` + "\n\n")
	}
	want.WriteString(head + `],"usage":{"prompt_tokens":2,"total_tokens":6,"completion_tokens":4}}` + "\n\n" + "data: [DONE]\n\n")
	if got != want.String() {
		t.Errorf("stream mismatch\n got: %q\nwant: %q", got, want.String())
	}
}

func TestNonStreamSeveralChoices(t *testing.T) {
	_, ts := start(t, Options{})
	status, _, got := do(t, ts.URL, `{"model":"mock","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"n":3}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, got)
	}
	for _, c := range []string{"0", "1", "2"} {
		if !strings.Contains(got, `{"index":`+c+`,"message":{"role":"assistant","content":"Once upon","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}`) {
			t.Errorf("choice %s missing: %s", c, got)
		}
	}
	if !strings.Contains(got, `"usage":{"prompt_tokens":2,"total_tokens":8,"completion_tokens":6}`) {
		t.Errorf("usage does not sum the choices: %s", got)
	}
	for body, msg := range map[string]string{
		`{"model":"mock","messages":[{"role":"user","content":"x"}],"n":0}`:   "n must be between 1 and 64, got 0",
		`{"model":"mock","messages":[{"role":"user","content":"x"}],"n":1.5}`: "n must be an integer, got 1.5",
		`{"model":"mock","messages":[{"role":"user","content":"x"}],"n":"2"}`: `n must be an integer, got "2"`,
	} {
		if status, _, got := do(t, ts.URL, body); status != http.StatusBadRequest || !strings.Contains(got, jstr(msg)) {
			t.Errorf("%s: %d %s", body, status, got)
		}
	}
}
