//go:build bench

package web_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
)

// BenchmarkResponsesTranslation measures what translating a Responses
// stream costs against passing one through: the same mock engine streams
// MOONJI_BENCH_TOKENS (default 1,000) tokens as fast as it can, once as
// Responses events passed through, once as chat chunks the gateway
// translates into Responses events. It reports the time per stream and per
// event of each, sequentially, one stream at a time.
//
//	go test ./web -run '^$' -bench ResponsesTranslation -benchtime 50x
func BenchmarkResponsesTranslation(b *testing.B) {
	tokens := envInt("MOONJI_BENCH_TOKENS", 1000)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Tokens: tokens, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	e := startBenchGateway(b, ms.URL, mock, func(c *config.Config) {
		c.Backends = []config.Backend{
			{Name: "full", URL: ms.URL + "/v1", MaxConcurrency: 64, MaxQueue: 64, APIs: []string{"chat", "responses"}},
			{Name: "chatonly", URL: ms.URL + "/v1", MaxConcurrency: 64, MaxQueue: 64}}
		c.Models = []config.Model{{Name: "m1", Backend: "full"}, {Name: "m2", Backend: "chatonly", UpstreamModel: "m1"}}
	})
	client := benchClient()
	for _, c := range []struct{ name, model string }{{"passthrough", "m1"}, {"translated", "m2"}} {
		b.Run(c.name, func(b *testing.B) {
			body := `{"model":"` + c.model + `","input":"Tell me a story","stream":true}`
			events := 0
			run := func() time.Duration {
				req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/responses", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+e.Key)
				req.Header.Set("Content-Type", "application/json")
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				got := readAll(b, resp.Body)
				resp.Body.Close()
				d := time.Since(t0)
				events = strings.Count(got, "\nevent: ") + 1
				if resp.StatusCode != http.StatusOK || strings.Count(got, "response.output_text.delta\n") != tokens {
					b.Fatalf("status %d, %d deltas", resp.StatusCode, strings.Count(got, "response.output_text.delta\n"))
				}
				return d
			}
			for range 5 {
				run()
			}
			var lat []time.Duration
			b.ResetTimer()
			for range b.N {
				lat = append(lat, run())
			}
			b.StopTimer()
			p50 := pct(lat, 50)
			b.ReportMetric(float64(p50.Microseconds())/1000, "stream-p50-ms")
			b.ReportMetric(float64(p50.Nanoseconds())/float64(events), "ns/event")
			b.ReportMetric(float64(events), "events")
		})
	}
}
