package web_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/money"
	"moonji/internal/testredis"
	"moonji/models"
)

// TestPriceChangeKeepsHistory: rows keep the cost of the price they were
// made under; a new price applies to new rows only, and the rollups hold
// both.
func TestPriceChangeKeepsHistory(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		body := `{"model":"m1","messages":[{"role":"user","content":"what does it cost"}],"max_tokens":5}`
		cost := func(e *testEnv) *models.Usage {
			t.Helper()
			resp := e.post(body)
			readAll(t, resp.Body)
			resp.Body.Close()
			return e.final(resp.Header.Get("X-Inference-Id"))
		}
		journal := t.TempDir()
		before := startEnv(t, dbURL, priced, func(c *config.Config) { c.JournalDir = journal })
		old := cost(before)
		before.srv.Shutdown(5 * time.Second)

		after := startEnv(t, dbURL, func(c *config.Config) {
			c.JournalDir = journal
			c.Models[0].Price = &config.Price{Input: 5, Output: 10}
		})
		fresh := cost(after)
		again, err := models.UsageByID(context.Background(), after.DB, old.InferenceID)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(old.PromptTokens)*1000 + int64(old.CompletionTokens)*2000; again.Cost != want || old.Cost != want {
			t.Fatalf("old row costs %d (was %d), want %d at the old price", again.Cost, old.Cost, want)
		}
		if want := int64(fresh.PromptTokens)*5000 + int64(fresh.CompletionTokens)*10000; fresh.Cost != want {
			t.Fatalf("new row costs %d, want %d at the new price", fresh.Cost, want)
		}
		var rolled int64
		if err := after.DB.Model(&models.UsageRollup{}).Where("span = ?", models.SpanDay).Select("COALESCE(SUM(cost), 0)").Scan(&rolled).Error; err != nil {
			t.Fatal(err)
		}
		if rolled != old.Cost+fresh.Cost {
			t.Fatalf("rollup holds %d, rows %d + %d", rolled, old.Cost, fresh.Cost)
		}
	})
}

// TestBudgetsFailClosedWhileRedisIsAway: with Redis gone, a request under a
// budget is refused (503 budget_unavailable, a rejected row, the engine
// untouched) while one under none is served; once Redis is back — empty,
// as after a restart without persistence — the budget's spending is
// rebuilt from the database and holds as before.
func TestBudgetsFailClosedWhileRedisIsAway(t *testing.T) {
	be := testredis.Mini(t)
	e := startEnv(t, "sqlite://"+t.TempDir()+"/r.db", priced, func(c *config.Config) {
		c.RedisURL, c.RedisPrefix = be.URL, be.Prefix
	})
	budget := int64(3_000_000)
	limited, limitedID := e.limitedKey("limited@example.com", models.Limits{Budget: &budget, BudgetPeriod: models.BudgetMonth})
	owner, err := models.UserByEmail(context.Background(), e.DB, "limited@example.com")
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":10}`
	send := func(key string) (*http.Response, string) {
		t.Helper()
		resp := e.postWith(context.Background(), key, body)
		out := readAll(t, resp.Body)
		resp.Body.Close()
		return resp, out
	}
	resp, _ := send(limited)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("before the outage: %d", resp.StatusCode)
	}
	spentBefore := e.final(resp.Header.Get("X-Inference-Id")).Cost

	be.Mini.Close()
	seen := len(e.Mock.Requests())
	resp, out := send(limited)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(out, `"budget_unavailable"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("budgeted request while Redis is away: %d %s", resp.StatusCode, out)
	}
	if row := e.final(resp.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeRejected || row.Reason != "budget_unavailable" {
		t.Fatalf("its row: %+v", row)
	}
	if n := len(e.Mock.Requests()); n != seen {
		t.Fatalf("the engine saw a request no budget could be checked for")
	}
	if resp, out := send(e.Key); resp.StatusCode != http.StatusOK {
		t.Fatalf("a request under no budget while Redis is away: %d %s", resp.StatusCode, out)
	}

	if err := be.Mini.Restart(); err != nil {
		t.Fatal(err)
	}
	be.Mini.FlushAll()
	// Back: the spending is rebuilt from the database, and the budget
	// holds to within one reservation.
	deadline := time.Now().Add(10 * time.Second)
	spent := spentBefore
	for {
		if err := be.Admin.Ping(context.Background()).Err(); err == nil {
			e.settled(owner.ID, &limitedID)
		}
		resp, out := send(limited)
		if resp.StatusCode == http.StatusServiceUnavailable && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond) // the client reconnects
			continue
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			break
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("after Redis came back: %d %s", resp.StatusCode, out)
		}
		spent += e.final(resp.Header.Get("X-Inference-Id")).Cost
	}
	reservation := int64(len(body)+256)*1000 + 10*2000
	if spent > budget || spent < budget-reservation {
		t.Fatalf("spent %d of %d across the outage (reservation %d)", spent, budget, reservation)
	}
}

// TestBudgetOverrunIsBoundedByOneRequest: an engine that counts far more
// prompt tokens than the request's reservation allowed for (no real one
// does: a token is at least a byte of the body) is charged what it
// reported, so the budget is exceeded by that request's excess over its
// reservation and no more: the next request is refused.
func TestBudgetOverrunIsBoundedByOneRequest(t *testing.T) {
	dir := recordings(t, map[string]string{"greedy.json": `{"id":"chatcmpl-g","object":"chat.completion","created":1,"model":"m1",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":50000,"completion_tokens":2,"total_tokens":50002}}`})
	e := startEnvReplaying(t, "sqlite://"+t.TempDir()+"/o.db", dir, priced)
	budget := int64(10_000_000) // 0.01: the engine's 50,000 tokens cost 0.05
	key, _ := e.limitedKey("overrun@example.com", models.Limits{Budget: &budget, BudgetPeriod: models.BudgetDay})
	body := `{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"mock":{"replay":"greedy.json"}}`
	reservation := money.Cost(money.Price{Input: 1_000_000_000, Output: 2_000_000_000}, money.Tokens{Prompt: int64(len(body) + 256), Completion: 2})

	resp := e.postWith(context.Background(), key, body)
	readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	row := e.final(resp.Header.Get("X-Inference-Id"))
	if row.PromptTokens != 50000 || row.Cost != 50000*1000+2*2000 {
		t.Fatalf("charged %d for %d tokens, want what the engine reported", row.Cost, row.PromptTokens)
	}
	if over := row.Cost - budget; over > row.Cost-reservation {
		t.Fatalf("exceeded by %d, more than the request's excess %d", over, row.Cost-reservation)
	}
	resp = e.postWith(context.Background(), key, body)
	readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after the overrun: %d, want the budget to refuse", resp.StatusCode)
	}
}
