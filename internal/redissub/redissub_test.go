package redissub

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

// harness is one Sub under test, on a client that dials through a gate.
type harness struct {
	be         *testredis.Backend
	gate       *testredis.Gate
	sub        *Sub
	channel    string
	messages   chan string
	subscribed chan bool // OnSubscribed's first
	logs       *logRecorder
}

func start(t *testing.T, be *testredis.Backend, ping time.Duration, before func(*harness)) *harness {
	t.Helper()
	h := &harness{
		be:         be,
		gate:       &testredis.Gate{},
		channel:    be.Prefix + "events",
		messages:   make(chan string, 100),
		subscribed: make(chan bool, 100),
		logs:       &logRecorder{},
	}
	opts := be.Options()
	opts.Dialer = h.gate.Dial
	opts.DialTimeout = 200 * time.Millisecond
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	if before != nil {
		before(h)
	}
	h.sub = Start(rdb, Options{
		Channel:      h.channel,
		OnMessage:    func(p string) { h.messages <- p },
		OnSubscribed: func(first bool) { h.subscribed <- first },
		PingInterval: ping,
		MinBackoff:   10 * time.Millisecond,
		MaxBackoff:   50 * time.Millisecond,
		Log:          slog.New(h.logs),
	})
	t.Cleanup(h.sub.Close)
	return h
}

// expectSubscribed waits for OnSubscribed(first).
func (h *harness) expectSubscribed(t *testing.T, first bool) {
	t.Helper()
	select {
	case got := <-h.subscribed:
		if got != first {
			t.Fatalf("OnSubscribed(%v), want OnSubscribed(%v)", got, first)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no OnSubscribed(%v) within 5s", first)
	}
}

// expectDelivery publishes payloads until one arrives (a message published
// while the subscription is being replaced may be lost, as pub/sub
// allows), then checks that the next one arrives too, in order.
func (h *harness) expectDelivery(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	ok := testredis.WaitFor(5*time.Second, func() bool {
		if err := h.be.Admin.Publish(ctx, h.channel, "probe").Err(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-h.messages:
			return true
		case <-time.After(20 * time.Millisecond):
			return false
		}
	})
	if !ok {
		t.Fatal("nothing published reached OnMessage within 5s")
	}
	drain(h.messages)
	for _, p := range []string{"one", "two"} {
		if err := h.be.Admin.Publish(ctx, h.channel, p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"one", "two"} {
		select {
		case got := <-h.messages:
			if got != want {
				t.Fatalf("OnMessage(%q), want %q", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("OnMessage(%q) not called within 5s", want)
		}
	}
}

func drain(ch chan string) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// TestDelivers: Ready once subscribed, messages in order, nothing from
// other channels, and no callback after Close.
func TestDelivers(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		h := start(t, be, 0, nil)
		select {
		case <-h.sub.Ready():
		case <-time.After(5 * time.Second):
			t.Fatal("not Ready within 5s")
		}
		h.expectSubscribed(t, true)
		if since, err := h.sub.Down(); !since.IsZero() || err != nil {
			t.Fatalf("Down() = %v, %v while subscribed", since, err)
		}
		ctx := context.Background()
		be.Admin.Publish(ctx, be.Prefix+"other", "not ours")
		h.expectDelivery(t)

		h.sub.Close()
		h.sub.Close() // a second Close does nothing
		be.Admin.Publish(ctx, h.channel, "after close")
		// The loop has returned (Close waited for it): nothing more can
		// reach OnMessage.
		if len(h.messages) != 0 {
			t.Fatalf("OnMessage(%q) after Close", <-h.messages)
		}
	})
}

// TestLostAndRestored: connections cut, the subscription reports itself
// down and logs the loss once, however many attempts fail; once Redis can
// be reached again it is restored, logged once, and delivers again.
func TestLostAndRestored(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		h := start(t, be, 0, nil)
		h.expectSubscribed(t, true)
		h.gate.Cut()
		var since time.Time
		var err error
		if !testredis.WaitFor(5*time.Second, func() bool { since, err = h.sub.Down(); return !since.IsZero() }) {
			t.Fatal("Down() still zero 5s after the connection was cut")
		}
		if err == nil {
			t.Fatal("Down() gives no reason")
		}
		// Several reconnection attempts fail meanwhile.
		if !testredis.WaitFor(5*time.Second, func() bool {
			_, err := h.sub.Down()
			return err != nil && strings.Contains(err.Error(), testredis.ErrPartitioned.Error())
		}) {
			_, err := h.sub.Down()
			t.Fatalf("Down() = %v, want the dialer's refusal", err)
		}
		h.gate.Heal()
		h.expectSubscribed(t, false)
		if s, err := h.sub.Down(); !s.IsZero() || err != nil {
			t.Fatalf("Down() = %v, %v once restored", s, err)
		}
		h.expectDelivery(t)
		if lost, restored := h.logs.count("lost"), h.logs.count("restored"); lost != 1 || restored != 1 {
			t.Errorf("logged %d losses and %d restorations for one outage, want 1 and 1", lost, restored)
		}
	})
}

