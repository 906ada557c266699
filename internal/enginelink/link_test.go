package enginelink

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/enginelink/protocol"
	"moonji/internal/proxy"
)

// 200 sessions at once over one connection: each gets exactly its own
// frames, in order, byte for byte, and every one is unregistered at its end.
func TestConcurrentSessionsGetOnlyTheirOwn(t *testing.T) {
	e := newFakeEngine(t)
	l, _ := newLink(t, e, Options{})
	waitConnected(t, l)
	const n, chunks = 200, 5
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			marker := fmt.Sprintf("m-%d", i)
			resp, err := l.ChatCompletions(context.Background(), fmt.Sprintf("inf_%d", i), "qwen", body(fakeBody{Marker: marker, Stream: true, Chunks: chunks}), "")
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", marker, err)
				return
			}
			var want strings.Builder
			for k := 1; k <= chunks; k++ {
				want.WriteString(frame(marker, k))
			}
			if string(got) != want.String() {
				errs <- fmt.Errorf("%s got %q, want %q", marker, got, want.String())
				return
			}
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				errs <- fmt.Errorf("%s: status %d, %q", marker, resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			done, ok := resp.Body.(*Stream).Done()
			if !ok || done.FinishReason != "stop" || done.Usage.CompletionTokens != chunks {
				errs <- fmt.Errorf("%s: done %+v %v", marker, done, ok)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	routerEmpty(t, l)
	if s := l.Stats(); s.Reconnects != 0 || s.DroppedUnknownSession != 0 {
		t.Errorf("stats %+v", s)
	}
	// Every session was closed on the engine's side too.
	for range n {
		e.expect(t, protocol.TypeSessionClose, "")
	}
}

// A whole answer keeps its status, content type and body byte for byte.
func TestWholeAnswer(t *testing.T) {
	e := newFakeEngine(t)
	l, _ := newLink(t, e, Options{})
	for _, status := range []int{200, 429} {
		resp, err := l.ChatCompletions(context.Background(), fmt.Sprintf("whole-%d", status), "qwen", body(fakeBody{Marker: "w", Status: status}), "")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := `{"marker":"w","text":"<b>&é \u00e9"}`; resp.StatusCode != status || string(got) != want || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("status %d body %q type %q, want %d %q", resp.StatusCode, got, resp.Header.Get("Content-Type"), status, want)
		}
		e.expect(t, protocol.TypeSessionClose, fmt.Sprintf("whole-%d", status))
	}
	routerEmpty(t, l)
}

// chat.error before any response is a *proxy.UpstreamError with the
// engine's status; mid-stream, or a seq gap, the stream's Read fails.
func TestEngineErrors(t *testing.T) {
	e := newFakeEngine(t)
	l, _ := newLink(t, e, Options{})
	_, err := l.ChatCompletions(context.Background(), "err-first", "qwen", body(fakeBody{Fail: "first"}), "")
	var ue *proxy.UpstreamError
	var ee *EngineError
	if !errors.As(err, &ue) || ue.Status != 503 || !errors.As(err, &ee) || ee.Code != "overloaded" {
		t.Fatalf("chat.error first: %v", err)
	}
	for _, fail := range []string{"mid", "gap"} {
		resp, err := l.ChatCompletions(context.Background(), "err-"+fail, "qwen", body(fakeBody{Marker: fail, Stream: true, Chunks: 2, Fail: fail}), "")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !errors.As(err, &ee) || !strings.HasPrefix(string(got), frame(fail, 1)) {
			t.Errorf("%s: read %q, %v", fail, got, err)
		}
		if fail == "gap" && !strings.Contains(err.Error(), "gap") {
			t.Errorf("gap: %v", err)
		}
	}
	e.expect(t, protocol.TypeSessionCancel, "err-gap")
	routerEmpty(t, l)
}

