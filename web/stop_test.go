package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/testredis"
	"moonji/models"
)

// cluster is several gateway replicas sharing one database, one Redis and
// one mock engine, each on its own port.
type cluster struct {
	replicas []*testEnv
	mock     *mockllm.Server
	be       *testredis.Backend // be.Mini is nil when running against a real Redis
}

// startCluster starts n replicas on miniredis and SQLite, or on the real
// Redis and PostgreSQL when MOONJI_TEST_REDIS_URL / MOONJI_TEST_POSTGRES_DSN
// are set (with a fresh schema and key prefix).
func startCluster(t *testing.T, n int, real bool, opts ...envOption) *cluster {
	t.Helper()
	c := &cluster{}
	dbURL := "sqlite://" + t.TempDir() + "/cluster.db"
	if real {
		c.be = testredis.Real(t)
		if dsn := os.Getenv("MOONJI_TEST_POSTGRES_DSN"); dsn != "" {
			dbURL = freshPostgresSchema(t, dsn)
		}
	} else {
		c.be = testredis.Mini(t)
	}
	c.mock = mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ms := httptest.NewServer(c.mock)
	t.Cleanup(ms.Close)
	var key string
	for i := 0; i < n; i++ {
		cfg := &config.Config{
			DatabaseURL: dbURL,
			RedisURL:    c.be.URL,
			RedisPrefix: c.be.Prefix, // fresh: a real Redis is shared with other tests and runs
			ReplicaID:   fmt.Sprintf("replica-%c-%d", 'A'+i, time.Now().UnixNano()),
			RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
			Backends:    []config.Backend{{Name: "mock", URL: ms.URL + "/v1", MaxConcurrency: 32, MaxQueue: 32, QueueTimeout: 10 * time.Second}},
			Models:      []config.Model{{Name: "m1", Backend: "mock"}},
		}
		for _, o := range opts {
			o(cfg)
		}
		e := startWithConfig(t, cfg, c.mock, ms.URL)
		if key == "" {
			key = e.Key
		}
		e.Key = key // one key, valid on every replica
		c.replicas = append(c.replicas, e)
	}
	return c
}

// streamed is a stream being read in the background.
type streamed struct {
	id      string
	started time.Time // when its answer's header arrived
	mu      sync.Mutex
	frames  []frameAt
	done    chan struct{}
	body    strings.Builder
}

type frameAt struct {
	at      time.Time
	content bool
	data    string
}

// startStream posts a stream to e and reads it frame by frame, recording
// when each frame arrived.
func startStream(t *testing.T, e *testEnv, key, body string) *streamed {
	t.Helper()
	resp := e.postWith(context.Background(), key, body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d: %s", resp.StatusCode, readAll(t, resp.Body))
	}
	s := &streamed{id: resp.Header.Get("X-Inference-Id"), started: time.Now(), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			s.mu.Lock()
			s.body.WriteString(line)
			if strings.HasPrefix(line, "data: ") {
				data := strings.TrimSpace(strings.TrimPrefix(line, "data: "))
				s.frames = append(s.frames, frameAt{at: time.Now(), data: data,
					content: strings.Contains(data, `"content":"`) && !strings.Contains(data, `"content":""`)})
			}
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *streamed) contentCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.frames {
		if f.content {
			n++
		}
	}
	return n
}

// contentAfter counts content frames that arrived after t.
func (s *streamed) contentAfter(t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.frames {
		if f.content && f.at.After(t) {
			n++
		}
	}
	return n
}

func (s *streamed) wait(t *testing.T) string {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end within 10s of the stop")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.body.String()
}

func waitContent(t *testing.T, s *streamed, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.contentCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d content chunks after 5s", s.contentCount())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type stopAnswer struct {
	status int
	body   map[string]any
	at     time.Time
}

// cancel stops id through replica e's API endpoint.
func cancelVia(t *testing.T, e *testEnv, key, id string) stopAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/inferences/"+id+"/cancel", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("cancel: %v", err)
	}
	at := time.Now()
	raw := readAll(t, resp.Body)
	var body map[string]any
	_ = json.Unmarshal([]byte(raw), &body)
	return stopAnswer{status: resp.StatusCode, body: body, at: at}
}

