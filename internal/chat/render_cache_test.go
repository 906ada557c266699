package chat

import (
	"strings"
	"testing"
)

// The cache gives what rendering gives, and tells apart finals that differ
// only in status, reason or content.
func TestRenderFinalCache(t *testing.T) {
	calls := 0
	s := New(Options{Render: func(md string) string { calls++; return "<p>" + md + "</p>" }})
	finals := []Final{
		{Status: "done", Content: "hello"},
		{Status: "stopped", Content: "hello"},
		{Status: "error", Content: "hello", Reason: "a"},
		{Status: "error", Content: "hello", Reason: "b"},
		{Status: "done", Content: "hello!"},
		// Length-prefixed parts: moving a byte between fields changes the key.
		{Status: "error", Content: "ab", Reason: "c"},
		{Status: "error", Content: "a", Reason: "bc"},
	}
	seen := map[string]bool{}
	for _, f := range finals {
		first, again := s.RenderFinal(f), s.RenderFinal(f)
		if first != again || first != s.renderFinal(f) {
			t.Fatalf("%+v: cached %q, rendered %q", f, again, s.renderFinal(f))
		}
		seen[first] = true
	}
	if len(seen) != len(finals) {
		t.Errorf("%d distinct renderings for %d distinct finals", len(seen), len(finals))
	}
	// Each final was rendered once by RenderFinal (plus once per check above).
	if want := 2 * len(finals); calls != want {
		t.Errorf("render called %d times, want %d", calls, want)
	}
	// Past the size bound nothing is kept.
	big := Final{Status: "done", Content: strings.Repeat("x", maxCachedRender+1)}
	calls = 0
	s.RenderFinal(big)
	s.RenderFinal(big)
	if calls != 2 || s.rendered.Len() != len(finals) {
		t.Errorf("a large answer: %d renders, %d cached", calls, s.rendered.Len())
	}
}
