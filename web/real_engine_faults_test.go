package web_test

import (
	"bufio"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/faultproxy"
	"moonji/models"
)

// realEngine is the real Ollama that `make test-engine` starts
// (scripts/test-engine.sh sets MOONJI_TEST_OLLAMA_URL and runs this test
// after its SDK suite); without it the test skips.
func realEngine(t *testing.T) *url.URL {
	t.Helper()
	raw := os.Getenv("MOONJI_TEST_OLLAMA_URL")
	if raw == "" {
		t.Skip("no real engine: `make test-engine` runs this against Ollama (MOONJI_TEST_OLLAMA_URL)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// A real engine (Ollama serving a real model) whose connection is cut while
// its answer streams: the client gets what had come and the API's error
// event, the row says error / upstream_disconnected, the slot is free at
// once, the backend is down until its probe passes, and then answers again.
func TestRealEngineCutMidStream(t *testing.T) {
	engine := realEngine(t)
	p := faultproxy.Start(t, engine.Host)
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(0), func(c *config.Config) {
		c.Backends = []config.Backend{{Name: "ollama", URL: "http://" + p.Addr() + engine.Path, MaxConcurrency: 1,
			MaxQueue: 4, QueueTimeout: 30 * time.Second, Timeout: time.Minute}}
		c.Models = []config.Model{{Name: "real-tiny", Backend: "ollama", UpstreamModel: "tiny"}}
		c.Health.Backoff, c.Health.MaxBackoff = 200*time.Millisecond, time.Second
	})
	// Slowed to a trickle, so that the cut lands mid-answer however fast
	// the tiny model writes.
	p.Bandwidth(1)
	resp := e.post(`{"model":"real-tiny","stream":true,"max_tokens":400,"messages":[{"role":"user","content":"Once upon a time"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d %s", resp.StatusCode, readAll(t, resp.Body))
	}
	br := bufio.NewReader(resp.Body)
	var got strings.Builder
	for !strings.Contains(got.String(), `"content":"`) {
		line, err := br.ReadString('\n')
		got.WriteString(line)
		if err != nil {
			t.Fatalf("before the first content chunk: %v\n%s", err, got.String())
		}
	}
	p.Down() // the engine's connection is gone mid-answer
	rest, _ := readAllQuiet(&http.Response{Body: readCloser{br, resp.Body}})
	body := got.String() + string(rest)
	if strings.Contains(body, "[DONE]") || !strings.Contains(body, `"code":"upstream_disconnected"`) {
		t.Fatalf("a stream cut mid-answer should end with the error event, no [DONE]; ends %q", tail(body))
	}
	row := e.final(resp.Header.Get("X-Inference-Id"))
	if row.Outcome != models.OutcomeError || row.Reason != "upstream_disconnected" || row.CompletionTokens == 0 {
		t.Fatalf("row = %+v, want error/upstream_disconnected with the chunks delivered billed", row)
	}
	waitFor(t, "slot freed", 5*time.Second, func() bool {
		return metricValue(t, e, "moonji_backend_in_flight", `backend="ollama"`) == 0
	})
	if up := metricValue(t, e, "moonji_backend_up", `backend="ollama"`); up != 0 {
		t.Fatalf("moonji_backend_up = %v after the engine cut an answer, want 0 until its probe passes", up)
	}
	p.Clear()
	p.Up()
	waitFor(t, "the engine back after its probe", 20*time.Second, func() bool {
		return metricValue(t, e, "moonji_backend_up", `backend="ollama"`) == 1
	})
	again := e.post(`{"model":"real-tiny","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"Once upon a time"}]}`)
	if b := readAll(t, again.Body); again.StatusCode != http.StatusOK || !strings.HasSuffix(b, "data: [DONE]\n\n") {
		t.Fatalf("after the engine came back: %d, ends %q", again.StatusCode, tail(b))
	}
}

// readCloser reads the rest of a body through the reader that already
// took its first lines.
type readCloser struct {
	r *bufio.Reader
	c interface{ Close() error }
}

func (rc readCloser) Read(p []byte) (int, error) { return rc.r.Read(p) }
func (rc readCloser) Close() error               { return rc.c.Close() }