func TestStopAcrossReplicas(t *testing.T) {
	for _, real := range realModes(t) {
		t.Run(modeName(real), func(t *testing.T) {
			c := startCluster(t, 3, real)
			a, b := c.replicas[0], c.replicas[1]
			tag := fmt.Sprintf("x-%d", time.Now().UnixNano())
			s := startStream(t, a, a.Key, `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}],"mock":{"tag":"`+tag+`","tps":50,"tokens":1000}}`)
			waitContent(t, s, 5)

			ans := cancelVia(t, b, b.Key, s.id)
			if ans.status != http.StatusOK || ans.body["state"] != "stopped" || ans.body["acknowledged"] != true {
				t.Fatalf("stop through B: %d %v", ans.status, ans.body)
			}
			body := s.wait(t)
			if n := s.contentAfter(ans.at); n != 0 {
				t.Errorf("%d content chunks reached the client after the stop's 200", n)
			}
			if !strings.HasSuffix(body, "data: [DONE]\n\n") {
				t.Errorf("stopped stream does not end cleanly with [DONE]: %q", tail(body))
			}
			if strings.Count(body, `"usage"`) != 1 {
				t.Errorf("the client asked for usage: want one usage chunk in %q", tail(body))
			}
			if _, err := c.mock.WaitFor(ctxTimeout(t, 2*time.Second), tag, func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
				t.Errorf("the engine never saw the cancellation: %v", err)
			}
			row := a.final(s.id)
			// The engine never said: delivered chunks counted, prompt estimated.
			if row.Outcome != models.OutcomeStopped || row.UsageSource != models.UsageEstimated || row.CompletionTokens != s.contentCount() || row.PromptTokens == 0 {
				t.Errorf("row = %+v, delivered %d", row, s.contentCount())
			}

			// Twice is harmless, and a finished inference answers with its state.
			again := cancelVia(t, c.replicas[2], a.Key, s.id)
			if again.status != http.StatusOK || again.body["state"] != "stopped" {
				t.Errorf("second stop: %d %v", again.status, again.body)
			}
			// The metrics say so on the replicas that took the requests.
			if v := metricValue(t, b, "moonji_stops_total", `result="acked"`); v != 1 {
				t.Errorf("B's moonji_stops_total{result=acked} = %v, want 1", v)
			}
			if v := metricValue(t, b, "moonji_stop_latency_seconds", ""); v != 1 {
				t.Errorf("B's moonji_stop_latency_seconds count = %v, want 1", v)
			}
			if v := metricValue(t, c.replicas[2], "moonji_stops_total", `result="finished"`); v != 1 {
				t.Errorf("C's moonji_stops_total{result=finished} = %v, want 1", v)
			}
		})
	}
}

func TestStopWhileQueuedAndBeforeFirstToken(t *testing.T) {
	c := startCluster(t, 2, false, func(cfg *config.Config) { cfg.Backends[0].MaxConcurrency = 1 })
	a, b := c.replicas[0], c.replicas[1]
	// The slot is held by a slow request; the next one waits in A's queue.
	holder := startStream(t, a, a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":20,"tokens":60}}`)
	_ = holder
	done := make(chan *http.Response, 1)
	go func() {
		done <- a.postWith(context.Background(), a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"queued"}}`)
	}()
	var id string
	deadline := time.Now().Add(3 * time.Second)
	for id == "" {
		_ = a.srv.Ledger.Flush(context.Background())
		var rows []models.Usage
		a.DB.Where("outcome = ? AND inference_id <> ?", models.OutcomePending, holder.id).Find(&rows)
		if len(rows) == 1 {
			id = rows[0].InferenceID
		}
		if time.Now().After(deadline) {
			t.Fatal("the queued request has no pending row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ans := cancelVia(t, b, b.Key, id)
	if ans.status != http.StatusOK || ans.body["acknowledged"] != true {
		t.Fatalf("stop of a queued request: %d %v", ans.status, ans.body)
	}
	resp := <-done
	body := readAll(t, resp.Body)
	// A complete, well-formed stream: one chunk that opens and closes the
	// message with the stream's id, then [DONE].
	want := `data: {"id":"chatcmpl-` + id + `","object":"chat.completion.chunk","created":`
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, want) ||
		!strings.Contains(body, `"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":"stop"}]}`) ||
		!strings.HasSuffix(body, "\n\ndata: [DONE]\n\n") || strings.Contains(body, `"created":0`) {
		t.Errorf("queued request after stop: %d %q", resp.StatusCode, body)
	}
	for _, r := range c.mock.Requests() {
		if r.Tag == "queued" {
			t.Error("the engine saw a request stopped in the queue")
		}
	}
	if row := a.final(id); row.Outcome != models.OutcomeStopped || row.CompletionTokens != 0 {
		t.Errorf("row = %+v", row)
	}

	// Before the engine's first token.
	s := startStream(t, a, a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"ttft","ttft_ms":20000}}`)
	_ = holder.wait(t)
	if _, err := c.mock.WaitFor(ctxTimeout(t, 5*time.Second), "ttft", nil); err != nil {
		t.Fatal(err)
	}
	ans = cancelVia(t, b, b.Key, s.id)
	if ans.status != http.StatusOK || ans.body["state"] != "stopped" {
		t.Fatalf("stop before first token: %d %v", ans.status, ans.body)
	}
	if body := s.wait(t); !strings.HasSuffix(body, "data: [DONE]\n\n") || s.contentCount() != 0 {
		t.Errorf("stream stopped before its first token: %q", body)
	}
	if _, err := c.mock.WaitFor(ctxTimeout(t, 2*time.Second), "ttft", func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
		t.Error("the engine did not see the cancellation:", err)
	}
}