// Cancelling the caller's context mid-stream, or closing the body early,
// tells the engine session.cancel then session.close, and Read returns the
// context's error.
func TestCancelMidStream(t *testing.T) {
	e := newFakeEngine(t)
	l, _ := newLink(t, e, Options{})
	for _, how := range []string{"ctx", "close"} {
		id := "cancel-" + how
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := l.ChatCompletions(ctx, id, "qwen", body(fakeBody{Marker: how, Stream: true, Chunks: 1, Hold: true}), "")
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		if n, err := resp.Body.Read(buf); err != nil || string(buf[:n]) != frame(how, 1) {
			t.Fatalf("first read %q %v", buf[:n], err)
		}
		if how == "ctx" {
			cancel()
			if _, err := resp.Body.Read(buf); !errors.Is(err, context.Canceled) {
				t.Errorf("read after cancel: %v", err)
			}
		}
		resp.Body.Close()
		cancel()
		e.expect(t, protocol.TypeSessionCancel, id)
		e.expect(t, protocol.TypeSessionClose, id)
	}
	// A context that ends before any answer: the call returns its error.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	e.onRequest = func(*fakeConn, protocol.Envelope, fakeBody) {} // never answers
	if _, err := l.ChatCompletions(ctx, "cancel-wait", "qwen", body(fakeBody{}), ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call: %v", err)
	}
	env := e.expect(t, protocol.TypeSessionCancel, "cancel-wait")
	if p, _ := protocol.Payload[protocol.SessionCancel](env); p.Reason != "timeout" {
		t.Errorf("cancel reason %q", p.Reason)
	}
	e.expect(t, protocol.TypeSessionClose, "cancel-wait")
	routerEmpty(t, l)
}

// A connection killed mid-stream fails its sessions with
// engine_disconnected; requests made while the engine is down wait in the
// queue and reach it, in order, once it is back.
func TestDisconnectThenQueue(t *testing.T) {
	e := newFakeEngine(t)
	l, _ := newLink(t, e, Options{MessageTTL: 30 * time.Second})
	waitConnected(t, l)
	var bodies []io.ReadCloser
	for i := range 3 {
		resp, err := l.ChatCompletions(context.Background(), fmt.Sprintf("held-%d", i), "qwen", body(fakeBody{Marker: "h", Stream: true, Chunks: 1, Hold: true}), "")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		bodies = append(bodies, resp.Body)
	}
	// Each stream's first chunk is in before the engine goes: the answer
	// starts with the headers, and the chunk may still be on its way.
	chunk := make([]byte, len(frame("h", 1)))
	for _, b := range bodies {
		if _, err := io.ReadFull(b, chunk); err != nil || string(chunk) != frame("h", 1) {
			t.Fatalf("first chunk %q, %v", chunk, err)
		}
	}
	e.down.Store(true)
	e.kill()
	for _, b := range bodies {
		got, err := io.ReadAll(b)
		if !errors.Is(err, ErrDisconnected) || !errors.Is(err, proxy.ErrEngineDisconnected) || !strings.Contains(err.Error(), "engine_disconnected") || len(got) != 0 {
			t.Errorf("read after the chunk %q, %v", got, err)
		}
	}
	eventually(t, "the link to notice", func() bool { return l.Stats().Connected == 0 })
	type result struct {
		body string
		err  error
	}
	results := make(chan result, 2)
	for i, marker := range []string{"first", "second"} {
		go func() {
			resp, err := l.ChatCompletions(context.Background(), "queued-"+marker, "qwen", body(fakeBody{Marker: marker, Status: 200}), "")
			if err != nil {
				results <- result{err: err}
				return
			}
			got, err := io.ReadAll(resp.Body)
			results <- result{string(got), err}
		}()
		eventually(t, "the request to be queued", func() bool { return l.Stats().Queued == int64(i+1) })
	}
	e.down.Store(false)
	for range 2 {
		r := <-results
		if r.err != nil || !strings.Contains(r.body, `"marker"`) {
			t.Errorf("queued request: %q %v", r.body, r.err)
		}
	}
	var first, second protocol.Envelope
	for !strings.HasPrefix(first.Session, "queued-") {
		first = e.expect(t, protocol.TypeChatRequest, "")
	}
	second = e.expect(t, protocol.TypeChatRequest, "")
	if first.Session != "queued-first" || second.Session != "queued-second" {
		t.Errorf("queue flushed as %s, %s", first.Session, second.Session)
	}
	if s := l.Stats(); s.Reconnects < 1 || s.Queued != 0 {
		t.Errorf("stats %+v", s)
	}
	routerEmpty(t, l)
}

// A request queued while the engine is down fails at its TTL, saying so.
func TestQueuedRequestExpires(t *testing.T) {
	e := newFakeEngine(t)
	e.down.Store(true)
	l, _ := newLink(t, e, Options{MessageTTL: 200 * time.Millisecond})
	_, err := l.ChatCompletions(context.Background(), "late", "qwen", body(fakeBody{}), "")
	var ue *proxy.UpstreamError
	if !errors.Is(err, ErrExpired) || !errors.Is(err, proxy.ErrEngineUnavailable) || !strings.Contains(err.Error(), "engine_unavailable") || !errors.As(err, &ue) || ue.Status != 503 {
		t.Fatalf("err %v", err)
	}
	if s := l.Stats(); s.DroppedExpired != 1 || s.Connected != 0 {
		t.Errorf("stats %+v", s)
	}
	routerEmpty(t, l)
}

