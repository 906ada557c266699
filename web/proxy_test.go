package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// Bodies as real clients send them. The web UI of seed 002 sent explicit
// nulls; vLLM users send chat_template_kwargs and friends.
const (
	bodyWithNulls = `{"model":"m1","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello","name":null}],` +
		`"temperature":null,"max_tokens":null,"stream":null,"stream_options":null,"tools":null,"stats":null,` +
		`"chat_template_kwargs":{"enable_thinking":false},"reasoning_effort":"low","top_k":20,"x_unknown":{"nested":[1,2,{"a":null}]},` +
		`"mock":{"tag":"nulls","tokens":5}}`
	// The openai npm SDK's streaming body, key order and all.
	bodySDKStream = `{"messages":[{"role":"user","content":"Tell me a story"}],"model":"m1","max_tokens":6,"stream":true,"stream_options":{"include_usage":true},"mock":{"tag":"sdk"}}`
)

func TestPassthroughKeepsEveryByte(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		resp := e.post(bodyWithNulls)
		body := readAll(t, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		rec, err := e.Mock.WaitFor(context.Background(), "nulls", func(r mockllm.Record) bool { return r.Completed })
		if err != nil {
			t.Fatal(err)
		}
		// Not streamed, model not renamed: the engine sees the very bytes sent.
		if string(rec.Body) != bodyWithNulls {
			t.Errorf("engine got a different body:\n got %s\nwant %s", rec.Body, bodyWithNulls)
		}
		id := resp.Header.Get("X-Inference-Id")
		row := e.final(id)
		if row.Outcome != models.OutcomeSuccess || row.CompletionTokens != 5 || row.UsageSource != models.UsageFromEngine || row.PromptTokens == 0 {
			t.Errorf("row = %+v", row)
		}
		if gjson.Get(body, "usage.completion_tokens").Int() != 5 {
			t.Errorf("client body lost its usage: %s", body)
		}
	})
}

func TestStreamRewritesOnlyModelAndStreamOptions(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	cases := []struct {
		name, body, want string
	}{
		{"missing stream_options", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"a"}}`,
			`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"a"},"stream_options":{"include_usage":true}}`},
		{"null stream_options", `{"model":"m1","stream":true,"stream_options":null,"messages":[],"mock":{"tag":"b"}}`,
			`{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[],"mock":{"tag":"b"}}`},
		{"include_usage false", `{"model":"m1","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":false},"messages":[{"role":"user","content":"x"}],"mock":{"tag":"c"}}`,
			`{"model":"m1","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false},"messages":[{"role":"user","content":"x"}],"mock":{"tag":"c"}}`},
		{"renamed model", `{"model":"renamed","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}],"mock":{"tag":"d"}}`,
			`{"model":"upstream-name","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}],"mock":{"tag":"d"}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := e.post(c.body)
			readAll(t, resp.Body)
			tag := gjson.Get(c.body, "mock.tag").Str
			rec, err := e.Mock.WaitFor(context.Background(), tag, func(r mockllm.Record) bool { return r.Completed || r.Status >= 400 })
			if err != nil {
				t.Fatal(err)
			}
			if string(rec.Body) != c.want {
				t.Errorf("engine got\n %s\nwant\n %s", rec.Body, c.want)
			}
		})
	}
}

// Each recorded Ollama stream relayed through the gateway arrives byte for
// byte, minus the usage chunk when the client did not ask for it.
func TestRelayIsByteIdenticalToRecordedEngine(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	for _, c := range []struct {
		file      string
		wantUsage bool
	}{
		{"chat_stream.sse", true},
		{"chat_stream.sse", false},
		{"chat_stream_no_usage.sse", false},
		{"chat_stream_stop.sse", false},
		{"chat_stream_stop.sse", true},
	} {
		name := c.file
		if c.wantUsage {
			name += "+usage"
		}
		t.Run(name, func(t *testing.T) {
			body := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"Once upon a time"}],"mock":{"replay":"` + c.file + `"}}`
			if c.wantUsage {
				body = `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Once upon a time"}],"mock":{"replay":"` + c.file + `"}}`
			}
			resp := e.post(body)
			got := readAll(t, resp.Body)
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Errorf("Content-Type %q", ct)
			}
			want := mustFixture(t, c.file)
			if !c.wantUsage {
				if u := usageFrame(want); u != "" {
					want = strings.Replace(want, u, "", 1)
				}
			}
			if got != want {
				t.Fatalf("relay differs from the recording (%d vs %d bytes)\n got: %q\nwant: %q", len(got), len(want), tail(got), tail(want))
			}
			row := e.final(resp.Header.Get("X-Inference-Id"))
			if row.Outcome != models.OutcomeSuccess {
				t.Errorf("outcome %s", row.Outcome)
			}
			if u := usageFrame(mustFixture(t, c.file)); u != "" {
				wantTokens := gjson.Get(strings.TrimPrefix(strings.TrimSpace(u), "data: "), "usage.completion_tokens").Int()
				if int64(row.CompletionTokens) != wantTokens || row.UsageSource != models.UsageFromEngine {
					t.Errorf("row tokens %d (%s), want %d from the engine", row.CompletionTokens, row.UsageSource, wantTokens)
				}
			}
		})
	}
}

