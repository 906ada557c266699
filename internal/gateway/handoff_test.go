package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"moonji/internal/admission"
	"moonji/internal/metrics"
	"moonji/internal/proxy"
	"moonji/models"
)

// handoffLink is an engine link whose answer each request's body names:
// "ok" a short stream, "hang" nothing until the request ends, "panic" a
// panic, "unavailable" the refusal of an engine that is not connected.
type handoffLink struct {
	calls, hanging atomic.Int64
}

func (l *handoffLink) ChatCompletions(ctx context.Context, session, model string, body []byte, traceparent string) (*http.Response, error) {
	l.calls.Add(1)
	switch {
	case strings.Contains(string(body), `"hang"`):
		l.hanging.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	case strings.Contains(string(body), `"panic"`):
		panic("a bug in the engine link")
	case strings.Contains(string(body), `"unavailable"`):
		return nil, proxy.ErrEngineUnavailable
	}
	frames := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(strings.NewReader(frames))}, nil
}

// handoff is a gateway on replica A of a stopPair (a Stopper on B): one
// backend of one slot and a queue of one.
type handoff struct {
	*stopPair
	g *Gateway
	// rows returns the rows of id once the ledger has written them.
	rows func(t *testing.T, id string) []models.Usage
	link *handoffLink
}

func newHandoff(t *testing.T) *handoff {
	t.Helper()
	db, led, quiet := newTestLedger(t)
	sched, err := admission.New(admission.Config{
		Backends: []admission.BackendSpec{{Name: "b", MaxConcurrency: 1}},
		Pools:    []admission.PoolSpec{{Name: "b", Backends: []string{"b"}, MaxQueue: 1, QueueTimeout: 10 * time.Second}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &handoff{stopPair: newStopPair(t, db, 0), link: &handoffLink{}}
	backend := &Backend{Name: "b", Kind: "engine", Link: h.link}
	h.g = New(Options{Routes: []*Route{{Model: "m", Backends: []*Backend{backend}, Pool: sched.Pool("b")}},
		Scheduler: sched, Ledger: led, Metrics: metrics.New([]string{"m"}, []string{"b"}), Stops: h.a, Log: quiet})
	h.rows = func(t *testing.T, id string) []models.Usage {
		t.Helper()
		if err := led.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		var rows []models.Usage
		if err := db.Where("inference_id = ?", id).Find(&rows).Error; err != nil {
			t.Fatal(err)
		}
		return rows
	}
	return h
}

// modeBody is a chat request to model whose engine answers as mode says.
func modeBody(model, mode string) []byte {
	return []byte(`{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"` + mode + `"}]}`)
}

// drain reads a response's stream to its end, as the server would.
func drain(resp *Response) {
	if resp.BodyStream != nil {
		_, _ = io.Copy(io.Discard, resp.BodyStream)
		_ = resp.BodyStream.Close()
	}
}

// eventually waits until cond holds, at most 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after 10s", what)
		}
		<-tick.C
	}
}

// A request its caller registered for Stop before the id was out (the
// chat's reply, Call.Stop) is its replica's from that moment: a stop sent
// through another replica before the gateway has even been called is
// taken by the owner, not answered "none", and acknowledged once the
// gateway, taking the registration over, has ended the request stopped —
// one row, stopped, and nothing left registered.
func TestCallStopIsTakenOver(t *testing.T) {
	h := newHandoff(t)
	alice := Principal{UserID: 7, Email: "alice@example.com", Source: SourceWeb}
	id := NewInferenceID()
	run := h.g.BeginStop(id, alice)

	type answer struct {
		res StopResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := h.s.Stop(context.Background(), alice, id, -1)
		got <- answer{res, err}
	}()
	eventually(t, "A took the stop", func() bool { return h.a.Holder().Stopped(id) })
	select {
	case a := <-got:
		t.Fatalf("the stop was answered before the request ran: %+v, %v", a.res, a.err)
	default:
	}
	reads := h.s.rowReads.Load()

	resp := h.g.Serve(proxy.APIChat, Call{ID: id, Start: time.Now(), Principal: alice, Body: modeBody("m", "ok"), Stop: run})
	drain(resp)
	a := <-got
	if a.err != nil || a.res.State != models.OutcomeStopped || !a.res.Acknowledged {
		t.Fatalf("the stop: %+v, %v; want stopped, acknowledged by A", a.res, a.err)
	}
	if n := h.s.rowReads.Load() - reads; n != 0 {
		t.Errorf("the stop read the row %d times; its owner decides", n)
	}
	if n := h.link.calls.Load(); n != 0 {
		t.Errorf("the engine was called %d times for a request stopped before it ran", n)
	}
	if rows := h.rows(t, id); len(rows) != 1 || rows[0].Outcome != models.OutcomeStopped {
		t.Fatalf("rows %+v; want one, stopped", rows)
	}
	if n := h.a.Running(); n != 0 {
		t.Errorf("%d runs still registered on A", n)
	}

	// Without a stop, the registered request runs, and ends registered
	// with its outcome.
	id = NewInferenceID()
	resp = h.g.Serve(proxy.APIChat, Call{ID: id, Start: time.Now(), Principal: alice, Body: modeBody("m", "ok"), Stop: h.g.BeginStop(id, alice)})
	drain(resp)
	if res, err := h.s.Stop(context.Background(), alice, id, -1); err != nil || res.State != models.OutcomeSuccess {
		t.Fatalf("a stop after the end: %+v, %v; want success from A's memory", res, err)
	}
	if n := h.a.Running(); n != 0 {
		t.Errorf("%d runs still registered on A", n)
	}
}