// A full queue refuses at once; Close fails what waits in it.
func TestQueueFull(t *testing.T) {
	e := newFakeEngine(t)
	e.down.Store(true)
	l, logs := newLink(t, e, Options{QueueSize: 2, MessageTTL: time.Minute})
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := l.ChatCompletions(context.Background(), fmt.Sprintf("q-%d", i), "qwen", body(fakeBody{}), "")
			errs <- err
		}()
	}
	eventually(t, "two queued requests", func() bool { return l.Stats().Queued == 2 })
	var ue *proxy.UpstreamError
	if _, err := l.ChatCompletions(context.Background(), "q-full", "qwen", body(fakeBody{}), ""); !errors.Is(err, ErrQueueFull) ||
		!errors.Is(err, proxy.ErrEngineUnavailable) || !errors.As(err, &ue) || ue.Status != 503 {
		t.Fatalf("third request: %v, want a 503 engine_unavailable", err)
	}
	if l.Stats().DroppedQueueFull != 1 || !strings.Contains(logs.String(), "engine not connected") {
		t.Errorf("stats %+v, logs %s", l.Stats(), logs)
	}
	l.Close()
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Errorf("queued request at Close: %v", err)
		}
	}
	routerEmpty(t, l)
}

// A reply for a session that is not open is dropped and counted, and an
// invalid envelope is answered with `error` naming it; neither touches the
// session that is running.
func TestUnknownAndInvalidFromEngine(t *testing.T) {
	e := newFakeEngine(t)
	l, logs := newLink(t, e, Options{})
	e.onRequest = func(fc *fakeConn, env protocol.Envelope, b fakeBody) {
		fc.send(protocol.TypeChatChunk, "nobody", protocol.ChatChunk{Seq: 1, Frame: frame("leak", 1)})
		fc.sendRaw([]byte(`{"v":1,"id":"bad-1","type":"chat.tool","session":"` + env.Session + `"}`))
		fc.sendRaw([]byte(`{"v":1,"id":"bad-2","type":"chat.chunk","session":"` + env.Session + `","payload":{"seq":0,"frame":"x"}}`))
		fc.answer(env.Session, b)
	}
	resp, err := l.ChatCompletions(context.Background(), "mine", "qwen", body(fakeBody{Marker: "mine", Stream: true, Chunks: 3}), "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := frame("mine", 1) + frame("mine", 2) + frame("mine", 3); err != nil || string(got) != want {
		t.Errorf("got %q %v, want %q", got, err, want)
	}
	for _, ref := range []string{"bad-1", "bad-2"} {
		env := e.expect(t, protocol.TypeError, "")
		p, _ := protocol.Payload[protocol.Error](env)
		if p.Ref != ref || p.Code != protocol.CodeInvalid {
			t.Errorf("error reply %+v, want ref %s", p, ref)
		}
	}
	s := l.Stats()
	if s.DroppedUnknownSession != 1 || s.DroppedInvalid != 2 || s.Reconnects != 0 || s.Connected != 1 {
		t.Errorf("stats %+v", s)
	}
	if !strings.Contains(logs.String(), "session not found") {
		t.Errorf("no 'session not found' log:\n%s", logs)
	}
	routerEmpty(t, l)
}

