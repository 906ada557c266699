package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"moonji/models"
)

func keyPath(admin bool, id uint, action string) string {
	if admin {
		return fmt.Sprintf("/admin/keys/%d/%s", id, action)
	}
	return fmt.Sprintf("/keys/%d/%s", id, action)
}

// mustKey is key id as stored.
func mustKey(t *testing.T, e *testEnv, id uint) *models.APIKey {
	t.Helper()
	k, err := models.APIKeyByID(context.Background(), e.DB, id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// budgetIs reports whether a stored budget is amount (nano-units) per period;
// amount < 0 is none.
func budgetIs(b *int64, period string, amount int64, wantPeriod string) bool {
	if amount < 0 {
		return b == nil && period == ""
	}
	return b != nil && *b == amount && period == wantPeriod
}

// An admin sets a person's budget and a key's budget and models on the
// people and keys pages; hostile forms change nothing.
func TestAdminBudgetForms(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL, priced)
		ctx := context.Background()
		ada := e.signedIn("ada@example.com", true)
		key, keyID := e.limitedKey("pia@example.com", models.Limits{})
		pia, _ := models.UserByEmail(ctx, e.DB, "pia@example.com")

		resp, body := e.sendForm(ada, personPath(pia.ID, "budget"), url.Values{"amount": {"10"}, "period": {"month"}, "email": {"pia"}})
		wantRedirect(t, "person budget", resp, body, "/admin/people?done=budget&email=pia")
		if u, _ := models.UserByID(ctx, e.DB, pia.ID); !budgetIs(u.Budget, u.BudgetPeriod, 10_000_000_000, "month") {
			t.Fatalf("pia's budget: %v %q", u.Budget, u.BudgetPeriod)
		}
		body = e.adminPage(ada, "/admin/people?done=budget")
		if !strings.Contains(body, "Budget saved") || !strings.Contains(body, "10.00 USD per month") || !strings.Contains(body, `value="10"`) {
			t.Errorf("people page after the budget:\n%s", body)
		}
		for _, bad := range []url.Values{{"amount": {"-1"}, "period": {"day"}}, {"amount": {"1e9"}, "period": {"day"}},
			{"amount": {"5"}, "period": {"fortnight"}}, {"amount": {"5"}}} {
			resp, body := e.sendForm(ada, personPath(pia.ID, "budget"), bad)
			if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `role="alert"`) {
				t.Errorf("person budget %v: %d", bad, resp.StatusCode)
			}
		}
		if u, _ := models.UserByID(ctx, e.DB, pia.ID); !budgetIs(u.Budget, u.BudgetPeriod, 10_000_000_000, "month") {
			t.Errorf("a refused form changed pia's budget: %v %q", u.Budget, u.BudgetPeriod)
		}
		if resp, _ := e.sendForm(ada, personPath(999999, "budget"), url.Values{"amount": {"1"}, "period": {"day"}}); resp.StatusCode != http.StatusNotFound {
			t.Errorf("budget of nobody: %d", resp.StatusCode)
		}

		// A key's budget and models, from /admin/keys; the models hold at once.
		resp, body = e.sendForm(ada, keyPath(true, keyID, "budget"), url.Values{"amount": {"0.25"}, "period": {"day"}, "owner": {"pia"}})
		wantRedirect(t, "key budget", resp, body, "/admin/keys?done=budget&owner=pia")
		if k := mustKey(t, e, keyID); !budgetIs(k.Budget, k.BudgetPeriod, 250_000_000, "day") {
			t.Errorf("key budget: %v %q", k.Budget, k.BudgetPeriod)
		}
		e.sendAs(key, `{"model":"renamed","messages":[{"role":"user","content":"hi"}]}`, http.StatusOK)
		resp, body = e.sendForm(ada, keyPath(true, keyID, "models"), url.Values{"models": {"m1"}})
		wantRedirect(t, "key models", resp, body, "/admin/keys?done=models")
		e.sendAs(key, `{"model":"renamed","messages":[{"role":"user","content":"hi"}]}`, http.StatusNotFound)
		for _, bad := range []url.Values{{"models": {"m1\x00"}}, {"models": {"gpt-17"}}, {"models": {strings.Repeat("x", 300)}}} {
			resp, body := e.sendForm(ada, keyPath(true, keyID, "models"), bad)
			if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `role="alert"`) {
				t.Errorf("key models %q: %d", bad.Get("models"), resp.StatusCode)
			}
		}
		if k := mustKey(t, e, keyID); k.Models != "m1" {
			t.Errorf("a refused form changed the key's models: %q", k.Models)
		}
		body = e.adminPage(ada, "/admin/keys")
		row := rowOf(body, "id", fmt.Sprintf("key-%d", keyID))
		if !strings.Contains(row, "0.25 USD per day") || !strings.Contains(row, "m1") || !strings.Contains(row, keyPath(true, keyID, "models")) {
			t.Errorf("the key's row on /admin/keys:\n%s", row)
		}
		// Removing a key's budget is an admin's right.
		resp, body = e.sendForm(ada, keyPath(true, keyID, "budget"), url.Values{"amount": {""}})
		wantRedirect(t, "remove key budget", resp, body, "/admin/keys?done=budget")
		if k := mustKey(t, e, keyID); k.Budget != nil {
			t.Errorf("key budget after removing it: %v", *k.Budget)
		}
	})
}

