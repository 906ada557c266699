package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/models"
)

// Tokens per minute: an estimate is reserved at admission (prompt + max_tokens)
// and reconciled with the real count at the end.
func TestTokensPerMinute(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) { c.RateLimit.TokensPerMinute = 1000 })
	// No max_tokens: 512 are reserved for the answer, 5 are used. Without
	// reconciliation the second request (another 512+) would not fit in 1000.
	for i := 0; i < 3; i++ {
		resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"tokens":5}}`)
		readAll(t, resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("x-ratelimit-limit-tokens") != "1000" {
			t.Fatalf("request %d: %d %v", i, resp.StatusCode, resp.Header)
		}
		e.final(resp.Header.Get("X-Inference-Id"))
	}
	// A request whose estimate exceeds what is left is refused at once.
	resp := e.post(`{"model":"m1","max_tokens":990,"messages":[{"role":"user","content":"x"}]}`)
	body := readAll(t, resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "tokens per minute") || resp.Header.Get("Retry-After") == "" {
		t.Errorf("over the token budget: %d %s %v", resp.StatusCode, body, resp.Header)
	}
}

// A person on the chat page is limited per user, the same way as a key.
func TestPerUserLimitForSessions(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) { c.RateLimit.RequestsPerMinute = 2 })
	browser := e.signedIn("chatter@example.com", false)
	_, who := e.me(browser)
	statuses := []int{}
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"x"}]}`))
		req.Header.Set("X-CSRF-Token", who.CSRFToken)
		resp, err := browser.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp.Body)
		statuses = append(statuses, resp.StatusCode)
		if i == 2 {
			row := e.final(resp.Header.Get("X-Inference-Id"))
			if row.Source != "web" || row.Reason != "rate_limited" || row.KeyID != nil {
				t.Errorf("row = %+v", row)
			}
		}
	}
	if statuses[0] != 200 || statuses[1] != 200 || statuses[2] != http.StatusTooManyRequests {
		t.Errorf("statuses %v, want 200 200 429", statuses)
	}
}

// Limits hold across replicas through Redis; when Redis goes away the
// gateway keeps serving with per-replica limits and says so in its metrics.
func TestRateLimitAcrossReplicasAndWithoutRedis(t *testing.T) {
	c := startCluster(t, 2, false, func(cfg *config.Config) { cfg.RateLimit.RequestsPerMinute = 4 })
	key := c.replicas[0].newKey("shared@example.com", 0)
	ok := 0
	for i := 0; i < 6; i++ {
		resp := c.replicas[i%2].postWith(context.Background(), key, `{"model":"m1","messages":[{"role":"user","content":"x"}]}`)
		readAll(t, resp.Body)
		if resp.StatusCode == http.StatusOK {
			ok++
		}
	}
	if ok != 4 {
		t.Errorf("%d of 6 requests admitted across two replicas, want 4", ok)
	}

	c.be.Mini.Close()
	e := c.replicas[0]
	fresh := e.newKey("fresh@example.com", 0)
	resp := e.postWith(context.Background(), fresh, `{"model":"m1","messages":[{"role":"user","content":"x"}]}`)
	readAll(t, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("with Redis down: %d", resp.StatusCode)
	}
	deadline := time.Now().Add(3 * time.Second)
	for metricValue(t, e, "moonji_ratelimit_degraded", "") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("moonji_ratelimit_degraded did not turn 1 with Redis down")
		}
		time.Sleep(20 * time.Millisecond)
	}
	row := e.final(resp.Header.Get("X-Inference-Id"))
	if row.Outcome != models.OutcomeSuccess {
		t.Errorf("row = %+v", row)
	}
}
