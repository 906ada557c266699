package stop

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

func TestMessageWireFormat(t *testing.T) {
	for _, m := range []Message{
		{Kind: KindStop, ID: "inf_1", From: "a", Ref: 1, Seen: -1, By: Caller{UserID: 7}},
		{Kind: KindStop, ID: "inf_3", From: "a", Ref: 1 << 63, Seen: 17, By: System},
		{Kind: KindAck, ID: "inf_with|pipe", From: "b", To: "a", Ref: 3, Seen: -1},
		{Kind: KindFinished, ID: "inf_2", From: "", To: "a", Seen: -1, Outcome: "success"},
		{Kind: KindNone, ID: "inf_2", From: "c", To: "a", Ref: 9, Seen: -1},
	} {
		got, err := decodeMessage(m.encode())
		if err != nil || got != m {
			t.Fatalf("round trip of %+v: got %+v, %v", m, got, err)
		}
	}
	for _, bad := range []string{"", "v1|stop|a|-1|inf", "v2|stop|a||1|-1|u1|", "v2|stop|a||1|-1|u1||", "v2|nope|a||1|-1|u1||inf",
		"v2|stop|a||x|-1|u1||inf", "v2|stop|a||1|x|u1||inf", "v2|stop|a||1|-1|7||inf", "v2|stop|a||1|-1|u-1||inf"} {
		if _, err := decodeMessage(bad); err == nil {
			t.Fatalf("decodeMessage(%q) accepted", bad)
		}
	}
	// A stop key member names the caller and the request to answer.
	m := Message{Kind: KindStop, ID: "inf_k|x", From: "replica-a", Ref: 12, Seen: -1, By: Caller{UserID: 42}}
	if got, err := parseKeyMember(m.ID, keyMember(m)); err != nil || got != m {
		t.Fatalf("key member round trip of %+v: %+v, %v", m, got, err)
	}
	for _, bad := range []string{"", "u1|a", "x|a|1", "u1|a|x", "u1|a|1|2"} {
		if _, err := parseKeyMember("inf", bad); err == nil {
			t.Fatalf("parseKeyMember(%q) accepted", bad)
		}
	}
}

// The usage row's rule: a person stops their own inferences, Any stops
// every one, and an inference begun for nobody only Any may stop.
func TestCallerMayStop(t *testing.T) {
	for _, c := range []struct {
		by    Caller
		owner uint
		want  bool
	}{
		{Caller{UserID: 7}, 7, true},
		{Caller{UserID: 7}, 8, false},
		{Caller{UserID: 0}, 0, false},
		{Caller{UserID: 7}, 0, false},
		{System, 0, true},
		{Caller{UserID: 3, Any: true}, 8, true},
	} {
		if got := c.by.MayStop(c.owner); got != c.want {
			t.Errorf("%+v.MayStop(%d) = %v, want %v", c.by, c.owner, got, c.want)
		}
	}
}

func TestStopAcrossReplicas(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
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
		// Only the owner marks its holder: a stop is the owner's to decide.
		if b.holder.Stopped("inf_x") || c.holder.Stopped("inf_x") {
			t.Error("a replica that does not run inf_x recorded its stop")
		}

		// The stop key names the caller and exists with the holder's TTL.
		ttl, err := be.Admin.TTL(ctx, a.bus.StopKey("inf_x")).Result()
		if err != nil || ttl <= 0 || ttl > DefaultTTL {
			t.Fatalf("stop key TTL = %v, %v; want (0, %v]", ttl, err, DefaultTTL)
		}
		members, err := be.Admin.SMembers(ctx, a.bus.StopKey("inf_x")).Result()
		if err != nil || len(members) != 1 || !strings.HasPrefix(members[0], "*|B|") {
			t.Fatalf("stop key members = %q, %v; want B's system stop", members, err)
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
		a.svc.Begin(ctx, "inf_y", 0, func() { t.Error("onStop after End") }).EndWith("success")
		res, err = b.svc.Request(ctx, "inf_y")
		if err != nil || !res.Acked || !res.Finished || res.Outcome != "success" {
			t.Fatalf("Request after End: %+v, %v; want finished with success", res, err)
		}
	})
}

