//go:build bench

package web_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
)

// BenchmarkTracingOverhead measures what traces cost a request: two
// gateways in front of one mock engine, one with tracing off and one with
// tracing on at sample_ratio 1.0, exporting to a local OTLP/HTTP sink (a
// server that reads and drops what it gets). Requests go one at a time,
// alternately in rounds (off, on, on, off, …) so that the machine's drift
// falls on both; each round sends MOONJI_BENCH_REQUESTS (default 500)
// whole answers and as many 16-token streams.
//
//	go test -tags bench ./web -run '^$' -bench TracingOverhead -benchtime 1x
//
// Reported per request: mean and p50/p99 latency, and heap allocations of
// the whole process (client and mock included: the difference is the
// tracing's).
func BenchmarkTracingOverhead(b *testing.B) {
	n := envInt("MOONJI_BENCH_REQUESTS", 500)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Tokens: 16, MaxRecords: 1000, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	var exports, exportBytes atomic.Int64
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _ := io.Copy(io.Discard, r.Body)
		exports.Add(1)
		exportBytes.Add(k)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	off := startBenchGateway(b, ms.URL, nil)
	ratio := 1.0
	on := startBenchGateway(b, ms.URL, nil, func(c *config.Config) {
		c.Tracing = config.Tracing{OTLPEndpoint: sink.URL, SampleRatio: &ratio}
	})
	client := benchClient()
	const whole = `{"model":"m1","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}`
	const stream = `{"model":"m1","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16,"stream":true}`

	type series struct {
		lat    []time.Duration
		allocs uint64
		reqs   int
	}
	run := func(e benchEnv, body string, s *series) {
		url := e.URL + "/v1/chat/completions"
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		for i := 0; i < n; i++ {
			t0 := time.Now()
			if st := do(client, url, e.Key, body); st != http.StatusOK {
				b.Fatalf("status %d", st)
			}
			s.lat = append(s.lat, time.Since(t0))
		}
		runtime.ReadMemStats(&m1)
		s.allocs += m1.Mallocs - m0.Mallocs
		s.reqs += n
	}
	for _, kind := range []struct{ name, body string }{{"whole", whole}, {"stream", stream}} {
		var sOff, sOn series
		// Warm both paths (connections, caches, the exporter's client).
		run(off, kind.body, &series{})
		run(on, kind.body, &series{})
		for round := 0; round < 3; round++ {
			if round%2 == 0 {
				run(off, kind.body, &sOff)
				run(on, kind.body, &sOn)
			} else {
				run(on, kind.body, &sOn)
				run(off, kind.body, &sOff)
			}
		}
		report := func(label string, s series) {
			slices.Sort(s.lat)
			var sum time.Duration
			for _, d := range s.lat {
				sum += d
			}
			mean := sum / time.Duration(len(s.lat))
			b.ReportMetric(us(mean), kind.name+"-"+label+"-mean-µs")
			b.ReportMetric(us(pct(s.lat, 50)), kind.name+"-"+label+"-p50-µs")
			b.ReportMetric(us(pct(s.lat, 99)), kind.name+"-"+label+"-p99-µs")
			b.ReportMetric(float64(s.allocs)/float64(s.reqs), kind.name+"-"+label+"-allocs/req")
			b.Logf("%s, tracing %s: mean %v p50 %v p99 %v, %.0f allocations per request (process)",
				kind.name, label, mean, pct(s.lat, 50), pct(s.lat, 99), float64(s.allocs)/float64(s.reqs))
		}
		report("off", sOff)
		report("on", sOn)
	}
	if err := on.srv.Tracer.ForceFlush(b.Context()); err != nil {
		b.Fatal(err)
	}
	if exports.Load() == 0 {
		b.Fatal("nothing reached the OTLP sink")
	}
	b.Logf("OTLP sink: %d exports, %d bytes", exports.Load(), exportBytes.Load())
}
