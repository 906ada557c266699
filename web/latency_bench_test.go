package web_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
)

// BenchmarkAddedLatency measures what the gateway adds to a request, against
// calling the mock engine directly, in one run on this machine:
//
//	go test ./web -run '^$' -bench AddedLatency -benchtime 1x
//
// Non-streaming: an open-loop load at MOONJI_BENCH_RPS (default 500) for
// MOONJI_BENCH_SECONDS (default 5) against each target, p50/p99 of each and
// the difference. Streaming: the gaps between chunks of a 200-token stream
// paced at 100 tokens/s, direct and through the gateway.
func BenchmarkAddedLatency(b *testing.B) {
	rps := envInt("MOONJI_BENCH_RPS", 500)
	secs := envInt("MOONJI_BENCH_SECONDS", 5)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Tokens: 16, MaxRecords: 1000,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	env := startBenchGateway(b, ms.URL)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 1024}}
	body := `{"model":"m1","max_tokens":16,"messages":[{"role":"user","content":"Hello there"}]}`
	for i := 0; i < b.N; i++ {
		// Warm both paths' connection pools.
		openLoop(client, ms.URL+"/v1/chat/completions", "", body, rps, 1)
		openLoop(client, env.URL+"/v1/chat/completions", env.Key, body, rps, 1)

		direct := openLoop(client, ms.URL+"/v1/chat/completions", "", body, rps, secs)
		via := openLoop(client, env.URL+"/v1/chat/completions", env.Key, body, rps, secs)
		d50, d99 := pct(direct.lat, 50), pct(direct.lat, 99)
		g50, g99 := pct(via.lat, 50), pct(via.lat, 99)
		b.ReportMetric(float64(d50.Microseconds()), "direct-p50-µs")
		b.ReportMetric(float64(d99.Microseconds()), "direct-p99-µs")
		b.ReportMetric(float64(g50.Microseconds()), "gateway-p50-µs")
		b.ReportMetric(float64(g99.Microseconds()), "gateway-p99-µs")
		b.ReportMetric(float64((g99 - d99).Microseconds()), "added-p99-µs")
		fmt.Fprintf(os.Stderr, "non-streaming at %d req/s for %ds: direct p50 %v p99 %v (%d ok, %d errors) | gateway p50 %v p99 %v (%d ok, %d errors) | added p50 %v p99 %v | ratio p50 %.2f p99 %.2f\n",
			rps, secs, d50, d99, len(direct.lat), direct.errs, g50, g99, len(via.lat), via.errs, g50-d50, g99-d99,
			float64(g50)/float64(d50), float64(g99)/float64(d99))

		sd := streamGaps(client, ms.URL+"/v1/chat/completions", "")
		sg := streamGaps(client, env.URL+"/v1/chat/completions", env.Key)
		fmt.Fprintf(os.Stderr, "streaming 200 tokens at 100/s: inter-chunk gap direct p50 %v p99 %v | gateway p50 %v p99 %v\n",
			pct(sd, 50), pct(sd, 99), pct(sg, 50), pct(sg, 99))
		b.ReportMetric(float64((pct(sg, 99) - pct(sd, 99)).Microseconds()), "stream-gap-added-p99-µs")
	}
}

type loadResult struct {
	lat  []time.Duration
	errs int
}

// openLoop sends requests at a fixed rate whatever the answers' speed (an
// open loop: a slow server cannot slow the load down and hide its latency).
func openLoop(client *http.Client, url, key, body string, rps, secs int) loadResult {
	var mu sync.Mutex
	var res loadResult
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rps)
	start := time.Now()
	n := rps * secs
	for i := 0; i < n; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			resp, err := client.Do(req)
			ok := err == nil && resp.StatusCode == 200
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			el := time.Since(t0)
			mu.Lock()
			if ok {
				res.lat = append(res.lat, el)
			} else {
				res.errs++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return res
}

// streamGaps returns the gaps between consecutive chunks of one stream.
func streamGaps(client *http.Client, url, key string) []time.Duration {
	body := `{"model":"m1","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"x"}],"mock":{"tps":100}}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil
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
	return gaps
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err == nil && n > 0 {
		return n
	}
	return def
}

type benchEnv struct {
	URL, Key string
}

func startBenchGateway(b *testing.B, mockURL string) benchEnv {
	cfg := &config.Config{
		DatabaseURL: "sqlite://" + b.TempDir() + "/bench.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 10_000_000},
		Backends:    []config.Backend{{Name: "mock", URL: mockURL + "/v1", MaxConcurrency: 4096, MaxQueue: 4096}},
		Models:      []config.Model{{Name: "m1", Backend: "mock"}},
	}
	e := startWithConfig(b, cfg, nil, mockURL)
	return benchEnv{URL: e.URL, Key: e.Key}
}
