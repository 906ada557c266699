package web_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// allAPIs makes the test engine's backend serve every API.
func allAPIs(c *config.Config) {
	for i := range c.Backends {
		c.Backends[i].APIs = []string{"chat", "responses", "embeddings", "completions"}
	}
}

// postPath posts body to one of the gateway's paths with the env's key.
func (e *testEnv) postPath(ctx context.Context, path, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// TestEveryAPIRelaysRecordedEngine: streams of the other APIs pass through
// byte for byte, as a real engine (Ollama 0.17.4) wrote them, and their
// rows take the token counts from each API's own usage fields.
func TestEveryAPIRelaysRecordedEngine(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", allAPIs)
	for _, c := range []struct {
		name, path, body, file string
		strip                  bool // the client did not ask for the usage chunk
		prompt, completion     string
	}{
		{"completions+usage", "/v1/completions",
			`{"model":"m1","prompt":"Once upon a time","max_tokens":16,"stream":true,"stream_options":{"include_usage":true},"mock":{"replay":"completions_stream.sse"}}`,
			"completions_stream.sse", false, "usage.prompt_tokens", "usage.completion_tokens"},
		{"completions", "/v1/completions",
			`{"model":"m1","prompt":"Once upon a time","max_tokens":16,"stream":true,"mock":{"replay":"completions_stream.sse"}}`,
			"completions_stream.sse", true, "usage.prompt_tokens", "usage.completion_tokens"},
		{"responses", "/v1/responses",
			`{"model":"m1","input":"Once upon a time","max_output_tokens":24,"stream":true,"mock":{"replay":"responses_stream.sse"}}`,
			"responses_stream.sse", false, "response.usage.input_tokens", "response.usage.output_tokens"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := e.postPath(context.Background(), c.path, c.body)
			got := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), tail(got))
			}
			want := mustFixture(t, c.file)
			usage := usageFrame(want)
			if c.file == "responses_stream.sse" {
				usage = lastFrame(want)
			}
			if c.strip {
				want = strings.Replace(want, usage, "", 1)
			}
			if got != want {
				t.Fatalf("relay differs from the recording (%d vs %d bytes)\n got: %q\nwant: %q", len(got), len(want), tail(got), tail(want))
			}
			row := e.final(resp.Header.Get("X-Inference-Id"))
			data := usage[strings.Index(usage, "data: ")+len("data: "):]
			wantIn, wantOut := gjson.Get(data, c.prompt).Int(), gjson.Get(data, c.completion).Int()
			if row.Outcome != models.OutcomeSuccess || row.UsageSource != models.UsageFromEngine ||
				int64(row.PromptTokens) != wantIn || int64(row.CompletionTokens) != wantOut || wantOut == 0 {
				t.Fatalf("row %s/%s tokens %d+%d (%s), want %d+%d from the engine", row.Outcome, row.Reason,
					row.PromptTokens, row.CompletionTokens, row.UsageSource, wantIn, wantOut)
			}
		})
	}
}

// lastFrame is a recorded stream's last frame.
func lastFrame(s string) string {
	frames := strings.SplitAfter(strings.TrimRight(s, "\n")+"\n\n", "\n\n")
	for i := len(frames) - 1; i >= 0; i-- {
		if strings.TrimSpace(frames[i]) != "" {
			return frames[i]
		}
	}
	return ""
}

