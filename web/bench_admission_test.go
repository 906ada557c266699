//go:build bench

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

	"github.com/prometheus/client_golang/prometheus/testutil"

	"moonji/internal/config"
	"moonji/internal/mockllm"
)

// BenchmarkRejectLatency measures what admission costs a request that is
// refused: an open loop of MOONJI_BENCH_RPS (default 2000) req/s for
// MOONJI_BENCH_SECONDS (default 3), after a one-second warm-up, every one of
// which must be refused. Sub-benchmarks:
//
//   - queue_full: the backend has max_concurrency 1 and max_queue 1, its slot
//     and its queue place held by requests the engine never answers (mock
//     "hang"): 503 queue_full.
//   - rate_limited/memory: a key with rpm 1 that has used its request: 429,
//     with the in-memory limiter.
//   - rate_limited/redis: the same with the limiter in Redis
//     (MOONJI_TEST_REDIS_URL; skipped when unset).
//   - baseline/unknown_model: the floor, a 404 for an unknown model, which
//     takes the same route up to the routing decision (key look-up, body
//     parse, a rejected row) without rate limit or admission.
//
// Run it with:
//
//	go test ./web -run '^$' -bench RejectLatency -benchtime 1x
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
		defer ms.CloseClientConnections() // ends the hanging requests
		// max_queue: 0 in the configuration means "the default, 32" (see
		// BENCHMARKS.md), so the queue has one place, taken by a second
		// hanging request that never times out.
		e := startBenchGateway(b, ms.URL, mock, func(c *config.Config) {
			c.Backends[0].MaxConcurrency, c.Backends[0].MaxQueue, c.Backends[0].QueueTimeout = 1, 1, time.Hour
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for i, tag := range []string{"hold", "queued"} {
			go func() {
				if resp, err := httpPost(ctx, e.URL, e.Key, `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"hang":true,"tag":"`+tag+`"}}`); err == nil {
					resp.Body.Close()
				}
			}()
			if i == 0 {
				wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := mock.WaitFor(wctx, "hold", func(mockllm.Record) bool { return true })
				wcancel()
				if err != nil {
					b.Fatalf("the slot holder never reached the engine: %v", err)
				}
			}
		}
		// Wait for the second one to take the queue's place.
		deadline := time.Now().Add(5 * time.Second)
		for testutil.ToFloat64(e.srv.Metrics.Queued.WithLabelValues("mock")) != 1 {
			if time.Now().After(deadline) {
				b.Fatal("the queue never filled")
			}
			time.Sleep(5 * time.Millisecond)
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

	// The HTTP floor: the same load on GET /healthz (no key, no database),
	// client and server on the same two cores.
	b.Run("baseline/healthz", func(b *testing.B) {
		mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, MaxRecords: 100, Logger: quietLog()})
		ms := httptest.NewServer(mock)
		defer ms.Close()
		e := startBenchGateway(b, ms.URL, mock)
		client := benchClient()
		spec := loadSpec{URL: e.URL + "/healthz", Method: http.MethodGet, RPS: rps, Want: http.StatusOK}
		for b.Loop() {
			openLoop(client, spec.with(time.Second))
			r := openLoop(client, spec.with(time.Duration(secs)*time.Second))
			fmt.Fprintf(os.Stderr, "%s at %d req/s for %ds (%d CPUs): %s\n", b.Name(), rps, secs, runtime.NumCPU(), r)
			b.ReportMetric(us(pct(r.Lat, 50)), "p50-µs")
			b.ReportMetric(us(pct(r.Lat, 99)), "p99-µs")
			b.ReportMetric(float64(r.Errs), "unexpected")
		}
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
