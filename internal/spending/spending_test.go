package spending

import (
	"context"
	"testing"
	"time"

	"moonji/internal/apikey"
	"moonji/internal/budget"
	"moonji/internal/testdb"
	"moonji/models"
)

// TestPolicy: a sender's budgets are their key's, their own and each of
// their teams'; every model list that applies holds at once; a policy is
// kept until its 5 s pass or Forget.
func TestPolicy(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		u, err := models.EnsureUser(ctx, db, "ann@example.com")
		if err != nil {
			t.Fatal(err)
		}
		amount := func(n int64) *int64 { return &n }
		_, key, err := apikey.CreateLimited(ctx, db, u.ID, "ci", 0, 0, models.Limits{Budget: amount(5), BudgetPeriod: models.BudgetDay, Models: "a,b,c"})
		if err != nil {
			t.Fatal(err)
		}
		if err := models.SetPersonBudget(ctx, db, u.ID, amount(50), models.BudgetMonth); err != nil {
			t.Fatal(err)
		}
		for _, team := range []struct {
			name string
			l    models.Limits
		}{{"bc", models.Limits{Models: "b,c,d"}}, {"rich", models.Limits{Budget: amount(500), BudgetPeriod: models.BudgetTotal}}} {
			tm, err := models.CreateTeam(ctx, db, team.name, team.l)
			if err != nil {
				t.Fatal(err)
			}
			if err := models.AddTeamMember(ctx, db, tm.ID, u.ID); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now()
		r := NewResolver(db)
		r.now = func() time.Time { return now }
		p, err := r.For(ctx, u.ID, &key.ID)
		if err != nil {
			t.Fatal(err)
		}
		got := map[budget.Scope]budget.Limit{}
		for _, l := range p.Limits {
			got[l.Scope] = l
		}
		if len(p.Limits) != 3 || got[budget.ScopeKey].Amount != 5 || got[budget.ScopeKey].Period != budget.PeriodDay ||
			got[budget.ScopePerson].Amount != 50 || got[budget.ScopePerson].Name != "ann@example.com" ||
			got[budget.ScopeTeam].Amount != 500 || got[budget.ScopeTeam].Name != "rich" {
			t.Fatalf("limits: %+v", p.Limits)
		}
		for model, want := range map[string]bool{"a": false, "b": true, "c": true, "d": false, "e": false} {
			if p.Allows(model) != want {
				t.Errorf("key a,b,c and team b,c,d: Allows(%q) = %v", model, !want)
			}
		}
		// The chat has no key: the key's list and budget do not apply.
		web, err := r.For(ctx, u.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(web.Limits) != 2 || !web.Allows("d") || web.Allows("a") {
			t.Fatalf("web policy: %+v", web)
		}

		// Kept 5 s, or until Forget.
		if err := models.SetPersonBudget(ctx, db, u.ID, nil, ""); err != nil {
			t.Fatal(err)
		}
		if p, _ := r.For(ctx, u.ID, &key.ID); len(p.Limits) != 3 {
			t.Fatalf("a policy read again within 5 s: %+v", p.Limits)
		}
		now = now.Add(ttl)
		if p, _ := r.For(ctx, u.ID, &key.ID); len(p.Limits) != 2 {
			t.Fatalf("after 5 s: %+v", p.Limits)
		}
		if err := models.SetKeyModels(ctx, db, key.ID, ""); err != nil {
			t.Fatal(err)
		}
		r.Forget()
		if p, _ := r.For(ctx, u.ID, &key.ID); !p.Allows("d") || p.Allows("a") {
			t.Fatalf("after Forget, only the team's list: %+v", p)
		}
	})
}

func TestLimitOf(t *testing.T) {
	n := int64(7)
	if _, ok := LimitOf(budget.ScopeKey, 1, "k", nil, "day"); ok {
		t.Error("no amount is no budget")
	}
	if l, ok := LimitOf(budget.ScopeKey, 1, "k", &n, "fortnight"); !ok || l.Period != budget.PeriodTotal {
		t.Errorf("an unknown period limits the most: %+v", l)
	}
}
