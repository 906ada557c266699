// Package health tracks whether each backend (engine instance) should take
// traffic.
//
// Checking is passive: nothing polls a healthy backend. When the gateway
// sees a backend refuse a connection or answer 5xx before the first byte,
// stay silent past a request's timeout before a stream's header, or break
// an answer off midway, it calls Checker.Failed, the backend is taken out
// of rotation at once, and a single prober goroutine waits a back-off
// period, probes the backend and either brings it back or waits twice as
// long before trying again. The gateway asks Checker.Up on every request,
// so Up is one atomic load.
package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for the zero values in Options.
const (
	DefaultBackoff      = time.Second
	DefaultMaxBackoff   = 30 * time.Second
	DefaultProbeTimeout = 2 * time.Second
)

// jitterFraction spreads each wait by up to ±10%, so that gateway replicas
// which saw the same backend fail at the same moment do not all probe it in
// lockstep.
const jitterFraction = 0.1

// probeBodyLimit bounds how much of a probe response is read before the
// connection is given back: enough for any real model list, so the
// connection can be reused, but a backend answering with an endless body
// cannot hold the prober.
const probeBodyLimit = 64 << 10

// Options configures a Checker.
type Options struct {
	// Backoff is how long a backend stays down after its first failure
	// before the first probe (default 1s); each failed probe doubles the
	// wait, up to MaxBackoff (default 30s, and never below Backoff). A
	// passing probe brings the backend up and resets the wait. Every wait
	// is jittered by ±10%.
	Backoff, MaxBackoff time.Duration
	// Probe checks the backend. It must return when its context ends,
	// because Close waits for it. Nil means the backend is healthy again
	// as soon as the back-off has passed (for in-process engines).
	Probe func(ctx context.Context) error
	// ProbeTimeout bounds each probe (default 2s).
	ProbeTimeout time.Duration
	// OnChange, when set, is called with the new state after every change,
	// for a gauge and logs. It is called without any lock held, yet calls
	// never overlap and always alternate down, up, down…, so the last call
	// is always the current state. It may call State but must not block
	// for long: a down backend's probing waits for it.
	OnChange func(up bool)
	// Log receives state changes and failed probes (default slog.Default()).
	Log *slog.Logger
}

// State is a snapshot of a backend's health for /readyz and the dashboard.
type State struct {
	Backend string
	Up      bool
	// Since is when the backend last changed state (or the Checker was
	// made).
	Since time.Time
	// Reason is why the backend went down, as given to Failed; empty while
	// up.
	Reason string
	// ProbeError is the error of the latest failed probe in this down
	// period; empty while up or before the first probe has failed.
	ProbeError string
	// NextProbe is when the backend will next be probed; zero while up and
	// after Close.
	NextProbe time.Time
	// Failures counts the consecutive failed probes in this down period.
	Failures int
}

// Checker tracks the health of one backend. It is safe for concurrent use.
type Checker struct {
	backend      string
	backoff      time.Duration
	maxBackoff   time.Duration
	probe        func(ctx context.Context) error
	probeTimeout time.Duration
	onChange     func(up bool)
	log          *slog.Logger

	// up is the only thing the hot path reads. It changes under mu, so
	// that State sees it agree with the fields below.
	up atomic.Bool

	// ctx ends at Close; it stops the prober and cancels a running probe.
	ctx    context.Context
	cancel context.CancelFunc
	// probers counts running prober goroutines (at most one) for Close.
	probers sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	since     time.Time
	reason    string
	probeErr  string
	nextProbe time.Time
	failures  int
}

