package web_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// The chaos test sends many mixed requests at one gateway at once — client
// aborts at random moments, clients that never read, engine errors, hangs
// and disconnects, stops, rate-limited and queue-refused requests,
// malformed, deeply nested, duplicate-key, oversized and key-less bodies —
// and then checks what must hold whatever happens: exactly one usage row per
// request with the outcome its client saw, no pending row, in-flight and
// queued gauges back at 0, goroutines and heap back near where they started.
//
// Each request that carries a key gets a key of its own, so that its one
// row is found by key id even when the client never saw an inference id
// (it left while queued). The rate-limited ones share a key with a tiny
// limit; key-less ones are counted together.
//
// Size: MOONJI_CHAOS_N requests (default 300, small enough for make test
// under the race detector); scripts/chaos.sh runs the full size.
func TestChaos(t *testing.T) {
	eachDatabaseInTurn(t, chaos) // it reads the process's heap
}

func chaos(t *testing.T, dbURL string) {
	n := envInt("MOONJI_CHAOS_N", 300)
	workers := envInt("MOONJI_CHAOS_WORKERS", 24)
	seed := uint64(envInt("MOONJI_CHAOS_SEED", int(time.Now().UnixNano()%1_000_000)))
	t.Logf("chaos: %d requests, %d workers, seed %d (MOONJI_CHAOS_SEED to replay)", n, workers, seed)

	// The mock keeps only its last records, so that what the heap holds
	// afterwards is the gateway's.
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, TokensPerSecond: 400, Tokens: 20, MaxRecords: 100,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	cfg := &config.Config{
		DatabaseURL:        dbURL,
		RateLimit:          config.RateLimit{RequestsPerMinute: 100000, UnauthenticatedPerMinute: 1000000},
		StreamWriteTimeout: 400 * time.Millisecond,
		MaxBodyBytes:       256 << 10,
		Backends: []config.Backend{{Name: "mock", URL: ms.URL + "/v1", MaxConcurrency: 8, MaxQueue: 12,
			QueueTimeout: 1500 * time.Millisecond, Timeout: 4 * time.Second}},
		Models: []config.Model{{Name: "m1", Backend: "mock"}},
	}
	e := startWithConfig(t, cfg, mock, ms.URL)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: 0}}
	defer client.CloseIdleConnections()

	// Keys: one per keyed request, made up front.
	rng := rand.New(rand.NewPCG(seed, 1))
	plan := make([]chaosReq, n)
	limited := e.newKey("limited@example.com", 3)
	for i := range plan {
		plan[i] = chaosReq{i: i, kind: chaosKinds[rng.IntN(len(chaosKinds))], delay: time.Duration(rng.IntN(300)) * time.Millisecond}
		switch plan[i].kind {
		case "no_key":
		case "rate_limited":
			plan[i].key = limited
		default:
			plan[i].key = e.newKey(fmt.Sprintf("chaos-%d@example.com", i), 0)
		}
	}
	keyIDs := keyIDsByEmail(t, e)

	runtime.GC()
	baseRSS := rssMiB()
	baseGoroutines := runtime.NumGoroutine()
	var baseMem runtime.MemStats
	runtime.ReadMemStats(&baseMem)

	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				plan[i].run(t, e, client)
			}
		}()
	}
	start := time.Now()
	for i := range plan {
		next <- i
	}
	close(next)
	wg.Wait()
	t.Logf("chaos: sent in %v", time.Since(start).Round(time.Millisecond))

	// Every row final, then one per request.
	waitFor(t, "no pending rows", 15*time.Second, func() bool {
		_ = e.srv.Ledger.Flush(context.Background())
		var pending int64
		e.DB.Model(&models.Usage{}).Where("outcome = ?", models.OutcomePending).Count(&pending)
		return pending == 0
	})
	var rows []models.Usage
	if err := e.DB.Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	byKey := map[uint][]models.Usage{}
	keyless := 0
	limitedID := keyIDs["limited@example.com"]
	tally := map[string]int{}
	for _, r := range rows {
		switch {
		case r.KeyID == nil:
			tally["no_key → "+r.Outcome+"/"+r.Reason]++
		case *r.KeyID == limitedID:
			tally["rate_limited → "+r.Outcome+"/"+r.Reason]++
		}
		if r.KeyID == nil {
			keyless++
			continue
		}
		byKey[*r.KeyID] = append(byKey[*r.KeyID], r)
	}
	wantKeyless, wantLimited := 0, 0
	for i := range plan {
		p := &plan[i]
		switch p.kind {
		case "no_key":
			wantKeyless++
			continue
		case "rate_limited":
			wantLimited++
			continue
		}
		got := byKey[keyIDs[fmt.Sprintf("chaos-%d@example.com", i)]]
		if len(got) != 1 {
			t.Errorf("request %d (%s, saw %s): %d rows, want exactly 1", i, p.kind, p.saw(), len(got))
			continue
		}
		row := got[0]
		tally[p.kind+" → "+row.Outcome+"/"+row.Reason]++
		if p.id != "" && row.InferenceID != p.id {
			t.Errorf("request %d: row %s, client saw id %s", i, row.InferenceID, p.id)
		}
		if !p.agrees(row) {
			t.Errorf("request %d (%s): client saw %s, row says %s/%s status %d", i, p.kind, p.saw(), row.Outcome, row.Reason, row.Status)
		}
	}
	if got := len(byKey[limitedID]); got != wantLimited {
		t.Errorf("rate-limited key: %d rows for %d requests", got, wantLimited)
	}
	if keyless != wantKeyless {
		t.Errorf("key-less: %d rows for %d requests", keyless, wantKeyless)
	}
	if t.Failed() || testing.Verbose() {
		var lines []string
		for k, v := range tally {
			lines = append(lines, fmt.Sprintf("%5d  %s", v, k))
		}
		sort.Strings(lines)
		t.Logf("outcomes:\n%s", strings.Join(lines, "\n"))
	}

	// Nothing is held any more. (The test lets go of what it read first.)
	nRows := len(rows)
	rows, byKey = nil, nil
	waitFor(t, "gauges at 0", 5*time.Second, func() bool {
		return metricValue(t, e, "moonji_backend_in_flight", `backend="mock"`) == 0 &&
			metricValue(t, e, "moonji_backend_queued", `backend="mock"`) == 0
	})
	client.CloseIdleConnections()
	var after runtime.MemStats
	// fasthttp keeps idle workers for 10 s and both HTTP clients keep idle
	// connections: allow for those, not for anything per request.
	waitFor(t, "goroutines back near the baseline", 20*time.Second, func() bool {
		runtime.GC()
		return runtime.NumGoroutine() <= baseGoroutines+2*workers+20
	}, func() {
		buf := make([]byte, 1<<20)
		t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	})
	runtime.ReadMemStats(&after)
	if f := os.Getenv("MOONJI_CHAOS_HEAPPROFILE"); f != "" {
		if out, err := os.Create(f); err == nil {
			_ = pprof.WriteHeapProfile(out)
			out.Close()
		}
	}
	t.Logf("chaos: %d requests, %d rows; goroutines %d → %d; heap in use %.1f → %.1f MiB; test process RSS %.1f → %.1f MiB (peak %.1f)",
		n, nRows, baseGoroutines, runtime.NumGoroutine(), mib(baseMem.HeapInuse), mib(after.HeapInuse),
		baseRSS, rssMiB(), peakRSSMiB())
	_ = byKey
	if after.HeapInuse > baseMem.HeapInuse+64<<20 {
		t.Errorf("heap in use grew from %.1f to %.1f MiB", mib(baseMem.HeapInuse), mib(after.HeapInuse))
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// rssMiB and peakRSSMiB read this process's resident memory (Linux).
func rssMiB() float64     { return procStatusMiB("VmRSS:") }
func peakRSSMiB() float64 { return procStatusMiB("VmHWM:") }

func procStatusMiB(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return float64(kb) / 1024
		}
	}
	return 0
}

