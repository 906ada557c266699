package web_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"moonji/models"
)

// sendForm posts a plain form in browser c as the page's form would, its
// CSRF token in _csrf, and stops at the answer (a redirect is not
// followed).
func (e *testEnv) sendForm(c *http.Client, path string, fields url.Values) (*http.Response, string) {
	e.t.Helper()
	fields.Set("_csrf", mustMe(e, c).CSRFToken)
	return e.fetch(noRedirects(c), http.MethodPost, path, fields, nil)
}

// sessionChatJSON sends a chat request in browser c with its session, as
// the web chat's requests go (no key), and returns its inference id.
func (e *testEnv) sessionChatJSON(c *http.Client, body string) string {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-CSRF-Token", mustMe(e, c).CSRFToken)
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if text := readAll(e.t, resp.Body); resp.StatusCode != http.StatusOK {
		e.t.Fatalf("session chat: %d %s", resp.StatusCode, text)
	}
	return resp.Header.Get("X-Inference-Id")
}

// costOf is the data-value of the row's cost cell.
func costOf(t *testing.T, row string) int64 {
	t.Helper()
	return cellValue(t, row, "data-field", "cost")
}

// Costs are on /usage (by model, by key and the web chat, by day) and on
// /admin (by person, key, team and model), read from the rollups: each
// equals the sum of the ledger rows' costs. The budgets that apply to the
// person are listed with what their period spent.
func TestCostsOnUsageAndAdmin(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL, priced)
		ctx := context.Background()
		pia := e.signedIn("pia@example.com", false)
		ada := e.signedIn("ada@example.com", true)
		bob := e.signedIn("bob@example.com", false)
		key, keyID := e.limitedKey("pia@example.com", models.Limits{Budget: amount(t, "0.5"), BudgetPeriod: models.BudgetTotal})

		var keyCost, chatCost int64
		for range 2 {
			keyCost += e.final(e.sendAs(key, chatBody, http.StatusOK)).Cost
		}
		chatCost = e.final(e.sessionChatJSON(pia, chatBody)).Cost
		if keyCost == 0 || chatCost == 0 {
			t.Fatalf("priced requests cost nothing: key %d, chat %d", keyCost, chatCost)
		}
		total := keyCost + chatCost

		pu, _ := models.UserByEmail(ctx, e.DB, "pia@example.com")
		if err := models.SetPersonBudget(ctx, e.DB, pu.ID, amount(t, "1"), models.BudgetDay); err != nil {
			t.Fatal(err)
		}
		crew, err := models.CreateTeam(ctx, e.DB, "crew", models.Limits{Budget: amount(t, "2"), BudgetPeriod: models.BudgetMonth})
		if err != nil {
			t.Fatal(err)
		}
		if err := models.AddTeamMember(ctx, e.DB, crew.ID, pu.ID); err != nil {
			t.Fatal(err)
		}

		body := e.adminPage(pia, "/usage")
		if got := costOf(t, rowOf(tableOf(t, body, "model-totals"), "data-model", "m1")); got != total {
			t.Errorf("/usage m1 cost = %d, want %d", got, total)
		}
		if got := costOf(t, rowOf(tableOf(t, body, "cost-table"), "data-total", "true")); got != total {
			t.Errorf("/usage cost by day total = %d, want %d", got, total)
		}
		keys := tableOf(t, body, "key-totals")
		if got := costOf(t, rowOf(keys, "data-key", strconv.FormatUint(uint64(keyID), 10))); got != keyCost {
			t.Errorf("/usage key cost = %d, want %d", got, keyCost)
		}
		chat := rowOf(keys, "data-key", "0")
		if got := costOf(t, chat); got != chatCost || !strings.Contains(chat, "Web chat") {
			t.Errorf("/usage web chat cost = %d, want %d:\n%s", got, chatCost, chat)
		}
		if !strings.Contains(body, "Cost (USD)") || !strings.Contains(body, "Amount (USD)") {
			t.Error("/usage does not name the currency")
		}
		// The budgets: hers, her team's, her key's, each with what its
		// period spent (all of it today), and what is left.
		budgets := tableOf(t, body, "budgets")
		for _, b := range []struct {
			scope, name   string
			amount, spent int64
		}{
			{"person", "pia@example.com", 1_000_000_000, total},
			{"team", "crew", 2_000_000_000, total},
			{"key", "limited", 500_000_000, keyCost},
		} {
			row := rowOf(budgets, "data-scope", b.scope)
			if row == "" {
				t.Errorf("no %s budget on /usage:\n%s", b.scope, budgets)
				continue
			}
			if got := cellValue(t, row, "data-field", "amount"); got != b.amount {
				t.Errorf("%s budget amount = %d, want %d", b.scope, got, b.amount)
			}
			if got := cellValue(t, row, "data-field", "spent"); got != b.spent {
				t.Errorf("%s budget spent = %d, want %d", b.scope, got, b.spent)
			}
			if got := cellValue(t, row, "data-field", "left"); got != b.amount-b.spent {
				t.Errorf("%s budget left = %d, want %d", b.scope, got, b.amount-b.spent)
			}
		}
		if row := rowOf(budgets, "data-scope", "person"); !strings.Contains(row, "per day") || !strings.Contains(row, "UTC") {
			t.Errorf("the person's budget row says no period or renewal:\n%s", row)
		}
		if row := rowOf(budgets, "data-scope", "key"); !strings.Contains(row, "in total") || !strings.Contains(row, "never") {
			t.Errorf("a total budget's row:\n%s", row)
		}
		// Bob has no budget, spent nothing, and sees nothing of hers.
		body = e.adminPage(bob, "/usage")
		if !strings.Contains(body, "No budget limits what you spend.") || strings.Contains(body, "crew") || strings.Contains(body, "limited") {
			t.Error("bob's /usage shows a budget that is not his")
		}

		// /admin: by person, key, team and model.
		body = e.adminPage(ada, "/admin?range=30d")
		if got := costOf(t, rowOf(tableOf(t, body, "top-users"), "data-user", "pia@example.com")); got != total {
			t.Errorf("/admin pia's cost = %d, want %d", got, total)
		}
		if got := costOf(t, rowOf(tableOf(t, body, "key-totals"), "data-key", strconv.FormatUint(uint64(keyID), 10))); got != keyCost {
			t.Errorf("/admin key cost = %d, want %d", got, keyCost)
		}
		if got := costOf(t, rowOf(tableOf(t, body, "top-teams"), "data-team", "crew")); got != total {
			t.Errorf("/admin team cost = %d, want %d", got, total)
		}
		if got := costOf(t, rowOf(tableOf(t, body, "model-totals"), "data-model", "m1")); got != total {
			t.Errorf("/admin m1 cost = %d, want %d", got, total)
		}
		// A team counts its present members: without pia, crew spent nothing.
		if err := models.RemoveTeamMember(ctx, e.DB, crew.ID, pu.ID); err != nil {
			t.Fatal(err)
		}
		if body := e.adminPage(ada, "/admin"); strings.Contains(body, `data-team="crew"`) {
			t.Error("a team without members still has a cost")
		}
	})
}
