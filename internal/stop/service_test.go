package stop

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMessageWireFormat(t *testing.T) {
	for _, m := range []Message{
		{Kind: KindStop, ID: "inf_1", From: "a", Seen: -1},
		{Kind: KindStop, ID: "inf_3", From: "a", Seen: 17},
		{Kind: KindAck, ID: "inf_with|pipe", From: "b", Seen: -1},
		{Kind: KindFinished, ID: "inf_2", From: "", Seen: -1},
	} {
		got, err := decodeMessage(m.encode())
		if err != nil || got != m {
			t.Fatalf("round trip of %+v: got %+v, %v", m, got, err)
		}
	}
	for _, bad := range []string{"", "v1|stop|a", "v1|stop|a|inf", "v2|stop|a|-1|inf", "v1|nope|a|-1|inf", "v1|stop|a|-1|", "v1|stop|a|x|inf"} {
		if _, err := decodeMessage(bad); err == nil {
			t.Fatalf("decodeMessage(%q) accepted", bad)
		}
	}
}

func TestStopAcrossReplicas(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be *backend) {
		a := newReplica(t, be, "A", replicaConfig{})
		b := newReplica(t, be, "B", replicaConfig{})
		c := newReplica(t, be, "C", replicaConfig{})
		ctx := context.Background()

		o := a.own("inf_x")
		res, err := b.svc.Request(ctx, "inf_x")
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		if !res.Acked || res.TimedOut || res.Local || res.Finished {
			t.Fatalf("Request result %+v, want acked from a remote owner", res)
		}
		if !o.wasStopped() || !o.run.Stopped() {
			t.Fatal("owner's onStop did not fire before the ack")
		}
		t.Logf("remote stop acked in %v", res.Latency)
		// Every replica hears the broadcast.
		waitFor(t, 2*time.Second, "C to hear the stop", func() bool { return c.holder.Stopped("inf_x") })

		// The stop key exists with the holder's TTL.
		ttl, err := be.admin.TTL(ctx, a.bus.StopKey("inf_x")).Result()
		if err != nil || ttl <= 0 || ttl > DefaultTTL {
			t.Fatalf("stop key TTL = %v, %v; want (0, %v]", ttl, err, DefaultTTL)
		}

		// A second stop while the run is still registered is answered again.
		res, err = c.svc.Request(ctx, "inf_x")
		if err != nil || !res.Acked || res.Finished {
			t.Fatalf("second Request: %+v, %v; want acked", res, err)
		}
		if n := o.onStopped.Load(); n != 1 {
			t.Fatalf("onStop fired %d times, want 1", n)
		}

		// A stop that reaches the owner just after the stream finished on
		// its own is answered at once, as finished. (A fresh id: a late ack
		// of inf_x may legitimately answer first, since an ack stays true.)
		o.run.End()
		a.svc.Begin(ctx, "inf_y", func() { t.Error("onStop after End") }).End()
		res, err = b.svc.Request(ctx, "inf_y")
		if err != nil || !res.Acked || !res.Finished {
			t.Fatalf("Request after End: %+v, %v; want finished", res, err)
		}
	})
}

func TestStopOnOwningReplica(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be *backend) {
		a := newReplica(t, be, "A", replicaConfig{})
		o := a.own("inf_local")
		res, err := a.svc.Request(context.Background(), "inf_local")
		if err != nil || !res.Acked || !res.Local {
			t.Fatalf("local Request: %+v, %v; want acked locally", res, err)
		}
		// The best-effort broadcast still records the key.
		waitFor(t, 2*time.Second, "stop key", func() bool {
			n, _ := be.admin.Exists(context.Background(), a.bus.StopKey("inf_local")).Result()
			return n == 1
		})
		if o.onStopped.Load() != 1 {
			t.Fatalf("onStop fired %d times, want 1", o.onStopped.Load())
		}
	})
}

func TestStopBeforeStart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be *backend) {
		cfg := replicaConfig{svc: Options{AckTimeout: 300 * time.Millisecond}}
		a := newReplica(t, be, "A", cfg)
		b := newReplica(t, be, "B", cfg)
		ctx := context.Background()

		res, err := b.svc.Request(ctx, "inf_early")
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		if !res.TimedOut || res.Acked {
			t.Fatalf("Request for an id nobody runs: %+v, want timed out", res)
		}
		if res.Latency < 300*time.Millisecond || res.Latency > 1500*time.Millisecond {
			t.Fatalf("timed out after %v, want about the 300ms AckTimeout", res.Latency)
		}

		// A subscribed replica heard the broadcast: its start is stopped at
		// once, from the holder alone.
		waitFor(t, 2*time.Second, "A to hear the stop", func() bool { return a.holder.Stopped("inf_early") })
		oa := a.own("inf_early")
		if !oa.wasStopped() || !oa.run.Stopped() {
			t.Fatal("Begin on A did not see the earlier stop")
		}

		// A replica that was not even running at publish time finds the key.
		d := newReplica(t, be, "D", cfg)
		if d.holder.Stopped("inf_early") {
			t.Fatal("D's holder cannot know yet; the test would prove nothing")
		}
		od := d.own("inf_early")
		if !od.wasStopped() || !od.run.Stopped() {
			t.Fatal("Begin on late replica D did not find the stop key")
		}
	})
}