func keyIDsByEmail(t *testing.T, e *testEnv) map[string]uint {
	var keys []models.APIKey
	if err := e.DB.Preload("User").Find(&keys).Error; err != nil {
		t.Fatal(err)
	}
	out := map[string]uint{}
	for _, k := range keys {
		out[k.User.Email] = k.ID
	}
	return out
}

var chaosKinds = []string{
	"stream", "stream", "whole", "abort", "abort", "stop", "engine_error", "stream_error",
	"disconnect", "hang", "rate_limited", "malformed", "nested", "duplicate", "oversized",
	"no_key", "no_reader", "burst",
}

// chaosReq is one request of the chaos run and what its client saw.
type chaosReq struct {
	i     int
	kind  string
	key   string
	delay time.Duration // when the client aborts, for the kinds that do

	id      string
	status  int
	end     string // for streams: done, error (an error frame), cut
	aborted bool
	stopped bool
	err     error
}

func (p *chaosReq) saw() string {
	return fmt.Sprintf("status %d end %q aborted %v stopped %v err %v", p.status, p.end, p.aborted, p.stopped, p.err)
}

// agrees tells whether the row matches what the client saw.
func (p *chaosReq) agrees(r models.Usage) bool {
	switch {
	case p.kind == "no_reader":
		// It never read a byte: refused, or cut for stalling or leaving.
		return r.Outcome == models.OutcomeCancelled || r.Outcome == models.OutcomeRejected
	case p.aborted:
		// It left: the row says so unless the gateway had already refused
		// or finished it.
		return r.Outcome == models.OutcomeCancelled || r.Outcome == models.OutcomeSuccess ||
			r.Outcome == models.OutcomeRejected || (r.Outcome == models.OutcomeError && r.Reason == "upstream_timeout")
	case p.status == 0:
		return false
	case p.status != http.StatusOK:
		want := models.OutcomeRejected
		if p.status >= 500 && p.status != http.StatusServiceUnavailable {
			want = models.OutcomeError
		}
		return r.Status == p.status && r.Outcome == want
	case p.end == "error":
		return r.Outcome == models.OutcomeError
	case p.stopped:
		return r.Outcome == models.OutcomeStopped
	case p.end == "done" || p.end == "":
		return r.Outcome == models.OutcomeSuccess
	}
	return false
}

