package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests do not run in parallel: several of them count goroutines.

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// waitFor polls cond until it holds or the test's patience runs out.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// probers counts the prober goroutines running in the whole process, by
// their stacks, so a test can see exactly the goroutines this package
// started whatever else (HTTP servers, the race detector) is running.
func probers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "health.(*Checker).run(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// noProbers waits for every prober goroutine to have exited. Close waits
// for the prober's WaitGroup, which is marked done an instant before the
// goroutine itself returns, hence a short wait rather than a snapshot.
func noProbers(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for n := probers(); n != 0; n = probers() {
		if time.Now().After(deadline) {
			t.Fatalf("%d prober goroutines still running", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// changes records OnChange calls and fails the test if two overlap.
type changes struct {
	t       testing.TB
	running atomic.Int32
	mu      sync.Mutex
	got     []bool
}

func (r *changes) record(up bool) {
	if r.running.Add(1) != 1 {
		r.t.Errorf("OnChange(%v) overlapped another call", up)
	}
	r.mu.Lock()
	r.got = append(r.got, up)
	r.mu.Unlock()
	r.running.Add(-1)
}

func (r *changes) list() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.got...)
}

func (r *changes) want(t testing.TB, want ...bool) {
	t.Helper()
	if got := r.list(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("OnChange calls %v, want %v", got, want)
	}
}

// newChecker makes a Checker that is closed, and checked for a leftover
// prober, when the test ends.
func newChecker(t *testing.T, o Options) (*Checker, *changes) {
	t.Helper()
	rec := &changes{t: t}
	o.OnChange = rec.record
	o.Log = discard()
	c := New("vllm-0", o)
	t.Cleanup(func() {
		c.Close()
		noProbers(t)
	})
	return c, rec
}

// modelsServer answers GET /v1/models with 200 and anything else with 404,
// counting the probes it saw.
func modelsServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[{"id":"qwen","object":"model"}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// A passive failure takes the backend down at once; after the back-off one
// real HTTP probe against a healthy server brings it back, and State tells
// the story at each step.
func TestFailedThenProbeBringsUp(t *testing.T) {
	srv, hits := modelsServer(t)
	const backoff = 50 * time.Millisecond
	c, rec := newChecker(t, Options{Backoff: backoff, Probe: HTTPProbe(srv.Client(), srv.URL+"/v1/", "")})

	if c.Name() != "vllm-0" || !c.Up() {
		t.Fatalf("new checker: name %q up %v", c.Name(), c.Up())
	}
	if s := c.State(); !s.Up || s.Backend != "vllm-0" || s.Reason != "" || !s.NextProbe.IsZero() || s.Failures != 0 || s.Since.IsZero() {
		t.Fatalf("new checker state %+v", s)
	}

	before := time.Now()
	c.Failed("connection refused")
	if c.Up() {
		t.Fatal("still up right after Failed")
	}
	rec.want(t, false)
	s := c.State()
	if s.Up || s.Reason != "connection refused" || s.Failures != 0 || s.ProbeError != "" {
		t.Fatalf("down state %+v", s)
	}
	if s.Since.Before(before) || time.Since(s.Since) > time.Second {
		t.Errorf("Since %v is not the moment of the failure (%v)", s.Since, before)
	}
	if wait := s.NextProbe.Sub(s.Since); wait < backoff*9/10 || wait > backoff*11/10 {
		t.Errorf("first probe planned %v after the failure, want %v ±10%%", wait, backoff)
	}
	if hits.Load() != 0 {
		t.Fatal("probed before the back-off")
	}

	waitFor(t, "the backend to come back up", c.Up)
	if took := time.Since(before); took < backoff*9/10 {
		t.Errorf("up again after %v, before the back-off of %v", took, backoff)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("%d probes, want 1", n)
	}
	rec.want(t, false, true)
	up := c.State()
	if !up.Up || up.Reason != "" || !up.NextProbe.IsZero() || up.Failures != 0 || !up.Since.After(s.Since) {
		t.Errorf("state after recovery %+v (down since %v)", up, s.Since)
	}
	noProbers(t)
}

// Each failed probe doubles the wait until MaxBackoff, Failures counts the
// failed probes, a passing probe brings the backend up, and the next
// failure starts again from the initial Backoff.
func TestBackoffDoublesAndCaps(t *testing.T) {
	const (
		backoff    = 20 * time.Millisecond
		maxBackoff = 80 * time.Millisecond
		failing    = 5
	)
	var (
		c       *Checker
		mu      sync.Mutex
		times   []time.Time // when each probe ran
		planned []time.Time // when each probe was planned for (State.NextProbe)
	)
	probe := func(ctx context.Context) error {
		now := time.Now()
		// The state is not locked while a probe runs, and it shows the
		// failures so far and when this probe was planned for.
		s := c.State()
		mu.Lock()
		times = append(times, now)
		planned = append(planned, s.NextProbe)
		n := len(times)
		mu.Unlock()
		if n <= failing+1 && (s.Failures != n-1 || s.Up || (n > 1 && !strings.Contains(s.ProbeError, "engine loading"))) {
			t.Errorf("probe %d sees state %+v", n, s)
		}
		if n <= failing {
			return errors.New("engine loading")
		}
		return nil
	}
	c, rec := newChecker(t, Options{Backoff: backoff, MaxBackoff: maxBackoff, Probe: probe})

	start := time.Now()
	c.Failed("status 503")
	waitFor(t, "the backend to come back up", c.Up)
	rec.want(t, false, true)

	mu.Lock()
	got, plan := append([]time.Time(nil), times...), append([]time.Time(nil), planned...)
	mu.Unlock()
	if len(got) != failing+1 {
		t.Fatalf("%d probes, want %d", len(got), failing+1)
	}
	wants := []time.Duration{backoff, 2 * backoff, maxBackoff, maxBackoff, maxBackoff, maxBackoff}
	prev := start
	for i, at := range got {
		want := wants[i]
		// The planned wait is measured from just after the previous probe
		// returned, so it is the back-off itself, jitter and all.
		if wait := plan[i].Sub(prev); wait < want*9/10 || wait > want*11/10+5*time.Millisecond {
			t.Errorf("probe %d planned %v after the previous one, want %v ±10%%", i+1, wait, want)
		}
		// The real gap: timers never fire early, so the lower bound is
		// exact; at the cap the gap must stay below what one more doubling
		// would give, with room for a busy machine.
		gap := at.Sub(prev)
		if gap < want*9/10 || (want == maxBackoff && gap >= 2*want*9/10) {
			t.Errorf("wait before probe %d was %v, want %v ±10%%", i+1, gap, want)
		}
		prev = at
	}
	if s := c.State(); !s.Up || s.Failures != 0 || s.ProbeError != "" || s.Reason != "" {
		t.Errorf("state after recovery %+v", s)
	}

	// A new failure starts from the initial Backoff again.
	noProbers(t)
	c.Failed("status 502")
	s := c.State()
	if wait := s.NextProbe.Sub(s.Since); wait < backoff*9/10 || wait > backoff*11/10 {
		t.Errorf("after a recovery the first probe is planned %v after the failure, want %v ±10%%", wait, backoff)
	}
	if s.Failures != 0 || s.Reason != "status 502" {
		t.Errorf("state after the second failure %+v", s)
	}
	waitFor(t, "the backend to come back up", c.Up)
	rec.want(t, false, true, false, true)
}

// A hundred requests failing at once start exactly one prober and one
// OnChange(false); once that prober has brought the backend up and gone, a
// new burst starts a new one. The second burst is held at the Checker's
// lock until all hundred have passed the lock-free "already down?" check,
// so that it exercises the check made again under the lock, which a free
// burst on a small machine may not reach.
func TestConcurrentFailedStartOneProber(t *testing.T) {
	var calls atomic.Int32
	release := make(chan struct{}, 1)
	probe := func(ctx context.Context) error {
		calls.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c, rec := newChecker(t, Options{Backoff: 5 * time.Millisecond, Probe: probe, ProbeTimeout: 10 * time.Second})

	const n = 100
	burst := func(held bool) {
		t.Helper()
		if held {
			c.mu.Lock()
		}
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				c.Failed(fmt.Sprintf("status %d", 500+i%4))
			}()
		}
		close(gate)
		if held {
			waitFor(t, "the burst to reach the lock", func() bool { return inFailed() == n })
			time.Sleep(5 * time.Millisecond) // from Failed's first line to Lock
			c.mu.Unlock()
		}
		wg.Wait()
	}

	for round, held := range []bool{false, true} {
		before := calls.Load()
		burst(held)
		if c.Up() {
			t.Fatalf("round %d: up after %d failures", round, n)
		}
		if got := rec.list(); len(got) != 2*round+1 {
			t.Fatalf("round %d: OnChange calls %v", round, got)
		}
		waitFor(t, "the first probe", func() bool { return calls.Load() == before+1 })
		if p := probers(); p != 1 {
			t.Fatalf("round %d: %d prober goroutines, want 1", round, p)
		}
		// Had a second prober been started its probe would have begun by
		// now (the back-off is 5ms).
		time.Sleep(30 * time.Millisecond)
		if got := calls.Load() - before; got != 1 {
			t.Fatalf("round %d: %d probes, want 1", round, got)
		}
		release <- struct{}{}
		waitFor(t, "the backend to come back up", c.Up)
		noProbers(t)
	}
	rec.want(t, false, true, false, true)
}

// inFailed counts the goroutines inside Checker.Failed.
func inFailed() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "health.(*Checker).Failed(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// closeWithin calls Close and fails the test if it does not return in d,
// rather than leaving a hung Close to the test binary's timeout.
func closeWithin(t *testing.T, c *Checker, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		c.Close()
		close(done)
	}()
	select {
	case <-done:
		t.Logf("Close took %v", time.Since(t0))
	case <-time.After(d):
		t.Fatalf("Close has not returned after %v", d)
	}
}

// Many goroutines failing a backend that keeps coming back: OnChange calls
// never overlap, strictly alternate, and the last one matches Up. OnChange
// calls State, which would deadlock if it ran under the Checker's lock.
func TestOnChangeOrderUnderChurn(t *testing.T) {
	var c *Checker
	rec := &changes{t: t}
	c = New("vllm-0", Options{
		Backoff: time.Millisecond, MaxBackoff: time.Millisecond, Log: discard(),
		OnChange: func(up bool) {
			rec.record(up)
			_ = c.State()
		},
	})
	defer c.Close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c.Up() {
					c.Failed("status 500")
				}
				runtime.Gosched()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	waitFor(t, "the backend to come back up", c.Up)
	noProbers(t)

	got := rec.list()
	if len(got) < 4 {
		t.Fatalf("only %d state changes in 200ms; the test proves nothing", len(got))
	}
	for i, up := range got {
		if up != (i%2 == 1) {
			t.Fatalf("change %d is up=%v: calls do not alternate: %v", i, up, got)
		}
	}
	if last := got[len(got)-1]; last != c.Up() || !c.State().Up {
		t.Errorf("last OnChange(%v) but Up %v", last, c.Up())
	}
}

// Close during a slow probe cancels it, returns promptly and leaves no
// goroutine; the backend stays down with no probe planned, the cancelled
// probe is not counted as a failure, and Failed after Close only marks
// down.
func TestCloseDuringSlowProbe(t *testing.T) {
	baseline := runtime.NumGoroutine()
	started := make(chan struct{})
	var once sync.Once
	probe := func(ctx context.Context) error {
		once.Do(func() { close(started) })
		<-ctx.Done()
		return ctx.Err()
	}
	rec := &changes{t: t}
	c := New("vllm-0", Options{Backoff: 5 * time.Millisecond, Probe: probe, ProbeTimeout: 30 * time.Second, OnChange: rec.record, Log: discard()})
	c.Failed("connection refused")
	<-started

	closeWithin(t, c, 500*time.Millisecond)
	noProbers(t)
	if s := c.State(); s.Up || !s.NextProbe.IsZero() || s.Failures != 0 || s.ProbeError != "" || s.Reason != "connection refused" {
		t.Errorf("state after Close %+v", s)
	}
	c.Failed("status 503")
	c.Close() // twice is fine
	rec.want(t, false)
	waitFor(t, "goroutines to return to the baseline", func() bool { return runtime.NumGoroutine() <= baseline })

	// An up backend closed and then failed goes down without a prober.
	c2 := New("vllm-1", Options{Backoff: time.Millisecond, OnChange: rec.record, Log: discard()})
	c2.Close()
	c2.Failed("status 500")
	if c2.Up() || !c2.State().NextProbe.IsZero() {
		t.Fatalf("Failed after Close: up %v, state %+v", c2.Up(), c2.State())
	}
	rec.want(t, false, false)
	time.Sleep(20 * time.Millisecond)
	if p := probers(); p != 0 || c2.Up() || !c2.State().NextProbe.IsZero() {
		t.Errorf("after Close, Failed started probing: %d probers, up %v, state %+v", p, c2.Up(), c2.State())
	}
}

// hangingServer accepts requests and never answers until the test ends or
// the client gives up.
func hangingServer(t *testing.T) *httptest.Server {
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(func() {
		close(done)
		srv.Close()
	})
	return srv
}

// The same with a real HTTP probe to a server that never answers: Close
// cancels the request and returns at once.
func TestCloseDuringHTTPProbe(t *testing.T) {
	baseline := runtime.NumGoroutine()
	srv := hangingServer(t)
	var hits atomic.Int32
	inner := HTTPProbe(srv.Client(), srv.URL+"/v1", "sk-test")
	probe := func(ctx context.Context) error {
		hits.Add(1)
		return inner(ctx)
	}
	c := New("vllm-0", Options{Backoff: 5 * time.Millisecond, Probe: probe, ProbeTimeout: 30 * time.Second, Log: discard()})
	c.Failed("status 503")
	waitFor(t, "the probe to start", func() bool { return hits.Load() == 1 })
	time.Sleep(20 * time.Millisecond) // let the request reach the server

	closeWithin(t, c, 500*time.Millisecond)
	noProbers(t)
	srv.Client().CloseIdleConnections()
	srv.Close()
	waitFor(t, "goroutines to return to the baseline", func() bool { return runtime.NumGoroutine() <= baseline })
}

func TestHTTPProbe(t *testing.T) {
	const key = "sk-moonji-7f3a9c1e"

	t.Run("ok", func(t *testing.T) {
		var auth []string
		var mu sync.Mutex
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			auth = append(auth, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
			mu.Unlock()
			if r.URL.Path != "/v1/models" {
				http.NotFound(w, r)
			}
		}))
		defer srv.Close()
		for _, base := range []string{srv.URL + "/v1", srv.URL + "/v1/"} {
			if err := HTTPProbe(srv.Client(), base, key)(context.Background()); err != nil {
				t.Errorf("%s: %v", base, err)
			}
		}
		if err := HTTPProbe(srv.Client(), srv.URL+"/v1", "")(context.Background()); err != nil {
			t.Error(err)
		}
		want := []string{"GET /v1/models Bearer " + key, "GET /v1/models Bearer " + key, "GET /v1/models "}
		if fmt.Sprint(auth) != fmt.Sprint(want) {
			t.Errorf("requests %q, want %q", auth, want)
		}
	})

	t.Run("any 2xx", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		}))
		defer srv.Close()
		if err := HTTPProbe(srv.Client(), srv.URL, key)(context.Background()); err != nil {
			t.Error(err)
		}
	})

	// A model list that never ends is read up to the limit, not forever.
	t.Run("endless body", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			chunk := []byte(strings.Repeat("x", 4096))
			for r.Context().Err() == nil {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}))
		defer srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := HTTPProbe(srv.Client(), srv.URL+"/v1", key)(ctx); err != nil {
			t.Error(err)
		}
	})

	// Failures: the error names the cause and never holds the key, even
	// from a server that echoes the request's headers in its body.
	echo := func(status int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			fmt.Fprintf(w, "no: %s", r.Header.Get("Authorization"))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	refused := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		return "http://" + addr + "/v1"
	}()
	s503, s404 := echo(http.StatusServiceUnavailable), echo(http.StatusNotFound)
	withPassword := strings.Replace(s503.URL, "http://", "http://admin:hunter2@", 1) + "/v1"
	hanging := hangingServer(t)

	for _, tc := range []struct {
		name, base string
		client     *http.Client
		timeout    time.Duration
		want       string
	}{
		{"503", s503.URL + "/v1", s503.Client(), 0, "status 503"},
		{"404", s404.URL + "/v1", s404.Client(), 0, "status 404"},
		{"password in URL", withPassword, s503.Client(), 0, "status 503"},
		{"connection refused", refused, nil, 0, "connection refused"},
		{"refused, password in URL", strings.Replace(refused, "http://", "http://admin:hunter2@", 1), nil, 0, "connection refused"},
		{"never answers", hanging.URL + "/v1", hanging.Client(), 100 * time.Millisecond, "deadline exceeded"},
		{"not a URL", "127.0.0.1:8000/v1", nil, 0, "not an absolute"},
		{"bad scheme", "ftp://127.0.0.1/v1", nil, 0, "not an absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			t0 := time.Now()
			errc := make(chan error, 1)
			go func() { errc <- HTTPProbe(tc.client, tc.base, key)(ctx) }()
			var err error
			select {
			case err = <-errc:
			case <-time.After(5 * time.Second):
				t.Fatal("probe has not returned after 5s")
			}
			took := time.Since(t0)
			if err == nil {
				t.Fatal("probe passed")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), key) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error %q leaks a secret", err)
			}
			if tc.timeout > 0 {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("error %v is not the context's deadline", err)
				}
				if took > tc.timeout+time.Second {
					t.Errorf("probe took %v with a %v timeout", took, tc.timeout)
				}
			}
		})
	}
}