// TestStopWhileRedisRestarts closes miniredis and starts it again on the same
// address. A stop published after the restart but before A has re-subscribed
// is lost on the channel; A finds its key after re-subscribing. A real Redis
// cannot be restarted from here: TestStopDuringPartition covers it.
func TestStopWhileRedisRestarts(t *testing.T) {
	be := newMiniBackend(t)
	// A comes back slowly (0.5–1 s), B quickly, so B's stop lands in A's gap.
	a := newReplica(t, be, "A", replicaConfig{bus: RedisOptions{MinBackoff: time.Second, MaxBackoff: time.Second}})
	b := newReplica(t, be, "B", replicaConfig{
		bus: RedisOptions{MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond},
		svc: Options{AckTimeout: 4 * time.Second},
	})
	o := a.own("inf_restart")

	be.mr.Close()
	time.Sleep(50 * time.Millisecond)
	if err := be.mr.Restart(); err != nil {
		t.Fatalf("restart miniredis: %v", err)
	}
	waitFor(t, 3*time.Second, "B to re-subscribe", func() bool { return b.resubs.Load() > 0 })
	if a.resubs.Load() != 0 {
		t.Fatal("A re-subscribed before the stop; the test would prove nothing")
	}

	res, err := b.svc.Request(context.Background(), "inf_restart")
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	if !res.Acked {
		t.Fatalf("Request: %+v, want acked once A re-subscribed and found the key", res)
	}
	if a.resubs.Load() != 1 {
		t.Fatalf("A re-subscribed %d times, want 1", a.resubs.Load())
	}
	if !o.wasStopped() {
		t.Fatal("owner not stopped")
	}
	t.Logf("stop published during A's reconnection gap acked after %v", res.Latency)
}

// TestStopDuringPartition cuts replica A off from Redis, publishes a stop from
// B meanwhile, then heals: A must find the stop through the key check that
// follows its re-subscription, and B's waiting Request must get the ack.
func TestStopDuringPartition(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be *backend) {
		a := newReplica(t, be, "A", replicaConfig{bus: RedisOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}})
		b := newReplica(t, be, "B", replicaConfig{svc: Options{AckTimeout: 3 * time.Second}})
		o := a.own("inf_part")

		a.gate.cut()
		type answer struct {
			res Result
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := b.svc.Request(context.Background(), "inf_part")
			done <- answer{res, err}
		}()
		// The stop is published now (B is connected) and lost for A.
		waitFor(t, 2*time.Second, "the stop key", func() bool {
			n, _ := be.admin.Exists(context.Background(), b.bus.StopKey("inf_part")).Result()
			return n == 1
		})
		time.Sleep(100 * time.Millisecond)
		if o.wasStopped() {
			t.Fatal("A stopped while partitioned; the test would prove nothing")
		}
		a.gate.heal()

		ans := <-done
		if ans.err != nil || !ans.res.Acked {
			t.Fatalf("Request: %+v, %v; want acked after A healed", ans.res, ans.err)
		}
		if a.resubs.Load() < 1 || !o.wasStopped() {
			t.Fatalf("A resubs=%d stopped=%v", a.resubs.Load(), o.wasStopped())
		}
		t.Logf("stop across a %v partition acked after %v", 100*time.Millisecond, ans.res.Latency)
	})
}

// TestStopOverHalfOpenConnection freezes replica A's connections (no data,
// no close, as after a silent network failure). A notices only because its
// PING goes unanswered, replaces the subscription, and finds the stop that B
// published meanwhile through the key check.
func TestStopOverHalfOpenConnection(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be *backend) {
		a := newReplica(t, be, "A", replicaConfig{
			bus: RedisOptions{PingInterval: 100 * time.Millisecond, MinBackoff: 10 * time.Millisecond},
			svc: Options{CheckTimeout: 2 * time.Second},
			// Frozen command connections must fail before CheckTimeout.
			client: func(o *redis.Options) { o.ReadTimeout = 200 * time.Millisecond },
		})
		b := newReplica(t, be, "B", replicaConfig{svc: Options{AckTimeout: 3 * time.Second}})
		o := a.own("inf_halfopen")

		a.gate.freeze()
		res, err := b.svc.Request(context.Background(), "inf_halfopen")
		if err != nil || !res.Acked {
			t.Fatalf("Request: %+v, %v; want acked after A replaced its subscription", res, err)
		}
		if a.resubs.Load() < 1 || !o.wasStopped() {
			t.Fatalf("A resubs=%d stopped=%v", a.resubs.Load(), o.wasStopped())
		}
		// The stop must have waited for detection: two silent intervals.
		if res.Latency < 150*time.Millisecond {
			t.Fatalf("acked after %v: faster than A could have noticed; the test proves nothing", res.Latency)
		}
		t.Logf("stop over a half-open connection acked after %v", res.Latency)
	})
}

