package web_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/internal/engine"
	"moonji/internal/faultproxy"
	"moonji/internal/mockllm"
	"moonji/internal/proxy"
	"moonji/models"
)

// linkResult is one request of the load and what its client saw.
type linkResult struct {
	id           string
	stream       bool
	status       int
	body         string
	start, end   time.Time
	clientFailed error
}

// seen is what the client saw, as outcome/reason, or why it was not a
// well-formed answer.
func (r linkResult) seen() (string, error) {
	if r.clientFailed != nil {
		return "", fmt.Errorf("the request never ended well: %w", r.clientFailed)
	}
	if r.status != http.StatusOK {
		code := gjson.Get(r.body, "error.code").Str
		if code == "" || gjson.Get(r.body, "error.message").Str == "" {
			return "", fmt.Errorf("status %d without OpenAI's error shape: %q", r.status, r.body)
		}
		outcome := models.OutcomeError
		if r.status == http.StatusServiceUnavailable {
			outcome = models.OutcomeRejected
		}
		return outcome + "/" + code, nil
	}
	if !r.stream {
		if !gjson.Get(r.body, "choices.0.message").Exists() {
			return "", fmt.Errorf("a 200 that is not a completion: %q", r.body)
		}
		return models.OutcomeSuccess + "/", nil
	}
	if strings.HasSuffix(r.body, "data: [DONE]\n\n") && !strings.Contains(r.body, `{"error":`) {
		return models.OutcomeSuccess + "/", nil
	}
	var last string
	for _, line := range strings.Split(r.body, "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			last = d
		}
	}
	if code := gjson.Get(last, "error.code").Str; code != "" {
		return models.OutcomeError + "/" + code, nil
	}
	return "", fmt.Errorf("a stream that ends with neither [DONE] nor an error event: %q", tail(r.body))
}

