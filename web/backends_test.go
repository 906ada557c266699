package web_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// killableEngine is a mock engine on a fixed address that can be killed
// (every connection cut, the port refusing) and started again on the same
// address. It counts the chat requests it serves and the peak of those
// running at once.
type killableEngine struct {
	t    testing.TB
	mock *mockllm.Server
	addr string

	mu  sync.Mutex
	srv *http.Server

	running, peak, served atomic.Int64
}

func startKillableEngine(t testing.TB, models ...string) *killableEngine {
	t.Helper()
	k := &killableEngine{t: t, mock: mockllm.New(mockllm.Options{Models: models,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k.addr = ln.Addr().String()
	k.serve(ln)
	t.Cleanup(k.kill)
	return k
}

func (k *killableEngine) URL() string { return "http://" + k.addr + "/v1" }

func (k *killableEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/chat/completions") {
		k.served.Add(1)
		n := k.running.Add(1)
		defer k.running.Add(-1)
		for {
			p := k.peak.Load()
			if n <= p || k.peak.CompareAndSwap(p, n) {
				break
			}
		}
	}
	k.mock.ServeHTTP(w, r)
}

func (k *killableEngine) serve(ln net.Listener) {
	srv := &http.Server{Handler: k}
	k.mu.Lock()
	k.srv = srv
	k.mu.Unlock()
	go srv.Serve(ln)
}

// kill closes the listener and every connection at once, as a crashed
// engine would: running streams are cut, new connections refused.
func (k *killableEngine) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.srv != nil {
		k.srv.Close()
		k.srv = nil
	}
}

// restart serves again on the same address.
func (k *killableEngine) restart() {
	k.t.Helper()
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", k.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		k.t.Fatalf("restart the engine on %s: %v", k.addr, err)
	}
	k.serve(ln)
}

