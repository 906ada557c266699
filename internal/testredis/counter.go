package testredis

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Counter is a go-redis hook (client.AddHook) counting the commands a
// client sends, a pipeline's one by one.
type Counter struct {
	// N counts every command but a new connection's set-up (HELLO, CLIENT
	// SETINFO, AUTH, SELECT), which Handshakes counts: a cost per
	// connection, not per operation, and the pool may open one at any time.
	N, Handshakes atomic.Int64
	// Match, if set before the client is used, splits N in two: Matched
	// counts the commands it matches and Others the rest, and LastOther
	// holds the name of the last of those. Each command adds to exactly one
	// of the two, so reading them never splits a command.
	Match           func(redis.Cmder) bool
	Matched, Others atomic.Int64
	LastOther       atomic.Pointer[string]
}

func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *Counter) count(cmd redis.Cmder) {
	switch strings.ToLower(cmd.Name()) {
	case "hello", "client", "auth", "select":
		c.Handshakes.Add(1)
		return
	}
	c.N.Add(1)
	if c.Match == nil {
		return
	}
	if c.Match(cmd) {
		c.Matched.Add(1)
	} else {
		c.Others.Add(1)
		name := cmd.Name()
		c.LastOther.Store(&name)
	}
}

// Logger returns a logger writing to the test's log, so that its output
// shows with -v or on failure only.
func Logger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
