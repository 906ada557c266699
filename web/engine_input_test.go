package web_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/proxy"
	"moonji/models"
	"moonji/web"
)

// A broken engine's answers, each a 200: what an engine sends is input.
func brokenEngineRecordings(t *testing.T) string {
	whole := func(usage string) string {
		return `{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m1","choices":[{"index":0,` +
			`"message":{"role":"assistant","content":"Once upon a time there was a gateway."},"finish_reason":"stop"}],"usage":` + usage + `}`
	}
	stream := func(usage string) string {
		var b strings.Builder
		b.WriteString("data: {\"id\":\"chatcmpl-s\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
		for _, w := range []string{"Once", " upon", " a", " time"} {
			b.WriteString("data: {\"id\":\"chatcmpl-s\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + w + "\"},\"finish_reason\":null}]}\n\n")
		}
		b.WriteString("data: {\"id\":\"chatcmpl-s\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
		b.WriteString("data: {\"id\":\"chatcmpl-s\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[],\"usage\":" + usage + "}\n\n")
		b.WriteString("data: [DONE]\n\n")
		return b.String()
	}
	return recordings(t, map[string]string{
		"neg_prompt.json":     whole(`{"prompt_tokens":-5,"completion_tokens":9,"total_tokens":4}`),
		"neg_completion.json": whole(`{"prompt_tokens":5,"completion_tokens":-1,"total_tokens":4}`),
		"absurd.json":         whole(`{"prompt_tokens":1e30,"completion_tokens":9223372036854775807,"total_tokens":1}`),
		"fraction.json":       whole(`{"prompt_tokens":1.5,"completion_tokens":9,"total_tokens":10.5}`),
		"string.json":         whole(`{"prompt_tokens":"12","completion_tokens":9}`),
		"good.json":           whole(`{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}`),
		"html.json":           "<html><body>502 Bad Gateway</body></html>",
		"torn.json":           `{"id":"chatcmpl-x","choices":[{"message":{"content":"Once`,
		"neg_stream.sse":      stream(`{"prompt_tokens":-1,"completion_tokens":-7,"total_tokens":-8}`),
		"absurd_stream.sse":   stream(`{"prompt_tokens":1e30,"completion_tokens":9223372036854775807}`),
		"good_stream.sse":     stream(`{"prompt_tokens":12,"completion_tokens":4,"total_tokens":16}`),
	})
}

// brokenEngine serves, as a 200, the recording named by the content of the
// request's last message (so that a translated Responses request, which
// carries no mock knobs, can choose one too).
func brokenEngine(t *testing.T) string {
	dir := brokenEngineRecordings(t)
	srv := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		name := gjson.GetBytes(body, "messages.@reverse.0.content").Str
		data, err := os.ReadFile(filepath.Join(dir, filepath.Base(name)))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		if strings.HasSuffix(name, ".sse") {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		_, _ = w.Write(data)
	}))
	return srv + "/v1"
}

