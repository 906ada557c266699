package web_test

import (
	"bufio"
	"context"
	"encoding/json"

	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// rawRequest writes a chat completion request on a fresh connection and
// returns it, without reading anything.
func rawRequest(t *testing.T, e *testEnv, body, after string, dial *net.Dialer) net.Conn {
	t.Helper()
	if dial == nil {
		dial = &net.Dialer{}
	}
	conn, err := dial.Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + e.Key +
		"\r\nContent-Type: application/json\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n" + body + after
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// smallReceiveBuffer dials with a tiny receive buffer, so that a client
// that does not read fills its socket soon.
func smallReceiveBuffer() *net.Dialer {
	return &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
}

// inFlight reads the backend's in-flight gauge from /metrics.
func inFlight(t *testing.T, e *testEnv) float64 {
	return metricValue(t, e, "moonji_backend_in_flight", `backend="mock"`)
}

// waitFor polls ok until it holds, failing the test after d; onFail, if
// given, runs first (to log what was found).
func waitFor(t *testing.T, what string, d time.Duration, ok func() bool, onFail ...func()) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			for _, f := range onFail {
				f()
			}
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A client that stops reading but keeps its socket open loses its stream
// after stream_write_timeout: the slot is freed, the engine's request
// cancelled, the row cancelled/client_stalled.
func TestStalledClientFreesItsSlot(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) {
		c.StreamWriteTimeout = 300 * time.Millisecond
		c.Backends[0].MaxConcurrency = 1
	})
	conn := rawRequest(t, e, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"stall","tokens":120000}}`, "", smallReceiveBuffer())
	_ = conn // never read
	rec, err := e.Mock.WaitFor(ctxTimeout(t, 30*time.Second), "stall", func(r mockllm.Record) bool { return r.Cancelled })
	if err != nil {
		t.Fatal("the engine's request was never cancelled for a client that stopped reading:", err)
	}
	if rec.Completed {
		t.Fatal("the engine finished the whole stream: the test did not stall the client")
	}
	row := e.final(lastRowID(t, e))
	if row.Outcome != models.OutcomeCancelled || row.Reason != "client_stalled" {
		t.Errorf("row = %+v, want cancelled/client_stalled", row)
	}
	if row.CompletionTokens == 0 || row.PromptTokens == 0 || row.UsageSource != models.UsageEstimated {
		t.Errorf("a stalled stream is billed for what was generated and the prompt: %+v", row)
	}
	waitFor(t, "slot freed", 2*time.Second, func() bool { return inFlight(t, e) == 0 })
	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tokens":3}}`)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the next request: %d %s", resp.StatusCode, readAll(t, resp.Body))
	}
}

// The backend's timeout bounds the whole request, relay included, whether
// the client reads or not.
func TestBackendTimeoutBoundsTheRelay(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) {
		c.Backends[0].Timeout = 700 * time.Millisecond
		c.StreamWriteTimeout = time.Minute
	})
	t.Run("reading", func(t *testing.T) {
		start := time.Now()
		resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":20,"tokens":1000}}`)
		body := readAll(t, resp.Body)
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("stream lasted %v past a 700ms timeout", d)
		}
		if !strings.Contains(body, `"code":"upstream_timeout"`) {
			t.Errorf("stream end: %q", tail(body))
		}
		row := e.final(resp.Header.Get("X-Inference-Id"))
		if row.Outcome != models.OutcomeError || row.Reason != "upstream_timeout" {
			t.Errorf("row = %+v", row)
		}
	})
	t.Run("not reading", func(t *testing.T) {
		rawRequest(t, e, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"nr","tokens":120000}}`, "", smallReceiveBuffer())
		if _, err := e.Mock.WaitFor(ctxTimeout(t, 10*time.Second), "nr", func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
			t.Fatal("a non-reading client kept its request past the backend timeout:", err)
		}
		row := e.final(lastRowID(t, e))
		if row.Outcome != models.OutcomeError || row.Reason != "upstream_timeout" {
			t.Errorf("row = %+v, want error/upstream_timeout", row)
		}
	})
}

// A client that half-closes after its request (shutdown of its sending
// side) but still reads gets its whole answer.
func TestHalfClosedClientGetsItsAnswer(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	for _, c := range []struct{ name, body, want string }{
		{"non-streaming", `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"ttft_ms":300,"tokens":3}}`, `"finish_reason":"length"`},
		{"stream", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"ttft_ms":300,"tokens":3}}`, "data: [DONE]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn := rawRequest(t, e, c.body, "", nil)
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			var resp *http.Response
			for {
				r, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				if r.StatusCode >= 200 {
					resp = r
					break
				}
			}
			body := readAll(t, resp.Body)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, c.want) {
				t.Fatalf("answer: %d %q", resp.StatusCode, tail(body))
			}
			row := e.final(resp.Header.Get("X-Inference-Id"))
			if row.Outcome != models.OutcomeSuccess {
				t.Errorf("row = %+v", row)
			}
		})
	}
}