// TestEveryAPIWhole: answers that are not streamed — embeddings, a
// completion, a response — pass through, one row each with its usage.
func TestEveryAPIWhole(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", allAPIs)
	for _, c := range []struct {
		path, body         string
		prompt, completion string
	}{
		// The openai SDKs ask for base64 embeddings by default.
		{"/v1/embeddings", `{"model":"m1","input":["first text","second"],"encoding_format":"base64"}`, "usage.prompt_tokens", ""},
		{"/v1/completions", `{"model":"m1","prompt":"Say hi","max_tokens":7,"temperature":null}`, "usage.prompt_tokens", "usage.completion_tokens"},
		{"/v1/responses", `{"model":"m1","input":[{"role":"user","content":"Say hi"}],"instructions":null,"max_output_tokens":9}`, "usage.input_tokens", "usage.output_tokens"},
	} {
		t.Run(c.path, func(t *testing.T) {
			resp := e.postPath(context.Background(), c.path, c.body)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			row := e.final(resp.Header.Get("X-Inference-Id"))
			if row.API != strings.TrimPrefix(c.path, "/v1/") {
				t.Fatalf("row api %q for %s", row.API, c.path)
			}
			wantIn := gjson.Get(body, c.prompt).Int()
			var wantOut int64
			if c.completion != "" {
				wantOut = gjson.Get(body, c.completion).Int()
			}
			if row.Outcome != models.OutcomeSuccess || row.UsageSource != models.UsageFromEngine || wantIn == 0 ||
				int64(row.PromptTokens) != wantIn || int64(row.CompletionTokens) != wantOut {
				t.Fatalf("row %s tokens %d+%d (%s), answer says %d+%d: %s", row.Outcome, row.PromptTokens,
					row.CompletionTokens, row.UsageSource, wantIn, wantOut, body)
			}
			rec := e.Mock.Requests()
			if last := rec[len(rec)-1]; string(last.Body) != c.body {
				t.Fatalf("the engine got other bytes:\n got %s\nwant %s", last.Body, c.body)
			}
		})
	}
}

// TestAPINotServed: a model whose backend does not serve an API answers
// 404 in OpenAI's shape naming the API, with a rejected row.
func TestAPINotServed(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db") // chat only
	for _, path := range []string{"/v1/embeddings", "/v1/completions"} {
		resp := e.postPath(context.Background(), path, `{"model":"m1","input":"x","prompt":"x"}`)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		api := strings.TrimPrefix(path, "/v1/")
		if resp.StatusCode != http.StatusNotFound || gjson.Get(body, "error.code").Str != "api_not_supported" ||
			gjson.Get(body, "error.param").Str != "model" || !strings.Contains(gjson.Get(body, "error.message").Str, api) {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		row := e.final(resp.Header.Get("X-Inference-Id"))
		if row.Outcome != models.OutcomeRejected || row.Reason != "api_not_supported" || row.Model != "m1" || row.API != api {
			t.Fatalf("%s: row %+v", path, row)
		}
	}
	if n := len(e.Mock.Requests()); n != 0 {
		t.Fatalf("the engine got %d requests", n)
	}
}

// readEvents reads SSE frames from r until it ends, handing each to fn.
func readEvents(r io.Reader, fn func(frame string)) {
	br := bufio.NewReader(r)
	var frame strings.Builder
	for {
		line, err := br.ReadString('\n')
		frame.WriteString(line)
		if line == "\n" || err != nil {
			if strings.TrimSpace(frame.String()) != "" {
				fn(frame.String())
			}
			frame.Reset()
		}
		if err != nil {
			return
		}
	}
}

// TestStopEndsEveryKindOfStream: a stopped completions stream ends with a
// finish chunk and [DONE]; a stopped Responses stream with
// response.incomplete numbered after the last event, carrying the usage.
// Both rows are stopped and billed for what was delivered.
func TestStopEndsEveryKindOfStream(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", allAPIs)
	for _, c := range []struct{ path, body, delta string }{
		{"/v1/completions", `{"model":"m1","prompt":"x","stream":true,"mock":{"tps":40,"tokens":2000}}`, `"text":"`},
		{"/v1/responses", `{"model":"m1","input":"x","stream":true,"mock":{"tps":40,"tokens":2000}}`, `response.output_text.delta`},
	} {
		t.Run(c.path, func(t *testing.T) {
			resp := e.postPath(context.Background(), c.path, c.body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, readAll(t, resp.Body))
			}
			id := resp.Header.Get("X-Inference-Id")
			frames := make(chan string, 4096)
			go func() {
				readEvents(resp.Body, func(f string) { frames <- f })
				close(frames)
			}()
			deltas := 0
			var all []string
			for f := range frames {
				all = append(all, f)
				if strings.Contains(f, c.delta) {
					deltas++
					if deltas == 3 {
						if ans := cancelVia(t, e, e.Key, id); ans.status != http.StatusOK {
							t.Fatalf("stop: %d %v", ans.status, ans.body)
						}
					}
				}
			}
			resp.Body.Close()
			last := all[len(all)-1]
			switch c.path {
			case "/v1/completions":
				if strings.TrimSpace(last) != "data: [DONE]" || !strings.Contains(all[len(all)-2], `"finish_reason":"stop"`) ||
					!strings.Contains(all[len(all)-2], `"object":"text_completion"`) {
					t.Fatalf("stopped completions stream ends with %q, %q", all[len(all)-2], last)
				}
			case "/v1/responses":
				data := last[strings.Index(last, "data: ")+len("data: "):]
				prev := all[len(all)-2]
				prevSeq := gjson.Get(prev[strings.Index(prev, "data: ")+len("data: "):], "sequence_number").Int()
				if !strings.HasPrefix(last, "event: response.incomplete\n") || gjson.Get(data, "response.status").Str != "incomplete" ||
					gjson.Get(data, "sequence_number").Int() != prevSeq+1 || !gjson.Get(data, "response.usage.output_tokens").Exists() {
					t.Fatalf("stopped Responses stream ends with %q after %q", last, prev)
				}
			}
			row := e.final(id)
			if row.Outcome != models.OutcomeStopped || row.CompletionTokens < 3 || row.PromptTokens == 0 {
				t.Fatalf("row %s/%s tokens %d+%d", row.Outcome, row.Reason, row.PromptTokens, row.CompletionTokens)
			}
		})
	}
}