// TestStopIsTheOwnersToDecide: a stop carries its caller, and the replica
// that runs the inference decides. Someone else's inference and one nobody
// runs get the same answer (NoOwner) once every replica has said so — not a
// timeout, with AckTimeout far away — and someone else's keeps running.
func TestStopIsTheOwnersToDecide(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		cfg := replicaConfig{svc: Options{AckTimeout: 5 * time.Second}}
		a := newReplica(t, be, "A", cfg)
		b := newReplica(t, be, "B", cfg)
		newReplica(t, be, "C", cfg)
		ctx := context.Background()
		const alice, bob = 7, 8
		o := a.ownFor("inf_alice", alice)

		for _, c := range []struct {
			name string
			via  *replica
			id   string
		}{
			{"someone else's, from another replica", b, "inf_alice"},
			{"someone else's, on the owner", a, "inf_alice"},
			{"unknown, from another replica", b, "inf_nobody"},
			{"unknown, on a replica", a, "inf_nobody"},
		} {
			res, err := c.via.svc.RequestAs(ctx, c.id, 3, Caller{UserID: bob})
			if err != nil || !res.NoOwner || res.Acked || res.TimedOut || res.Finished {
				t.Fatalf("%s: %+v, %v; want NoOwner", c.name, res, err)
			}
		}
		if o.wasStopped() || a.holder.Stopped("inf_alice") {
			t.Fatal("bob's stop stopped alice's inference")
		}
		if _, ok := o.run.Seen(); ok {
			t.Error("bob's seen count was kept for alice's inference")
		}

		// Alice's own stop, from another replica, is acknowledged.
		res, err := b.svc.RequestAs(ctx, "inf_alice", 2, Caller{UserID: alice})
		if err != nil || !res.Acked || res.Finished || res.Local {
			t.Fatalf("alice's stop: %+v, %v; want acked by the remote owner", res, err)
		}
		if n, ok := o.run.Seen(); !ok || n != 2 {
			t.Errorf("Seen = %d, %v; want alice's 2", n, ok)
		}
		o.run.EndWith("stopped")

		// Once finished, the owner still tells alice how it ended, and
		// still nobody else that it exists.
		res, err = b.svc.RequestAs(ctx, "inf_alice", -1, Caller{UserID: alice})
		if err != nil || !res.Finished || res.Outcome != "stopped" {
			t.Fatalf("alice's stop after the end: %+v, %v; want finished, stopped", res, err)
		}
		res, err = a.svc.RequestAs(ctx, "inf_alice", -1, Caller{UserID: alice})
		if err != nil || !res.Finished || !res.Local || res.Outcome != "stopped" {
			t.Fatalf("alice's stop on the owner after the end: %+v, %v; want finished locally", res, err)
		}
		for _, via := range []*replica{a, b} {
			res, err = via.svc.RequestAs(ctx, "inf_alice", -1, Caller{UserID: bob})
			if err != nil || !res.NoOwner {
				t.Fatalf("bob's stop via %s after the end: %+v, %v; want NoOwner", via.name, res, err)
			}
		}
		// An administrator may stop, and learn about, anyone's.
		res, err = b.svc.RequestAs(ctx, "inf_alice", -1, Caller{UserID: bob, Any: true})
		if err != nil || !res.Finished || res.Outcome != "stopped" {
			t.Fatalf("an administrator's stop after the end: %+v, %v; want finished", res, err)
		}
	})
}

