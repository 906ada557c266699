package lease

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

// envRedisURL names a real Redis to run the tests against as well as
// miniredis, e.g. redis://127.0.0.1:6379/0.
const envRedisURL = "MOONJI_TEST_REDIS_URL"

// backend is one Redis the tests run against: miniredis, or a real one.
type backend struct {
	name   string
	mr     *miniredis.Miniredis // nil for a real Redis
	opts   *redis.Options
	prefix string
	admin  *redis.Client
}

// forEachBackend runs fn against a fresh miniredis and, when envRedisURL is
// set, against that Redis with a fresh random prefix. A bad URL fails the
// test rather than skipping it.
func forEachBackend(t *testing.T, fn func(t *testing.T, be *backend)) {
	t.Run("miniredis", func(t *testing.T) { fn(t, newMiniBackend(t)) })
	if os.Getenv(envRedisURL) != "" {
		t.Run("redis", func(t *testing.T) { fn(t, newRealBackend(t)) })
	}
}

// forEachIsolatedBackend is forEachBackend for tests that count the
// server's commands: the real variant runs on a private redis-server, since
// the shared one also serves other packages' tests at the same time.
func forEachIsolatedBackend(t *testing.T, fn func(t *testing.T, be *backend)) {
	t.Run("miniredis", func(t *testing.T) { fn(t, newMiniBackend(t)) })
	if os.Getenv(envRedisURL) != "" {
		t.Run("redis", func(t *testing.T) {
			t.Setenv(envRedisURL, testredis.Start(t))
			fn(t, newRealBackend(t))
		})
	}
}

// latencyBackend returns the real Redis when envRedisURL is set, otherwise
// miniredis: measurements should use the real thing when offered.
func latencyBackend(tb testing.TB) *backend {
	if os.Getenv(envRedisURL) != "" {
		return newRealBackend(tb)
	}
	return newMiniBackend(tb)
}

func newMiniBackend(tb testing.TB) *backend {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		tb.Fatalf("start miniredis: %v", err)
	}
	tb.Cleanup(mr.Close)
	be := &backend{name: "miniredis", mr: mr, opts: &redis.Options{Addr: mr.Addr()}, prefix: randomPrefix()}
	be.admin = redis.NewClient(be.options())
	tb.Cleanup(func() { _ = be.admin.Close() })
	return be
}

func newRealBackend(tb testing.TB) *backend {
	url := os.Getenv(envRedisURL)
	opts, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatalf("%s=%q: %v", envRedisURL, url, err)
	}
	be := &backend{name: "redis", opts: opts, prefix: randomPrefix()}
	be.admin = redis.NewClient(be.options())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := be.admin.Ping(ctx).Err(); err != nil {
		tb.Fatalf("%s is set but Redis does not answer: %v", envRedisURL, err)
	}
	tb.Cleanup(func() {
		// Leave nothing behind under this test's prefix.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		iter := be.admin.Scan(ctx, 0, be.prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			be.admin.Del(ctx, iter.Val())
		}
		_ = be.admin.Close()
	})
	return be
}

func randomPrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "moonjitest:" + hex.EncodeToString(b[:]) + ":"
}

// options returns a copy of the backend's client options.
func (be *backend) options() *redis.Options {
	o := *be.opts
	return &o
}

// commandStats returns, from INFO commandstats of a real Redis, the calls
// per command (lower-case name), INFO itself left out. Commands that
// scripts run are counted there too, under their own names.
func (be *backend) commandStats(tb testing.TB) map[string]int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	info, err := be.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	out := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			tb.Fatalf("parse %q: %v", line, err)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// gate is a dialer that can cut a client off from Redis, to simulate an
// outage of any Redis, including one the test cannot stop.
type gate struct {
	mu    sync.Mutex
	down  bool
	conns []*freezableConn
}

var errPartitioned = errors.New("test gate: partitioned from redis")

func (g *gate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	g.mu.Lock()
	down := g.down
	g.mu.Unlock()
	if down {
		return nil, errPartitioned
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.down {
		_ = c.Close()
		return nil, errPartitioned
	}
	fc := &freezableConn{Conn: c, thawed: make(chan struct{})}
	g.conns = append(g.conns, fc)
	return fc, nil
}

// cut closes every connection and refuses new ones.
func (g *gate) cut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = true
	for _, c := range g.conns {
		_ = c.Close()
	}
	g.conns = nil
}

// heal lets connections through again.
func (g *gate) heal() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.down = false
}

// freeze turns every open connection into a black hole, as a hung Redis or
// a half-open TCP connection behaves: writes vanish, reads wait for their
// deadline.
func (g *gate) freeze() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.frozen.Store(true)
	}
	g.conns = nil
}

