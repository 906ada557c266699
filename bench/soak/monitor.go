package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sample is one replica's state at one moment.
type sample struct {
	T          float64 `json:"t_s"` // since the run's start
	Replica    int     `json:"replica"`
	RSSMiB     float64 `json:"rss_mib"`
	Goroutines int     `json:"goroutines"`
	InFlight   float64 `json:"in_flight"`
	Queued     float64 `json:"queued"`
	Err        string  `json:"err,omitempty"`
}

// rssMiB reads a process's resident set from /proc (Linux).
func rssMiB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// scrape reads go_goroutines and the sums of the backends' in-flight and
// queued gauges from a replica's /metrics.
func scrape(base string) (goroutines int, inFlight, queued float64, err error) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, perr := strconv.ParseFloat(l[i+1:], 64)
		if perr != nil {
			continue
		}
		switch {
		case strings.HasPrefix(l, "go_goroutines "):
			goroutines = int(v)
		case strings.HasPrefix(l, "moonji_backend_in_flight{"):
			inFlight += v
		case strings.HasPrefix(l, "moonji_backend_queued{"):
			queued += v
		}
	}
	return goroutines, inFlight, queued, sc.Err()
}

func sampleReplica(r *replica, t float64) sample {
	s := sample{T: t, Replica: r.n}
	rss, err := rssMiB(r.proc.pid())
	if err != nil {
		s.Err = err.Error()
	}
	s.RSSMiB = rss
	g, f, q, err := scrape(r.base())
	if err != nil {
		s.Err = err.Error()
	}
	s.Goroutines, s.InFlight, s.Queued = g, f, q
	return s
}

// monitor samples every replica every interval until ctx ends.
type monitor struct {
	c     *cluster
	start time.Time
	mu    sync.Mutex
	all   []sample
}

func (m *monitor) once() []sample {
	t := time.Since(m.start).Seconds()
	out := make([]sample, len(m.c.replicas))
	var wg sync.WaitGroup
	for i, r := range m.c.replicas {
		wg.Add(1)
		go func() { defer wg.Done(); out[i] = sampleReplica(r, t) }()
	}
	wg.Wait()
	m.mu.Lock()
	m.all = append(m.all, out...)
	m.mu.Unlock()
	return out
}

func (m *monitor) run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		m.once()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (m *monitor) samples() []sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]sample(nil), m.all...)
}

// idle waits until every replica's gauges read 0 for two scrapes in a row,
// and returns the last scrape (the idle state), or an error at timeout.
func (m *monitor) idle(timeout time.Duration) ([]sample, error) {
	deadline := time.Now().Add(timeout)
	zeros := 0
	for {
		ss := m.once()
		ok := true
		for _, s := range ss {
			if s.Err != "" || s.InFlight != 0 || s.Queued != 0 {
				ok = false
			}
		}
		if ok {
			if zeros++; zeros == 2 {
				return ss, nil
			}
		} else {
			zeros = 0
		}
		if time.Now().After(deadline) {
			return ss, fmt.Errorf("gauges not back to 0 after %v: %+v", timeout, ss)
		}
		time.Sleep(time.Second)
	}
}
