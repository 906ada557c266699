package stop

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

// The Redis the tests run against, the dialer that cuts a replica off and
// the test logger are package testredis's.

// replica is one gateway replica in a test: its own client, bus, holder and
// service, all closed at cleanup.
type replica struct {
	name    string
	svc     *Service
	bus     *RedisBus
	holder  *Holder
	client  *redis.Client
	gate    *testredis.Gate
	resubs  atomic.Int32
	cleanup func()
}

type replicaConfig struct {
	bus RedisOptions
	svc Options
	// client, if set, adjusts the replica's Redis client options.
	client func(*redis.Options)
}

func newReplica(tb testing.TB, be *testredis.Backend, name string, cfg replicaConfig) *replica {
	tb.Helper()
	r := &replica{name: name, gate: &testredis.Gate{}}
	opts := be.Options()
	opts.Dialer = r.gate.Dial
	if cfg.client != nil {
		cfg.client(opts)
	}
	r.client = redis.NewClient(opts)
	logger := testredis.Logger(tb).With("replica", name)
	cfg.bus.Prefix = be.Prefix
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