// readyz returns the backends part of /readyz.
func readyzBackends(t *testing.T, e *testEnv) map[string]map[string]any {
	t.Helper()
	resp, err := http.Get(e.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Backends map[string]map[string]any `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Backends
}

// TestModelOnThreeBackendsSurvivesOneDying: three engines behind one model.
// One dies while it streams: its stream ends with an error (after the first
// byte a request is never retried), which takes the backend down at once,
// and it gets nothing until a probe finds it back. Dying again while idle,
// nothing tells it: the next request sent to it goes to another backend
// (retried before its first byte), and it is down from then.
func TestModelOnThreeBackendsSurvivesOneDying(t *testing.T) {
	engines := map[string]*killableEngine{}
	var backends []config.Backend
	for _, name := range []string{"a", "b", "c"} {
		engines[name] = startKillableEngine(t, "m1")
		backends = append(backends, config.Backend{Name: name, URL: engines[name].URL(), MaxConcurrency: 8, MaxQueue: 32,
			QueueTimeout: 5 * time.Second})
	}
	e := startWithConfig(t, &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/m.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends:    backends,
		Models:      []config.Model{{Name: "m1", Backends: []string{"a", "b", "c"}}},
		Health:      config.Health{Backoff: 100 * time.Millisecond, MaxBackoff: 300 * time.Millisecond, ProbeTimeout: time.Second},
	}, nil, "")
	ask := func(body string) (*http.Response, string) {
		resp := e.post(body)
		data := readAll(t, resp.Body)
		resp.Body.Close()
		return resp, data
	}
	const plain = `{"model":"m1","messages":[{"role":"user","content":"hi"}],"mock":{"tokens":2}}`

	// Idle backends: requests spread over all three.
	for range 30 {
		if resp, body := ask(plain); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	for name, k := range engines {
		if k.served.Load() == 0 {
			t.Fatalf("engine %s served none of 30 requests", name)
		}
	}

	// Three streams at once: the least loaded choice puts one on each.
	type stream struct {
		id   string
		body *bufio.Reader
		resp *http.Response
	}
	var streams []stream
	before := map[string]int64{}
	for name, k := range engines {
		before[name] = k.served.Load()
	}
	for range 3 {
		resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"long"}],"mock":{"tps":20,"tokens":400}}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream status %d", resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil { // the first frame: the answer has started
			t.Fatal(err)
		}
		streams = append(streams, stream{id: resp.Header.Get("X-Inference-Id"), body: br, resp: resp})
		defer resp.Body.Close()
	}
	for name, k := range engines {
		if got := k.served.Load() - before[name]; got != 1 {
			t.Fatalf("engine %s took %d of the 3 concurrent streams, want 1", name, got)
		}
	}

	// b dies. Its stream had started: it ends with an error event, no retry.
	engines["b"].kill()
	// The stream on b ends at once; the two others run on.
	ended := make(chan int, len(streams))
	for i := range streams {
		go func() {
			rest, _ := io.ReadAll(streams[i].body)
			if strings.Contains(string(rest), "upstream_disconnected") {
				ended <- i
			}
		}()
	}
	var onB *stream
	select {
	case i := <-ended:
		onB = &streams[i]
	case <-time.After(5 * time.Second):
		t.Fatal("no stream saw b die")
	}
	for i := range streams {
		if &streams[i] != onB {
			streams[i].resp.Body.Close()
		}
	}
	row := e.final(onB.id)
	if row.Backend != "b" || row.RetriedFrom != "" || row.Outcome != models.OutcomeError {
		t.Fatalf("cut stream's row: backend %q retried_from %q outcome %s/%s; want b, no retry, error", row.Backend, row.RetriedFrom, row.Outcome, row.Reason)
	}

	// The broken stream took b down: no request goes to it, none is
	// retried.
	askAll := func(n int) (retried int) {
		t.Helper()
		var ids []string
		for range n {
			resp, body := ask(plain)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("while b is dead: status %d: %s", resp.StatusCode, body)
			}
			ids = append(ids, resp.Header.Get("X-Inference-Id"))
		}
		for _, id := range ids {
			row := e.final(id)
			if row.Backend == "b" {
				t.Fatalf("request %s was served by the dead backend", id)
			}
			if row.RetriedFrom != "" {
				retried++
				if row.RetriedFrom != "b" || row.Outcome != models.OutcomeSuccess {
					t.Fatalf("retried row: %+v", row)
				}
			}
		}
		return retried
	}
	if retried := askAll(20); retried != 0 {
		t.Fatalf("%d requests were retried; b was down from its broken stream on", retried)
	}
	if st := readyzBackends(t, e)["b"]; st["up"] != false || st["reason"] != "the stream broke off" {
		t.Fatalf("/readyz for b = %v, want down (the stream broke off)", st)
	}
	if v := metricValue(t, e, "moonji_backend_up", `backend="b"`); v != 0 {
		t.Fatalf("moonji_backend_up{b} = %v, want 0", v)
	}
	if v := metricValue(t, e, "moonji_backend_retries_total", `backend="b"`); v != 0 {
		t.Fatalf("moonji_backend_retries_total{b} = %v, want 0", v)
	}
	if v := metricValue(t, e, "moonji_backend_up", `backend="a"`); v != 1 {
		t.Fatalf("moonji_backend_up{a} = %v, want 1", v)
	}

	// b comes back: a probe finds it, and it takes traffic again.
	servedBefore := engines["b"].served.Load()
	engines["b"].restart()
	waitFor(t, "b to be probed back up", 5*time.Second, func() bool { return readyzBackends(t, e)["b"]["up"] == true })
	if got := engines["b"].served.Load(); got != servedBefore {
		t.Fatalf("b served %d chat requests before any was sent to it: the probe must use GET /models", got-servedBefore)
	}
	for range 30 {
		if resp, body := ask(plain); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	if engines["b"].served.Load() == servedBefore {
		t.Fatal("b took no traffic after it came back")
	}
	if v := metricValue(t, e, "moonji_backend_up", `backend="b"`); v != 1 {
		t.Fatalf("moonji_backend_up{b} = %v after recovery, want 1", v)
	}

	// b dies again, idle: b looks up, so the first request sent to it fails
	// before its first byte (connection refused) and is retried elsewhere;
	// b is then down and no request goes to it.
	engines["b"].kill()
	if retried := askAll(40); retried != 1 {
		t.Fatalf("%d requests were retried, want exactly the first one sent to b", retried)
	}
	if st := readyzBackends(t, e)["b"]; st["up"] != false || st["reason"] != "unreachable" {
		t.Fatalf("/readyz for b = %v, want down (unreachable)", st)
	}
	if v := metricValue(t, e, "moonji_backend_retries_total", `backend="b"`); v != 1 {
		t.Fatalf("moonji_backend_retries_total{b} = %v, want 1", v)
	}
}

// TestRetryAfter5xxBeforeFirstByte: an engine answering 5xx is a failure
// before the first byte: the request is retried once on another backend,
// and the row says so. A 4xx is the client's own error: no retry.
func TestRetryAfter5xxBeforeFirstByte(t *testing.T) {
	a, b := startKillableEngine(t, "m1"), startKillableEngine(t, "m1")
	e := startWithConfig(t, &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/m.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends: []config.Backend{{Name: "a", URL: a.URL(), MaxConcurrency: 4, MaxQueue: 4},
			{Name: "b", URL: b.URL(), MaxConcurrency: 4, MaxQueue: 4}},
		Models: []config.Model{{Name: "m1", Backends: []string{"a", "b"}}},
		Health: config.Health{Backoff: time.Minute, MaxBackoff: time.Minute, ProbeTimeout: time.Second},
	}, nil, "")

	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"fail_status":400}}`)
	resp.Body.Close()
	row := e.final(resp.Header.Get("X-Inference-Id"))
	if resp.StatusCode != 400 || row.RetriedFrom != "" || a.served.Load()+b.served.Load() != 1 {
		t.Fatalf("a 400 was retried: status %d, retried_from %q, engines saw %d", resp.StatusCode, row.RetriedFrom, a.served.Load()+b.served.Load())
	}

	resp = e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"fail_status":503}}`)
	body := readAll(t, resp.Body)
	resp.Body.Close()
	row = e.final(resp.Header.Get("X-Inference-Id"))
	// Both engines fail this body: the client gets the second one's 503.
	if resp.StatusCode != 503 || !strings.Contains(body, "error") {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if row.RetriedFrom == "" || row.RetriedFrom == row.Backend || row.Status != 503 {
		t.Fatalf("row: backend %q retried_from %q status %d; want a retry on the other backend", row.Backend, row.RetriedFrom, row.Status)
	}
	if a.served.Load()+b.served.Load() != 3 {
		t.Fatalf("engines saw %d requests, want 3 (the 400, and the 503 twice: one retry)", a.served.Load()+b.served.Load())
	}
}

// TestWeightsSpreadTraffic: weights 3 and 1 on equal engines split
// sequential traffic about 3:1.
func TestWeightsSpreadTraffic(t *testing.T) {
	a, b := startKillableEngine(t, "m1"), startKillableEngine(t, "m1")
	e := startWithConfig(t, &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/m.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends: []config.Backend{{Name: "a", URL: a.URL(), MaxConcurrency: 4, Weight: 3},
			{Name: "b", URL: b.URL(), MaxConcurrency: 4, Weight: 1}},
		Models: []config.Model{{Name: "m1", Backends: []string{"a", "b"}}},
	}, nil, "")
	const n = 400
	for i := range n {
		resp := e.post(fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"%d"}],"mock":{"tokens":1}}`, i))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	share := float64(a.served.Load()) / n
	// 3:1 is 0.75; with 400 draws the standard deviation is about 0.022.
	if share < 0.68 || share > 0.82 {
		t.Fatalf("a (weight 3) served %.3f of the traffic (a=%d b=%d), want about 0.75", share, a.served.Load(), b.served.Load())
	}
	var rows []models.Usage
	e.srv.Ledger.Flush(t.Context())
	e.DB.Where("model = ?", "m1").Find(&rows)
	perBackend := map[string]int64{}
	for _, r := range rows {
		perBackend[r.Backend]++
	}
	if perBackend["a"] != a.served.Load() || perBackend["b"] != b.served.Load() {
		t.Fatalf("rows per backend %v, engines served a=%d b=%d", perBackend, a.served.Load(), b.served.Load())
	}
}
