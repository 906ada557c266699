package stop

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

// failPipelines fails the next n key checks its client sends, as commands on
// connections that died silently do (after their read timeout).
type failPipelines struct{ n atomic.Int32 }

var errDeadConn = errors.New("test: i/o timeout on a connection that died silently")

func (f *failPipelines) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (f *failPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (f *failPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		// Only the key checks: a new connection's own set-up is a
		// pipeline too.
		if len(cmds) > 0 && cmds[0].Name() == "smembers" && f.n.Add(-1) >= 0 {
			return errDeadConn
		}
		return next(ctx, cmds)
	}
}

// TestStopFoundAfterAFailedKeyCheck: B stops an inference while its owner A
// is cut off from Redis; when A is back, its first two checks of the stop
// keys fail (the first commands after an outage often do). A tries again
// and stops the run: the stop's key is the only trace of it, and one
// failed check used to lose it until the stream ended by itself.
func TestStopFoundAfterAFailedKeyCheck(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "A", replicaConfig{bus: RedisOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}})
		b := newReplica(t, be, "B", replicaConfig{})
		var fail failPipelines
		a.client.AddHook(&fail)
		o := a.own("inf_recheck")

		a.gate.Cut()
		waitFor(t, 2*time.Second, "Redis to drop A's subscription", func() bool {
			n, _ := be.Admin.PubSubNumSub(context.Background(), b.bus.Channel()).Result()
			return n[b.bus.Channel()] == 1
		})
		if res, err := b.svc.Request(context.Background(), "inf_recheck"); err != nil || !res.NoOwner {
			t.Fatalf("Request: %+v, %v; want NoOwner while A is cut off", res, err)
		}
		fail.n.Store(2)
		a.gate.Heal()
		select {
		case <-o.stopped:
		case <-time.After(5 * time.Second):
			t.Fatalf("A did not find the stop after its key check failed (%d failures left)", fail.n.Load())
		}
		if left := fail.n.Load(); left > 0 {
			t.Fatalf("A stopped with %d failures left: the test proves nothing", left)
		}
	})
}
