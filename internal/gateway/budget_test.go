package gateway

import (
	"testing"

	"moonji/internal/money"
	"moonji/internal/proxy"
)

// TestMaxCost: a reservation counts every byte of the body and the margin
// as prompt tokens, and the output the request allows for each choice — its
// own limit, or the route's when it sets none; an embedding makes none, and
// a free model's requests reserve nothing.
func TestMaxCost(t *testing.T) {
	r := &Route{Price: money.Price{Input: 1_000_000, Output: 2_000_000}, ReserveOutput: 100} // 1 and 2 nano-units a token
	for _, c := range []struct {
		name    string
		req     proxy.Request
		body, n int
		want    int64
	}{
		{"its own limit", proxy.Request{API: proxy.APIChat, MaxTokens: 10}, 44, 1, (44+promptMargin)*1 + 10*2},
		{"the route's when it sets none", proxy.Request{API: proxy.APIChat}, 44, 1, (44+promptMargin)*1 + 100*2},
		{"a negative limit is none", proxy.Request{API: proxy.APICompletions, MaxTokens: -5}, 10, 1, (10+promptMargin)*1 + 100*2},
		{"each of n choices", proxy.Request{API: proxy.APIChat, MaxTokens: 10}, 44, 3, (44+promptMargin)*1 + 3*10*2},
		{"an embedding makes no output", proxy.Request{API: proxy.APIEmbeddings, MaxTokens: 10}, 44, 1, (44 + promptMargin) * 1},
	} {
		if got := r.maxCost(c.req, c.body, c.n); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
	if got := (&Route{ReserveOutput: 100}).maxCost(proxy.Request{API: proxy.APIChat, MaxTokens: 1 << 30}, 1<<20, 64); got != 0 {
		t.Errorf("a free model reserves %d", got)
	}
}
