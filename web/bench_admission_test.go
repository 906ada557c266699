package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
)

// BenchmarkRejectLatency measures what admission costs a request that is
// refused: an open loop of MOONJI_BENCH_RPS (default 2000) req/s for
// MOONJI_BENCH_SECONDS (default 3), after a one-second warm-up, every one of
// which must be refused.
//
//	go test ./web -run '^$' -bench RejectLatency -benchtime 1x
//
//   - queue_full: the backend has max_concurrency 1 and max_queue 0, and its
//     one slot is held by a request the engine never answers (mock "hang"):
//     503 queue_full.
//   - rate_limited/memory: a key with rpm 1 that has used its request: 429,
//     with the in-memory limiter.
//   - rate_limited/redis: the same with the limiter in Redis
//     (MOONJI_TEST_REDIS_URL; skipped when unset).
//   - baseline/healthz: the same load on GET-less POST /healthz-like path is
//     not available, so the floor is the unknown-model 404, which takes the
//     same route (key look-up, body parse, rejected row) without admission.
func BenchmarkRejectLatency(b *testing.B) {
	rps := envInt("MOONJI_BENCH_RPS", 2000)
	secs := envInt("MOONJI_BENCH_SECONDS", 3)
	body := `{"model":"m1","messages":[{"role":"user","content":"Hello there"}]}`

	run := func(b *testing.B, e *testEnv, key string, body string, want int) {
		client := benchClient()
		spec := loadSpec{URL: e.URL + "/v1/chat/completions", Key: key, Body: body, RPS: rps, Want: want}
		for b.Loop() {
			openLoop(client, spec.with(time.Second)) // warm-up
			r := openLoop(client, spec.with(time.Duration(secs)*time.Second))
			fmt.Fprintf(os.Stderr, "%s at %d req/s for %ds (%d CPUs): %s\n", b.Name(), rps, secs, runtime.NumCPU(), r)
			b.ReportMetric(us(pct(r.Lat, 50)), "p50-µs")
			b.ReportMetric(us(pct(r.Lat, 99)), "p99-µs")
			b.ReportMetric(us(pctf(r.Lat, 99.9)), "p99.9-µs")
			b.ReportMetric(us(pctf(r.Lat, 100)), "max-µs")
			b.ReportMetric(float64(r.Errs), "unexpected")
			if r.Errs > 0 {
				b.Errorf("%d answers were not %d: %v", r.Errs, want, r.Statuses)
			}
		}
	}

	b.Run("queue_full", func(b *testing.B) {
		mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, MaxRecords: 100, Logger: quietLog()})
		ms := httptest.NewServer(mock)
		defer ms.Close()
		e := startBenchGateway(b, ms.URL, mock, func(c *config.Config) {
			c.Backends[0].MaxConcurrency, c.Backends[0].MaxQueue = 1, 0
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			if resp, err := httpPost(ctx, e.URL, e.Key, `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"hang":true,"tag":"hold"}}`); err == nil {
				resp.Body.Close()
			}
		}()
		wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer wcancel()
		if _, err := mock.WaitFor(wctx, "hold", func(mockllm.Record) bool { return true }); err != nil {
			b.Fatalf("the slot holder never reached the engine: %v", err)
		}
		run(b, e.testEnv, e.Key, body, http.StatusServiceUnavailable)
	})

	rateLimited := func(b *testing.B, redisURL string) {
		mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, MaxRecords: 100, Logger: quietLog()})
		ms := httptest.NewServer(mock)
		defer ms.Close()
		e := startBenchGateway(b, ms.URL, mock, func(c *config.Config) { c.RedisURL = redisURL })
		key := randomIDKey(b, e.testEnv, "limited@example.com", 1)
		if st := do(benchClient(), e.URL+"/v1/chat/completions", key, body); st != http.StatusOK {
			b.Fatalf("first request under rpm 1: %d", st)
		}
		run(b, e.testEnv, key, body, http.StatusTooManyRequests)
	}
	b.Run("rate_limited/memory", func(b *testing.B) { rateLimited(b, "") })
	b.Run("rate_limited/redis", func(b *testing.B) {
		url := os.Getenv("MOONJI_TEST_REDIS_URL")
		if url == "" {
			b.Skip("MOONJI_TEST_REDIS_URL is not set")
		}
		rateLimited(b, url)
	})

	b.Run("baseline/unknown_model", func(b *testing.B) {
		mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, MaxRecords: 100, Logger: quietLog()})
		ms := httptest.NewServer(mock)
		defer ms.Close()
		e := startBenchGateway(b, ms.URL, mock)
		run(b, e.testEnv, e.Key, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound)
	})
}

func httpPost(ctx context.Context, base, key, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", stringsReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	return http.DefaultClient.Do(req)
}
