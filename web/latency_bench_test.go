//go:build bench

package web_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/apikey"
	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// The benchmarks in this package are load tests: they start a gateway (and a
// mock engine) over real HTTP, drive it in an open loop and report
// percentiles with b.ReportMetric. Run them one at a time with -benchtime 1x
// (one load run per benchmark); BENCHMARKS.md has the commands and numbers.
// Each uses `go test -run '^$' -bench ...`, so `go test ./...` skips them.

// BenchmarkAddedLatency measures what the gateway adds to a request, against
// calling the mock engine directly, in one run on this machine:
//
//	go test ./web -run '^$' -bench AddedLatency -benchtime 1x
//
// Non-streaming: after a warm-up of each path, an open-loop load at
// MOONJI_BENCH_RPS (default 500) for MOONJI_BENCH_SECONDS (default 5) against
// the engine directly, then the same through the gateway; latency counts from
// each request's scheduled send time (no coordinated omission), non-200
// answers and transport errors are counted and reported. Streaming: the gaps
// between data frames (role, 200 content, finish, [DONE]) of 4 concurrent
// 200-token streams paced at 100 tokens/s,
// direct then through the gateway.
func BenchmarkAddedLatency(b *testing.B) {
	rps := envInt("MOONJI_BENCH_RPS", 500)
	secs := envInt("MOONJI_BENCH_SECONDS", 5)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Tokens: 16, MaxRecords: 1000, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	env := startBenchGateway(b, ms.URL, nil)
	// Where the added time goes: the ledger's commits (the handler waits for
	// the pending row's commit before it answers). Set before any request,
	// while the writer is idle.
	var lmu sync.Mutex
	var commits []time.Duration
	var rows []int
	env.srv.Ledger.OnWrite(func(n int, took time.Duration, err error) {
		lmu.Lock()
		commits, rows = append(commits, took), append(rows, n)
		lmu.Unlock()
	})

	client := benchClient()
	body := `{"model":"m1","max_tokens":16,"messages":[{"role":"user","content":"Hello there"}]}`
	direct := loadSpec{URL: ms.URL + "/v1/chat/completions", Body: body, RPS: rps, Want: http.StatusOK}
	via := loadSpec{URL: env.URL + "/v1/chat/completions", Key: env.Key, Body: body, RPS: rps, Want: http.StatusOK}
	for b.Loop() {
		// Warm both paths: connection pools, the database, the JIT-free but
		// cache-cold first requests.
		openLoop(client, direct.with(time.Second))
		openLoop(client, via.with(time.Second))

		d := openLoop(client, direct.with(time.Duration(secs)*time.Second))
		lmu.Lock()
		commits, rows = commits[:0], rows[:0]
		lmu.Unlock()
		g := openLoop(client, via.with(time.Duration(secs)*time.Second))
		lmu.Lock()
		nrows := 0
		for _, n := range rows {
			nrows += n
		}
		fmt.Fprintf(os.Stderr, "ledger during the gateway run: %d commits of %d rows (%.1f per commit), commit time p50 %v p99 %v max %v\n",
			len(commits), nrows, float64(nrows)/float64(max(len(commits), 1)), pct(commits, 50), pct(commits, 99), pctf(commits, 100))
		b.ReportMetric(us(pct(commits, 99)), "ledger-commit-p99-µs")
		lmu.Unlock()
		d50, d99 := pct(d.Lat, 50), pct(d.Lat, 99)
		g50, g99 := pct(g.Lat, 50), pct(g.Lat, 99)
		b.ReportMetric(us(d50), "direct-p50-µs")
		b.ReportMetric(us(d99), "direct-p99-µs")
		b.ReportMetric(us(g50), "gateway-p50-µs")
		b.ReportMetric(us(g99), "gateway-p99-µs")
		b.ReportMetric(us(g50-d50), "added-p50-µs")
		b.ReportMetric(us(g99-d99), "added-p99-µs")
		b.ReportMetric(float64(g99)/float64(d99), "ratio-p99")
		b.ReportMetric(float64(d.Errs+g.Errs), "errors")
		fmt.Fprintf(os.Stderr, "non-streaming at %d req/s for %ds (%d CPUs):\n  direct  %s\n  gateway %s\n  added p50 %v p99 %v | ratio p50 %.2f p99 %.2f\n",
			rps, secs, runtime.NumCPU(), d, g, g50-d50, g99-d99, float64(g50)/float64(d50), float64(g99)/float64(d99))
		if d.Errs+g.Errs > 0 {
			b.Errorf("%d requests failed (direct %v, gateway %v)", d.Errs+g.Errs, d.Statuses, g.Statuses)
		}

		const streams, tokens, tps = 4, 200, 100
		sd := streamGaps(client, ms.URL+"/v1/chat/completions", "", streams, tokens, tps)
		sg := streamGaps(client, env.URL+"/v1/chat/completions", env.Key, streams, tokens, tps)
		fmt.Fprintf(os.Stderr, "streaming %d×%d tokens at %d/s: inter-chunk gap direct p50 %v p99 %v max %v (%d gaps) | gateway p50 %v p99 %v max %v (%d gaps) | added p50 %v p99 %v\n",
			streams, tokens, tps, pct(sd, 50), pct(sd, 99), slices.Max(sd), len(sd), pct(sg, 50), pct(sg, 99), slices.Max(sg), len(sg),
			pct(sg, 50)-pct(sd, 50), pct(sg, 99)-pct(sd, 99))
		b.ReportMetric(us(pct(sd, 99)), "stream-gap-direct-p99-µs")
		b.ReportMetric(us(pct(sg, 99)), "stream-gap-gateway-p99-µs")
		b.ReportMetric(us(pct(sg, 99)-pct(sd, 99)), "stream-gap-added-p99-µs")
		if want := streams * (tokens + 2); len(sd) != want || len(sg) != want {
			b.Errorf("streams cut short: %d direct and %d gateway gaps, want %d each", len(sd), len(sg), want)
		}
	}
}

