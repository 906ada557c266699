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
	"moonji/models"
)

// BenchmarkQueueFairness measures the admission queue's order: a backend
// with max_concurrency 4 gets a burst of MOONJI_BENCH_BURST (default 100)
// requests sent 1 ms apart in a known order, each holding its slot for
// 20 ms (mock ttft), so about 80 of them wait in the queue. It reports:
//
//   - inversions: pairs started at the engine in the opposite order of
//     their arrival (0 for a strict FIFO), against the send order and
//     against the gateway's own arrival time (the ledger row's created_at);
//   - Kendall's tau between arrival and start order (1 = identical);
//   - the spread of queue waits (the row's queue_ms): min, p50, p99, max,
//     and how far each wait is from what a strict FIFO with these service
//     times predicts.
//
// Run it with:
//
//	go test ./web -run '^$' -bench QueueFairness -benchtime 1x
func BenchmarkQueueFairness(b *testing.B) {
	n := envInt("MOONJI_BENCH_BURST", 100)
	const conc, hold, gap = 4, 20 * time.Millisecond, time.Millisecond
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	e := startBenchGateway(b, ms.URL, mock, func(c *config.Config) {
		c.Backends[0].MaxConcurrency, c.Backends[0].MaxQueue, c.Backends[0].QueueTimeout = conc, n, 60*time.Second
	})
	client := benchClient()
	// Warm the connection pool with as many connections as the burst needs.
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(client, e.URL+"/v1/chat/completions", e.Key, `{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tokens":1}}`)
		}()
	}
	wg.Wait()

	for it := 0; it < b.N; it++ {
		prefix := fmt.Sprintf("it%d-", it)
		ids := make([]string, n)
		statuses := make([]int, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			body := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tag":"%s%03d","ttft_ms":%d,"tokens":1}}`, prefix, i, hold.Milliseconds())
			go func(i int) {
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
			}(i)
			time.Sleep(gap)
		}
		wg.Wait()
		for i, st := range statuses {
			if st != http.StatusOK {
				b.Fatalf("request %d: status %d", i, st)
			}
		}

		// Start order at the engine, as send indexes.
		recs := mock.Requests()
		slices.SortFunc(recs, func(a, b mockllm.Record) int { return a.Started.Compare(b.Started) })
		var started []int
		for _, r := range recs {
			if rest, ok := strings.CutPrefix(r.Tag, prefix); ok {
				k, _ := strconv.Atoi(rest)
				started = append(started, k)
			}
		}
		if len(started) != n {
			b.Fatalf("the engine saw %d of %d requests", len(started), n)
		}
		// Arrival order at the gateway, from the rows' created_at; the
		// queue waits from their queue_ms.
		_ = e.srv.Ledger.Flush(context.Background())
		arrived := make([]time.Time, n)
		waits := make([]time.Duration, n)
		for i, id := range ids {
			var u models.Usage
			if err := e.DB.Where("inference_id = ?", id).First(&u).Error; err != nil {
				b.Fatalf("row of request %d: %v", i, err)
			}
			arrived[i] = u.CreatedAt
			waits[i] = time.Duration(u.QueueMs) * time.Millisecond
		}
		gwOrder := make([]int, n) // send index by gateway arrival rank
		for i := range gwOrder {
			gwOrder[i] = i
		}
		slices.SortStableFunc(gwOrder, func(x, y int) int { return arrived[x].Compare(arrived[y]) })
		rankAtGateway := make([]int, n)
		for r, i := range gwOrder {
			rankAtGateway[i] = r
		}
		startByGateway := make([]int, n)
		for r, i := range started {
			startByGateway[r] = rankAtGateway[i]
		}

		invSend := inversions(started)
		invGw := inversions(startByGateway)
		arrivalSwaps := inversions(gwOrder) // the network and handler, before the queue
		pairs := n * (n - 1) / 2
		tau := 1 - 2*float64(invSend)/float64(pairs)
		tauGw := 1 - 2*float64(invGw)/float64(pairs)
		maxDisp := 0
		for r, i := range started {
			maxDisp = max(maxDisp, abs(r-i))
		}

		// A strict FIFO with c slots and equal holds starts the r-th
		// arrival (0-based) at about (r/c)·H after the first, H being the
		// measured time per round of c; the deviation from that is the
		// spread of waits that the queue position does not explain.
		startAt := map[int]time.Time{}
		for _, rec := range recs {
			if rest, ok := strings.CutPrefix(rec.Tag, prefix); ok {
				k, _ := strconv.Atoi(rest)
				startAt[k] = rec.Started
			}
		}
		first := arrived[gwOrder[0]]
		rounds := (n - 1) / conc
		round := startAt[gwOrder[n-1]].Sub(first) / time.Duration(max(rounds, 1))
		var dev []time.Duration
		for r, i := range gwOrder {
			dev = append(dev, absDur(startAt[i].Sub(first)-time.Duration(r/conc)*round))
		}
		if invGw > 0 {
			fmt.Fprintf(os.Stderr, "  start order at the engine, as gateway-arrival ranks: %v\n", startByGateway)
		}
		queued := slices.DeleteFunc(slices.Clone(waits), func(d time.Duration) bool { return d == 0 })
		fmt.Fprintf(os.Stderr, "burst of %d at %v gaps, max_concurrency %d, hold %v: inversions vs send order %d (tau %.4f, max displacement %d), vs gateway arrival %d (tau %.4f); arrival reordered before the queue: %d pairs\n",
			n, gap, conc, hold, invSend, tau, maxDisp, invGw, tauGw, arrivalSwaps)
		fmt.Fprintf(os.Stderr, "  queue_ms of the %d that waited: min %v p50 %v p99 %v max %v; time per round of %d %v; |start − FIFO prediction| p50 %v p99 %v max %v\n",
			len(queued), slices.Min(waits), pct(queued, 50), pct(queued, 99), slices.Max(waits), conc, round, pct(dev, 50), pct(dev, 99), pctf(dev, 100))
		b.ReportMetric(float64(invSend), "inversions-vs-send")
		b.ReportMetric(float64(invGw), "inversions-vs-gateway")
		b.ReportMetric(tau, "kendall-tau")
		b.ReportMetric(float64(maxDisp), "max-displacement")
		b.ReportMetric(float64(farInversions(startByGateway, conc)), "inversions-across-rounds")
		b.ReportMetric(float64(pct(queued, 50).Milliseconds()), "wait-p50-ms")
		b.ReportMetric(float64(slices.Max(waits).Milliseconds()), "wait-max-ms")
		b.ReportMetric(float64(pct(dev, 99).Milliseconds()), "start-dev-p99-ms")
	}
}

// farInversions counts inverted pairs whose ranks differ by at least d:
// with c slots, requests granted in the same round (a few µs apart) may
// reach the engine in either order, but one from a later round never
// should overtake one from an earlier round.
func farInversions(s []int, d int) int {
	n := 0
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[i]-s[j] >= d {
				n++
			}
		}
	}
	return n
}

// inversions counts pairs i<j with s[i] > s[j].
func inversions(s []int) int {
	n := 0
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[i] > s[j] {
				n++
			}
		}
	}
	return n
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