// TestClientLeavingCancelsEveryAPI: a client that hangs up on a completions
// or Responses stream cancels the engine's request.
func TestClientLeavingCancelsEveryAPI(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", allAPIs)
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"m1","prompt":"x","stream":true,"mock":{"tag":"leave-c","tps":40,"tokens":2000}}`},
		{"/v1/responses", `{"model":"m1","input":"x","stream":true,"mock":{"tag":"leave-r","tps":40,"tokens":2000}}`},
		{"/v1/embeddings", `{"model":"m1","input":"x","mock":{"tag":"leave-e","hang":true}}`},
	} {
		t.Run(c.path, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+c.path, strings.NewReader(c.body))
				req.Header.Set("Authorization", "Bearer "+e.Key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // cancelled before the answer began (the hanging embeddings)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}()
			tag := gjson.Get(c.body, "mock.tag").Str
			if _, err := e.Mock.WaitFor(context.Background(), tag, func(r mockllm.Record) bool {
				return r.ChunksSent > 2 || (r.Endpoint == "embeddings" && !r.Started.IsZero())
			}); err != nil {
				t.Fatal(err)
			}
			cancel()
			<-done
			waitCtx, stop := context.WithTimeout(context.Background(), 3*time.Second)
			defer stop()
			if _, err := e.Mock.WaitFor(waitCtx, tag, func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
				t.Fatalf("the engine's request was not cancelled: %v", err)
			}
		})
	}
}

// startTranslatingEnv is a gateway whose only backend serves chat, in
// front of a mock engine paced by opts (translated bodies carry no mock
// knobs: unknown fields are refused).
func startTranslatingEnv(t *testing.T, opts mockllm.Options) *testEnv {
	t.Helper()
	opts.Models = []string{"m1"}
	opts.APIs = []string{"chat"}
	opts.Logger = quietLog()
	mock := mockllm.New(opts)
	ms := httptestServer(t, mock)
	return startWithConfig(t, &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/m.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends:    []config.Backend{{Name: "chatonly", URL: ms + "/v1", MaxConcurrency: 8, MaxQueue: 8}},
		Models:      []config.Model{{Name: "m1", Backend: "chatonly"}},
	}, mock, ms)
}

// TestResponsesTranslatedForChatBackend: /v1/responses on a model whose
// backend serves only chat is translated both ways: the engine gets a chat
// request, the client the Responses events (or object) the SDKs expect, and
// the row the engine's usage.
func TestResponsesTranslatedForChatBackend(t *testing.T) {
	// Whole sentences: the chat answer finishes "stop", the response
	// completes (one cut mid-sentence would be "incomplete").
	n := mockllm.SentenceLength("Tell me a story", 6)
	e := startTranslatingEnv(t, mockllm.Options{Tokens: n})
	t.Run("stream", func(t *testing.T) {
		resp := e.postPath(context.Background(), "/v1/responses",
			`{"model":"m1","input":[{"role":"user","content":[{"type":"input_text","text":"Tell me a story"}]}],"instructions":"Be brief.","stream":true,"temperature":null}`)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var types []string
		var deltas strings.Builder
		var completed string
		seq := int64(-1)
		readEvents(resp.Body, func(f string) {
			data := f[strings.Index(f, "data: ")+len("data: "):]
			typ := gjson.Get(data, "type").Str
			types = append(types, typ)
			if n := gjson.Get(data, "sequence_number").Int(); n != seq+1 {
				t.Errorf("sequence_number %d after %d", n, seq)
			} else {
				seq = n
			}
			switch typ {
			case "response.output_text.delta":
				deltas.WriteString(gjson.Get(data, "delta").Str)
			case "response.completed":
				completed = data
			}
		})
		resp.Body.Close()
		if len(types) < 4 || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
			t.Fatalf("events %v", types)
		}
		if got := gjson.Get(completed, "response.output.0.content.0.text").Str; got == "" || got != deltas.String() {
			t.Fatalf("completed text %q, deltas %q", got, deltas.String())
		}
		row := e.final(resp.Header.Get("X-Inference-Id"))
		if row.Outcome != models.OutcomeSuccess || row.CompletionTokens != n || row.UsageSource != models.UsageFromEngine ||
			int64(row.PromptTokens) != gjson.Get(completed, "response.usage.input_tokens").Int() {
			t.Fatalf("row %+v, completed usage %s", row, gjson.Get(completed, "response.usage").Raw)
		}
		rec := e.Mock.Requests()
		last := rec[len(rec)-1]
		if last.Endpoint != "chat" || gjson.GetBytes(last.Body, "messages.0.role").Str != "system" ||
			gjson.GetBytes(last.Body, "temperature").Exists() {
			t.Fatalf("the engine got %s %s", last.Endpoint, last.Body)
		}
	})
	t.Run("whole", func(t *testing.T) {
		resp := e.postPath(context.Background(), "/v1/responses", `{"model":"m1","input":"Say hi","max_output_tokens":4}`)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || gjson.Get(body, "object").Str != "response" ||
			gjson.Get(body, "output.0.content.0.type").Str != "output_text" {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		row := e.final(resp.Header.Get("X-Inference-Id"))
		if row.Outcome != models.OutcomeSuccess || int64(row.CompletionTokens) != gjson.Get(body, "usage.output_tokens").Int() ||
			row.CompletionTokens == 0 {
			t.Fatalf("row %+v for %s", row, body)
		}
	})
	t.Run("refused", func(t *testing.T) {
		resp := e.postPath(context.Background(), "/v1/responses", `{"model":"m1","input":"x","previous_response_id":"resp_1"}`)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || gjson.Get(body, "error.param").Str != "previous_response_id" {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if row := e.final(resp.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeRejected || row.Reason != "invalid_request" {
			t.Fatalf("row %+v", row)
		}
	})
}

// TestTranslatedResponsesStop: a stopped translated stream ends with
// response.completed carrying the text delivered, which is what the SDK
// helpers (openai-python's get_final_response, openai-node's
// finalResponse) accept; the row is stopped.
func TestTranslatedResponsesStop(t *testing.T) {
	e := startTranslatingEnv(t, mockllm.Options{Tokens: 2000, TokensPerSecond: 40})
	resp := e.postPath(context.Background(), "/v1/responses", `{"model":"m1","input":"go on","stream":true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	id := resp.Header.Get("X-Inference-Id")
	var deltas strings.Builder
	var last string
	n := 0
	readEvents(resp.Body, func(f string) {
		data := f[strings.Index(f, "data: ")+len("data: "):]
		last = data
		if gjson.Get(data, "type").Str == "response.output_text.delta" {
			deltas.WriteString(gjson.Get(data, "delta").Str)
			if n++; n == 3 {
				if ans := cancelVia(t, e, e.Key, id); ans.status != http.StatusOK {
					t.Errorf("stop: %d %v", ans.status, ans.body)
				}
			}
		}
	})
	resp.Body.Close()
	if gjson.Get(last, "type").Str != "response.completed" || gjson.Get(last, "response.output.0.content.0.text").Str != deltas.String() {
		t.Fatalf("stopped stream ends with %s (deltas %q)", last, deltas.String())
	}
	if row := e.final(id); row.Outcome != models.OutcomeStopped || row.CompletionTokens < 3 {
		t.Fatalf("row %s %d", row.Outcome, row.CompletionTokens)
	}
}

