//go:build bench

package web_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// BenchmarkYoungStopAcrossReplicas measures a stop through replica B of a
// stream replica A started 50 ms earlier, when no replica but A knows it
// exists (A writes its row 500 ms after the start), for MOONJI_BENCH_STOPS
// (default 200) stops one after another, on each route:
//
//   - v1_cancel: a /v1 stream with a key, stopped with
//     POST /v1/inferences/{id}/cancel;
//   - chat_stop: a chat reply, stopped with the person's session through
//     POST /api/v1/inference/stop.
//
// For each it reports the time from sending the stop to B's 200 and, within
// it, B's stop itself (moonji_stop_latency_seconds: from asking the replicas
// to the running one's acknowledgement; the rest is HTTP and the route's
// authentication — a database read for a session). Every stop must be
// acknowledged by A (B's result "acked": none went through storage), and a
// /v1 stream must deliver no content after the 200. With
// MOONJI_TEST_REDIS_URL set it uses that Redis (and PostgreSQL when
// MOONJI_TEST_POSTGRES_DSN is set):
//
//	MOONJI_TEST_REDIS_URL=redis://127.0.0.1:6379/0 MOONJI_TEST_POSTGRES_DSN=postgres://… \
//	  go test -tags bench ./web -run '^$' -bench YoungStopAcrossReplicas -benchtime 1x
func BenchmarkYoungStopAcrossReplicas(b *testing.B) {
	n := envInt("MOONJI_BENCH_STOPS", 200)
	mode, a, bb := startStopPair(b)
	key := randomIDKey(b, a, "young-stopper@example.com", 0)
	client := benchClient()
	body := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":50,"tokens":1000}}`
	const email = "young-chatter@example.com"
	pa, pb := a.chatter(email), bb.chatter(email)
	a.mockBody(map[string]any{"tokens": 1000, "tps": 50})
	// A conversation has one reply at a time, and a stopped one lets go of
	// it just after the stop's 200: they take turns.
	convs := make([]string, 4)
	for i := range convs {
		convs[i] = pa.newConversation()
	}
	used := map[string]bool{}
	// B's own time for its stops so far (one at a time: a difference is
	// one stop's).
	stopSum := func() time.Duration {
		var m dto.Metric
		_ = bb.srv.Metrics.StopLatency.Write(&m)
		return time.Duration(m.GetHistogram().GetSampleSum() * 1e9)
	}
	acked := func() float64 {
		var m dto.Metric
		_ = bb.srv.Metrics.Stops.WithLabelValues("acked").Write(&m)
		return m.GetCounter().GetValue()
	}
	report := func(route string, lat, own []time.Duration) {
		fmt.Fprintf(os.Stderr, "%s: %d stops of %v old streams through the other replica (%s):\n"+
			"  stop → 200:          p50 %v p99 %v max %v\n  B's stop within it:  p50 %v p99 %v max %v\n",
			route, len(lat), youngAge, mode, pct(lat, 50), pct(lat, 99), pctf(lat, 100), pct(own, 50), pct(own, 99), pctf(own, 100))
		b.ReportMetric(us(pct(lat, 50)), route+"-p50-µs")
		b.ReportMetric(us(pct(lat, 99)), route+"-p99-µs")
		b.ReportMetric(us(pct(own, 99)), route+"-stop-p99-µs")
	}
	// measure runs n stops of one route and checks that A answered each.
	measure := func(route string, stopOne func(i int) (time.Duration, error)) {
		lat, own := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
		before := acked()
		for i := range n {
			sum := stopSum()
			d, err := stopOne(i)
			if err != nil {
				b.Fatalf("%s stop %d: %v", route, i, err)
			}
			lat, own = append(lat, d), append(own, stopSum()-sum)
		}
		if got := acked() - before; got != float64(n) {
			b.Errorf("%s: %v of %d stops acknowledged by the running replica; the rest went through storage", route, got, n)
		}
		report(route, lat, own)
	}

	for b.Loop() {
		measure("v1_cancel", func(int) (time.Duration, error) {
			return stopYoungStream(client, a.URL, bb.URL, key, body)
		})
		measure("chat_stop", func(i int) (time.Duration, error) {
			conv := convs[i%len(convs)]
			if used[conv] {
				pa.reply(conv)
			}
			used[conv] = true
			s := pa.send(conv, "x")
			untilAge(time.Now(), youngAge)
			start := time.Now()
			st, body := pb.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s.InferenceID+`"}`)
			d := time.Since(start)
			if st != http.StatusOK || !strings.Contains(body, `"state":"stopped"`) || !strings.Contains(body, `"acknowledged":true`) {
				return 0, fmt.Errorf("%d %s", st, body)
			}
			return d, nil
		})
	}
}

// stopYoungStream starts a stream on aURL, stops it through bURL youngAge
// after its header arrived, and returns the stop's time to its 200, once
// the stream has ended with [DONE] and no content after the 200.
func stopYoungStream(client *http.Client, aURL, bURL, key, body string) (time.Duration, error) {
	req, _ := http.NewRequest(http.MethodPost, aURL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	started := time.Now()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("stream: status %d", resp.StatusCode)
	}
	id := resp.Header.Get("X-Inference-Id")
	type frame struct {
		at      time.Time
		content bool
		done    bool
	}
	frames := make(chan frame, 1024)
	go func() {
		defer close(frames)
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: ") {
				frames <- frame{at: time.Now(), done: line == "data: [DONE]\n",
					content: strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`)}
			}
			if err != nil {
				return
			}
		}
	}()
	untilAge(started, youngAge)
	sent := time.Now()
	sreq, _ := http.NewRequest(http.MethodPost, bURL+"/v1/inferences/"+id+"/cancel", nil)
	sreq.Header.Set("Authorization", "Bearer "+key)
	sresp, err := client.Do(sreq)
	if err != nil {
		return 0, err
	}
	raw, _ := io.ReadAll(sresp.Body)
	sresp.Body.Close()
	ok := time.Now()
	var ans struct {
		State        string `json:"state"`
		Acknowledged bool   `json:"acknowledged"`
	}
	_ = json.Unmarshal(raw, &ans)
	if sresp.StatusCode != http.StatusOK || ans.State != "stopped" || !ans.Acknowledged {
		return 0, fmt.Errorf("stop of %s: %d %s", id, sresp.StatusCode, raw)
	}
	timeout := time.After(5 * time.Second)
	var after int
	done := false
	for {
		select {
		case f, open := <-frames:
			if !open {
				if !done {
					return 0, fmt.Errorf("the stopped stream %s did not end with [DONE]", id)
				}
				if after > 0 {
					return 0, fmt.Errorf("%d content chunks of %s read after the stop's 200", after, id)
				}
				return ok.Sub(sent), nil
			}
			if f.content && f.at.After(ok) {
				after++
			}
			done = done || f.done
		case <-timeout:
			return 0, fmt.Errorf("the stream %s did not end within 5 s of its stop", id)
		}
	}
}