// freezableConn is a net.Conn that can stop passing data without closing.
type freezableConn struct {
	net.Conn
	frozen       atomic.Bool
	readDeadline atomic.Int64 // unix nanos; 0 means none
	thawed       chan struct{}
	closeOnce    sync.Once
}

func (c *freezableConn) SetReadDeadline(t time.Time) error {
	c.readDeadline.Store(t.UnixNano())
	return c.Conn.SetReadDeadline(t)
}

func (c *freezableConn) SetDeadline(t time.Time) error {
	c.readDeadline.Store(t.UnixNano())
	return c.Conn.SetDeadline(t)
}

func (c *freezableConn) Read(p []byte) (int, error) {
	if !c.frozen.Load() {
		n, err := c.Conn.Read(p)
		if !c.frozen.Load() {
			return n, err
		}
	}
	wait := time.Hour
	if d := c.readDeadline.Load(); d != 0 {
		wait = max(time.Until(time.Unix(0, d)), 0)
	}
	select {
	case <-time.After(wait):
		return 0, os.ErrDeadlineExceeded
	case <-c.thawed:
		return 0, net.ErrClosed
	}
}

func (c *freezableConn) Write(p []byte) (int, error) {
	if c.frozen.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *freezableConn) Close() error {
	c.closeOnce.Do(func() { close(c.thawed) })
	return c.Conn.Close()
}

// commandCounter is a go-redis hook counting the commands a client sends,
// pipelined ones one by one.
type commandCounter struct {
	n atomic.Int64
	// renewals and others split n: the commands that ran the renewal
	// script (EVALSHA, or EVAL after NOSCRIPT), and the rest. Each command
	// adds to exactly one of them, so reading them never splits a command.
	renewals, others atomic.Int64
	lastOther        atomic.Pointer[string] // the last other command, for failure messages
	// handshakes counts what go-redis sends on each new connection (HELLO,
	// CLIENT SETINFO), apart from n: a cost per connection, not per lease,
	// and the pool may open one at any time (CI once saw it inside the
	// window where TestCommandCount wants renewals alone).
	handshakes atomic.Int64
}

func (cc *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (cc *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		cc.count(cmd)
		return next(ctx, cmd)
	}
}

func (cc *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			cc.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (cc *commandCounter) count(cmd redis.Cmder) {
	switch strings.ToLower(cmd.Name()) {
	case "hello", "client", "auth", "select":
		cc.handshakes.Add(1)
		return
	}
	cc.n.Add(1)
	if cc.isRenewal(cmd) {
		cc.renewals.Add(1)
	} else {
		cc.others.Add(1)
		name := cmd.Name()
		cc.lastOther.Store(&name)
	}
}

func (cc *commandCounter) isRenewal(cmd redis.Cmder) bool {
	if args := cmd.Args(); len(args) > 1 {
		name, _ := args[0].(string)
		body, _ := args[1].(string)
		if strings.EqualFold(name, "eval") {
			sum := sha1.Sum([]byte(body))
			body = hex.EncodeToString(sum[:])
		}
		return (strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "eval")) && body == renewScript.Hash()
	}
	return false
}

// replica is one gateway replica in a test: its own client and store.
type replica struct {
	name     string
	store    *Store
	client   *redis.Client
	gate     *gate
	counter  *commandCounter
	released chan string // OnReleased calls, dropped when full
}

type replicaConfig struct {
	ttl time.Duration
	// client, if set, adjusts the replica's Redis client options.
	client func(*redis.Options)
	// noStart leaves Start to the test.
	noStart bool
	// linger, if set, replaces releaseLinger.
	linger time.Duration
	// onReleased, if set, is called by OnReleased besides the released
	// channel.
	onReleased func(string)
}

// newReplica starts a store named name on be, closed at cleanup.
func newReplica(tb testing.TB, be *backend, name string, cfg replicaConfig) *replica {
	tb.Helper()
	r := &replica{name: name, gate: &gate{}, counter: &commandCounter{}, released: make(chan string, 1024)}
	opts := be.options()
	opts.Dialer = r.gate.dial
	if cfg.client != nil {
		cfg.client(opts)
	}
	r.client = redis.NewClient(opts)
	r.client.AddHook(r.counter)
	r.store = New(r.client, Options{
		Prefix:  be.prefix,
		Replica: name,
		TTL:     cfg.ttl,
		linger:  cfg.linger,
		Log:     testLogger(tb).With("replica", name),
		OnReleased: func(b string) {
			if cfg.onReleased != nil {
				cfg.onReleased(b)
			}
			select {
			case r.released <- b:
			default:
			}
		},
	})
	tb.Cleanup(func() {
		_ = r.store.Close()
		_ = r.client.Close()
	})
	if !cfg.noStart {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.store.Start(ctx); err != nil {
			tb.Fatalf("start replica %s: %v", name, err)
		}
	}
	return r
}

// testLogger sends slog output to the test log, so that it shows with -v or
// on failure only.
func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