// The engine link cut by a proxy every second or two while requests flow:
// the sessions in flight fail cleanly (engine_disconnected, in OpenAI's
// shape or as the stream's error event), requests made while the link is
// down wait and are sent once it is back, those that outwait the link's
// TTL are refused as engine_unavailable, every request leaves one row that
// says what its client saw — and when the load stops nothing is left: no
// session on either side, no slot, no goroutine.
func TestEngineLinkCutRepeatedly(t *testing.T) {
	const (
		workers = 6
		load    = 8 * time.Second
		ttl     = 2 * time.Second
	)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, ReplayDir: fixtures, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	t.Cleanup(ms.Close)
	eng, addr := startLinkedEngine(t, ms.URL+"/v1")
	p := faultproxy.Start(t, addr)
	cfg := &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/moonji.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends: []config.Backend{{Name: "e1", Kind: config.KindEngine, URL: "ws://" + p.Addr() + engine.Path,
			APIKey: "engine-secret", MaxConcurrency: 4, MaxQueue: 64, QueueTimeout: 5 * time.Second,
			Link: config.Link{PingInterval: time.Second, MessageTTL: ttl}}},
		Models: []config.Model{{Name: "m1", Backend: "e1"}},
		Health: config.Health{Backoff: 100 * time.Millisecond, MaxBackoff: 400 * time.Millisecond, ProbeTimeout: time.Second},
	}
	e := startWithConfig(t, cfg, mock, ms.URL)
	gauge := func(name string) float64 { return metricValue(t, e, name, `backend="e1"`) }
	waitFor(t, "the link to connect", 10*time.Second, func() bool { return gauge("moonji_engine_connected") == 1 })

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 30 * time.Second}
	post := func(stream bool, tag string) linkResult {
		body := fmt.Sprintf(`{"model":"m1","stream":false,"messages":[{"role":"user","content":"x"}],"mock":{"tag":%q,"ttft_ms":300,"tokens":5}}`, tag)
		if stream {
			body = fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":%q,"tps":60,"tokens":30}}`, tag)
		}
		r := linkResult{stream: stream, start: time.Now()}
		req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.Key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			r.clientFailed, r.end = err, time.Now()
			return r
		}
		r.id, r.status = resp.Header.Get("X-Inference-Id"), resp.StatusCode
		r.body, r.end = readAllOrErr(resp, &r.clientFailed), time.Now()
		return r
	}
	// Warm up: one of each, so that pools and the ledger have their
	// goroutines before the baseline is taken.
	var results []linkResult
	for _, stream := range []bool{true, false} {
		results = append(results, post(stream, "warm"))
	}
	baseline := moonjiGoroutines()

	// The load: workers sending one request after another.
	stop := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := post((w+i)%3 != 0, fmt.Sprintf("w%d-%d", w, i))
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
	// The cuts: every 1–2 s the proxy goes down (every connection through
	// it closed, new ones refused) for 0.2–0.6 s, or restarts at once; the
	// last cut outlasts the link's TTL.
	type window struct{ down, up time.Time }
	var windows []window
	began := time.Now()
	for time.Since(began) < load {
		time.Sleep(time.Duration(1000+rand.IntN(1000)) * time.Millisecond)
		w := window{down: time.Now()}
		if rand.IntN(3) == 0 {
			p.Restart()
		} else {
			p.Down()
			time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond)
			p.Up()
		}
		w.up = time.Now()
		windows = append(windows, w)
	}
	long := window{down: time.Now()}
	p.Down()
	time.Sleep(ttl + time.Second)
	p.Up()
	long.up = time.Now()
	windows = append(windows, long)
	waitFor(t, "the link to be back", 15*time.Second, func() bool { return gauge("moonji_engine_connected") == 1 })
	waitFor(t, "a request sent after the last cut to be answered over the link", 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range results {
			if r.start.After(long.up) && r.clientFailed == nil && r.status == http.StatusOK {
				return true
			}
		}
		return false
	})
	close(stop)
	wg.Wait()

	// Every request: a well-formed answer, and the one row that says the same.
	seen := map[string]int{}
	queuedAndServed, expired := 0, 0
	for _, r := range results {
		what, err := r.seen()
		if err != nil {
			t.Errorf("request %s (stream %t): %v", r.id, r.stream, err)
			continue
		}
		seen[what]++
		switch what {
		case "success/", "error/engine_disconnected", "rejected/engine_unavailable", "rejected/queue_timeout":
		default:
			t.Errorf("request %s (stream %t): %s: %q", r.id, r.stream, what, tail(r.body))
		}
		row := e.final(r.id)
		if got := row.Outcome + "/" + row.Reason; got != what {
			t.Errorf("request %s: the client saw %s, its row says %s", r.id, what, got)
		}
		for _, w := range windows {
			// Made after the cut and before the proxy was back, answered in
			// full: the cut connection could not carry it, so it waited for
			// the next one.
			if r.start.After(w.down) && r.start.Before(w.up) && what == "success/" {
				queuedAndServed++
			}
		}
		if what == "rejected/engine_unavailable" {
			// It outwaited the link's TTL, after whatever it waited for a
			// slot.
			expired++
			d := r.end.Sub(r.start)
			if d < ttl-100*time.Millisecond || d-time.Duration(row.QueueMs)*time.Millisecond > ttl+2*time.Second {
				t.Errorf("request %s was refused after %v (%d ms for a slot); the link's TTL is %v", r.id, d, row.QueueMs, ttl)
			}
			if !strings.Contains(r.body, "Retry after") {
				t.Errorf("request %s: %s", r.id, r.body)
			}
		}
	}
	t.Logf("%d requests, %d cuts: %v; %d sent while the link was down and served after it came back",
		len(results), len(windows), seen, queuedAndServed)
	if seen["error/engine_disconnected"] == 0 {
		t.Error("no session was in flight at a cut: the test cut nothing")
	}
	if queuedAndServed == 0 {
		t.Error("no request made while the link was down was served after it came back")
	}
	if expired == 0 {
		t.Error("no request outwaited the link's TTL")
	}
	if n := e.countRows(); n != int64(len(results)) {
		t.Errorf("%d rows for %d requests", n, len(results))
	}

	// Nothing left: no slot, no session on either side, no goroutine.
	client.CloseIdleConnections()
	waitFor(t, "nothing held", 15*time.Second, func() bool {
		b := e.srv.Gateway.Backends()[0]
		open, running := eng.Sessions()
		return b.InFlight == 0 && b.Queued == 0 && gauge("moonji_engine_sessions") == 0 &&
			gauge("moonji_engine_queued_messages") == 0 && open == 0 && running == 0
	}, func() {
		open, running := eng.Sessions()
		t.Logf("backend %+v; link sessions %v, queued %v; engine sessions %d, running %d", e.srv.Gateway.Backends()[0],
			gauge("moonji_engine_sessions"), gauge("moonji_engine_queued_messages"), open, running)
	})
	waitFor(t, "moonji's goroutines back to the baseline", 15*time.Second, func() bool {
		return moonjiGoroutines() <= baseline
	}, func() {
		t.Logf("%d of moonji's goroutines, baseline %d", moonjiGoroutines(), baseline)
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
	})
	if !e.srv.Health["e1"].Up() {
		t.Errorf("the backend is still down: %+v", e.srv.Health["e1"].State())
	}
}

// startLinkedEngine serves an engine (what `moonji engine` runs) of model
// m1 in front of upstream (a /v1 URL), and returns it and its address.
func startLinkedEngine(t *testing.T, upstream string) (*engine.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(engine.Options{Token: "engine-secret", Logger: quietLog(), PingInterval: time.Second,
		Models: []engine.Model{{Name: "m1", Upstream: proxy.Upstream{Name: "mock", BaseURL: upstream}}}})
	hs := &http.Server{Handler: eng}
	go hs.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = eng.Shutdown(ctx)
		hs.Close()
	})
	return eng, ln.Addr().String()
}

// moonjiGoroutines counts the goroutines running moonji's own code (the
// test's aside): the gateway's, the link's and the engine's. Pools of
// libraries (fasthttp's idle workers, the mock's kept-alive connections)
// come and go with the load and are left out.
func moonjiGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "moonji/") && !strings.Contains(g, "moonji/web_test.") {
			count++
		}
	}
	return count
}

// readAllOrErr reads a response body to its end, noting a read error.
func readAllOrErr(resp *http.Response, failed *error) string {
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			if !errors.Is(err, io.EOF) {
				*failed = err
			}
			return sb.String()
		}
	}
}
