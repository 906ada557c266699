package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/admission"
	"moonji/internal/metrics"
	"moonji/internal/proxy"
	"moonji/models"
)

// panickyLink is an engine link whose behaviour each test sets: it may
// panic when called, answer a stream whose body panics mid-way, or answer
// well.
type panickyLink struct {
	mode atomic.Value // string
}

func (l *panickyLink) ChatCompletions(ctx context.Context, session, model string, body []byte, traceparent string) (*http.Response, error) {
	switch l.mode.Load().(string) {
	case "call":
		panic("a bug in the engine link")
	case "stream":
		frames := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n"
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
			Body: &panicAfter{r: strings.NewReader(frames)}}, nil
	}
	frames := "data: {\"id\":\"c2\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"id\":\"c2\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(strings.NewReader(frames))}, nil
}

// panicAfter reads r, then panics instead of ending.
type panicAfter struct{ r io.Reader }

func (p *panicAfter) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if err == io.EOF {
		panic("a bug while reading the engine's stream")
	}
	return n, err
}

func (p *panicAfter) Close() error { return nil }

// TestPanicFailsOnlyItsRequest: a panic while a request is served — in the
// call to its engine, or while its stream is relayed outside any handler —
// fails that request alone: a 500 in OpenAI's shape (or the stream's error
// event), one error row, its slot freed for the next request.
func TestPanicFailsOnlyItsRequest(t *testing.T) {
	db, led, quiet := newTestLedger(t)
	sched, err := admission.New(admission.Config{
		Backends: []admission.BackendSpec{{Name: "b", MaxConcurrency: 1}},
		Pools:    []admission.PoolSpec{{Name: "b", Backends: []string{"b"}, MaxQueue: 4, QueueTimeout: 10 * time.Second}},
	})
	if err != nil {
		t.Fatal(err)
	}
	link := &panickyLink{}
	backend := &Backend{Name: "b", Kind: "engine", Link: link}
	met := metrics.New([]string{"m"}, []string{"b"})
	g := New(Options{Routes: []*Route{{Model: "m", Backends: []*Backend{backend}, Pool: sched.Pool("b")}},
		Scheduler: sched, Ledger: led, Metrics: met, Log: quiet})

	serve := func(mode string) (*Response, string) {
		link.mode.Store(mode)
		id := NewInferenceID()
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`
		return g.Serve(proxy.APIChat, Call{ID: id, FreshID: true, Start: time.Now(), Body: []byte(body),
			Principal: Principal{Email: "p@example.com", Source: SourceAPI}}), id
	}
	rowOf := func(id string) *models.Usage {
		t.Helper()
		if err := led.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		var rows []models.Usage
		if err := db.Where("inference_id = ?", id).Find(&rows).Error; err != nil || len(rows) != 1 {
			t.Fatalf("%d rows for %s (%v), want exactly one", len(rows), id, err)
		}
		return &rows[0]
	}

	// The engine call panics: the handler's goroutine would die with it.
	resp, id := serve("call")
	if resp.Status != http.StatusInternalServerError || gjson.GetBytes(resp.Body, "error.code").Str != "internal_error" ||
		gjson.GetBytes(resp.Body, "error.type").Str != "server_error" {
		t.Fatalf("panicking call answered %d %s", resp.Status, resp.Body)
	}
	if row := rowOf(id); row.Outcome != models.OutcomeError || row.Reason != "internal_panic" || row.Status != 500 {
		t.Fatalf("row after a panic = %+v", row)
	}

	// The stream's body panics after its first frame, inside the server's
	// pull of the stream (no handler around it): the client gets the frame,
	// then the API's error event; the row is an error.
	resp, id = serve("stream")
	if resp.Status != http.StatusOK || resp.BodyStream == nil {
		t.Fatalf("stream answered %d %s", resp.Status, resp.Body)
	}
	out, err := io.ReadAll(resp.BodyStream)
	_ = resp.BodyStream.Close()
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	if !strings.Contains(string(out), `"content":"Hi"`) || !strings.Contains(string(out), `"code":"internal_error"`) ||
		strings.Contains(string(out), "[DONE]") {
		t.Fatalf("stream after a panic:\n%s", out)
	}
	if row := rowOf(id); row.Outcome != models.OutcomeError || row.Reason != "internal_panic" {
		t.Fatalf("row after a panicking stream = %+v", row)
	}

	// Both freed their one slot: the next request is served.
	resp, id = serve("ok")
	if resp.BodyStream == nil {
		t.Fatalf("request after the panics answered %d %s", resp.Status, resp.Body)
	}
	out, _ = io.ReadAll(resp.BodyStream)
	_ = resp.BodyStream.Close()
	if !strings.HasSuffix(string(out), "data: [DONE]\n\n") {
		t.Fatalf("stream after the panics:\n%s", out)
	}
	if row := rowOf(id); row.Outcome != models.OutcomeSuccess || row.PromptTokens != 3 {
		t.Fatalf("row after the panics = %+v", row)
	}
	if snap := sched.Snapshot("b"); snap.InFlight != 0 {
		t.Fatalf("%d slots still held", snap.InFlight)
	}
}