// TestEngineUsageIsInput: usage counts an engine sends that cannot be true
// (negative, fractional, absurd, not numbers) count as unknown — the prompt
// estimated from its text, the answer counted from its chunks or estimated
// from its text — never as the engine's; a 200 whose body is not the API's
// JSON is an error. Before, a negative count killed the process (a
// Prometheus counter's panic in the request's finish), on chat and on
// translated Responses alike. Every case leaves exactly one row.
func TestEngineUsageIsInput(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startWithConfig(t, &config.Config{
			DatabaseURL: db,
			RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
			Backends:    []config.Backend{{Name: "broken", URL: brokenEngine(t), MaxConcurrency: 8, MaxQueue: 8}},
			Models:      []config.Model{{Name: "m1", Backend: "broken"}},
		}, nil, "")
		chat := func(stream bool, name string) string {
			return `{"model":"m1","stream":` + strconv.FormatBool(stream) + `,"messages":[{"role":"user","content":"` + name + `"}]}`
		}
		responses := func(stream bool, name string) string {
			return `{"model":"m1","stream":` + strconv.FormatBool(stream) + `,"input":"` + name + `"}`
		}
		est := func(name string) int { return proxy.EstimatePromptTokens([]byte(chat(false, name))) }
		const any = -1 // anything from 1 to 100
		cases := []struct {
			name, path, body string
			status           int
			outcome, source  string
			prompt, complete int
			reason           string
		}{
			{"whole, negative prompt", "/v1/chat/completions", chat(false, "neg_prompt.json"),
				200, models.OutcomeSuccess, models.UsageEstimated, est("neg_prompt.json"), any, ""},
			{"whole, negative completion", "/v1/chat/completions", chat(false, "neg_completion.json"),
				200, models.OutcomeSuccess, models.UsageEstimated, est("neg_completion.json"), any, ""},
			{"whole, absurd", "/v1/chat/completions", chat(false, "absurd.json"),
				200, models.OutcomeSuccess, models.UsageEstimated, est("absurd.json"), any, ""},
			{"whole, fraction", "/v1/chat/completions", chat(false, "fraction.json"),
				200, models.OutcomeSuccess, models.UsageEstimated, est("fraction.json"), any, ""},
			{"whole, a string", "/v1/chat/completions", chat(false, "string.json"),
				200, models.OutcomeSuccess, models.UsageEstimated, est("string.json"), any, ""},
			{"whole, good", "/v1/chat/completions", chat(false, "good.json"),
				200, models.OutcomeSuccess, models.UsageFromEngine, 12, 9, ""},
			{"whole, HTML", "/v1/chat/completions", chat(false, "html.json"),
				502, models.OutcomeError, models.UsageNone, 0, 0, "upstream_unreadable"},
			{"whole, torn JSON", "/v1/chat/completions", chat(false, "torn.json"),
				502, models.OutcomeError, models.UsageNone, 0, 0, "upstream_unreadable"},
			{"stream, negative", "/v1/chat/completions", chat(true, "neg_stream.sse"),
				200, models.OutcomeSuccess, models.UsageEstimated, est("neg_stream.sse"), 4, ""},
			{"stream, absurd", "/v1/chat/completions", chat(true, "absurd_stream.sse"),
				200, models.OutcomeSuccess, models.UsageEstimated, est("absurd_stream.sse"), 4, ""},
			{"stream, good", "/v1/chat/completions", chat(true, "good_stream.sse"),
				200, models.OutcomeSuccess, models.UsageFromEngine, 12, 4, ""},
			// A Responses request to a chat-only backend is translated.
			{"responses, negative", "/v1/responses", responses(false, "neg_prompt.json"),
				200, models.OutcomeSuccess, models.UsageEstimated, any, any, ""},
			{"responses, absurd", "/v1/responses", responses(false, "absurd.json"),
				200, models.OutcomeSuccess, models.UsageEstimated, any, any, ""},
			{"responses stream, negative", "/v1/responses", responses(true, "neg_stream.sse"),
				200, models.OutcomeSuccess, models.UsageEstimated, any, 4, ""},
			{"responses, HTML", "/v1/responses", responses(false, "html.json"),
				502, models.OutcomeError, models.UsageNone, 0, 0, "upstream_unreadable"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				resp := e.postPath(context.Background(), c.path, c.body)
				body := readAll(t, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != c.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
				}
				if c.status != 200 && gjson.Get(body, "error.code").Str != "upstream_unreadable" {
					t.Errorf("error body %s", body)
				}
				if c.path == "/v1/chat/completions" && strings.HasSuffix(c.name, "stream") && !strings.HasSuffix(body, "data: [DONE]\n\n") {
					t.Errorf("stream not complete:\n%s", body)
				}
				// The translation passes on no count that cannot be true.
				if c.path == "/v1/responses" && (strings.Contains(body, `_tokens":-`) || strings.Contains(body, `_tokens":9223372036854775807`)) {
					t.Errorf("translated answer carries impossible usage: %s", body)
				}
				row := e.final(resp.Header.Get("X-Inference-Id"))
				if row.Outcome != c.outcome || row.UsageSource != c.source || row.Reason != c.reason {
					t.Errorf("row %s/%s/%s, want %s/%s/%s", row.Outcome, row.UsageSource, row.Reason, c.outcome, c.source, c.reason)
				}
				check := func(what string, got, want int) {
					if (want == any && (got < 1 || got > 100)) || (want != any && got != want) {
						t.Errorf("%s tokens %d, want %d", what, got, want)
					}
				}
				check("prompt", row.PromptTokens, c.prompt)
				check("completion", row.CompletionTokens, c.complete)
			})
		}
		if n := e.countRows(); n != int64(len(cases)) {
			t.Errorf("%d rows for %d requests", n, len(cases))
		}
	})
}

