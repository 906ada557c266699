//go:build bench

package web_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"moonji/internal/testdb"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/testredis"
)

// BenchmarkStopLatency measures Stop end to end across two replicas: streams
// run on replica A at 50 tokens/s; after the third content chunk the client
// asks replica B to stop it (POST /v1/inferences/{id}/cancel), which goes
// through Redis to A, and A acknowledges once the stream has ended. For each
// of MOONJI_BENCH_STOPS (default 1000) stops, MOONJI_BENCH_PARALLEL (default
// 20) at a time, it records
//
//   - stop → 200: from sending the stop to B's answer;
//   - stop → [DONE]: from sending the stop to the client reading A's final
//     "data: [DONE]";
//   - content chunks read by the client after the stop's 200 (target 0).
//
// With MOONJI_TEST_REDIS_URL set it uses that Redis (and PostgreSQL when
// MOONJI_TEST_POSTGRES_DSN is set, else a shared SQLite file); without it,
// miniredis, and says so.
//
//	MOONJI_TEST_REDIS_URL=redis://127.0.0.1:6379/0 go test ./web -run '^$' -bench StopLatency -benchtime 1x
func BenchmarkStopLatency(b *testing.B) {
	total := envInt("MOONJI_BENCH_STOPS", 1000)
	par := envInt("MOONJI_BENCH_PARALLEL", 20)
	mode, a, bb := startStopPair(b)
	key := randomIDKey(b, a, "stopper@example.com", 0)
	client := benchClient()
	body := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":50,"tokens":1000}}`

	for b.Loop() {
		var mu sync.Mutex
		var toOK, toDone []time.Duration
		var after, bad, unacked, doneLate int
		var doneLateMax time.Duration
		var badWhy []string
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range par {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(total) {
					r := stopOne(client, a.URL, bb.URL, key, body)
					mu.Lock()
					switch {
					case r.err != nil:
						bad++
						if len(badWhy) < 5 {
							badWhy = append(badWhy, r.err.Error())
						}
					default:
						toOK = append(toOK, r.ok.Sub(r.sent))
						toDone = append(toDone, r.done.Sub(r.sent))
						after += r.after
						if d := r.done.Sub(r.ok); d > 0 {
							doneLate++
							doneLateMax = max(doneLateMax, d)
						}
						if !r.acked {
							unacked++
						}
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		took := time.Since(start)
		var m dto.Metric
		_ = bb.srv.Metrics.StopLatency.Write(&m)
		h := m.GetHistogram()
		var within20 uint64
		for _, bk := range h.GetBucket() {
			if bk.GetUpperBound() == 0.02 {
				within20 = bk.GetCumulativeCount()
			}
		}
		fmt.Fprintf(os.Stderr, "%d stops (%d at a time, streams at 50 tokens/s, %s) in %v:\n  stop → 200:    p50 %v p99 %v max %v\n  stop → [DONE]: p50 %v p99 %v max %v\n  content chunks read after the 200: %d; [DONE] read after the 200: %d stops (max %v later)\n  B's own stop latency (moonji_stop_latency_seconds): %d stops, mean %v, %d within 20 ms\n  unacknowledged: %d; failed: %d %v\n",
			len(toOK), par, mode, took.Round(time.Millisecond), pct(toOK, 50), pct(toOK, 99), pctf(toOK, 100),
			pct(toDone, 50), pct(toDone, 99), pctf(toDone, 100), after, doneLate, doneLateMax,
			h.GetSampleCount(), time.Duration(h.GetSampleSum()/float64(max(h.GetSampleCount(), 1))*1e9), within20, unacked, bad, badWhy)
		b.ReportMetric(us(pct(toOK, 50)), "to200-p50-µs")
		b.ReportMetric(us(pct(toOK, 99)), "to200-p99-µs")
		b.ReportMetric(us(pct(toDone, 50)), "toDONE-p50-µs")
		b.ReportMetric(us(pct(toDone, 99)), "toDONE-p99-µs")
		b.ReportMetric(float64(after), "chunks-after-200")
		b.ReportMetric(float64(bad+unacked), "failed")
		if bad+unacked > 0 || after > 0 {
			b.Errorf("%d stops failed, %d unacknowledged, %d chunks after the 200", bad, unacked, after)
		}
	}
}

type stopResult struct {
	sent, ok, done time.Time
	after          int
	acked          bool
	err            error
}

// stopOne starts one stream on a, waits for its third content chunk, stops
// it through b and waits for its end.
func stopOne(client *http.Client, aURL, bURL, key, body string) stopResult {
	var r stopResult
	req, _ := http.NewRequest(http.MethodPost, aURL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.err = fmt.Errorf("stream: status %d", resp.StatusCode)
		return r
	}
	id := resp.Header.Get("X-Inference-Id")

	// The reader timestamps every content frame and the [DONE].
	third := make(chan struct{})
	ended := make(chan struct{})
	var contentAt []time.Time
	var doneAt time.Time
	var tail string
	go func() {
		defer close(ended)
		br := bufio.NewReaderSize(resp.Body, 8192)
		for {
			line, err := br.ReadString('\n')
			now := time.Now()
			if strings.HasPrefix(line, "data: ") {
				tail = line
				switch {
				case line == "data: [DONE]\n":
					doneAt = now
				case strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`):
					contentAt = append(contentAt, now)
					if len(contentAt) == 3 {
						close(third)
					}
				}
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-third:
	case <-ended:
		r.err = fmt.Errorf("stream ended before its third chunk")
		return r
	case <-time.After(5 * time.Second):
		r.err = fmt.Errorf("no third chunk after 5s")
		return r
	}

	r.sent = time.Now()
	sreq, _ := http.NewRequest(http.MethodPost, bURL+"/v1/inferences/"+id+"/cancel", nil)
	sreq.Header.Set("Authorization", "Bearer "+key)
	sresp, err := client.Do(sreq)
	if err != nil {
		r.err = err
		return r
	}
	raw, _ := io.ReadAll(sresp.Body)
	sresp.Body.Close()
	r.ok = time.Now()
	var ans struct {
		State        string `json:"state"`
		Acknowledged bool   `json:"acknowledged"`
	}
	_ = json.Unmarshal(raw, &ans)
	if sresp.StatusCode != http.StatusOK || ans.State != "stopped" {
		r.err = fmt.Errorf("stop: %d %s", sresp.StatusCode, raw)
		resp.Body.Close()
		<-ended
		return r
	}
	r.acked = ans.Acknowledged
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		r.err = fmt.Errorf("stream did not end within 5s of the stop")
		resp.Body.Close()
		<-ended
		return r
	}
	if doneAt.IsZero() {
		r.err = fmt.Errorf("stopped stream did not end with [DONE] (last %q)", tail)
		return r
	}
	r.done = doneAt
	for _, at := range contentAt {
		if at.After(r.ok) {
			r.after++
		}
	}
	return r
}

// startStopPair starts replicas A and B sharing one database, one Redis and
// one mock engine, and names the setup.
func startStopPair(b *testing.B) (string, *testEnv, *testEnv) {
	be := testredis.Best(b)
	dbURL := "sqlite://" + b.TempDir() + "/cluster.db"
	mode := "real Redis " + be.URL
	if be.Mini != nil {
		mode = "miniredis (MOONJI_TEST_REDIS_URL not set)"
	}
	if dsn := os.Getenv("MOONJI_TEST_POSTGRES_DSN"); dsn != "" && be.Mini == nil {
		dbURL = benchPostgresSchema(b, dsn)
		mode += ", PostgreSQL"
	} else {
		mode += ", SQLite"
	}
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, MaxRecords: 1000, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	b.Cleanup(ms.Close)
	var envs []*testEnv
	for i := 0; i < 2; i++ {
		cfg := &config.Config{
			DatabaseURL: dbURL,
			RedisURL:    be.URL,
			RedisPrefix: be.Prefix,
			ReplicaID:   fmt.Sprintf("bench-%c-%d", 'A'+i, time.Now().UnixNano()),
			RateLimit:   config.RateLimit{RequestsPerMinute: 1_000_000},
			Backends:    []config.Backend{{Name: "mock", URL: ms.URL + "/v1", MaxConcurrency: 256, MaxQueue: 256, QueueTimeout: 10 * time.Second}},
			Models:      []config.Model{{Name: "m1", Backend: "mock"}},
		}
		e := startWithConfig(b, cfg, mock, ms.URL)
		// An experiment knob: the database pool's idle connections
		// (database/sql keeps 2 by default, and models.Open sets none).
		if n := envInt("MOONJI_BENCH_DB_IDLE", 0); n > 0 {
			if sqlDB, err := e.DB.DB(); err == nil {
				sqlDB.SetMaxIdleConns(n)
				if i == 0 {
					mode += fmt.Sprintf(", MaxIdleConns %d", n)
				}
			}
		}
		envs = append(envs, e)
	}
	return mode, envs[0], envs[1]
}

// benchPostgresSchema creates a schema of its own and returns a URL whose
// search_path points at it (freshPostgresSchema for a benchmark).
func benchPostgresSchema(tb testing.TB, dsn string) string {
	tb.Helper()
	return testdb.PostgresSchema(tb, dsn)
}