// httptestServer serves h until the test ends and returns its URL.
func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// storingEngine is the mock engine plus what a storing engine (vLLM with
// store: true) answers for GET and DELETE /v1/responses/{id}.
type storingEngine struct {
	*mockllm.Server
	mu   sync.Mutex
	seen []string // "GET resp_x", "DELETE resp_x"
}

func (s *storingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok && r.Method != http.MethodPost {
		s.mu.Lock()
		s.seen = append(s.seen, r.Method+" "+id)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodDelete {
			io.WriteString(w, `{"id":"`+id+`","object":"response","deleted":true}`)
			return
		}
		io.WriteString(w, `{"id":"`+id+`","object":"response","status":"completed","stored":true}`)
		return
	}
	s.Server.ServeHTTP(w, r)
}

// TestResponsesByID: cancel, retrieve and delete a response by its id,
// for its owner only; translated responses can be cancelled, not retrieved.
func TestResponsesByID(t *testing.T) {
	mock := &storingEngine{Server: mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})}
	ms := httptestServer(t, mock)
	e := startWithConfig(t, &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/m.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends: []config.Backend{
			{Name: "full", URL: ms + "/v1", MaxConcurrency: 8, MaxQueue: 8, APIs: []string{"chat", "responses"}},
			{Name: "chatonly", URL: ms + "/v1", MaxConcurrency: 8, MaxQueue: 8}},
		Models: []config.Model{{Name: "m1", Backend: "full"}, {Name: "m2", Backend: "chatonly", UpstreamModel: "m1"}},
	}, mock.Server, ms)
	other := e.newKey("other@example.com", 0)
	call := func(key, method, path string) (int, string) {
		req, _ := http.NewRequest(method, e.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, readAll(t, resp.Body)
	}

	// A passed-through stream, cancelled by the engine's response id.
	resp := e.postPath(context.Background(), "/v1/responses", `{"model":"m1","input":"go on","stream":true,"mock":{"tps":40,"tokens":2000}}`)
	inf := resp.Header.Get("X-Inference-Id")
	var respID, last string
	deltas := 0
	readEvents(resp.Body, func(f string) {
		data := f[strings.Index(f, "data: ")+len("data: "):]
		last = data
		switch gjson.Get(data, "type").Str {
		case "response.created":
			respID = gjson.Get(data, "response.id").Str
		case "response.output_text.delta":
			if deltas++; deltas == 3 {
				if st, body := call(other, http.MethodPost, "/v1/responses/"+respID+"/cancel"); st != http.StatusNotFound {
					t.Errorf("someone else's cancel: %d %s", st, body)
				}
				if st, body := call(e.Key, http.MethodPost, "/v1/responses/"+respID+"/cancel"); st != http.StatusOK ||
					gjson.Get(body, "inference_id").Str != inf {
					t.Errorf("cancel by response id: %d %s", st, body)
				}
			}
		}
	})
	resp.Body.Close()
	if gjson.Get(last, "type").Str != "response.incomplete" {
		t.Fatalf("the cancelled stream ends with %s", last)
	}
	row := e.final(inf)
	if row.Outcome != models.OutcomeStopped || row.ResponseID != respID || respID == "" {
		t.Fatalf("row %s response_id %q, want stopped %q", row.Outcome, row.ResponseID, respID)
	}

	// Retrieved and deleted at the engine that served it, by its owner.
	if st, body := call(e.Key, http.MethodGet, "/v1/responses/"+respID); st != http.StatusOK || gjson.Get(body, "stored").Bool() != true {
		t.Fatalf("GET: %d %s", st, body)
	}
	if st, body := call(e.Key, http.MethodDelete, "/v1/responses/"+respID); st != http.StatusOK || !gjson.Get(body, "deleted").Bool() {
		t.Fatalf("DELETE: %d %s", st, body)
	}
	for _, c := range []struct{ key, id string }{
		{other, respID},                // someone else's
		{e.Key, "resp_unknown"},        // nobody's
		{e.Key, "resp_x%2F..%2Fadmin"}, // not an id
		{e.Key, strings.Repeat("r", 500)},
	} {
		if st, body := call(c.key, http.MethodGet, "/v1/responses/"+c.id); st != http.StatusNotFound || gjson.Get(body, "error.code").Str != "response_not_found" {
			t.Fatalf("GET %q: %d %s", c.id[:min(len(c.id), 40)], st, body)
		}
	}
	mock.mu.Lock()
	seen := strings.Join(mock.seen, "; ")
	mock.mu.Unlock()
	if seen != "GET "+respID+"; DELETE "+respID {
		t.Fatalf("the engine saw %q: only the owner's requests may reach it", seen)
	}

	// A translated response: cancelled by its id, but not stored.
	resp = e.postPath(context.Background(), "/v1/responses", `{"model":"m2","input":"go on","stream":true}`)
	inf = resp.Header.Get("X-Inference-Id")
	readEvents(resp.Body, func(string) {})
	resp.Body.Close()
	if row := e.final(inf); row.ResponseID != "resp_"+inf {
		t.Fatalf("translated row response_id %q", row.ResponseID)
	}
	if st, body := call(e.Key, http.MethodGet, "/v1/responses/resp_"+inf); st != http.StatusNotFound || !strings.Contains(body, "not stored") {
		t.Fatalf("GET translated: %d %s", st, body)
	}
	if st, body := call(e.Key, http.MethodPost, "/v1/responses/resp_"+inf+"/cancel"); st != http.StatusOK || gjson.Get(body, "state").Str != "success" {
		t.Fatalf("cancel of a finished translated response: %d %s", st, body)
	}
}