// loadSpec is one open-loop load: RPS requests per second for Dur, each a
// POST of Body to URL (with Key as a Bearer token when set), expecting Want.
type loadSpec struct {
	Method         string // default POST
	URL, Key, Body string
	RPS            int
	Dur            time.Duration
	Want           int
}

func (s loadSpec) with(d time.Duration) loadSpec { s.Dur = d; return s }

type loadResult struct {
	Lat      []time.Duration // answered with Want, from the scheduled send time
	Errs     int             // any other status, or a transport error
	Statuses map[int]int     // every status seen (0: transport error)
	MaxLag   time.Duration   // the sender's worst lateness against its schedule
	Sent     int
}

func (r loadResult) String() string {
	return fmt.Sprintf("%d sent, %d ok, %d errors %v, p50 %v p90 %v p99 %v p99.9 %v max %v, sender lag max %v",
		r.Sent, len(r.Lat), r.Errs, r.Statuses, pct(r.Lat, 50), pct(r.Lat, 90), pct(r.Lat, 99), pctf(r.Lat, 99.9), pctf(r.Lat, 100), r.MaxLag)
}

// openLoop sends requests on a fixed schedule whatever the answers' speed (an
// open loop: a slow server cannot slow the load down and hide its latency).
// Each latency counts from the request's scheduled time, so a sender that
// falls behind shows up as latency rather than vanishing.
func openLoop(client *http.Client, s loadSpec) loadResult {
	var mu sync.Mutex
	res := loadResult{Statuses: map[int]int{}}
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(s.RPS)
	n := int(s.Dur / interval)
	res.Lat = make([]time.Duration, 0, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		} else if -d > res.MaxLag {
			res.MaxLag = -d
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			status := doMethod(client, s.Method, s.URL, s.Key, s.Body)
			el := time.Since(due)
			mu.Lock()
			res.Statuses[status]++
			if status == s.Want {
				res.Lat = append(res.Lat, el)
			} else {
				res.Errs++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.Sent = n
	return res
}

// do POSTs body and reads the whole answer; it returns the status, or 0 on a
// transport error.
func do(client *http.Client, url, key, body string) int {
	return doMethod(client, http.MethodPost, url, key, body)
}

func doMethod(client *http.Client, method, url, key, body string) int {
	if method == "" {
		method = http.MethodPost
	}
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// streamGaps runs n streams at once and returns the gaps between consecutive
// data frames of each.
func streamGaps(client *http.Client, url, key string, n, tokens, tps int) []time.Duration {
	body := fmt.Sprintf(`{"model":"m1","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"x"}],"mock":{"tps":%d}}`, tokens, tps)
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			var gaps []time.Duration
			var last time.Time
			for {
				line, err := br.ReadBytes('\n')
				if err != nil {
					break
				}
				if !bytes.HasPrefix(line, []byte("data: ")) {
					continue
				}
				now := time.Now()
				if !last.IsZero() {
					gaps = append(gaps, now.Sub(last))
				}
				last = now
			}
			mu.Lock()
			all = append(all, gaps...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(all) == 0 {
		all = []time.Duration{0}
	}
	return all
}

func pct(d []time.Duration, p int) time.Duration { return pctf(d, float64(p)) }

// pctf returns the p-th percentile (nearest rank) of d.
func pctf(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(min(i, len(s)-1), 0)]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxIdleConns: 4096, DisableCompression: true}}
}

type benchEnv struct {
	*testEnv
}

// startBenchGateway starts a gateway on SQLite in front of mockURL, with
// limits high enough not to matter unless opts change them.
func startBenchGateway(b *testing.B, mockURL string, mock *mockllm.Server, opts ...envOption) benchEnv {
	cfg := &config.Config{
		DatabaseURL: "sqlite://" + b.TempDir() + "/bench.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 10_000_000},
		Backends:    []config.Backend{{Name: "mock", URL: mockURL + "/v1", MaxConcurrency: 4096, MaxQueue: 4096}},
		Models:      []config.Model{{Name: "m1", Backend: "mock"}},
	}
	for _, o := range opts {
		o(cfg)
	}
	return benchEnv{startWithConfig(b, cfg, mock, mockURL)}
}

// randomIDKey issues a key with a random id and an rpm override. Rate-limit
// buckets in Redis are named after the key id ("moonji:rl:req:key:<id>"),
// and every fresh database numbers its keys from 1, so a benchmark on a
// shared Redis needs an id nobody else uses.
func randomIDKey(tb testing.TB, e *testEnv, email string, rpm int) string {
	tb.Helper()
	u, err := models.EnsureUser(context.Background(), e.DB, email)
	if err != nil {
		tb.Fatal(err)
	}
	secret, hash, err := apikey.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	id := uint(binary.BigEndian.Uint32(r[:])>>1) + 1_000_000
	key := &models.APIKey{ID: id, UserID: u.ID, Name: "bench", Prefix: secret[:len(apikey.Prefix)+8], Hash: hash, RPM: rpm}
	if err := models.CreateAPIKey(context.Background(), e.DB, key); err != nil {
		tb.Fatal(err)
	}
	return secret
}