// TestRedisDown: with Redis gone, a stop of an inference this replica owns
// still works; one owned elsewhere fails fast with ErrUnavailable.
func TestRedisDown(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be *backend) {
		cfg := replicaConfig{svc: Options{AckTimeout: 2 * time.Second}}
		a := newReplica(t, be, "A", cfg)
		b := newReplica(t, be, "B", cfg)
		oLocal := a.own("inf_down_local")
		oRemote := a.own("inf_down_remote")

		if be.mr != nil {
			be.mr.Close()
		} else {
			a.gate.cut()
			b.gate.cut()
		}
		// Noticing takes a read of the subscription connection: not in zero
		// time. Until then a remote Request tries to publish, bounded by
		// AckTimeout.
		waitFor(t, 2*time.Second, "the buses to notice", func() bool {
			return a.bus.Ready() != nil && b.bus.Ready() != nil
		})

		ctx := context.Background()
		for range 2 { // the second time is a double stop
			res, err := a.svc.Request(ctx, "inf_down_local")
			if err != nil || !res.Acked || !res.Local {
				t.Fatalf("local Request with Redis down: %+v, %v; want acked locally", res, err)
			}
			if res.Latency > 500*time.Millisecond {
				t.Fatalf("local Request took %v with Redis down", res.Latency)
			}
		}
		if !oLocal.wasStopped() {
			t.Fatal("local owner not stopped")
		}

		start := time.Now()
		res, err := b.svc.Request(ctx, "inf_down_remote")
		took := time.Since(start)
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("remote Request with Redis down: %+v, %v; want ErrUnavailable", res, err)
		}
		t.Logf("remote Request with Redis down failed after %v: %v", took, err)
		if took > 2500*time.Millisecond {
			t.Fatalf("remote Request took %v to fail, want within the AckTimeout", took)
		}
		if oRemote.wasStopped() {
			t.Fatal("remote owner stopped without Redis")
		}
		// Run bookkeeping still works without Redis.
		oLocal.run.End()
		oRemote.run.End()
		// Closing with Redis down must not hang.
		closed := make(chan struct{})
		go func() { a.cleanup(); b.cleanup(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close hung with Redis down")
		}
	})
}