// TestEarlyStopHonoursItsCaller: a stop recorded before its run begins
// (the chat's id is out before its request starts) stops the run only if
// its caller may.
func TestEarlyStopHonoursItsCaller(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "A", replicaConfig{})
		b := newReplica(t, be, "B", replicaConfig{})
		ctx := context.Background()
		for _, id := range []string{"inf_early_a", "inf_early_b"} {
			if res, err := b.svc.RequestAs(ctx, id, -1, Caller{UserID: 8}); err != nil || !res.NoOwner {
				t.Fatalf("early stop of %s: %+v, %v; want NoOwner", id, res, err)
			}
		}
		if res, err := b.svc.RequestAs(ctx, "inf_early_b", -1, Caller{UserID: 7}); err != nil || !res.NoOwner {
			t.Fatalf("early stop: %+v, %v; want NoOwner", res, err)
		}
		if oa := a.ownFor("inf_early_a", 7); oa.wasStopped() {
			t.Fatal("someone else's early stop stopped the run")
		}
		if ob := a.ownFor("inf_early_b", 7); !ob.wasStopped() || !ob.run.Stopped() {
			t.Fatal("the owner's early stop did not stop the run")
		}
	})
}

func TestStopOnOwningReplica(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "A", replicaConfig{})
		o := a.own("inf_local")
		res, err := a.svc.Request(context.Background(), "inf_local")
		if err != nil || !res.Acked || !res.Local {
			t.Fatalf("local Request: %+v, %v; want acked locally", res, err)
		}
		// Nothing to tell the others: no key, no broadcast.
		if n, _ := be.Admin.Exists(context.Background(), a.bus.StopKey("inf_local")).Result(); n != 0 {
			t.Error("a local stop wrote the stop key")
		}
		if o.onStopped.Load() != 1 {
			t.Fatalf("onStop fired %d times, want 1", o.onStopped.Load())
		}
	})
}

func TestStopBeforeStart(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		cfg := replicaConfig{svc: Options{AckTimeout: 3 * time.Second}}
		a := newReplica(t, be, "A", cfg)
		b := newReplica(t, be, "B", cfg)
		ctx := context.Background()

		res, err := b.svc.Request(ctx, "inf_early")
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		if !res.NoOwner || res.Acked || res.TimedOut {
			t.Fatalf("Request for an id nobody runs: %+v, want NoOwner", res)
		}

		// A's start finds the stop key.
		oa := a.own("inf_early")
		if !oa.wasStopped() || !oa.run.Stopped() {
			t.Fatal("Begin on A did not see the earlier stop")
		}

		// So does a replica that was not even running at publish time.
		d := newReplica(t, be, "D", cfg)
		od := d.own("inf_early")
		if !od.wasStopped() || !od.run.Stopped() {
			t.Fatal("Begin on late replica D did not find the stop key")
		}
	})
}

// TestEarlyStopOnTheRunningReplica: a stop a replica published before it
// began the inference itself (a chat reply's id is out before its request
// starts) is found by Begin's key check, which answers the request still
// waiting — here kept waiting by a subscriber that never answers.
func TestEarlyStopOnTheRunningReplica(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "A", replicaConfig{svc: Options{AckTimeout: 10 * time.Second}})
		silent := be.Admin.Subscribe(context.Background(), a.bus.Channel())
		defer silent.Close()
		if _, err := silent.Receive(context.Background()); err != nil {
			t.Fatal(err)
		}
		type answer struct {
			res Result
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := a.svc.RequestAs(context.Background(), "inf_mine_early", -1, Caller{UserID: 7})
			done <- answer{res, err}
		}()
		waitFor(t, 5*time.Second, "the stop key", func() bool {
			n, _ := be.Admin.Exists(context.Background(), a.bus.StopKey("inf_mine_early")).Result()
			return n == 1
		})
		o := a.ownFor("inf_mine_early", 7)
		ans := <-done
		if ans.err != nil || !ans.res.Acked || ans.res.TimedOut {
			t.Fatalf("the early stop: %+v, %v; want acked once the run began", ans.res, ans.err)
		}
		if !o.wasStopped() {
			t.Fatal("the run was not stopped")
		}
	})
}