// TestHalfOpenReplaced: the connection goes silent without closing (a
// half-open TCP connection); after a PING goes unanswered the subscription
// is replaced by one on a new connection.
func TestHalfOpenReplaced(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		const ping = 100 * time.Millisecond
		h := start(t, be, ping, nil)
		h.expectSubscribed(t, true)
		h.gate.Freeze()
		h.expectSubscribed(t, false)
		h.expectDelivery(t)
		if n := h.logs.count("silent after PING"); n != 1 {
			t.Errorf("logged %d half-open replacements, want 1", n)
		}
	})
}

// TestRedisRestarted: the server goes away and comes back on the same
// address, empty; the subscription follows.
func TestRedisRestarted(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		be := testredis.Mini(t)
		h := start(t, be, 0, nil)
		h.expectSubscribed(t, true)
		be.Mini.Close()
		if !testredis.WaitFor(5*time.Second, func() bool { s, _ := h.sub.Down(); return !s.IsZero() }) {
			t.Fatal("Down() still zero 5s after Redis stopped")
		}
		if err := be.Mini.Restart(); err != nil {
			t.Fatal(err)
		}
		h.expectSubscribed(t, false)
		h.expectDelivery(t)
	})
	if os.Getenv(testredis.EnvURL) == "" {
		return
	}
	t.Run("redis", func(t *testing.T) {
		srv := testredis.StartServer(t)
		t.Setenv(testredis.EnvURL, srv.URL)
		be := testredis.Real(t)
		h := start(t, be, 0, nil)
		h.expectSubscribed(t, true)
		srv.Stop(t)
		if !testredis.WaitFor(5*time.Second, func() bool { s, _ := h.sub.Down(); return !s.IsZero() }) {
			t.Fatal("Down() still zero 5s after Redis stopped")
		}
		srv.Restart(t)
		h.expectSubscribed(t, false)
		h.expectDelivery(t)
	})
}

// TestStartWhileDown: a Sub started while Redis cannot be reached is not
// Ready and says why; it subscribes once Redis can be reached, and Close
// ends it promptly either way.
func TestStartWhileDown(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		h := start(t, be, 0, func(h *harness) { h.gate.Cut() })
		if !testredis.WaitFor(5*time.Second, func() bool {
			_, err := h.sub.Down()
			return err != nil && strings.Contains(err.Error(), testredis.ErrPartitioned.Error())
		}) {
			_, err := h.sub.Down()
			t.Fatalf("Down() = %v, want the dialer's refusal", err)
		}
		select {
		case <-h.sub.Ready():
			t.Fatal("Ready with Redis unreachable")
		default:
		}
		h.gate.Heal()
		h.expectSubscribed(t, true)
		<-h.sub.Ready()
		h.expectDelivery(t)

		down := start(t, be, 0, func(h *harness) { h.gate.Cut() })
		closed := make(chan struct{})
		go func() {
			down.sub.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatal("Close of a Sub retrying against an unreachable Redis did not return within 5s")
		}
	})
}

// logRecorder is an slog.Handler keeping the messages logged.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// count returns how many messages contain s.
func (l *logRecorder) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}