// A session whose reader falls behind past its buffer fails alone: the
// engine is told to cancel it, and the connection and the others go on.
func TestSlowReaderFailsAlone(t *testing.T) {
	e := newFakeEngine(t)
	l, _ := newLink(t, e, Options{SessionFrames: 8})
	slow, err := l.ChatCompletions(context.Background(), "slow", "qwen", body(fakeBody{Marker: "slow", Stream: true, Chunks: 50, Hold: true}), "")
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Body.Close()
	e.expect(t, protocol.TypeSessionCancel, "slow")
	e.expect(t, protocol.TypeSessionClose, "slow")
	if _, err := io.ReadAll(slow.Body); !errors.Is(err, ErrSlowReader) {
		t.Errorf("slow reader: %v", err)
	}
	fast, err := l.ChatCompletions(context.Background(), "fast", "qwen", body(fakeBody{Marker: "fast", Stream: true, Chunks: 7}), "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(fast.Body)
	fast.Body.Close()
	if err != nil || strings.Count(string(got), "fast") != 7 {
		t.Errorf("fast: %q %v", got, err)
	}
	if s := l.Stats(); s.DroppedSlowReader != 1 || s.Reconnects != 0 || s.Connected != 1 {
		t.Errorf("stats %+v", s)
	}
	routerEmpty(t, l)
}

// goaway: the running session finishes on its connection, a new one waits
// for the next connection.
func TestGoAway(t *testing.T) {
	e := newFakeEngine(t)
	l, _ := newLink(t, e, Options{})
	var first *fakeConn
	var held string
	e.onRequest = func(fc *fakeConn, env protocol.Envelope, b fakeBody) {
		if b.Hold {
			first, held = fc, env.Session
			fc.send(protocol.TypeChatResponse, env.Session, protocol.ChatResponse{Status: 200, Stream: true})
			fc.send(protocol.TypeGoAway, "", protocol.GoAway{Reason: "restart"})
			return
		}
		fc.answer(env.Session, b)
	}
	running, err := l.ChatCompletions(context.Background(), "running", "qwen", body(fakeBody{Hold: true}), "")
	if err != nil {
		t.Fatal(err)
	}
	defer running.Body.Close()
	eventually(t, "the connection to drain", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.current != nil && l.current.draining
	})
	done := make(chan error, 1)
	go func() {
		_, err := l.ChatCompletions(context.Background(), "next", "qwen", body(fakeBody{Status: 200}), "")
		done <- err
	}()
	eventually(t, "the new request to queue", func() bool { return l.Stats().Queued == 1 })
	// The running session still gets its chunks, then ends.
	first.send(protocol.TypeChatChunk, held, protocol.ChatChunk{Seq: 1, Frame: frame("r", 1)})
	first.send(protocol.TypeChatDone, held, protocol.ChatDone{})
	if got, err := io.ReadAll(running.Body); err != nil || string(got) != frame("r", 1) {
		t.Errorf("running: %q %v", got, err)
	}
	e.kill() // the engine restarts
	if err := <-done; err != nil {
		t.Errorf("queued after goaway: %v", err)
	}
	routerEmpty(t, l)
}

// A peer that stops answering pings is closed within two ping intervals
// of the last thing heard from it (here: its handshake), and redialled.
func TestHeartbeatRedials(t *testing.T) {
	const every = time.Second
	e := newFakeEngine(t)
	e.silentFirst = true
	l, logs := newLink(t, e, Options{PingInterval: every})
	eventually(t, "the silent connection", func() bool { return l.Stats().Connected == 1 })
	for l.Stats().Connected == 1 {
		time.Sleep(time.Millisecond)
	}
	// The bound is two intervals; three quarters more is room for a busy
	// machine's late timers, and less than the three intervals a ping
	// timeout of two would take.
	silent := time.Since(time.Unix(0, e.silentSince.Load()))
	t.Logf("silent peer closed after %v (ping interval %v)", silent, every)
	if silent > 2*every+3*every/4 {
		t.Errorf("a silent peer was closed after %v, more than two ping intervals (%v)", silent, 2*every)
	}
	eventually(t, "a redial after the silent connection", func() bool {
		return l.Stats().Reconnects >= 1 && l.Stats().Connected == 1
	})
	if !strings.Contains(logs.String(), "engine silent") {
		t.Errorf("no 'engine silent' log:\n%s", logs)
	}
	resp, err := l.ChatCompletions(context.Background(), "after", "qwen", body(fakeBody{Status: 200}), "")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after redial: %v", err)
	}
	resp.Body.Close()
}

// A refused upgrade (wrong token, no common version) or another
// subprotocol leaves the link unconnected, saying why.
func TestRefusedConnections(t *testing.T) {
	cases := []struct {
		name  string
		setup func(e *fakeEngine, o *Options)
		want  []string
	}{
		{"wrong token", func(e *fakeEngine, o *Options) { e.token, o.Token = "secret", "wrong" }, []string{"401", "wrong engine token"}},
		{"no token", func(e *fakeEngine, o *Options) { e.token = "secret" }, []string{"401"}},
		{"other version", func(e *fakeEngine, o *Options) { e.subprotocols = []string{"moonji-engine.v2"} }, []string{"426", "moonji-engine.v2"}},
		{"no subprotocol", func(e *fakeEngine, o *Options) { e.subprotocols = []string{} }, []string{"subprotocol", "moonji-engine.v1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newFakeEngine(t)
			var o Options
			c.setup(e, &o)
			l, logs := newLink(t, e, o)
			eventually(t, "a dial error", func() bool { return l.LastError() != nil })
			for _, w := range c.want {
				if !strings.Contains(l.LastError().Error(), w) || !strings.Contains(logs.String(), w) {
					t.Errorf("%q missing from error %v or logs:\n%s", w, l.LastError(), logs)
				}
			}
			if l.Stats().Connected != 0 {
				t.Error("connected")
			}
		})
	}
	// The right token connects.
	e := newFakeEngine(t)
	e.token = "secret"
	l, _ := newLink(t, e, Options{Token: "secret"})
	waitConnected(t, l)
}

