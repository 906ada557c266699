package stop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"moonji/internal/testredis"
)

// envLatencyN sets how many stops TestStopLatency measures (default 500).
const envLatencyN = "MOONJI_STOP_LATENCY_N"

// measureStops stops n inferences owned by replica a from replica b (or from
// a itself when local) and returns each Request→ack latency. The owner acks
// from its own goroutine after onStop, as a stream relay would.
func measureStops(tb testing.TB, a, b *replica, n int, tag string) []time.Duration {
	tb.Helper()
	ctx := context.Background()
	lat := make([]time.Duration, 0, n)
	for i := range n {
		id := "inf_lat_" + tag + "_" + strconv.Itoa(i)
		o := a.own(id)
		res, err := b.svc.Request(ctx, id)
		if err != nil || !res.Acked {
			tb.Fatalf("stop %d: %+v, %v", i, res, err)
		}
		lat = append(lat, res.Latency)
		o.run.End()
	}
	return lat
}

// percentile returns the p-th percentile (0–100) of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

func summarize(lat []time.Duration) string {
	s := slices.Clone(lat)
	slices.Sort(s)
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", len(s),
		percentile(s, 50).Round(time.Microsecond),
		percentile(s, 99).Round(time.Microsecond),
		s[len(s)-1].Round(time.Microsecond))
}

// TestStopLatency measures Request→ack between two replicas over Redis (the
// one in MOONJI_TEST_REDIS_URL if set, else miniredis) and on the owning
// replica, and logs p50/p99:
//
//	go test ./internal/stop -run TestStopLatency -v
func TestStopLatency(t *testing.T) {
	n := 500
	if v := os.Getenv(envLatencyN); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive integer", envLatencyN, v)
		}
	}
	be := testredis.Best(t)
	a := newReplica(t, be, "A", replicaConfig{})
	b := newReplica(t, be, "B", replicaConfig{})

	measureStops(t, a, b, min(n, 50), "warm")
	remote := measureStops(t, a, b, n, "remote")
	local := measureStops(t, a, a, n, "local")
	t.Logf("backend=%s remote stop (B→Redis→A, A acks→Redis→B): %s", be.Name, summarize(remote))
	t.Logf("backend=%s local stop (owner replica, no Redis round trip): %s", be.Name, summarize(local))
}

// BenchmarkStopLatency reports the p50/p99 Request→ack latency of a stop
// between two replicas (real Redis if MOONJI_TEST_REDIS_URL is set).
func BenchmarkStopLatency(b *testing.B) {
	be := testredis.Best(b)
	ra := newReplica(b, be, "A", replicaConfig{})
	rb := newReplica(b, be, "B", replicaConfig{})
	b.ResetTimer()
	lat := measureStops(b, ra, rb, b.N, "bench")
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(percentile(lat, 50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(lat, 99).Microseconds()), "p99-µs")
}

// failingBus is subscribed but cannot publish: Redis that accepts the
// subscription and then refuses commands.
type failingBus struct{ LocalBus }

func (*failingBus) Publish(context.Context, Message) (int, error) {
	return 0, errors.New("connection refused")
}

func TestPublishFailureIsUnavailable(t *testing.T) {
	bus := &failingBus{}
	h := NewHolder(0)
	defer h.Close()
	s := NewService(h, bus, Options{AckTimeout: time.Second})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	_, err := s.Request(context.Background(), "inf_remote")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("failed after %v, want at once", took)
	}
	// Local stops do not need the bus.
	r := s.Begin(context.Background(), "inf_local", 0, nil)
	go func() {
		for !r.Stopped() {
			time.Sleep(time.Millisecond)
		}
		r.Ack()
	}()
	res, err := s.Request(context.Background(), "inf_local")
	if err != nil || !res.Acked || !res.Local {
		t.Fatalf("local: %+v, %v", res, err)
	}
}
