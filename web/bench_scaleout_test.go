//go:build bench

package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/testredis"
	"moonji/models"
)

// benchRedis is the Redis of the scale-out benchmarks, a real one
// (miniredis's Lua is much slower than Redis's: numbers from it would say
// little): MOONJI_BENCH_REDIS_URL, else MOONJI_TEST_REDIS_URL, under a fresh
// key prefix whose keys are deleted when the benchmark ends
// (testredis.Real). Without either URL the benchmark is skipped.
func benchRedis(b *testing.B) (url, prefix string) {
	if u := os.Getenv("MOONJI_BENCH_REDIS_URL"); u != "" {
		b.Setenv(testredis.EnvURL, u)
	} else if os.Getenv(testredis.EnvURL) == "" {
		b.Skip("set MOONJI_BENCH_REDIS_URL or " + testredis.EnvURL + " to a real Redis")
	}
	be := testredis.Real(b)
	return be.URL, be.Prefix
}

// BenchmarkQueueFairnessAcrossReplicas measures the order in which three
// replicas sharing one backend's limit through Redis admit a burst: n
// requests (MOONJI_BENCH_BURST, default 90) sent 2 ms apart, round robin
// over the replicas, to a backend with max_concurrency 4 whose requests
// hold their slot 20 ms, so most of them wait in their replica's queue. It
// reports, against the gateway's arrival order (the rows' created_at):
// inversions, inversions across rounds of 4 (a request overtaken by one that
// arrived a full round later), and the largest lead an overtaking request
// had: how much later it arrived than the one it overtook.
//
//	MOONJI_BENCH_REDIS_URL=redis://127.0.0.1:6379/0 go test ./web -run '^$' -bench QueueFairnessAcrossReplicas -benchtime 1x
func BenchmarkQueueFairnessAcrossReplicas(b *testing.B) {
	redisURL, prefix := benchRedis(b)
	n := envInt("MOONJI_BENCH_BURST", 90)
	const conc, hold, gap = 4, 20 * time.Millisecond, 2 * time.Millisecond
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	dbURL := "sqlite://" + b.TempDir() + "/fair.db"
	var replicas []*testEnv
	for i := range 3 {
		e := startWithConfig(b, &config.Config{
			DatabaseURL: dbURL, RedisURL: redisURL, RedisPrefix: prefix,
			ReplicaID: fmt.Sprintf("fair-%d", i),
			RateLimit: config.RateLimit{RequestsPerMinute: 10_000_000},
			Backends: []config.Backend{{Name: "mock", URL: ms.URL + "/v1", MaxConcurrency: conc, MaxQueue: n,
				QueueTimeout: 60 * time.Second}},
			Models: []config.Model{{Name: "m1", Backend: "mock"}},
		}, mock, ms.URL)
		if len(replicas) > 0 {
			e.Key = replicas[0].Key
		}
		replicas = append(replicas, e)
	}
	client := benchClient()
	for it := 0; it < b.N; it++ {
		tag := fmt.Sprintf("it%d-", it)
		ids := make([]string, n)
		statuses := make([]int, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			e := replicas[i%3]
			body := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tag":"%s%03d","ttft_ms":%d,"tokens":1}}`, tag, i, hold.Milliseconds())
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+e.Key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					return
				}
				readAll(b, resp.Body)
				ids[i], statuses[i] = resp.Header.Get("X-Inference-Id"), resp.StatusCode
			}()
			time.Sleep(gap)
		}
		wg.Wait()
		for i, st := range statuses {
			if st != http.StatusOK {
				b.Fatalf("request %d: status %d", i, st)
			}
		}
		startAt := map[int]time.Time{}
		for _, r := range mock.Requests() {
			if rest, ok := strings.CutPrefix(r.Tag, tag); ok {
				k, _ := strconv.Atoi(rest)
				startAt[k] = r.Started
			}
		}
		if len(startAt) != n {
			b.Fatalf("the engine saw %d of %d requests", len(startAt), n)
		}
		for _, e := range replicas {
			_ = e.srv.Ledger.Flush(context.Background())
		}
		arrived := make([]time.Time, n)
		for i, id := range ids {
			var u models.Usage
			if err := replicas[0].DB.Where("inference_id = ?", id).First(&u).Error; err != nil {
				b.Fatalf("row of request %d: %v", i, err)
			}
			arrived[i] = u.CreatedAt
		}
		byArrival := make([]int, n)
		for i := range byArrival {
			byArrival[i] = i
		}
		slices.SortStableFunc(byArrival, func(x, y int) int { return arrived[x].Compare(arrived[y]) })
		rank := make([]int, n)
		for r, i := range byArrival {
			rank[i] = r
		}
		byStart := slices.Clone(byArrival)
		slices.SortStableFunc(byStart, func(x, y int) int { return startAt[x].Compare(startAt[y]) })
		started := make([]int, n) // arrival ranks in start order
		for r, i := range byStart {
			started[r] = rank[i]
		}
		// The largest lead of an overtaking request: j started before i
		// although it arrived later, by arrived[j]-arrived[i].
		var lead time.Duration
		for a := range byStart {
			for c := a + 1; c < n; c++ {
				j, i := byStart[a], byStart[c]
				if arrived[j].After(arrived[i]) {
					lead = max(lead, arrived[j].Sub(arrived[i]))
				}
			}
		}
		inv := inversions(started)
		far := farInversions(started, conc)
		fmt.Fprintf(os.Stderr, "3 replicas, burst of %d at %v gaps, max_concurrency %d (shared), hold %v: inversions %d of %d pairs (tau %.4f), across rounds of %d: %d, largest lead of an overtaking request %v\n",
			n, gap, conc, hold, inv, n*(n-1)/2, 1-2*float64(inv)/float64(n*(n-1)/2), conc, far, lead.Round(100*time.Microsecond))
		b.ReportMetric(float64(inv), "inversions")
		b.ReportMetric(float64(far), "inversions-across-rounds")
		b.ReportMetric(float64(lead.Microseconds())/1000, "max-lead-ms")
	}
}

// BenchmarkSlotPath measures what the shared limit adds to one request:
// sequential non-streamed requests through one replica, with the slot
// leased in Redis and with the local gate. Redis is configured in both (so
// rate limits and Stop cost the same); only the lease differs, switched by
// max_concurrency's scope. Reports p50 and p99 per request.
//
//	MOONJI_BENCH_REDIS_URL=redis://127.0.0.1:6379/0 go test ./web -run '^$' -bench SlotPath -benchtime 2000x
func BenchmarkSlotPath(b *testing.B) {
	redisURL, prefix := benchRedis(b)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	for _, shared := range []bool{false, true} {
		name := map[bool]string{false: "local", true: "redis_lease"}[shared]
		b.Run(name, func(b *testing.B) {
			e := startBenchGateway(b, ms.URL, mock, func(c *config.Config) {
				c.RedisURL, c.RedisPrefix = redisURL, prefix+name+":"
				c.LocalConcurrency = !shared
			})
			client := benchClient()
			body := `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tokens":1}}`
			for range 200 {
				do(client, e.URL+"/v1/chat/completions", e.Key, body)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				do(client, e.URL+"/v1/chat/completions", e.Key, body)
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			b.ReportMetric(float64(pct(lat, 50).Microseconds()), "p50-µs")
			b.ReportMetric(float64(pct(lat, 99).Microseconds()), "p99-µs")
		})
	}
}