// New returns a Checker for the named backend, which starts up.
func New(backend string, o Options) *Checker {
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = o.Backoff
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = DefaultProbeTimeout
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	c := &Checker{
		backend:      backend,
		backoff:      o.Backoff,
		maxBackoff:   o.MaxBackoff,
		probe:        o.Probe,
		probeTimeout: o.ProbeTimeout,
		onChange:     o.OnChange,
		log:          o.Log.With("backend", backend),
		since:        time.Now(),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.up.Store(true)
	return c
}

// Name returns the backend name the Checker was made for.
func (c *Checker) Name() string { return c.backend }

// Up reports whether the backend takes traffic: one atomic load.
func (c *Checker) Up() bool { return c.up.Load() }

// Failed records a passive failure (connection refused, 5xx before the
// first byte); reason is a short description for logs and State, such as
// "connection refused" or "status 503". An up backend goes down at once and
// one prober goroutine starts: it waits the back-off, probes, and either
// brings the backend up or waits twice as long and probes again. On a
// backend that is already down Failed does nothing, so a burst of failing
// requests starts a single prober. After Close it only marks the backend
// down.
func (c *Checker) Failed(reason string) {
	// While a backend is down every request that was already on its way
	// to it may fail too; they leave here without touching the lock.
	if !c.up.Load() {
		return
	}
	c.mu.Lock()
	if !c.up.Load() {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	c.up.Store(false)
	c.since = now
	c.reason = reason
	c.probeErr = ""
	c.failures = 0
	c.nextProbe = time.Time{}
	start := !c.closed
	var wait time.Duration
	if start {
		wait = jitter(c.backoff)
		c.nextProbe = now.Add(wait)
		// Added under the lock Close takes before it waits, so Close
		// either sees this prober or prevents it.
		c.probers.Add(1)
	}
	c.mu.Unlock()

	c.log.Warn("health: backend down", "reason", reason, "probe_in", wait)
	if c.onChange != nil {
		c.onChange(false)
	}
	// Started only after OnChange(false) has returned, so the prober's
	// OnChange(true) cannot overtake it.
	if start {
		go c.run(wait)
	}
}

// run is the prober: it probes after wait, and again after doubling waits,
// until a probe passes or the Checker is closed.
func (c *Checker) run(wait time.Duration) {
	defer c.probers.Done()
	backoff := c.backoff
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			c.stopped()
			return
		case <-t.C:
		}
		err := c.check()
		if c.ctx.Err() != nil {
			// Closed while probing: the probe was cancelled, which says
			// nothing about the backend.
			c.stopped()
			return
		}
		if err == nil {
			c.recovered()
			return
		}
		if backoff > c.maxBackoff/2 {
			backoff = c.maxBackoff
		} else {
			backoff *= 2
		}
		wait = jitter(backoff)
		c.mu.Lock()
		c.failures++
		c.probeErr = err.Error()
		c.nextProbe = time.Now().Add(wait)
		failures := c.failures
		c.mu.Unlock()
		c.log.Warn("health: probe failed", "err", err, "failures", failures, "probe_in", wait)
		t.Reset(wait)
	}
}

// check runs one probe under ProbeTimeout and Close's cancellation.
func (c *Checker) check() error {
	if c.probe == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.probeTimeout)
	defer cancel()
	return c.probe(ctx)
}

// recovered brings the backend back up after a passing probe.
func (c *Checker) recovered() {
	c.mu.Lock()
	down := time.Since(c.since)
	failures := c.failures
	c.mu.Unlock()
	c.log.Info("health: backend up", "down_for", down.Round(time.Millisecond), "failed_probes", failures)
	// OnChange(true) runs before up is set: until then no Failed can mark
	// the backend down again, so its OnChange(false) cannot come first and
	// leave a gauge showing "up" for a backend that is down.
	if c.onChange != nil {
		c.onChange(true)
	}
	c.mu.Lock()
	c.since = time.Now()
	c.reason = ""
	c.probeErr = ""
	c.nextProbe = time.Time{}
	c.failures = 0
	c.up.Store(true)
	c.mu.Unlock()
}

// stopped records that no probe is coming any more.
func (c *Checker) stopped() {
	c.mu.Lock()
	c.nextProbe = time.Time{}
	c.mu.Unlock()
}

// State returns a snapshot of the backend's health, read under one hold of
// the lock so that its fields agree with each other.
func (c *Checker) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return State{
		Backend:    c.backend,
		Up:         c.up.Load(),
		Since:      c.since,
		Reason:     c.reason,
		ProbeError: c.probeErr,
		NextProbe:  c.nextProbe,
		Failures:   c.failures,
	}
}

// Close stops the prober, if one is running, cancelling a probe in
// progress, and waits for it to exit. A backend that is down stays down.
// Close may be called more than once.
func (c *Checker) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.probers.Wait()
}

// jitter returns d spread uniformly over ±jitterFraction.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*2-1)*jitterFraction*float64(d))
}

// HTTPProbe returns a Probe doing GET baseURL+"/models" (baseURL like
// http://127.0.0.1:8000/v1; a trailing slash is tolerated), sending
// "Authorization: Bearer apiKey" when apiKey is not empty, that passes on
// any 2xx. The response body is drained up to a small limit and closed so
// the connection can be reused. Errors name the status or the transport
// error, never the API key or a password in the URL. A nil client means
// http.DefaultClient.
func HTTPProbe(client *http.Client, baseURL, apiKey string) func(ctx context.Context) error {
	if client == nil {
		client = http.DefaultClient
	}
	target := strings.TrimRight(baseURL, "/") + "/models"
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// Reported by every probe rather than at start-up, so that it shows
		// in State and the logs where the backend is looked at. The parse
		// error is left out because it quotes the URL, which may hold a
		// password.
		bad := errors.New("health: probe URL is not an absolute http(s) URL")
		return func(context.Context) error { return bad }
	}
	shown := u.Redacted()
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err != nil {
			return fmt.Errorf("health: probe %s: %w", shown, err)
		}
		if apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+apiKey)
		}
		resp, err := client.Do(req)
		if err != nil {
			// net/http's *url.Error already names the method and the URL
			// with any password stripped; headers never appear in it.
			return fmt.Errorf("health: probe: %w", err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, probeBodyLimit))
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			// The body is not quoted: some servers echo request headers,
			// and the key must not reach logs or /readyz.
			return fmt.Errorf("health: probe GET %s: status %s", shown, resp.Status)
		}
		return nil
	}
}