// Frames whose lines are longer than the relay's read buffer (1 KiB; lines
// of every length around one and two buffers) reach the client whole and
// byte for byte. A line one byte longer than the buffer once ended its
// frame early: the client got the frame without its blank line, and
// openai-node's finalResponse() came back without the response.completed
// event (Ollama's, 1,025 bytes long).
func TestRelayKeepsFramesWithLongLines(t *testing.T) {
	// line is a data line of exactly n bytes, its line feed included, of
	// the payload padded to length.
	line := func(n int, payload func(pad string) string) string {
		l := "data: " + payload("") + "\n"
		return "data: " + payload(strings.Repeat("x", n-len(l))) + "\n"
	}
	chunk := func(pad string) string {
		return `{"id":"chatcmpl-long","object":"chat.completion.chunk","created":1795979333,"model":"m1","choices":[{"index":0,"delta":{"content":"` + pad + `"},"finish_reason":null}]}`
	}
	var chat, resp strings.Builder
	chat.WriteString(line(200, chunk) + "\n")
	resp.WriteString("event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_long\",\"status\":\"in_progress\",\"output\":[]}}\n\n")
	seq := 1
	for _, around := range []int{1 << 10, 2 << 10} {
		for n := around - 3; n <= around+3; n++ {
			chat.WriteString(line(n, chunk) + "\n")
			crlf := line(n-1, chunk)
			chat.WriteString(strings.TrimSuffix(crlf, "\n") + "\r\n\r\n")
			delta := func(pad string) string {
				return `{"type":"response.output_text.delta","sequence_number":` + strconv.Itoa(seq) + `,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"` + pad + `"}`
			}
			resp.WriteString("event: response.output_text.delta\n" + line(n, delta) + "\n")
			seq++
		}
	}
	chat.WriteString("data: [DONE]\n\n")
	completed := func(pad string) string {
		return `{"type":"response.completed","sequence_number":` + strconv.Itoa(seq) + `,"response":{"id":"resp_long","status":"completed","metadata":{"pad":"` + pad + `"},"usage":{"input_tokens":3,"output_tokens":14,"total_tokens":17}}}`
	}
	resp.WriteString("event: response.completed\n" + line(1<<10+1, completed) + "\n")
	dir := recordings(t, map[string]string{"long.sse": chat.String(), "long_responses.sse": resp.String()})
	e := startEnvReplaying(t, "sqlite://"+t.TempDir()+"/m.db", dir, allAPIs)

	for _, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"replay":"long.sse"}}`, chat.String()},
		{"/v1/responses", `{"model":"m1","stream":true,"input":"x","mock":{"replay":"long_responses.sse"}}`, resp.String()},
	} {
		r := e.postPath(context.Background(), c.path, c.body)
		got := readAll(t, r.Body)
		r.Body.Close()
		if got != c.want {
			gf, wf := strings.SplitAfter(got, "\n\n"), strings.SplitAfter(c.want, "\n\n")
			for i := range min(len(gf), len(wf)) {
				if gf[i] != wf[i] {
					t.Fatalf("%s: frame %d differs (%d frames vs %d):\n got %q\nwant %q", c.path, i, len(gf), len(wf), tail(gf[i]), tail(wf[i]))
				}
			}
			t.Fatalf("%s: %d bytes relayed, the engine wrote %d", c.path, len(got), len(c.want))
		}
		if row := e.final(r.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeSuccess {
			t.Errorf("%s: outcome %s", c.path, row.Outcome)
		}
	}
}

// usageFrame is the usage chunk's frame of a recorded stream, "" if none.
func usageFrame(s string) string {
	for _, f := range strings.SplitAfter(s, "\n\n") {
		if strings.Contains(f, `"choices":[]`) {
			return f
		}
	}
	return ""
}

func tail(s string) string {
	if len(s) > 300 {
		return "…" + s[len(s)-300:]
	}
	return s
}

// The gateway always asks the engine for usage and records it; the client
// gets the usage chunk only when it asked.
func TestUsageInjectedAndStripped(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	resp := e.post(`{"model":"m1","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"one two three"}],"mock":{"tag":"strip"}}`)
	got := readAll(t, resp.Body)
	if strings.Contains(got, `"usage"`) {
		t.Errorf("usage chunk reached a client that did not ask: %s", got)
	}
	if !strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Errorf("stream does not end with [DONE]: %q", tail(got))
	}
	rec, _ := e.Mock.WaitFor(context.Background(), "strip", func(r mockllm.Record) bool { return r.Completed })
	if !rec.IncludeUsage {
		t.Error("the engine was not asked for include_usage")
	}
	row := e.final(resp.Header.Get("X-Inference-Id"))
	if row.CompletionTokens != 4 || row.PromptTokens == 0 || row.UsageSource != models.UsageFromEngine || row.TTFTMs == nil {
		t.Errorf("row = %+v", row)
	}

	resp = e.post(bodySDKStream)
	got = readAll(t, resp.Body)
	if n := strings.Count(got, `"usage"`); n != 1 {
		t.Errorf("want exactly one usage chunk, got %d: %s", n, got)
	}
}