const chaosMsgs = `"messages":[{"role":"user","content":"tell me a story"}]`

func (p *chaosReq) body() string {
	switch p.kind {
	case "whole":
		return `{"model":"m1",` + chaosMsgs + `}`
	case "abort":
		return `{"model":"m1","stream":true,` + chaosMsgs + `,"mock":{"tps":100,"tokens":200}}`
	case "stop":
		return `{"model":"m1","stream":true,"stream_options":{"include_usage":true},` + chaosMsgs + `,"mock":{"tps":200,"tokens":1000}}`
	case "engine_error":
		return `{"model":"m1",` + chaosMsgs + `,"mock":{"fail_status":500}}`
	case "stream_error":
		return `{"model":"m1","stream":true,` + chaosMsgs + `,"mock":{"stream_error_after":3}}`
	case "disconnect":
		return `{"model":"m1","stream":true,` + chaosMsgs + `,"mock":{"disconnect_after":4}}`
	case "hang":
		return `{"model":"m1","stream":true,` + chaosMsgs + `,"mock":{"hang":true}}`
	case "malformed":
		return `{"model":"m1","messages":[`
	case "nested":
		return `{"model":"m1","messages":` + strings.Repeat("[", 100000) + `}`
	case "duplicate":
		return `{"model":"m1","stream":false,"stream":true,` + chaosMsgs + `}`
	case "oversized":
		return `{"model":"m1",` + chaosMsgs + `,"pad":"` + strings.Repeat("x", 300<<10) + `"}`
	case "no_reader":
		return `{"model":"m1","stream":true,` + chaosMsgs + `,"mock":{"tps":0,"tokens":60000}}`
	case "burst":
		return `{"model":"m1","stream":true,` + chaosMsgs + `,"mock":{"tps":50,"tokens":40}}`
	}
	return `{"model":"m1","stream":true,` + chaosMsgs + `}`
}

func (p *chaosReq) run(t *testing.T, e *testEnv, client *http.Client) {
	if p.kind == "no_reader" {
		p.noReader(t, e)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if p.kind == "abort" || p.kind == "hang" {
		// The clock starts once the whole request is on the wire: from then
		// on the gateway has it, and owes it a row whatever the client does.
		var mu sync.Mutex
		var timer *time.Timer
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
			mu.Lock()
			timer = time.AfterFunc(p.delay, func() { p.aborted = true; cancel() })
			mu.Unlock()
		}})
		defer func() {
			mu.Lock()
			if timer != nil {
				timer.Stop()
			}
			mu.Unlock()
		}()
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+"/v1/chat/completions", strings.NewReader(p.body()))
	req.Header.Set("Content-Type", "application/json")
	if p.key != "" {
		req.Header.Set("Authorization", "Bearer "+p.key)
	}
	resp, err := client.Do(req)
	if err != nil {
		p.err = err // a failure unless this client aborted: status 0 agrees with no row
		return
	}
	defer resp.Body.Close()
	p.status = resp.StatusCode
	p.id = resp.Header.Get("X-Inference-Id")
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		_, _ = io.Copy(io.Discard, resp.Body)
		return
	}
	br := bufio.NewReader(resp.Body)
	content := 0
	p.end = "cut"
	for {
		line, err := br.ReadString('\n')
		switch {
		case strings.HasPrefix(line, "data: [DONE]"):
			if p.end != "error" {
				p.end = "done"
			}
		case strings.HasPrefix(line, `data: {"error"`):
			p.end = "error"
		case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`):
			content++
			if p.kind == "stop" && content == 3 {
				ans := cancelVia(t, e, p.key, p.id)
				p.stopped = ans.status == http.StatusOK && ans.body["state"] == "stopped"
			}
		}
		if err != nil {
			if err != io.EOF {
				p.err = err
			}
			if p.end == "cut" && ctx.Err() != nil {
				p.aborted = true
			}
			return
		}
	}
}

// noReader sends a long stream's request on a socket with a tiny receive
// buffer and never reads; it closes the socket after a while.
func (p *chaosReq) noReader(t *testing.T, e *testEnv) {
	conn, err := smallReceiveBuffer().Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	body := p.body()
	_, _ = conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + p.key +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body))
	time.Sleep(1500 * time.Millisecond)
}