// TestEmbeddingsReserveNoCompletion: a tokens-per-minute limit reserves an
// embedding's input only (it has no completion), so a small limit still
// admits small embeddings, where a chat request reserves its answer too.
func TestEmbeddingsReserveNoCompletion(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", allAPIs, func(c *config.Config) { c.RateLimit.TokensPerMinute = 100 })
	for i := range 3 {
		resp := e.postPath(context.Background(), "/v1/embeddings", `{"model":"m1","input":"a short text"}`)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("embedding %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp := e.postPath(context.Background(), "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a chat request without max_tokens reserves its default answer (512) against 100 tokens: got %d", resp.StatusCode)
	}
}

// TestEveryAPIRelaysRecordedWholeAnswers: whole answers a real engine
// wrote (Ollama 0.17.4) reach the client byte for byte, with their usage
// in the row.
func TestEveryAPIRelaysRecordedWholeAnswers(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", allAPIs)
	for _, c := range []struct{ path, body, file, in, out string }{
		{"/v1/embeddings", `{"model":"m1","input":["a","b"],"mock":{"replay":"embeddings.json"}}`, "embeddings.json", "usage.prompt_tokens", ""},
		{"/v1/responses", `{"model":"m1","input":[{"role":"user","content":"Hi"}],"mock":{"replay":"responses_nonstream.json"}}`, "responses_nonstream.json", "usage.input_tokens", "usage.output_tokens"},
		{"/v1/completions", `{"model":"m1","prompt":"Hi","mock":{"replay":"completions_nonstream.json"}}`, "completions_nonstream.json", "usage.prompt_tokens", "usage.completion_tokens"},
	} {
		t.Run(c.file, func(t *testing.T) {
			resp := e.postPath(context.Background(), c.path, c.body)
			got := readAll(t, resp.Body)
			resp.Body.Close()
			want := mustFixture(t, c.file)
			if resp.StatusCode != http.StatusOK || got != want {
				t.Fatalf("status %d, body differs from the recording:\n got %q\nwant %q", resp.StatusCode, tail(got), tail(want))
			}
			row := e.final(resp.Header.Get("X-Inference-Id"))
			var out int64
			if c.out != "" {
				out = gjson.Get(want, c.out).Int()
			}
			if int64(row.PromptTokens) != gjson.Get(want, c.in).Int() || int64(row.CompletionTokens) != out || row.UsageSource != models.UsageFromEngine {
				t.Fatalf("row tokens %d+%d (%s), recording %s", row.PromptTokens, row.CompletionTokens, row.UsageSource, gjson.Get(want, "usage").Raw)
			}
		})
	}
}

// TestEveryAPIRefusedLikeChat: the rate limit (429 with Retry-After) and a
// full backend (503) refuse every API the same way, each with its row.
func TestEveryAPIRefusedLikeChat(t *testing.T) {
	bodies := map[string]string{
		"/v1/embeddings":  `{"model":"m1","input":"x","mock":{"ttft_ms":3000}}`,
		"/v1/completions": `{"model":"m1","prompt":"x","mock":{"ttft_ms":3000}}`,
		"/v1/responses":   `{"model":"m1","input":"x","mock":{"ttft_ms":3000}}`,
	}
	for path, body := range bodies {
		t.Run(strings.TrimPrefix(path, "/v1/"), func(t *testing.T) {
			e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", allAPIs, func(c *config.Config) {
				c.Backends[0].MaxConcurrency, c.Backends[0].QueueTimeout = 1, 100*time.Millisecond
			})
			slow := make(chan struct{})
			go func() {
				defer close(slow)
				resp := e.postPath(context.Background(), path, body)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}()
			waitFor(t, "the first request to hold the slot", 5*time.Second, func() bool { return len(e.Mock.Requests()) == 1 })
			resp := e.postPath(context.Background(), path, body)
			got := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
				gjson.Get(got, "error.code").Str != "queue_timeout" {
				t.Fatalf("backend full: %d %s", resp.StatusCode, got)
			}
			row := e.final(resp.Header.Get("X-Inference-Id"))
			if row.Outcome != models.OutcomeRejected || row.Reason != "queue_timeout" || row.API != strings.TrimPrefix(path, "/v1/") {
				t.Fatalf("row %s/%s api %s", row.Outcome, row.Reason, row.API)
			}
			<-slow

			key := e.newKey("limited@example.com", 1)
			e.Key = key
			first := e.postPath(context.Background(), path, strings.Replace(body, `"ttft_ms":3000`, `"ttft_ms":0`, 1))
			io.Copy(io.Discard, first.Body)
			first.Body.Close()
			resp = e.postPath(context.Background(), path, body)
			got = readAll(t, resp.Body)
			resp.Body.Close()
			if first.StatusCode != http.StatusOK || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
				gjson.Get(got, "error.code").Str != "rate_limit_exceeded" {
				t.Fatalf("rate limit: first %d, then %d %s", first.StatusCode, resp.StatusCode, got)
			}
			if row := e.final(resp.Header.Get("X-Inference-Id")); row.Reason != "rate_limited" {
				t.Fatalf("row %s/%s", row.Outcome, row.Reason)
			}
		})
	}
}