// Close ends every goroutine the link started, fails its open sessions,
// and a call after Close fails at once.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	e := newFakeEngine(t)
	l := New(Options{Name: "fake", URL: e.url(), PingInterval: 20 * time.Millisecond, Log: discard()})
	l.Start()
	resp, err := l.ChatCompletions(context.Background(), "open", "qwen", body(fakeBody{Marker: "o", Stream: true, Chunks: 1, Hold: true}), "")
	if err != nil {
		t.Fatal(err)
	}
	whole, err := l.ChatCompletions(context.Background(), "whole", "qwen", body(fakeBody{Status: 200}), "")
	if err != nil {
		t.Fatal(err)
	}
	whole.Body.Close()
	l.Close()
	if got, err := io.ReadAll(resp.Body); !errors.Is(err, ErrClosed) || string(got) != frame("o", 1) {
		t.Errorf("open stream at Close: %q %v", got, err)
	}
	resp.Body.Close()
	if _, err := l.ChatCompletions(context.Background(), "late", "qwen", body(fakeBody{}), ""); !errors.Is(err, ErrClosed) {
		t.Errorf("call after Close: %v", err)
	}
	routerEmpty(t, l)
	e.close()
	eventually(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// Requests refused before they are sent: a bad session id, no model.
func TestBadCalls(t *testing.T) {
	l := New(Options{Name: "fake", URL: "ws://127.0.0.1:1/engine", Log: discard()})
	defer l.Close()
	if _, err := l.ChatCompletions(context.Background(), "a b", "qwen", []byte(`{}`), ""); err == nil {
		t.Error("a session id with a space was accepted")
	}
	if _, err := l.ChatCompletions(context.Background(), "s1", "", []byte(`{}`), ""); err == nil {
		t.Error("no model was accepted")
	}
	if l.Stats().SessionsOpen != 0 {
		t.Error("a refused call was registered")
	}
	_ = http.StatusOK
}

// A relay stops reading at `data: [DONE]` and closes the body, usually
// before the engine's chat.done arrives. That answer is complete: the
// engine is not told session.cancel, and the late chat.done is taken by its
// session (then closed) rather than dropped as unknown.
func TestCloseAfterDoneIsNotACancel(t *testing.T) {
	e := newFakeEngine(t)
	release := make(chan struct{})
	e.onRequest = func(fc *fakeConn, env protocol.Envelope, b fakeBody) {
		fc.send(protocol.TypeChatResponse, env.Session, protocol.ChatResponse{Status: 200, ContentType: "text/event-stream", Stream: true})
		fc.send(protocol.TypeChatChunk, env.Session, protocol.ChatChunk{Seq: 1, Frame: frame(b.Marker, 1)})
		fc.send(protocol.TypeChatChunk, env.Session, protocol.ChatChunk{Seq: 2, Frame: "data: [DONE]\n\n"})
		go func() {
			<-release
			fc.send(protocol.TypeChatDone, env.Session, protocol.ChatDone{FinishReason: "stop"})
		}()
	}
	l, _ := newLink(t, e, Options{})
	resp, err := l.ChatCompletions(context.Background(), "s-done", "qwen", body(fakeBody{Marker: "d", Stream: true}), "")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	var got strings.Builder
	for !strings.HasSuffix(got.String(), "data: [DONE]\n\n") {
		line, err := br.ReadString('\n')
		got.WriteString(line)
		if err != nil {
			t.Fatalf("read: %v after %q", err, got.String())
		}
	}
	resp.Body.Close() // as the gateway's relay does, before chat.done
	close(release)
	// What the engine hears of the session from here: a session.close,
	// and no session.cancel before it.
	deadline := time.After(wait)
	for closed := false; !closed; {
		select {
		case env := <-e.got:
			switch {
			case env.Session != "s-done":
			case env.Type == protocol.TypeSessionCancel:
				t.Fatalf("a complete answer was cancelled: %+v", env)
			case env.Type == protocol.TypeSessionClose:
				closed = true
			}
		case <-deadline:
			t.Fatal("the engine never received session.close")
		}
	}
	eventually(t, "the session to be forgotten", func() bool { return l.Stats().SessionsOpen == 0 })
	if s := l.Stats(); s.DroppedUnknownSession != 0 {
		t.Errorf("the late chat.done was dropped as unknown: %+v", s)
	}
}