// An engine that writes an error into its 200 stream (then [DONE]) failed
// the request: every SDK raises it, and the row says so.
func TestErrorInsideAStreamIsAnError(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tokens":20,"stream_error_after":3}}`)
	body := readAll(t, resp.Body)
	if !strings.Contains(body, `"error":{"message":"The engine failed`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("the engine's stream was not relayed as written: %q", body)
	}
	row := e.final(resp.Header.Get("X-Inference-Id"))
	if row.Outcome != models.OutcomeError || row.Reason != "upstream_stream_error" {
		t.Errorf("row = %+v, want error/upstream_stream_error", row)
	}
}

// A request that waited in the queue and then left records how long it
// waited.
func TestQueueWaitOfARequestThatLeftTheQueue(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) { c.Backends[0].MaxConcurrency = 1 })
	holder := startStream(t, e, e.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":10,"tokens":30}}`)
	conn := rawRequest(t, e, `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tag":"q"}}`, "", nil)
	time.Sleep(400 * time.Millisecond)
	conn.Close()
	var id string
	waitFor(t, "queued row", 3*time.Second, func() bool {
		_ = e.srv.Ledger.Flush(context.Background())
		var rows []models.Usage
		e.DB.Where("inference_id <> ? AND outcome = ?", holder.id, models.OutcomeCancelled).Find(&rows)
		if len(rows) == 1 {
			id = rows[0].InferenceID
		}
		return id != ""
	})
	row := e.final(id)
	if row.QueueMs < 350 || row.PromptTokens != 0 {
		t.Errorf("row = %+v, want queue_ms ≥ 350 and nothing billed", row)
	}
}

// A stopped stream ends as a complete one: a chunk with finish_reason for
// the choice, with the stream's own id, model and created, then usage and
// [DONE]. Billing counts what was delivered and estimates the prompt.
func TestStoppedStreamIsWellFormedAndBilled(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	s := startStream(t, e, e.Key, `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Tell me a long story about a lighthouse keeper."}],"mock":{"tps":50,"tokens":1000}}`)
	waitContent(t, s, 5)
	if ans := cancelVia(t, e, e.Key, s.id); ans.status != http.StatusOK {
		t.Fatalf("cancel: %d %v", ans.status, ans.body)
	}
	body := s.wait(t)
	var first, finish, usage map[string]any
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("frame %q: %v", data, err)
		}
		if first == nil {
			first = m
		}
		if ch, _ := m["choices"].([]any); len(ch) > 0 {
			if fr := ch[0].(map[string]any)["finish_reason"]; fr != nil {
				finish = m
			}
		}
		if m["usage"] != nil {
			usage = m
		}
	}
	if finish == nil {
		t.Fatalf("no chunk with finish_reason: %q", tail(body))
	}
	for _, k := range []string{"id", "model", "created"} {
		if finish[k] != first[k] || usage == nil || usage[k] != first[k] {
			t.Errorf("%s: first %v, finish %v, usage %v", k, first[k], finish[k], usage)
		}
	}
	if !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("end: %q", tail(body))
	}
	row := e.final(s.id)
	delivered := s.contentCount()
	if row.Outcome != models.OutcomeStopped || row.CompletionTokens < delivered || row.PromptTokens == 0 ||
		row.UsageSource != models.UsageEstimated {
		t.Errorf("row = %+v, want stopped with ≥ %d completion tokens and an estimated prompt", row, delivered)
	}
	u := usage["usage"].(map[string]any)
	if int(u["completion_tokens"].(float64)) != row.CompletionTokens || int(u["prompt_tokens"].(float64)) != row.PromptTokens {
		t.Errorf("usage chunk %v disagrees with the row %+v", u, row)
	}
}

// An unknown model names the field at fault, as OpenAI does.
func TestErrorsNameTheParam(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	resp := e.post(`{"model":"nope","messages":[]}`)
	body := readAll(t, resp.Body)
	if resp.StatusCode != http.StatusNotFound || gjson.Get(body, "error.param").Str != "model" {
		t.Errorf("unknown model: %d %s", resp.StatusCode, body)
	}
	resp = e.post(`{"model":"m1","stream":"yes","messages":[]}`)
	body = readAll(t, resp.Body)
	if resp.StatusCode != http.StatusBadRequest || gjson.Get(body, "error.param").Str != "stream" {
		t.Errorf("bad stream: %d %s", resp.StatusCode, body)
	}
}