// TestPanickingHandlerFailsItsRequestAlone: a handler made to panic answers
// its request 500 in OpenAI's shape, while a stream open at the time runs
// to its end, and the server goes on serving.
func TestPanickingHandlerFailsItsRequestAlone(t *testing.T) {
	e := startEnvReplaying(t, "sqlite://"+t.TempDir()+"/m.db", fixtures, withHook(func(s *web.Server) {
		s.App.Get("/v1/test/panic", func(c *fiber.Ctx) error { panic("a handler's bug") })
	}))
	// A stream that is open while the panic happens.
	var wg sync.WaitGroup
	streamed := make(chan string, 1)
	started := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tokens":20,"tps":40}}`)
		defer resp.Body.Close()
		buf := make([]byte, 1)
		_, _ = resp.Body.Read(buf) // the stream has begun
		close(started)
		rest, _ := io.ReadAll(resp.Body)
		streamed <- string(buf) + string(rest)
	}()
	<-started
	for range 3 {
		resp, err := http.Get(e.URL + "/v1/test/panic")
		if err != nil {
			t.Fatalf("after a panic the server is gone: %v", err)
		}
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || gjson.Get(body, "error.type").Str != "server_error" {
			t.Fatalf("panicking handler answered %d %s", resp.StatusCode, body)
		}
	}
	wg.Wait()
	if s := <-streamed; !strings.HasSuffix(s, "data: [DONE]\n\n") {
		t.Fatalf("the stream open during the panics did not end whole:\n%s", s)
	}
	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"x"}]}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the panics: %d", resp.StatusCode)
	}
	metrics := readAll(t, mustGet(t, e.URL+"/metrics").Body)
	if !strings.Contains(metrics, "moonji_panics_total 3") {
		t.Errorf("moonji_panics_total is not 3")
	}
}

func mustGet(t *testing.T, url string) *http.Response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestTranslatedResponsesValidateTheirFields: a Responses request translated
// for a chat-only backend is checked for the fields the gateway translates:
// max_output_tokens of -1 or 1e30 (and temperature, top_p out of range) get
// a 400 in OpenAI's shape naming the field the client sent, before the
// engine sees anything — not the engine's chat error naming max_tokens.
func TestTranslatedResponsesValidateTheirFields(t *testing.T) {
	e := startTranslatingEnv(t, mockllm.Options{Tokens: 4})
	for _, c := range []struct{ field, value string }{
		{"max_output_tokens", "-1"}, {"max_output_tokens", "1e30"}, {"max_output_tokens", "0"},
		{"max_output_tokens", "2.5"}, {"temperature", "3"}, {"top_p", "-0.5"},
	} {
		for _, stream := range []string{"false", "true"} {
			resp := e.postPath(context.Background(), "/v1/responses",
				`{"model":"m1","stream":`+stream+`,"input":"x","`+c.field+`":`+c.value+`}`)
			body := readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || gjson.Get(body, "error.param").Str != c.field ||
				gjson.Get(body, "error.type").Str != "invalid_request_error" || gjson.Get(body, "error.code").Type != gjson.String {
				t.Errorf("%s: %s answered %d %s", c.field, c.value, resp.StatusCode, body)
			}
			if row := e.final(resp.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeRejected || row.Status != 400 {
				t.Errorf("%s: %s left row %+v", c.field, c.value, row)
			}
		}
	}
	if n := len(e.Mock.Requests()); n != 0 {
		t.Errorf("the engine got %d requests", n)
	}
}
