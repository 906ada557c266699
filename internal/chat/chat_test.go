package chat

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A viewer reads from any seq; the writer never waits for viewers, and a
// viewer that never reads holds nothing.
func TestLogSinceAndWake(t *testing.T) {
	l := NewLog()
	_, done, _, changed := l.Since(0, 10)
	for i := range 1000 {
		l.Append(strings.Repeat("x", i%3+1)) // nobody reads: must not block
	}
	select {
	case <-changed:
	default:
		t.Fatal("a waiting viewer was not woken")
	}
	chunks, done, _, _ := l.Since(998, 10)
	if len(chunks) != 2 || done {
		t.Fatalf("since 998: %d chunks, done %t", len(chunks), done)
	}
	if chunks, _, _, _ := l.Since(0, 256); len(chunks) != 256 {
		t.Fatalf("a batch holds %d", len(chunks))
	}
	l.Finish(Final{Status: "done", Content: l.Text(-1)})
	if l.Append("late") != l.size || l.Len() != 1000 {
		t.Fatal("an append after the end was kept")
	}
	chunks, done, final, _ := l.Since(1000, 10)
	if len(chunks) != 0 || !done || final.Status != "done" {
		t.Fatalf("end: %d chunks, done %t, %+v", len(chunks), done, final)
	}
	if got := l.Text(2); got != "xxx" {
		t.Fatalf("Text(2) = %q", got)
	}
}

func TestFitContextKeepsNewest(t *testing.T) {
	big := wireMessage{Role: "user", Content: strings.Repeat("a", 4000)} // ~1004 tokens
	h := []wireMessage{{Role: "user", Content: "old"}, {Role: "assistant", Content: "older answer"}, big, big}
	got := fitContext(h, 2010)
	if len(got) != 2 {
		t.Fatalf("kept %d messages, want the 2 newest", len(got))
	}
	if got := fitContext([]wireMessage{big}, 10); len(got) != 1 {
		t.Fatal("the newest message must always go")
	}
	if got := fitContext(h[:2], 8192); len(got) != 2 {
		t.Fatal("a small history must go whole")
	}
}

func TestTitleOf(t *testing.T) {
	for in, want := range map[string]string{
		"\n  Hello there \nsecond": "Hello there",
		strings.Repeat("é", 70):    strings.Repeat("é", 59) + "…",
		"   ":                      "",
	} {
		if got := titleOf(in); got != want {
			t.Errorf("titleOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRenderFinalEscapesAndShowsStatus(t *testing.T) {
	s := New(Options{})
	got := s.RenderFinal(Final{Status: "error", Content: "<b>x</b>", Reason: "Rate <limit>"})
	want := `<div class="answer" data-status="error"><p>&lt;b&gt;x&lt;/b&gt;</p><p class="error">Rate &lt;limit&gt;</p></div>`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	s = New(Options{Render: func(md string) string { return "<em>" + md + "</em>" }})
	if got := s.RenderFinal(Final{Status: "stopped", Content: "hi"}); got != `<div class="answer" data-status="stopped"><em>hi</em></div>` {
		t.Fatalf("custom render: %s", got)
	}
	// What it was billed for, beside the answer; a free model's without a cost.
	s = New(Options{Render: func(md string) string { return md }, Currency: "EUR"})
	if got := s.RenderFinal(Final{Status: "done", Content: "hi", PromptTokens: 12, CompletionTokens: 3, Cost: 18_000}); got !=
		`<div class="answer" data-status="done">hi</div><p class="usage-note" data-cost="18000">12 tokens in · 3 out · 0.000018 EUR</p>` {
		t.Fatalf("priced: %s", got)
	}
	if got := s.RenderFinal(Final{Status: "done", Content: "hi", PromptTokens: 12, CompletionTokens: 3}); got !=
		`<div class="answer" data-status="done">hi</div><p class="usage-note" data-cost="0">12 tokens in · 3 out</p>` {
		t.Fatalf("free: %s", got)
	}
}

// A follower of a live generation gets chunks after its seq, then done;
// with nothing new it returns empty after wait (a heartbeat).
func TestFollowerLive(t *testing.T) {
	s := New(Options{})
	g := &generation{s: s, id: "inf_x", userID: 1, log: NewLog(), ended: make(chan struct{})}
	s.live[g.id] = g
	if _, err := s.Follow(context.Background(), 2, g.id); err != ErrNotFound {
		t.Fatalf("someone else's generation: %v", err)
	}
	f, err := s.Follow(context.Background(), 1, g.id)
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := f.Next(context.Background(), 0, 20*time.Millisecond); err != nil || len(evs) != 0 {
		t.Fatalf("quiet: %v %v", evs, err)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		g.log.Append("a")
		g.log.Append("b")
		g.log.Finish(Final{Status: "done", Content: "ab"})
	}()
	var got []Event
	for from := 0; ; {
		evs, err := f.Next(context.Background(), from, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, evs...)
		if n := len(got); n > 0 && got[n-1].Done {
			break
		}
		if len(evs) > 0 {
			from = evs[len(evs)-1].Seq
		}
	}
	if len(got) != 3 || got[0].Text != "a" || got[1].Seq != 2 || !strings.Contains(got[2].HTML, `data-status="done"`) {
		t.Fatalf("events %+v", got)
	}
	s.Close()
	if _, err := f.Next(context.Background(), 2, time.Second); err != nil {
		// done is still there to read after close
		t.Fatalf("after close: %v", err)
	}
}