// TestStopWhileRedisRestarts closes miniredis and starts it again on the same
// address. A stop published after the restart but before A has re-subscribed
// is lost on the channel; A finds its key after re-subscribing. A real Redis
// cannot be restarted from here: TestStopDuringPartition covers it.
func TestStopWhileRedisRestarts(t *testing.T) {
	be := testredis.Mini(t)
	// A comes back slowly (0.5–1 s), B quickly, so B's stop lands in A's gap.
	a := newReplica(t, be, "A", replicaConfig{bus: RedisOptions{MinBackoff: time.Second, MaxBackoff: time.Second}})
	b := newReplica(t, be, "B", replicaConfig{
		bus: RedisOptions{MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond},
		svc: Options{AckTimeout: 4 * time.Second},
	})
	o := a.own("inf_restart")

	be.Mini.Close()
	time.Sleep(50 * time.Millisecond)
	if err := be.Mini.Restart(); err != nil {
		t.Fatalf("restart miniredis: %v", err)
	}
	waitFor(t, 3*time.Second, "B to re-subscribe", func() bool { return b.resubs.Load() > 0 })
	if a.resubs.Load() != 0 {
		t.Fatal("A re-subscribed before the stop; the test would prove nothing")
	}

	// Redis knows A is not subscribed: B hears from nobody, so nobody runs
	// it as far as the bus can tell, and the caller falls back to storage.
	res, err := b.svc.Request(context.Background(), "inf_restart")
	if err != nil || !res.NoOwner {
		t.Fatalf("Request: %+v, %v; want NoOwner while A is away", res, err)
	}
	select {
	case <-o.stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("A did not find the stop key after re-subscribing")
	}
	if a.resubs.Load() != 1 {
		t.Fatalf("A re-subscribed %d times, want 1", a.resubs.Load())
	}
}

// TestStopDuringPartition cuts replica A off from Redis, publishes a stop from
// B meanwhile, then heals: A must find the stop through the key check that
// follows its re-subscription. B's Request does not wait for A: Redis says
// nobody else heard it.
func TestStopDuringPartition(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "A", replicaConfig{bus: RedisOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}})
		b := newReplica(t, be, "B", replicaConfig{svc: Options{AckTimeout: 3 * time.Second}})
		o := a.own("inf_part")

		a.gate.Cut()
		waitFor(t, 2*time.Second, "Redis to drop A's subscription", func() bool {
			n, _ := be.Admin.PubSubNumSub(context.Background(), b.bus.Channel()).Result()
			return n[b.bus.Channel()] == 1
		})
		res, err := b.svc.Request(context.Background(), "inf_part")
		if err != nil || !res.NoOwner {
			t.Fatalf("Request: %+v, %v; want NoOwner while A is cut off", res, err)
		}
		if o.wasStopped() {
			t.Fatal("A stopped while partitioned; the test would prove nothing")
		}
		a.gate.Heal()
		select {
		case <-o.stopped:
		case <-time.After(5 * time.Second):
			t.Fatal("A did not find the stop after the partition healed")
		}
		if a.resubs.Load() < 1 {
			t.Fatalf("A resubs=%d", a.resubs.Load())
		}
	})
}