// Through a Checker, ProbeTimeout bounds a probe of a server that never
// answers, and the failure is counted with the reason in State.
func TestProbeTimeout(t *testing.T) {
	srv := hangingServer(t)
	c, _ := newChecker(t, Options{
		// The back-off is long enough that the next probe is still ahead
		// when the test looks, even on a loaded machine (at 5 ms, a busy CI
		// machine looked after it was due).
		Backoff: 200 * time.Millisecond, MaxBackoff: time.Minute, ProbeTimeout: 50 * time.Millisecond,
		Probe: HTTPProbe(srv.Client(), srv.URL+"/v1", "sk-secret"),
	})
	c.Failed("status 503")
	waitFor(t, "a probe to time out", func() bool { return c.State().Failures == 1 })
	s := c.State()
	if s.Up || !strings.Contains(s.ProbeError, "deadline exceeded") || strings.Contains(s.ProbeError, "sk-secret") {
		t.Errorf("state after a timed-out probe %+v", s)
	}
	// Doubled to 400 ms, ±10 % jitter, less the time the test took to look.
	if wait := time.Until(s.NextProbe); wait < 150*time.Millisecond || wait > 440*time.Millisecond {
		t.Errorf("next probe in %v, want about 400ms", wait)
	}
}

// Without a Probe the backend is up again once the back-off has passed.
func TestNilProbe(t *testing.T) {
	c, rec := newChecker(t, Options{Backoff: 10 * time.Millisecond})
	t0 := time.Now()
	c.Failed("status 500")
	waitFor(t, "the backend to come back up", c.Up)
	if took := time.Since(t0); took < 9*time.Millisecond {
		t.Errorf("up after %v", took)
	}
	rec.want(t, false, true)
}

