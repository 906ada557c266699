package stop

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
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

// envRedisURL names a real Redis to run the Redis tests against as well as
// miniredis, e.g. redis://127.0.0.1:6379/0. Use a Redis of its own: the
// command-count test reads server-wide statistics.
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
// the shared one also serves the other packages' tests at the same time.
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
// miniredis: for measurements, which should use the real thing when offered.
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

// commands returns how many commands the server has processed so far. For a
// real Redis it sums INFO commandstats, leaving out INFO itself.
func (be *backend) commands(tb testing.TB) int64 {
	tb.Helper()
	if be.mr != nil {
		return int64(be.mr.CommandCount())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	info, err := be.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	var total int64
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
		total += n
	}
	return total
}

// gate is a dialer that can cut a client off from Redis, to simulate a
// network partition against any Redis, including one the test cannot restart.
type gate struct {
	mu    sync.Mutex
	down  bool
	conns []net.Conn
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

// freeze turns every open connection into a black hole, as a half-open TCP
// connection behaves: writes vanish, reads wait for their deadline. New
// connections work.
func (g *gate) freeze() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		if fc, ok := c.(*freezableConn); ok {
			fc.frozen.Store(true)
		}
	}
	g.conns = nil
}

// freezableConn is a net.Conn that can stop passing data without closing.
type freezableConn struct {
	net.Conn
	frozen       atomic.Bool
	readDeadline atomic.Int64 // unix nanos; 0 means none
	thawed       chan struct{}
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
		// A read that began before the freeze must not deliver either.
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
	select {
	case <-c.thawed:
	default:
		close(c.thawed)
	}
	return c.Conn.Close()
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

// replica is one gateway replica in a test: its own client, bus, holder and
// service, all closed at cleanup.
type replica struct {
	name    string
	svc     *Service
	bus     *RedisBus
	holder  *Holder
	client  *redis.Client
	gate    *gate
	resubs  atomic.Int32
	cleanup func()
}

type replicaConfig struct {
	bus RedisOptions
	svc Options
	// client, if set, adjusts the replica's Redis client options.
	client func(*redis.Options)
}

func newReplica(tb testing.TB, be *backend, name string, cfg replicaConfig) *replica {
	tb.Helper()
	r := &replica{name: name, gate: &gate{}}
	opts := be.options()
	opts.Dialer = r.gate.dial
	if cfg.client != nil {
		cfg.client(opts)
	}
	r.client = redis.NewClient(opts)
	logger := testLogger(tb).With("replica", name)
	cfg.bus.Prefix = be.prefix
	cfg.bus.Logger = logger
	hook := cfg.bus.OnResubscribed
	cfg.bus.OnResubscribed = func() {
		r.resubs.Add(1)
		if hook != nil {
			hook()
		}
	}
	r.bus = NewRedisBus(r.client, cfg.bus)
	r.holder = NewHolder(cfg.bus.KeyTTL)
	cfg.svc.ReplicaID = name
	cfg.svc.Logger = logger
	r.svc = NewService(r.holder, r.bus, cfg.svc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.svc.Start(ctx); err != nil {
		tb.Fatalf("start replica %s: %v", name, err)
	}
	var once sync.Once
	r.cleanup = func() {
		once.Do(func() {
			r.svc.Close()
			r.holder.Close()
			_ = r.client.Close()
		})
	}
	tb.Cleanup(r.cleanup)
	return r
}

// owner plays the stream relay of one inference: when stopped, it "ends the
// stream" and acknowledges.
type owner struct {
	run       *Run
	stopped   chan struct{}
	onStopped atomic.Int32
}

// own begins id on r for nobody in particular: only a Caller with Any (the
// System of Request) may stop it.
func (r *replica) own(id string) *owner { return r.ownFor(id, 0) }

// ownFor begins id on r for person who.
func (r *replica) ownFor(id string, who uint) *owner {
	o := &owner{stopped: make(chan struct{})}
	var once sync.Once
	o.run = r.svc.Begin(context.Background(), id, who, func() {
		o.onStopped.Add(1)
		once.Do(func() { close(o.stopped) })
	})
	go func() {
		<-o.stopped
		o.run.Ack()
	}()
	return o
}

// wasStopped reports whether onStop has fired.
func (o *owner) wasStopped() bool {
	select {
	case <-o.stopped:
		return true
	default:
		return false
	}
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

var _ io.Writer = tbWriter{}
