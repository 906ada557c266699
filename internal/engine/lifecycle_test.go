package engine_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/engine"
	"moonji/internal/enginelink/protocol"
	"moonji/internal/mockllm"
)

// A connection that drops with sessions running frees them all: every
// upstream request is cancelled and the engine's goroutines return to what
// they were before the connection.
func TestDroppedConnectionFreesEverySession(t *testing.T) {
	e := startEnv(t)
	// Warm up: the first request starts the upstream client's machinery,
	// which stays; it must not count as a leak.
	warm := e.dial(t, nil)
	warm.open("w", "m1", chatBody("m1", false, map[string]any{"tokens": 1}))
	warm.collect([]string{"w"}, nil)
	_ = warm.ws.Close(websocket.StatusNormalClosure, "")
	baseline := settledGoroutines()

	c := e.dial(t, nil)
	const n = 20
	for i := range n {
		s := fmt.Sprintf("h%d", i)
		c.open(s, "m1", chatBody("m1", true, map[string]any{"tag": s, "hang": true}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for i := range n {
		if _, err := e.mock.WaitFor(ctx, fmt.Sprintf("h%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if during := runtime.NumGoroutine(); during < baseline+n {
		t.Fatalf("%d goroutines with %d sessions running, %d before: the test would prove nothing", during, n, baseline)
	}
	_ = c.ws.CloseNow() // the gateway is gone, without a word
	for i := range n {
		if _, err := e.mock.WaitFor(ctx, fmt.Sprintf("h%d", i), func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(wait)
	for {
		now := runtime.NumGoroutine()
		if now <= baseline {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the connection:\n%s", now, baseline, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settledGoroutines counts goroutines once the count stops falling
// (connections of the warm-up closing).
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for range 50 {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m >= n {
			return m
		}
		n = m
	}
	return n
}

// Shutdown sends goaway, refuses new sessions and connections, lets the
// running session finish, then closes the connection.
func TestGracefulShutdown(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	c.open("r1", "m1", chatBody("m1", true, map[string]any{"tokens": 20, "tps": 40}))
	for env := c.next(); env.Type != protocol.TypeChatChunk; env = c.next() {
	}
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		errc <- e.srv.Shutdown(ctx)
	}()
	sawGoAway := false
	var rest []protocol.Envelope
	for !sawGoAway {
		env := c.next()
		if env.Type == protocol.TypeGoAway {
			sawGoAway = true
			continue
		}
		rest = append(rest, env)
	}
	c.open("r2", "m1", chatBody("m1", true, nil))
	chunks, done := 0, false
	var refused *protocol.ChatError
	for env := range c.in { // until the engine closes the connection
		rest = append(rest, env)
	}
	for _, env := range rest {
		switch {
		case env.Session == "r1" && env.Type == protocol.TypeChatChunk:
			chunks++
		case env.Session == "r1" && env.Type == protocol.TypeChatDone:
			done = true
		case env.Session == "r2" && env.Type == protocol.TypeChatError:
			p := must(protocol.Payload[protocol.ChatError](env))
			refused = &p
		}
	}
	if !done || chunks < 20 {
		t.Fatalf("the running session: %d more chunks, done %v", chunks, done)
	}
	if refused == nil || refused.Status != 503 {
		t.Fatalf("a session opened after goaway: %+v", refused)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if s := websocket.CloseStatus(c.closeErr); s != websocket.StatusGoingAway {
		t.Fatalf("the connection ended with %v, want a close with status going away", c.closeErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, resp, err := websocket.Dial(ctx, e.url, &websocket.DialOptions{Subprotocols: []string{protocol.Subprotocol(1)}}); err == nil || resp == nil || resp.StatusCode != 503 {
		t.Fatalf("a connection after shutdown: %v %v", resp, err)
	}
}

// A gateway that stops answering pings (its host died, a NAT forgot the
// connection) is dropped by the engine's own heartbeat: its sessions are
// freed and their upstream requests cancelled, without waiting for TCP.
func TestSilentGatewayIsDropped(t *testing.T) {
	const every = time.Second
	e := startEnv(t, func(o *engine.Options) { o.PingInterval = every })
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// Dialled by hand and never read: coder/websocket answers a ping only
	// from inside a read, so this gateway is silent.
	ws, _, err := websocket.Dial(ctx, e.url, &websocket.DialOptions{
		Subprotocols: []string{protocol.Subprotocol(protocol.Version)},
		HTTPClient:   &http.Client{Transport: &http.Transport{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dialled := time.Now()
	defer ws.CloseNow()
	send := func(typ string, payload any) {
		env := must(protocol.New("g-"+typ, typ, "silent", payload))
		if err := ws.Write(ctx, websocket.MessageText, must(protocol.Encode(env))); err != nil {
			t.Fatal(err)
		}
	}
	send(protocol.TypeSessionOpen, protocol.SessionOpen{Model: "m1"})
	send(protocol.TypeChatRequest, protocol.ChatRequest{Body: chatBody("m1", true, map[string]any{"tag": "silent", "hang": true})})
	if _, err := e.mock.WaitFor(ctx, "silent", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.mock.WaitFor(ctx, "silent", func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
		t.Fatalf("the silent gateway's session was not freed: %v", err)
	}
	// Heard from last at its handshake, it is dropped within two ping
	// intervals (three quarters more for a busy machine's late timers; a
	// ping timeout of two intervals would take three).
	silent := time.Since(dialled)
	t.Logf("silent gateway dropped after %v (ping interval %v)", silent, every)
	if silent > 2*every+3*every/4 {
		t.Errorf("the silent gateway was dropped after %v, more than two ping intervals (%v)", silent, 2*every)
	}
}
