package testredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// EnvURL names a real Redis to run the tests against as well as miniredis,
// e.g. redis://127.0.0.1:6379/0. A bad URL, or a Redis that does not
// answer, fails the tests rather than skipping them.
const EnvURL = "MOONJI_TEST_REDIS_URL"

// Backend is one Redis a test runs against: a miniredis of its own, or a
// real one. Either way the test puts its keys and channels under Prefix,
// fresh for it, since a real Redis is shared with other tests.
type Backend struct {
	Name   string               // "miniredis" or "redis"
	Mini   *miniredis.Miniredis // nil for a real Redis
	URL    string
	Prefix string
	// Admin is a client of the test's own, for looking at what the code
	// under test left in Redis; closed when the test ends.
	Admin *redis.Client
	opts  *redis.Options
}

// ForEach runs fn as a subtest against a fresh miniredis and, when EnvURL
// is set, against that Redis.
func ForEach(t *testing.T, fn func(t *testing.T, be *Backend)) {
	t.Run("miniredis", func(t *testing.T) { fn(t, Mini(t)) })
	if os.Getenv(EnvURL) != "" {
		t.Run("redis", func(t *testing.T) { fn(t, Real(t)) })
	}
}

// ForEachIsolated is ForEach for tests that count the server's commands:
// the real variant runs on a private redis-server (Start), since the
// shared one also serves other packages' tests at the same time.
func ForEachIsolated(t *testing.T, fn func(t *testing.T, be *Backend)) {
	t.Run("miniredis", func(t *testing.T) { fn(t, Mini(t)) })
	if os.Getenv(EnvURL) != "" {
		t.Run("redis", func(t *testing.T) {
			t.Setenv(EnvURL, Start(t))
			fn(t, Real(t))
		})
	}
}

// Best returns the real Redis when EnvURL is set, otherwise a miniredis:
// measurements should use the real thing when offered.
func Best(tb testing.TB) *Backend {
	if os.Getenv(EnvURL) != "" {
		return Real(tb)
	}
	return Mini(tb)
}

// Mini starts a miniredis, closed when the test ends.
func Mini(tb testing.TB) *Backend {
	tb.Helper()
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		tb.Fatalf("start miniredis: %v", err)
	}
	tb.Cleanup(mr.Close)
	be := &Backend{Name: "miniredis", Mini: mr, URL: "redis://" + mr.Addr(), Prefix: RandomPrefix(),
		opts: &redis.Options{Addr: mr.Addr()}}
	be.Admin = redis.NewClient(be.Options())
	tb.Cleanup(func() { _ = be.Admin.Close() })
	return be
}

// Real connects to the Redis of EnvURL; when the test ends it deletes the
// keys left under the backend's prefix.
func Real(tb testing.TB) *Backend {
	tb.Helper()
	url := os.Getenv(EnvURL)
	opts, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatalf("%s=%q: %v", EnvURL, url, err)
	}
	be := &Backend{Name: "redis", URL: url, Prefix: RandomPrefix(), opts: opts}
	be.Admin = redis.NewClient(be.Options())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := be.Admin.Ping(ctx).Err(); err != nil {
		tb.Fatalf("%s is set but Redis does not answer: %v", EnvURL, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		iter := be.Admin.Scan(ctx, 0, be.Prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			be.Admin.Del(ctx, iter.Val())
		}
		_ = be.Admin.Close()
	})
	return be
}

// RandomPrefix returns a fresh key prefix, "moonjitest:<random>:".
func RandomPrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "moonjitest:" + hex.EncodeToString(b[:]) + ":"
}

// Options returns a copy of the backend's client options, for a client of
// the code under test (give it a Gate's Dial to cut it off).
func (be *Backend) Options() *redis.Options {
	o := *be.opts
	return &o
}

// CommandStats returns, from INFO commandstats, the calls per command
// (lower-case name) the server has run so far, INFO itself left out.
// Commands that scripts run are counted too, under their own names. A
// real Redis only: miniredis has no INFO (see Commands).
func (be *Backend) CommandStats(tb testing.TB) map[string]int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	info, err := be.Admin.Info(ctx, "commandstats").Result()
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

// Commands returns how many commands the server has run so far: miniredis's
// count, or the sum of CommandStats.
func (be *Backend) Commands(tb testing.TB) int64 {
	tb.Helper()
	if be.Mini != nil {
		return int64(be.Mini.CommandCount())
	}
	var total int64
	for _, n := range be.CommandStats(tb) {
		total += n
	}
	return total
}