// A client that leaves cancels the engine's work within a second: before the
// first token, mid-stream, and for a non-streamed request.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	cases := []struct {
		name, body string
		readBytes  int    // bytes to read before hanging up (0: hang up while waiting)
		after      string // bytes sent after the request (they once switched detection off)
	}{
		{"stream before first token", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"ttft","ttft_ms":30000}}`, 0, ""},
		{"stream while hanging", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"hang","hang":true}}`, 0, ""},
		{"mid-stream", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"mid","tps":5,"tokens":1000}}`, 400, ""},
		{"non-streaming", `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tag":"whole","ttft_ms":30000}}`, 0, ""},
		{"non-streaming, extra byte", `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tag":"x1","ttft_ms":30000}}`, 0, "x"},
		{"stream before first token, extra byte", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"x2","ttft_ms":30000}}`, 0, "x"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tag := gjson.Get(c.body, "mock.tag").Str
			conn := rawRequest(t, e, c.body, c.after, nil)
			var id string
			if c.readBytes > 0 {
				br := bufio.NewReader(conn)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				id = resp.Header.Get("X-Inference-Id")
				buf := make([]byte, c.readBytes)
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					t.Fatal(err)
				}
			} else {
				if _, err := e.Mock.WaitFor(ctxTimeout(t, 5*time.Second), tag, func(mockllm.Record) bool { return true }); err != nil {
					t.Fatal("engine never saw the request:", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			left := time.Now()
			conn.Close()
			rec, err := e.Mock.WaitFor(ctxTimeout(t, 5*time.Second), tag, func(r mockllm.Record) bool { return r.Cancelled })
			if err != nil {
				t.Fatal("the engine never saw the cancellation:", err)
			}
			if lag := rec.CancelledAt.Sub(left); lag > time.Second {
				t.Errorf("engine saw the cancellation %v after the client left; want < 1s", lag)
			}
			if id == "" {
				id = lastRowID(t, e)
			}
			row := e.final(id)
			if row.Outcome != models.OutcomeCancelled || row.Reason != "client_disconnected" {
				t.Errorf("row = %+v", row)
			}
			if c.readBytes > 0 && (row.CompletionTokens == 0 || row.PromptTokens == 0 || row.UsageSource != models.UsageEstimated) {
				t.Errorf("a cut stream should count its delivered chunks and estimate its prompt: %+v", row)
			}
		})
	}
}

func lastRowID(t *testing.T, e *testEnv) string {
	t.Helper()
	// A request's pending row waits in the ledger (its Begin is in the
	// journal) until it has run for a while; a Flush writes it.
	if err := e.srv.Ledger.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, err := models.ListUsage(context.Background(), e.DB, 1)
	if err != nil || len(rows) == 0 {
		t.Fatalf("no usage rows: %v", err)
	}
	return rows[0].InferenceID
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Every request leaves exactly one row, whatever happens to it.
func TestOneLedgerRowPerOutcome(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db, func(c *config.Config) {
			c.Backends = append(c.Backends, backendDown())
			c.Models = append(c.Models, modelOn("down-model", "down"))
		})
		revoked := e.newKey("revoked@example.com", 0)
		revokeAll(t, e, "revoked@example.com")
		cases := []struct {
			name, key, body string
			status          int
			outcome, reason string
			code            string
		}{
			{"success", e.Key, `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, 200, "success", "", ""},
			{"stream success", e.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`, 200, "success", "", ""},
			{"no key", "", `{"model":"m1","messages":[]}`, 401, "rejected", "unauthorized", "invalid_api_key"},
			{"bad key", "mj-bogusbogusbogusbogusbogus", `{"model":"m1","messages":[]}`, 401, "rejected", "unauthorized", "invalid_api_key"},
			{"revoked key", revoked, `{"model":"m1","messages":[]}`, 401, "rejected", "unauthorized", "invalid_api_key"},
			{"invalid json", e.Key, `{"model":"m1",`, 400, "rejected", "invalid_request", "invalid_request"},
			{"no model", e.Key, `{"messages":[]}`, 400, "rejected", "invalid_request", "invalid_request"},
			{"stream not bool", e.Key, `{"model":"m1","stream":"yes","messages":[]}`, 400, "rejected", "invalid_request", "invalid_request"},
			{"unknown model", e.Key, `{"model":"gpt-17","messages":[]}`, 404, "rejected", "model_not_found", "model_not_found"},
			{"engine 500", e.Key, `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"fail_status":500}}`, 500, "error", "upstream_500", ""},
			{"engine 429", e.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"fail_status":429}}`, 429, "error", "upstream_429", ""},
			{"engine down", e.Key, `{"model":"down-model","messages":[{"role":"user","content":"x"}]}`, 502, "error", "upstream_unreachable", "upstream_unreachable"},
			{"engine tears stream", e.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"disconnect_after":3}}`, 200, "error", "upstream_disconnected", ""},
		}
		before := e.countRows()
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				resp := e.postWith(context.Background(), c.key, c.body)
				body := readAll(t, resp.Body)
				if resp.StatusCode != c.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
				}
				id := resp.Header.Get("X-Inference-Id")
				if !strings.HasPrefix(id, "inf_") {
					t.Fatalf("X-Inference-Id = %q", id)
				}
				if c.status >= 400 {
					var e struct {
						Error struct {
							Message string          `json:"message"`
							Type    string          `json:"type"`
							Code    json.RawMessage `json:"code"`
						} `json:"error"`
					}
					if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
						t.Errorf("not OpenAI's error format: %s", body)
					}
					// Engines' own errors are relayed as they are (vLLM's
					// code is a number); the gateway's codes are strings.
					if c.code != "" && string(e.Error.Code) != strconv.Quote(c.code) {
						t.Errorf("code = %s, want %q (%s)", e.Error.Code, c.code, body)
					}
				}
				row := e.final(id)
				if row.Outcome != c.outcome || row.Reason != c.reason {
					t.Errorf("row outcome/reason = %s/%s, want %s/%s", row.Outcome, row.Reason, c.outcome, c.reason)
				}
				if c.status != 200 && row.Status != c.status {
					t.Errorf("row status %d, want %d", row.Status, c.status)
				}
				if c.name == "engine tears stream" && (!strings.Contains(body, `"error"`) || row.CompletionTokens != 3) {
					t.Errorf("torn stream: body %q, row %+v", tail(body), row)
				}
			})
		}
		if got := e.countRows() - before; got != int64(len(cases)) {
			t.Errorf("%d rows for %d requests", got, len(cases))
		}
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

// Frames reach the client as the engine writes them, not at the end.
func TestStreamIsNotBuffered(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	s := startStream(t, e, e.Key, `{"model":"m1","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"x"}],"mock":{"tps":20}}`)
	s.wait(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	var first, last time.Time
	for _, f := range s.frames {
		if f.content {
			if first.IsZero() {
				first = f.at
			}
			last = f.at
		}
	}
	if spread := last.Sub(first); spread < 300*time.Millisecond {
		t.Errorf("10 tokens at 20/s arrived within %v: the relay buffers", spread)
	}
}