// TestStopOverHalfOpenConnection freezes replica A's connections (no data,
// no close, as after a silent network failure). A notices only because its
// PING goes unanswered, replaces the subscription, and finds the stop that B
// published meanwhile through the key check.
func TestStopOverHalfOpenConnection(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "A", replicaConfig{
			bus: RedisOptions{PingInterval: 100 * time.Millisecond, MinBackoff: 10 * time.Millisecond},
			svc: Options{CheckTimeout: 2 * time.Second},
			// Frozen command connections must fail before CheckTimeout.
			client: func(o *redis.Options) { o.ReadTimeout = 200 * time.Millisecond },
		})
		b := newReplica(t, be, "B", replicaConfig{svc: Options{AckTimeout: 3 * time.Second}})
		o := a.own("inf_halfopen")

		a.gate.Freeze()
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
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		cfg := replicaConfig{svc: Options{AckTimeout: 2 * time.Second}}
		a := newReplica(t, be, "A", cfg)
		b := newReplica(t, be, "B", cfg)
		oLocal := a.own("inf_down_local")
		oRemote := a.own("inf_down_remote")

		if be.Mini != nil {
			be.Mini.Close()
		} else {
			a.gate.Cut()
			b.gate.Cut()
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
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
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
	testredis.ForEachIsolated(t, func(t *testing.T, be *testredis.Backend) {
		// No PINGs during the test.
		cfg := replicaConfig{bus: RedisOptions{PingInterval: time.Hour}}
		a := newReplica(t, be, "A", cfg)
		newReplica(t, be, "B", cfg)

		const streams, tokens = 20, 100
		// Warm A's connection pool first: a new connection's handshake
		// (HELLO, CLIENT SETINFO) is not the cost of a Begin.
		a.svc.Begin(context.Background(), "inf_warmup", 0, nil).End()
		before := be.Commands(t)
		runs := make([]*Run, streams)
		for i := range runs {
			runs[i] = a.svc.Begin(context.Background(), fmt.Sprintf("inf_tok_%d", i), 0, func() {})
		}
		afterBegin := be.Commands(t)
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
		if got := be.Commands(t) - afterBegin; got != 0 {
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
	run = a.Begin(ctx, "inf_l1", 0, func() { close(stopped) })
	go func() { <-stopped; run.Ack() }()
	res, err := a.Request(ctx, "inf_l1")
	if err != nil || !res.Acked || !res.Local {
		t.Fatalf("local: %+v, %v", res, err)
	}

	// Two services on one LocalBus act as two replicas.
	stopped2 := make(chan struct{})
	var run2 *Run
	run2 = a.Begin(ctx, "inf_l2", 0, func() { close(stopped2) })
	go func() { <-stopped2; run2.Ack() }()
	res, err = b.Request(ctx, "inf_l2")
	if err != nil || !res.Acked || res.Local {
		t.Fatalf("remote over LocalBus: %+v, %v", res, err)
	}

	// Stop before start: the bus remembers it.
	res, err = b.Request(ctx, "inf_l3")
	if err != nil || !res.NoOwner {
		t.Fatalf("unknown id: %+v, %v; want NoOwner", res, err)
	}
	fired := false
	r3 := a.Begin(ctx, "inf_l3", 0, func() { fired = true })
	if !fired || !r3.Stopped() {
		t.Fatal("Begin after a stop over LocalBus not stopped")
	}
	r3.End()
}

func TestRequestHonoursContext(t *testing.T) {
	be := testredis.Mini(t)
	b := newReplica(t, be, "B", replicaConfig{svc: Options{AckTimeout: 5 * time.Second}})
	// A subscriber that never answers keeps B's request waiting.
	silent := be.Admin.Subscribe(context.Background(), b.bus.Channel())
	defer silent.Close()
	if _, err := silent.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
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
	be := testredis.Mini(t)
	be.Mini.Close()
	client := redis.NewClient(be.Options())
	defer client.Close()
	bus := NewRedisBus(client, RedisOptions{Prefix: be.Prefix, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Logger: testredis.Logger(t)})
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
	if err := be.Mini.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the bus to subscribe after Redis came back", func() bool { return bus.Ready() == nil })
}

// A run begun with BeginFresh (an id nobody has seen yet) costs no Redis
// command, and a stop sent once its id is out still reaches it.
func TestBeginFreshCostsNoRedisCommand(t *testing.T) {
	testredis.ForEachIsolated(t, func(t *testing.T, be *testredis.Backend) {
		cfg := replicaConfig{bus: RedisOptions{PingInterval: time.Hour}}
		a := newReplica(t, be, "A", cfg)
		b := newReplica(t, be, "B", cfg)
		a.svc.Begin(context.Background(), "inf_warmup", 0, nil).End()
		before := be.Commands(t)
		stopped := make(chan struct{})
		var runs []*Run
		for i := range 20 {
			onStop := func() {}
			if i == 0 {
				onStop = func() { close(stopped) }
			}
			runs = append(runs, a.svc.BeginFresh(fmt.Sprintf("inf_fresh_%d", i), 0, onStop))
		}
		if got := be.Commands(t) - before; got != 0 {
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