// A registration handed over with the call ends however the request ends
// — refused (unknown model, the caller's own refusal through Reject, a
// full queue, an engine not connected), panicked, or cut off because its
// person was disabled — and a stop after it is answered with that outcome.
// A panicked request's own registration (the gateway's) ends as an error
// too, not as a bare "finished".
func TestCallStopEndsOnEveryPath(t *testing.T) {
	h := newHandoff(t)
	ctx := context.Background()
	bob := Principal{UserID: 8, Email: "bob@example.com", Source: SourceWeb}
	call := func(model, mode string) Call {
		id := NewInferenceID()
		return Call{ID: id, Start: time.Now(), Principal: bob, Body: modeBody(model, mode), Stop: h.g.BeginStop(id, bob)}
	}
	ended := func(t *testing.T, id, outcome string) {
		t.Helper()
		if n := h.a.Running(); n != 0 {
			t.Errorf("%d runs still registered on A", n)
		}
		res, err := h.s.Stop(ctx, bob, id, -1)
		if err != nil || res.State != outcome || !res.Acknowledged {
			t.Errorf("a stop after the end: %+v, %v; want %s", res, err, outcome)
		}
		if rows := h.rows(t, id); len(rows) != 1 || rows[0].Outcome != outcome {
			t.Errorf("rows %+v; want one, %s", rows, outcome)
		}
	}

	t.Run("unknown model", func(t *testing.T) {
		c := call("nope", "ok")
		if resp := h.g.Serve(proxy.APIChat, c); resp.Status != http.StatusNotFound {
			t.Fatalf("status %d", resp.Status)
		}
		ended(t, c.ID, models.OutcomeRejected)
	})
	t.Run("refused by the caller", func(t *testing.T) {
		c := call("m", "ok")
		h.g.Reject(c, "m", http.StatusTooManyRequests, "too_many_generations", "no", "requests", "too_many_generations", nil)
		ended(t, c.ID, models.OutcomeRejected)
	})
	t.Run("engine not connected", func(t *testing.T) {
		c := call("m", "unavailable")
		if resp := h.g.Serve(proxy.APIChat, c); resp.Status != http.StatusServiceUnavailable {
			t.Fatalf("status %d", resp.Status)
		}
		ended(t, c.ID, models.OutcomeRejected)
	})
	t.Run("panic", func(t *testing.T) {
		c := call("m", "panic")
		if resp := h.g.Serve(proxy.APIChat, c); resp.Status != http.StatusInternalServerError {
			t.Fatalf("status %d", resp.Status)
		}
		ended(t, c.ID, models.OutcomeError)
		// The gateway's own registration of a request (a /v1 one's).
		id := NewInferenceID()
		resp := h.g.Serve(proxy.APIChat, Call{ID: id, FreshID: true, Start: time.Now(), Principal: bob, Body: modeBody("m", "panic")})
		if resp.Status != http.StatusInternalServerError {
			t.Fatalf("status %d", resp.Status)
		}
		ended(t, id, models.OutcomeError)
	})
	t.Run("queue full, then the person disabled", func(t *testing.T) {
		// One request holds the slot, one waits, the third finds no place.
		running, waiting := call("m", "hang"), call("m", "hang")
		var wg sync.WaitGroup
		wg.Go(func() { drain(h.g.Serve(proxy.APIChat, running)) })
		eventually(t, "the first request reached its engine", func() bool { return h.link.hanging.Load() == 1 })
		wg.Go(func() { drain(h.g.Serve(proxy.APIChat, waiting)) })
		// Both hold their person's place once started: the second when it
		// began to wait.
		eventually(t, "the second request waits", func() bool { return h.g.people.Held(bob.UserID) == 2 })
		full := call("m", "ok")
		if resp := h.g.Serve(proxy.APIChat, full); resp.Status != http.StatusServiceUnavailable {
			t.Fatalf("third request: status %d", resp.Status)
		}
		if n := h.a.Running(); n != 2 {
			t.Fatalf("%d runs registered on A; want the two that hold a place", n)
		}
		if res, err := h.s.Stop(ctx, bob, full.ID, -1); err != nil || res.State != models.OutcomeRejected {
			t.Errorf("a stop of the refused request: %+v, %v; want rejected", res, err)
		}
		if n := h.g.EndPerson(bob.UserID); n != 2 {
			t.Fatalf("EndPerson ended %d requests; want 2", n)
		}
		wg.Wait()
		ended(t, running.ID, models.OutcomeCancelled)
		ended(t, waiting.ID, models.OutcomeCancelled)
		if rows := h.rows(t, running.ID); len(rows) == 1 && rows[0].Reason != "person_disabled" {
			t.Errorf("row %+v; want person_disabled", rows[0])
		}
	})
}
