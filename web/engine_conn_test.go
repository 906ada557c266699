package web_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/models"
)

// TestStreamsKeepTheirEngineConnection: streams sent one after another go
// over one connection to the engine, although the engine writes the end
// of each chunked body after its last frame, as Go's net/http (when the
// handler returns) and uvicorn do: the relay is over by then, and closing
// the connection because its end had not come made every such stream's
// successor dial anew (~1 ms on the first byte in BENCHMARKS.md §38).
func TestStreamsKeepTheirEngineConnection(t *testing.T) {
	chat := "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n" +
		"data: [DONE]\n\n"
	resp := "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"output\":[]}}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1,\"total_tokens\":4}}}\n\n"
	var conns atomic.Int64
	engine := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.HasSuffix(r.URL.Path, "/responses") {
			io.WriteString(w, resp)
		} else {
			io.WriteString(w, chat)
		}
		w.(http.Flusher).Flush()
		time.Sleep(5 * time.Millisecond) // the body's end: once the handler returns
	}))
	engine.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	engine.Start()
	t.Cleanup(engine.Close)
	cfg := &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/m.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends: []config.Backend{{Name: "e", URL: engine.URL + "/v1", MaxConcurrency: 4, MaxQueue: 4,
			APIs: []string{"chat", "responses"}}},
		Models: []config.Model{{Name: "m1", Backend: "e"}},
	}
	e := startWithConfig(t, cfg, nil, engine.URL)

	for _, c := range []struct{ path, body, want string }{
		{"/v1/chat/completions", `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`, chat},
		{"/v1/responses", `{"model":"m1","stream":true,"input":"x"}`, resp},
	} {
		before := conns.Load()
		for i := range 5 {
			r := e.postPath(context.Background(), c.path, c.body)
			if got := readAll(t, r.Body); got != c.want {
				t.Fatalf("%s stream %d: relayed %q, want %q", c.path, i, got, c.want)
			}
			r.Body.Close()
			if row := e.final(r.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeSuccess {
				t.Fatalf("%s stream %d: outcome %s", c.path, i, row.Outcome)
			}
			time.Sleep(20 * time.Millisecond) // the engine's end has come by the next stream
		}
		if n := conns.Load() - before; n > 1 {
			t.Errorf("%s: 5 streams one after another took %d new engine connections, want at most 1", c.path, n)
		}
	}
}