// A person may give their own key a budget, or lower it, within their own
// budget; not raise it, remove it, make its period shorter, nor touch
// someone else's key. A lowered budget holds at once.
func TestOwnKeyBudget(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL, priced)
		ctx := context.Background()
		piaWeb := e.signedIn("pia@example.com", false)
		key, keyID := e.limitedKey("pia@example.com", models.Limits{})
		_, bobKey := e.limitedKey("bob@example.com", models.Limits{Budget: amount(t, "1"), BudgetPeriod: models.BudgetDay})
		pia, _ := models.UserByEmail(ctx, e.DB, "pia@example.com")
		if err := models.SetPersonBudget(ctx, e.DB, pia.ID, amount(t, "10"), models.BudgetMonth); err != nil {
			t.Fatal(err)
		}

		set := func(amount, period string) (*http.Response, string) {
			return e.sendForm(piaWeb, keyPath(false, keyID, "budget"), url.Values{"amount": {amount}, "period": {period}})
		}
		// No budget yet: one above her own is refused, one within it is set.
		resp, body := set("20", "month")
		wantRefused(t, "above her own budget", resp, body, "above what is left of your own budget of 10.00 USD per month")
		resp, body = set("", "month")
		wantRefused(t, "nothing", resp, body, "Give the key a budget")
		resp, body = set("5", "month")
		wantRedirect(t, "set", resp, body, "/keys?done=budget")
		if k := mustKey(t, e, keyID); !budgetIs(k.Budget, k.BudgetPeriod, 5_000_000_000, "month") {
			t.Fatalf("key budget: %v %q", k.Budget, k.BudgetPeriod)
		}
		if body := e.adminPage(piaWeb, "/keys?done=budget"); !strings.Contains(body, "Budget saved") || !strings.Contains(body, "5.00 USD per month") {
			t.Errorf("/keys after the budget:\n%s", body)
		}
		// Raise, remove, a shorter period, hostile amounts: refused, unchanged.
		for _, c := range []struct{ amount, period, msg string }{
			{"6", "month", "not raise it"},
			{"", "month", "Only an admin can remove"},
			{"4", "day", "Keep its period or choose a longer one"},
			{"-1", "month", "not negative"},
			{"1e9", "month", "no exponent"},
			{"4", "week", "Choose the budget’s period"},
			{strings.Repeat("1", 10_000), "month", "amount such as"},
		} {
			resp, body := set(c.amount, c.period)
			wantRefused(t, fmt.Sprintf("%q %s", c.amount[:min(len(c.amount), 10)], c.period), resp, body, c.msg)
		}
		if k := mustKey(t, e, keyID); !budgetIs(k.Budget, k.BudgetPeriod, 5_000_000_000, "month") {
			t.Fatalf("a refused form changed the key's budget: %v %q", k.Budget, k.BudgetPeriod)
		}
		// Someone else's key: not found, unchanged.
		resp, _ = e.sendForm(piaWeb, keyPath(false, bobKey, "budget"), url.Values{"amount": {"0.5"}, "period": {"day"}})
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("bob's key from pia: %d, want 404", resp.StatusCode)
		}
		if k := mustKey(t, e, bobKey); !budgetIs(k.Budget, k.BudgetPeriod, 1_000_000_000, "day") {
			t.Errorf("bob's key changed: %v %q", k.Budget, k.BudgetPeriod)
		}

		// Lowered below what one request reserves, in total: her next
		// request is refused at once, though her policy was just cached.
		e.sendAs(key, chatBody, http.StatusOK)
		// Now that she spent some of her own budget, a key of hers can
		// have at most what is left of it.
		_, otherID := e.limitedKey("pia@example.com", models.Limits{})
		resp, body = e.sendForm(piaWeb, keyPath(false, otherID, "budget"), url.Values{"amount": {"10"}, "period": {"month"}})
		wantRefused(t, "her whole budget once some is spent", resp, body, "above what is left of your own budget")
		resp, body = set("0.0001", "total")
		wantRedirect(t, "lower", resp, body, "/keys?done=budget")
		refusal := e.postWith(ctx, key, chatBody)
		if refusal.StatusCode != http.StatusTooManyRequests {
			t.Errorf("a request over the lowered budget: %d, want 429", refusal.StatusCode)
		}
		if ae := decodeError(t, refusal); ae.Error.Code != "budget_exceeded" {
			t.Errorf("refusal: %+v", ae)
		}
		// A revoked key's budget is not hers to change any more.
		if err := models.RevokeAPIKey(ctx, e.DB, keyID, pia.ID); err != nil {
			t.Fatal(err)
		}
		resp, body = set("0.00001", "total")
		wantRefused(t, "revoked key", resp, body, "revoked or expired")
	})
}