func TestConcurrentDoubleStop(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be *backend) {
		a := newReplica(t, be, "A", replicaConfig{})
		b := newReplica(t, be, "B", replicaConfig{})
		c := newReplica(t, be, "C", replicaConfig{})
		o := a.own("inf_double")
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		for i := range 6 {
			svc := []*Service{b.svc, c.svc}[i%2]
			wg.Go(func() {
				res, err := svc.Request(context.Background(), "inf_double")
				if err == nil && !res.Acked {
					err = fmt.Errorf("not acked: %+v", res)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := o.onStopped.Load(); n != 1 {
			t.Fatalf("onStop fired %d times, want 1", n)
		}
	})
}

// TestNoRedisCommandsPerToken: checking for a stop costs Redis nothing. 20
// streams each check 100 times; the server sees no command at all. Starting
// a stream costs exactly one (the stop-key check).
func TestNoRedisCommandsPerToken(t *testing.T) {
	forEachIsolatedBackend(t, func(t *testing.T, be *backend) {
		// No PINGs during the test.
		cfg := replicaConfig{bus: RedisOptions{PingInterval: time.Hour}}
		a := newReplica(t, be, "A", cfg)
		newReplica(t, be, "B", cfg)

		const streams, tokens = 20, 100
		// Warm A's connection pool first: a new connection's handshake
		// (HELLO, CLIENT SETINFO) is not the cost of a Begin.
		a.svc.Begin(context.Background(), "inf_warmup", nil).End()
		before := be.commands(t)
		runs := make([]*Run, streams)
		for i := range runs {
			runs[i] = a.svc.Begin(context.Background(), fmt.Sprintf("inf_tok_%d", i), func() {})
		}
		afterBegin := be.commands(t)
		if got := afterBegin - before; got != streams {
			t.Fatalf("%d Begins cost %d Redis commands, want %d", streams, got, streams)
		}

		var wg sync.WaitGroup
		for _, r := range runs {
			wg.Go(func() {
				for range tokens {
					if r.Stopped() {
						t.Errorf("%s stopped", r.ID())
						return
					}
				}
			})
		}
		wg.Wait()
		if got := be.commands(t) - afterBegin; got != 0 {
			t.Fatalf("%d×%d Stopped checks cost %d Redis commands, want 0", streams, tokens, got)
		}
		for _, r := range runs {
			r.End()
		}
	})
}

func TestLocalBus(t *testing.T) {
	ctx := context.Background()
	bus := NewLocalBus()
	defer bus.Close()
	ha, hb := NewHolder(0), NewHolder(0)
	defer ha.Close()
	defer hb.Close()
	a := NewService(ha, bus, Options{ReplicaID: "A", AckTimeout: 200 * time.Millisecond})
	b := NewService(hb, bus, Options{ReplicaID: "B", AckTimeout: 200 * time.Millisecond})
	for _, s := range []*Service{a, b} {
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	defer a.Close()
	defer b.Close()

	// Single replica: stop and ack without any network.
	stopped := make(chan struct{})
	var run *Run
	run = a.Begin(ctx, "inf_l1", func() { close(stopped) })
	go func() { <-stopped; run.Ack() }()
	res, err := a.Request(ctx, "inf_l1")
	if err != nil || !res.Acked || !res.Local {
		t.Fatalf("local: %+v, %v", res, err)
	}

	// Two services on one LocalBus act as two replicas.
	stopped2 := make(chan struct{})
	var run2 *Run
	run2 = a.Begin(ctx, "inf_l2", func() { close(stopped2) })
	go func() { <-stopped2; run2.Ack() }()
	res, err = b.Request(ctx, "inf_l2")
	if err != nil || !res.Acked || res.Local {
		t.Fatalf("remote over LocalBus: %+v, %v", res, err)
	}

	// Stop before start: the holder remembers it.
	res, err = b.Request(ctx, "inf_l3")
	if err != nil || !res.TimedOut {
		t.Fatalf("unknown id: %+v, %v; want timed out", res, err)
	}
	fired := false
	r3 := a.Begin(ctx, "inf_l3", func() { fired = true })
	if !fired || !r3.Stopped() {
		t.Fatal("Begin after a stop over LocalBus not stopped")
	}
	r3.End()
}

func TestRequestHonoursContext(t *testing.T) {
	be := newMiniBackend(t)
	b := newReplica(t, be, "B", replicaConfig{svc: Options{AckTimeout: 5 * time.Second}})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.svc.Request(ctx, "inf_nobody")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Request ignored its context for %v", took)
	}
}

// TestStartWhileRedisDown: Start reports the failure by its deadline, and the
// bus subscribes on its own once Redis is back.
func TestStartWhileRedisDown(t *testing.T) {
	be := newMiniBackend(t)
	be.mr.Close()
	client := redis.NewClient(be.options())
	defer client.Close()
	bus := NewRedisBus(client, RedisOptions{Prefix: be.prefix, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Logger: testLogger(t)})
	h := NewHolder(0)
	defer h.Close()
	s := NewService(h, bus, Options{})
	defer s.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := s.Start(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start with Redis down: %v, want deadline exceeded", err)
	}
	t.Logf("Start with Redis down: %v", err)
	if bus.Ready() == nil {
		t.Fatal("Ready with Redis down")
	}
	if err := be.mr.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the bus to subscribe after Redis came back", func() bool { return bus.Ready() == nil })
}

// A run begun with BeginFresh (an id nobody has seen yet) costs no Redis
// command, and a stop sent once its id is out still reaches it.
func TestBeginFreshCostsNoRedisCommand(t *testing.T) {
	forEachIsolatedBackend(t, func(t *testing.T, be *backend) {
		cfg := replicaConfig{bus: RedisOptions{PingInterval: time.Hour}}
		a := newReplica(t, be, "A", cfg)
		b := newReplica(t, be, "B", cfg)
		a.svc.Begin(context.Background(), "inf_warmup", nil).End()
		before := be.commands(t)
		stopped := make(chan struct{})
		var runs []*Run
		for i := range 20 {
			onStop := func() {}
			if i == 0 {
				onStop = func() { close(stopped) }
			}
			runs = append(runs, a.svc.BeginFresh(fmt.Sprintf("inf_fresh_%d", i), onStop))
		}
		if got := be.commands(t) - before; got != 0 {
			t.Fatalf("20 fresh Begins cost %d Redis commands, want 0", got)
		}
		go func() {
			<-stopped
			runs[0].Ack()
		}()
		res, err := b.svc.Request(context.Background(), "inf_fresh_0")
		if err != nil {
			t.Fatal(err)
		}
		if !res.Acked {
			t.Fatalf("a stop from another replica for a fresh run: %+v, want acknowledged", res)
		}
		for _, r := range runs {
			r.End()
		}
	})
}
