// Command openloop sends POST requests at a fixed rate, whatever the
// answers' pace, and reports the latency percentiles, counted from when
// each request was due: a request that waits for a free connection waits
// on the clock (no coordinated omission, as wrk2 counts).
//
//	openloop -url URL -body FILE [-H 'Name: value']... [-rate 5000] [-duration 10s] [-conns 512]
//	         [-slowlog FILE [-slow 2ms]]
//
// It exists because vegeta costs too much CPU a request for the two-core
// bench machine: at 5,000 req/s, vegeta and the mock engine on one core
// cannot keep up with themselves (BENCHMARKS.md §30). openloop sends with
// fasthttp's client from a fixed pool of connections and keeps only a
// duration a request, so that bench/bench-maxrate.sh can offer the rates
// issue 12 asks about.
//
// The output is one line: rate, sent, ok (2xx), p50, p90, p99 and max in
// milliseconds, and the rate achieved. -slowlog writes when each slow
// request was due (Unix nanoseconds) and its latency, to set beside what
// the server did then (BENCHMARKS.md §31 did, with a Go execution trace).
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

type headers []string

func (h *headers) String() string     { return strings.Join(*h, ", ") }
func (h *headers) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	var cfg config
	var hdrs headers
	flag.StringVar(&cfg.url, "url", "", "the URL to POST to")
	bodyFile := flag.String("body", "", "the file whose bytes are each request's body")
	flag.IntVar(&cfg.rate, "rate", 1000, "requests per second")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long to send")
	flag.IntVar(&cfg.conns, "conns", 512, "connections at most (and requests in flight)")
	flag.Var(&hdrs, "H", "a request header, 'Name: value' (repeatable)")
	flag.StringVar(&cfg.slowLog, "slowlog", "", "a file to write each slow request to: when it was due (Unix ns) and its latency (ns)")
	flag.DurationVar(&cfg.slowOver, "slow", 2*time.Millisecond, "what -slowlog counts as slow")
	flag.Parse()
	if cfg.url == "" || *bodyFile == "" || cfg.rate <= 0 || cfg.conns <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	var err error
	if cfg.body, err = os.ReadFile(*bodyFile); err != nil {
		log.Fatal(err)
	}
	cfg.headers = hdrs
	res, err := run(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ms := func(q float64) float64 { return float64(res.quantile(q).Nanoseconds()) / 1e6 }
	fmt.Printf("rate %d sent %d ok %d p50 %.3f p90 %.3f p99 %.3f max %.3f achieved %.0f/s\n",
		cfg.rate, res.sent, res.ok, ms(0.50), ms(0.90), ms(0.99), ms(1), float64(res.sent)/res.took.Seconds())
}

// config is one run: POST body to url, rate requests a second for
// duration, over conns connections at most.
type config struct {
	url      string
	body     []byte
	headers  []string // "Name: value"
	rate     int
	duration time.Duration
	conns    int
	slowLog  string
	slowOver time.Duration
}

// result is what a run measured.
type result struct {
	sent, ok  int
	latencies []time.Duration // sorted; each from when its request was due
	took      time.Duration
}

// quantile returns the latency below which a fraction q of the requests
// finished (1: the slowest).
func (r result) quantile(q float64) time.Duration {
	n := len(r.latencies)
	if n == 0 {
		return 0
	}
	return r.latencies[min(n-1, int(q*float64(n)))]
}

func run(cfg config) (result, error) {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI(cfg.url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	for _, h := range cfg.headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return result{}, fmt.Errorf("header %q: want 'Name: value'", h)
		}
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	req.SetBody(cfg.body)

	client := &fasthttp.Client{MaxConnsPerHost: cfg.conns, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
	n := int(float64(cfg.rate) * cfg.duration.Seconds())
	latencies := make([]time.Duration, n)
	ok := make([]bool, n)
	due := make(chan int, n)

	// Each worker owns a request and a response; request i is due at
	// start + i/rate, and its latency runs from then.
	start := time.Now().Add(10 * time.Millisecond)
	interval := time.Second / time.Duration(cfg.rate)
	var wg sync.WaitGroup
	for range cfg.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := fasthttp.AcquireRequest()
			req.CopyTo(r)
			resp := fasthttp.AcquireResponse()
			for i := range due {
				err := client.Do(r, resp)
				latencies[i] = time.Since(start.Add(time.Duration(i) * interval))
				ok[i] = err == nil && resp.StatusCode()/100 == 2
			}
		}()
	}
	pace(n, start, interval, due)
	wg.Wait()

	res := result{sent: n, latencies: latencies, took: time.Since(start)}
	if cfg.slowLog != "" {
		if err := writeSlow(cfg.slowLog, start, interval, latencies, cfg.slowOver); err != nil {
			return res, err
		}
	}
	for _, o := range ok {
		if o {
			res.ok++
		}
	}
	slices.Sort(res.latencies)
	return res, nil
}

// pace hands out the numbers 0..n-1 on due, each at start + i*interval, and
// closes it. It sleeps in nanosleep on a thread of its own: Go's timers
// wake a thread idle in the network poller to the millisecond, which would
// send a millisecond's requests at once.
func pace(n int, start time.Time, interval time.Duration, due chan<- int) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			sleepFor(wait)
		}
		due <- i
	}
	close(due)
}

// writeSlow writes the requests slower than over to path, one a line: when
// each was due (Unix nanoseconds) and its latency (nanoseconds), so that
// they can be set beside what the server was doing then.
func writeSlow(path string, start time.Time, interval time.Duration, latencies []time.Duration, over time.Duration) error {
	var b strings.Builder
	for i, d := range latencies {
		if d > over {
			fmt.Fprintf(&b, "%d %d\n", start.Add(time.Duration(i)*interval).UnixNano(), d.Nanoseconds())
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