func TestDefaults(t *testing.T) {
	c, _ := newChecker(t, Options{})
	if c.backoff != DefaultBackoff || c.maxBackoff != DefaultMaxBackoff || c.probeTimeout != DefaultProbeTimeout {
		t.Errorf("defaults %v %v %v", c.backoff, c.maxBackoff, c.probeTimeout)
	}
	c.Failed("status 500")
	s := c.State()
	if wait := s.NextProbe.Sub(s.Since); wait < 900*time.Millisecond || wait > 1100*time.Millisecond {
		t.Errorf("first probe planned after %v, want 1s ±10%%", wait)
	}
	c.Close()
	c2, _ := newChecker(t, Options{Backoff: 5 * time.Second, MaxBackoff: time.Second})
	if c2.maxBackoff != 5*time.Second {
		t.Errorf("MaxBackoff below Backoff kept as %v", c2.maxBackoff)
	}
}

// Jitter stays within ±10% and does spread.
func TestJitter(t *testing.T) {
	const d = 100 * time.Millisecond
	lo, hi := d, d
	for range 2000 {
		j := jitter(d)
		if j < d*9/10 || j > d*11/10 {
			t.Fatalf("jitter(%v) = %v", d, j)
		}
		lo, hi = min(lo, j), max(hi, j)
	}
	if lo > d*95/100 || hi < d*105/100 {
		t.Errorf("2000 jittered waits all within [%v, %v]", lo, hi)
	}
}

// Up is on every request's path: it must not allocate, up or down.
func TestUpAllocatesNothing(t *testing.T) {
	c, _ := newChecker(t, Options{Backoff: time.Hour})
	if n := testing.AllocsPerRun(1000, func() { _ = c.Up() }); n != 0 {
		t.Errorf("Up allocates %v times while up", n)
	}
	c.Failed("status 500")
	if n := testing.AllocsPerRun(1000, func() { _ = c.Up() }); n != 0 {
		t.Errorf("Up allocates %v times while down", n)
	}
	// Failed on a down backend is as cheap: many in-flight requests may
	// fail together.
	if n := testing.AllocsPerRun(1000, func() { c.Failed("status 500") }); n != 0 {
		t.Errorf("Failed on a down backend allocates %v times", n)
	}
}

func BenchmarkUp(b *testing.B) {
	c := New("vllm-0", Options{Log: discard()})
	defer c.Close()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !c.Up() {
				b.Fatal("down")
			}
		}
	})
}