func TestStopOwnershipAndStates(t *testing.T) {
	c := startCluster(t, 2, false)
	a, b := c.replicas[0], c.replicas[1]
	other := a.newKey("someone-else@example.com", 0)
	s := startStream(t, a, a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":50,"tokens":500}}`)
	waitContent(t, s, 2)
	if ans := cancelVia(t, b, other, s.id); ans.status != http.StatusNotFound {
		t.Errorf("someone else's stop: %d %v", ans.status, ans.body)
	}
	if ans := cancelVia(t, b, other, "inf_doesnotexist"); ans.status != http.StatusNotFound {
		t.Errorf("unknown id: %d %v", ans.status, ans.body)
	}
	if ans := cancelVia(t, b, "", s.id); ans.status != http.StatusUnauthorized {
		t.Errorf("no key: %d", ans.status)
	}
	// An admin may stop anyone's.
	admin := a.newKey("root@example.com", 0)
	a.DB.Model(&models.User{}).Where("email = ?", "root@example.com").Update("admin", true)
	if ans := cancelVia(t, b, admin, s.id); ans.status != http.StatusOK || ans.body["state"] != "stopped" {
		t.Errorf("admin stop: %d %v", ans.status, ans.body)
	}
	s.wait(t)

	// A finished inference: 200 with its state.
	resp := a.post(`{"model":"m1","messages":[{"role":"user","content":"x"}]}`)
	readAll(t, resp.Body)
	id := resp.Header.Get("X-Inference-Id")
	a.final(id)
	if ans := cancelVia(t, b, a.Key, id); ans.status != http.StatusOK || ans.body["state"] != "success" {
		t.Errorf("finished: %d %v", ans.status, ans.body)
	}
}

func TestStopDuringRedisRestart(t *testing.T) {
	c := startCluster(t, 2, false)
	a, b := c.replicas[0], c.replicas[1]
	s := startStream(t, a, a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":50,"tokens":2000}}`)
	waitContent(t, s, 2)
	c.be.Mini.Close()

	// Landing elsewhere while Redis is down: 503 naming the cause, quickly.
	start := time.Now()
	ans := cancelVia(t, b, b.Key, s.id)
	if ans.status != http.StatusServiceUnavailable || !strings.Contains(fmt.Sprint(ans.body), "stop") {
		t.Errorf("stop on B with Redis down: %d %v", ans.status, ans.body)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the 503 took %v", took)
	}
	if s.contentCount() == 0 {
		t.Fatal("stream died with Redis")
	}
	// Redis comes back; once B has resubscribed, its stop reaches A again.
	if err := c.be.Mini.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ans = cancelVia(t, b, b.Key, s.id)
		if ans.status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stop after Redis came back: %d %v", ans.status, ans.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.wait(t)
	if row := a.final(s.id); row.Outcome != models.OutcomeStopped {
		t.Errorf("row = %+v", row)
	}

	// Landing on the owner works without Redis at all.
	s2 := startStream(t, a, a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":50,"tokens":2000}}`)
	waitContent(t, s2, 2)
	c.be.Mini.Close()
	if ans := cancelVia(t, a, a.Key, s2.id); ans.status != http.StatusOK || ans.body["state"] != "stopped" {
		t.Errorf("stop on the owner with Redis down: %d %v", ans.status, ans.body)
	}
	s2.wait(t)
}

// While 20 streams deliver 2,000 tokens, Redis sees a fixed number of
// commands per request (the shared GCRA limiter's script, which every
// request asks once, and the slot lease's acquire and release) and none
// per token. Two counts: the round trips the replica's client makes (a
// hook on its Redis client), and the commands the server runs, scripts'
// own included.
func TestNoRedisCommandsPerToken(t *testing.T) {
	for _, real := range realModes(t) {
		t.Run(modeName(real), func(t *testing.T) {
			if real {
				// A private server: the shared one also serves the other
				// packages' tests, running at the same time.
				t.Setenv("MOONJI_TEST_REDIS_URL", testredis.Start(t))
			}
			// Leases renewed every 200 s: the renewal is per replica and
			// time, and must not land in one run and not the other.
			c := startCluster(t, 1, real, func(c *config.Config) { c.LeaseTTL = 10 * time.Minute })
			a := c.replicas[0]
			var calls testredis.Counter
			a.srv.Redis.AddHook(&calls)
			count := func() int {
				if c.be.Mini != nil {
					return c.be.Mini.CommandCount()
				}
				return requestCommands(t, c.be)
			}
			run := func(tokens int) (server, client int) {
				before, beforeCalls := count(), calls.N.Load()
				var wg sync.WaitGroup
				for i := 0; i < 20; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						resp := a.post(fmt.Sprintf(`{"model":"m1","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"x"}]}`, tokens))
						if got := readAll(t, resp.Body); strings.Count(got, `"content":"`) < tokens {
							t.Errorf("short stream: %q", tail(got))
						}
					}()
				}
				wg.Wait()
				// The last releases run just after the streams' ends.
				time.Sleep(100 * time.Millisecond)
				return count() - before, int(calls.N.Load() - beforeCalls)
			}
			run(5) // warm up: script loads and the connection pool are not per request
			few, fewCalls := run(5)
			many, manyCalls := run(100)
			t.Logf("Redis for 20 streams: %d round trips and %d server commands with 100 tokens in all, %d and %d with 2,000",
				fewCalls, few, manyCalls, many)
			// A release rides on the replica's next acquire or goes alone or
			// batched a moment later, as timing falls: the two runs may
			// differ by up to one round trip per request (20). One per token
			// would add 1,900.
			if manyCalls > fewCalls+20 {
				t.Errorf("round trips grew with the tokens: %d for 100 tokens, %d for 2,000", fewCalls, manyCalls)
			}
			// At most three per request: the rate limit, the slot's lease
			// and its release (often carried by the next acquire). A /v1
			// request's id is new, so no stop key is checked at its start
			// (stop.Service.BeginFresh).
			if manyCalls > 20*3 {
				t.Errorf("%d round trips to Redis for 20 requests: more than three per request", manyCalls)
			}
			// The server's count varies a little from run to run: miniredis
			// counts connection set-up (HELLO, CLIENT), and the scripts run
			// a command or two more or less with the clock (a key's expiry
			// pushed only when it has come near). The rate limit is the same
			// GCRA script for every request, whatever its length
			// (ratelimit.Limiter.AllowRequest). 1,900 more tokens: one
			// command per token would add 1,900.
			if many-few > 100 {
				t.Errorf("%d Redis commands for 20 requests of 100 tokens, %d for 5: something runs per token", many, few)
			}
			// Inside its scripts the server runs a dozen or two commands per
			// request (expired leases purged, the least-loaded choice, the
			// rate limit's GCRA): bounded, whatever the answer's length.
			if many > 20*30 {
				t.Errorf("%d Redis commands for 20 requests: more than the scripts' fixed work per request", many)
			}
		})
	}
}

// requestCommands returns how many commands the server has run, leaving
// out those that come with connections and subscriptions rather than
// requests (a new connection's set-up, PING, INFO, CONFIG, SUBSCRIBE),
// whose number varies from run to run.
func requestCommands(t *testing.T, be *testredis.Backend) int {
	t.Helper()
	total := 0
	for name, n := range be.CommandStats(t) {
		cmd, _, _ := strings.Cut(name, "|")
		switch cmd {
		case "hello", "client", "ping", "info", "config", "subscribe", "psubscribe":
			continue
		}
		total += int(n)
	}
	return total
}

func realModes(t *testing.T) []bool {
	modes := []bool{false}
	if os.Getenv("MOONJI_TEST_REDIS_URL") != "" {
		modes = append(modes, true)
	}
	return modes
}

func modeName(real bool) string {
	if real {
		return "real-redis"
	}
	return "miniredis"
}

// A person's stop through /api/v1/inference/stop, landing on another
// replica, with "seen": the stop is owner-checked, and the ledger bills
// what was delivered whatever the page had shown.
func TestStopFromTheWebKeepsWhatWasSeen(t *testing.T) {
	c := startCluster(t, 2, false)
	a, b := c.replicas[0], c.replicas[1]
	browserA := a.signedIn("person@example.com", false)
	_, who := a.me(browserA)

	req, _ := http.NewRequest(http.MethodPost, a.URL+"/v1/chat/completions", strings.NewReader(
		`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":40,"tokens":1000}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-CSRF-Token", who.CSRFToken)
	resp, err := browserA.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream with a session: %v %v", err, resp)
	}
	id := resp.Header.Get("X-Inference-Id")
	br := bufio.NewReader(resp.Body)
	shown := 0
	for shown < 6 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			shown++
		}
	}
	// The page has shown 4 of the 6 chunks that arrived when Stop is pressed.
	stopReq := func(c *http.Client, csrf string, body string) (int, string) {
		r, _ := http.NewRequest(http.MethodPost, b.URL+"/api/v1/inference/stop", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if csrf != "" {
			r.Header.Set("X-CSRF-Token", csrf)
		}
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, readAll(t, resp.Body)
	}
	if st, body := stopReq(browserA, "", `{"inference_id":"`+id+`","seen":4}`); st != http.StatusUnauthorized {
		t.Errorf("stop without the CSRF header: %d %s", st, body)
	}
	other := b.signedIn("other@example.com", false)
	_, otherWho := b.me(other)
	if st, body := stopReq(other, otherWho.CSRFToken, `{"inference_id":"`+id+`","seen":4}`); st != http.StatusNotFound {
		t.Errorf("someone else's stop: %d %s", st, body)
	}
	if st, body := stopReq(browserA, who.CSRFToken, `{"inference_id":"`+id+`","seen":"four"}`); st != http.StatusBadRequest {
		t.Errorf("bad seen: %d %s", st, body)
	}
	st, body := stopReq(browserA, who.CSRFToken, `{"inference_id":"`+id+`","seen":4}`)
	if st != http.StatusOK || !strings.Contains(body, `"state":"stopped"`) {
		t.Fatalf("stop: %d %s", st, body)
	}
	rest, _ := io.ReadAll(br)
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("stream end: %q", tail(string(rest)))
	}
	// Billing counts what was generated and delivered (at least the 6
	// chunks read), not what the page showed: seen is for the saved answer.
	row := a.final(id)
	if row.Outcome != models.OutcomeStopped || row.CompletionTokens < 6 || row.PromptTokens == 0 || row.Source != "web" {
		t.Errorf("row = %+v, want stopped with at least the 6 chunks delivered and the prompt", row)
	}
}

// A stop sent to another replica for a request so young that its pending
// row is not written yet (the journal holds it) stops it: the replica that
// runs it decides, no row needed. (TestYoungStopAcrossReplicas: someone
// else's stop, and both routes; internal/gateway's TestStopWaitsAreBounded:
// a flood of made-up ids.)
func TestStopOfAYoungRequestElsewhere(t *testing.T) {
	c := startCluster(t, 2, false)
	a, b := c.replicas[0], c.replicas[1]
	s := startStream(t, a, a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":20,"tokens":500}}`)
	var n int64
	a.DB.Model(&models.Usage{}).Where("inference_id = ?", s.id).Count(&n)
	ans := cancelVia(t, b, b.Key, s.id)
	if ans.status != http.StatusOK || ans.body["state"] != "stopped" {
		t.Fatalf("stop through B of a young request (row written: %d): %d %v", n, ans.status, ans.body)
	}
	s.wait(t)
	if row := a.final(s.id); row.Outcome != models.OutcomeStopped {
		t.Errorf("row = %+v", row)
	}

}
