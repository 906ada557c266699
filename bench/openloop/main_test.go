package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunCountsAndTimes sends 200 requests to a server that takes 3 ms and
// fails every tenth: every request is sent, the failures are not counted
// as ok, and no latency is shorter than the server's time.
func TestRunCountsAndTimes(t *testing.T) {
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer k" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		time.Sleep(3 * time.Millisecond)
		if seen.Add(1)%10 == 0 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()

	res, err := run(config{url: srv.URL, body: []byte(`{"model":"m"}`), headers: []string{"Authorization: Bearer k"},
		rate: 400, duration: 500 * time.Millisecond, conns: 64})
	if err != nil {
		t.Fatal(err)
	}
	if res.sent != 200 || res.ok != 180 {
		t.Fatalf("sent %d, ok %d; want 200 and 180", res.sent, res.ok)
	}
	if p0 := res.quantile(0); p0 < 3*time.Millisecond {
		t.Errorf("fastest latency %v, shorter than the server's 3 ms", p0)
	}
	if !(res.quantile(0.5) <= res.quantile(0.99) && res.quantile(0.99) <= res.quantile(1)) {
		t.Errorf("quantiles out of order: %v %v %v", res.quantile(0.5), res.quantile(0.99), res.quantile(1))
	}
}

// TestLatencyCountsFromWhenDue offers 200 req/s over one connection to a
// server that takes 10 ms a request: it can answer only half, so requests
// queue, and the last ones are due long before they are sent. Measured
// from sending, every latency would be ~10 ms; measured from when each was
// due, the slowest waited for about half the run.
func TestLatencyCountsFromWhenDue(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(10 * time.Millisecond)
	}))
	defer srv.Close()

	res, err := run(config{url: srv.URL, body: []byte(`{}`), rate: 200, duration: 400 * time.Millisecond, conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.sent != 80 || res.ok != 80 {
		t.Fatalf("sent %d, ok %d; want 80 and 80", res.sent, res.ok)
	}
	// 80 requests of 10 ms each take 800 ms; the last was due at 395 ms.
	if worst := res.quantile(1); worst < 350*time.Millisecond {
		t.Errorf("slowest latency %v; requests that waited for the connection were not counted from when due", worst)
	}
	if res.took < 750*time.Millisecond {
		t.Errorf("the run took %v; the server cannot answer 80 requests of 10 ms in less than 800 ms", res.took)
	}
}

// TestRunRefusesAMalformedHeader checks the one input run itself parses.
func TestRunRefusesAMalformedHeader(t *testing.T) {
	if _, err := run(config{url: "http://127.0.0.1:1/", headers: []string{"no colon"}, rate: 1, duration: time.Second, conns: 1}); err == nil {
		t.Fatal("a header without a colon was accepted")
	}
}

// TestSlowLogNamesTheSlowRequests: a server that takes 60 ms for every
// fifth request; the slow log (over 30 ms) holds those, each with when it
// was due (within the run) and a latency above the threshold, and not the
// others. A machine busy with other tests can stall a fast request past the
// threshold now and then, so a few more lines are allowed: a log that took
// in the fast requests would have about 50.
func TestSlowLogNamesTheSlowRequests(t *testing.T) {
	const delay, over = 60 * time.Millisecond, 30 * time.Millisecond
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1)%5 == 0 {
			time.Sleep(delay)
		}
	}))
	defer srv.Close()

	log := filepath.Join(t.TempDir(), "slow.txt")
	before := time.Now()
	if _, err := run(config{url: srv.URL, body: []byte(`{}`), rate: 200, duration: 250 * time.Millisecond, conns: 16,
		slowLog: log, slowOver: over}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) < 10 || len(lines) > 15 {
		t.Fatalf("%d slow requests logged, want the 10 the server delayed (and a few a busy machine might):\n%s", len(lines), data)
	}
	delayed := 0
	for _, l := range lines {
		var due, lat int64
		if _, err := fmt.Sscanf(l, "%d %d", &due, &lat); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if at := time.Unix(0, due); at.Before(before) || at.After(time.Now()) {
			t.Errorf("line %q: due at %v, outside the run", l, at)
		}
		if lat < over.Nanoseconds() {
			t.Errorf("line %q: latency under the threshold", l)
		}
		if lat >= delay.Nanoseconds() {
			delayed++
		}
	}
	if delayed < 10 {
		t.Errorf("%d lines with the server's delay, want the 10 it delayed:\n%s", delayed, data)
	}
}
