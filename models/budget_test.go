package models

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

func TestParseModelList(t *testing.T) {
	for in, want := range map[string][]string{
		"":                       nil,
		"   ":                    nil,
		"a":                      {"a"},
		" a , b ,a,, c, ":        {"a", "b", "c"},
		"Qwen/Qwen3-8B,x":        {"Qwen/Qwen3-8B", "x"},
		"modèle,模型":              {"modèle", "模型"},
		strings.Repeat("é", 200): {strings.Repeat("é", 200)},
	} {
		got, err := ParseModelList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseModelList(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	hundred := make([]string, 100)
	for i := range hundred {
		hundred[i] = fmt.Sprintf("m%d", i)
	}
	if got, err := ParseModelList(strings.Join(hundred, ",") + ",m0,m1"); err != nil || len(got) != 100 {
		t.Errorf("100 names and repeats: %d, %v", len(got), err)
	}
	for _, bad := range []string{
		",", " , ,",
		strings.Join(append(hundred, "m100"), ","), // 101 names
		strings.Repeat("x", 201),
		"a,b\x00c", "a\tb", "line\nbreak", "esc\x1b[2J", "del\x7f", "c1\u0085x", "bidi\u202e",
		"bad\xffutf8",
	} {
		if got, err := ParseModelList(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseModelList(%.40q) = %q, %v; want ErrInvalid", bad, got, err)
		}
	}
}

func TestBudgetPeriodStart(t *testing.T) {
	now := time.Date(2026, 3, 17, 23, 30, 0, 0, time.FixedZone("x", -5*3600)) // 04:30 UTC on the 18th
	for period, want := range map[string]time.Time{
		BudgetDay:   time.Date(2026, 3, 18, 0, 0, 0, 0, time.UTC),
		BudgetMonth: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC),
		BudgetTotal: {},
		"week":      {},
	} {
		if got := BudgetPeriodStart(period, now); !got.Equal(want) {
			t.Errorf("BudgetPeriodStart(%q) = %v, want %v", period, got, want)
		}
	}
}

// The budget and model fields of keys and people: set, cleared, refused
// when invalid, and a missing row is ErrNotFound. Rows from before the
// columns existed (NULL) read as no budget and every model.
func TestKeyAndPersonLimits(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		u, _ := EnsureUser(ctx, db, "ann@example.com")
		k := APIKey{UserID: u.ID, Name: "k", Prefix: "mj-x", Hash: "h1"}
		if err := CreateAPIKey(ctx, db, &k); err != nil {
			t.Fatal(err)
		}
		if err := SetKeyBudget(ctx, db, k.ID, new(int64(2_500_000_000)), BudgetDay); err != nil {
			t.Fatal(err)
		}
		if err := SetKeyModels(ctx, db, k.ID, "b, a, b"); err != nil {
			t.Fatal(err)
		}
		if err := SetPersonBudget(ctx, db, u.ID, new(int64(0)), BudgetTotal); err != nil {
			t.Fatal(err)
		}
		got, _ := APIKeyByID(ctx, db, k.ID)
		if got.Budget == nil || *got.Budget != 2_500_000_000 || got.BudgetPeriod != BudgetDay || got.Models != "b,a" {
			t.Errorf("key after the setters: budget %v %q models %q", got.Budget, got.BudgetPeriod, got.Models)
		}
		if got.User.Budget == nil || *got.User.Budget != 0 || got.User.BudgetPeriod != BudgetTotal {
			t.Errorf("person after SetPersonBudget: %v %q", got.User.Budget, got.User.BudgetPeriod)
		}

		for _, bad := range []struct {
			budget *int64
			period string
		}{{nil, BudgetDay}, {new(int64(1)), ""}, {new(int64(1)), "hour"}, {new(int64(-1)), BudgetMonth}} {
			if err := SetKeyBudget(ctx, db, k.ID, bad.budget, bad.period); !errors.Is(err, ErrInvalid) {
				t.Errorf("SetKeyBudget(%v, %q) = %v", bad.budget, bad.period, err)
			}
			if err := SetPersonBudget(ctx, db, u.ID, bad.budget, bad.period); !errors.Is(err, ErrInvalid) {
				t.Errorf("SetPersonBudget(%v, %q) = %v", bad.budget, bad.period, err)
			}
		}
		if err := SetKeyModels(ctx, db, k.ID, "ok,\x00"); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetKeyModels with NUL: %v", err)
		}
		if err := SetKeyBudget(ctx, db, 9999, nil, ""); !errors.Is(err, ErrNotFound) {
			t.Errorf("SetKeyBudget of an unknown key: %v", err)
		}
		if err := SetKeyModels(ctx, db, 9999, ""); !errors.Is(err, ErrNotFound) {
			t.Errorf("SetKeyModels of an unknown key: %v", err)
		}
		if err := SetPersonBudget(ctx, db, 9999, nil, ""); !errors.Is(err, ErrNotFound) {
			t.Errorf("SetPersonBudget of an unknown person: %v", err)
		}
		// Invalid values changed nothing.
		got, _ = APIKeyByID(ctx, db, k.ID)
		if *got.Budget != 2_500_000_000 || got.Models != "b,a" || *got.User.Budget != 0 {
			t.Errorf("a refused change changed the key: %+v", got)
		}

		if err := SetKeyBudget(ctx, db, k.ID, nil, ""); err != nil {
			t.Fatal(err)
		}
		if err := SetPersonBudget(ctx, db, u.ID, nil, ""); err != nil {
			t.Fatal(err)
		}
		got, _ = APIKeyByID(ctx, db, k.ID)
		if got.Budget != nil || got.BudgetPeriod != "" || got.User.Budget != nil || got.User.BudgetPeriod != "" {
			t.Errorf("after clearing: key %v %q, person %v %q", got.Budget, got.BudgetPeriod, got.User.Budget, got.User.BudgetPeriod)
		}

		// A row of an older schema: NULL where the new columns are.
		if err := db.Exec("UPDATE api_keys SET models = NULL, budget_period = NULL WHERE id = ?", k.ID).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Exec("UPDATE users SET budget_period = NULL WHERE id = ?", u.ID).Error; err != nil {
			t.Fatal(err)
		}
		got, err := APIKeyByID(ctx, db, k.ID)
		if err != nil || got.Models != "" || got.BudgetPeriod != "" || got.User.BudgetPeriod != "" {
			t.Errorf("NULL columns read as %+v, %v", got, err)
		}
	})
}

// ensureCostColumn adds usage_people's cost column if the schema does not
// have it yet (UsageByPerson.Cost comes with the ledger's prices).
func ensureCostColumn(t *testing.T, db *gorm.DB) {
	t.Helper()
	if !db.Migrator().HasColumn(&UsageByPerson{}, "cost") {
		if err := db.Exec("ALTER TABLE usage_people ADD COLUMN cost bigint DEFAULT 0").Error; err != nil {
			t.Fatal(err)
		}
	}
}

// SpentSince sums the day rollup's cost by key, person or team, from the
// day of since on; hourly rows and older days do not count.
func TestSpentSince(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		ensureCostColumn(t, db)
		ann, _ := EnsureUser(ctx, db, "ann@example.com")
		bob, _ := EnsureUser(ctx, db, "bob@example.com")
		cid, _ := EnsureUser(ctx, db, "cid@example.com")
		team, err := CreateTeam(ctx, db, "eng", Limits{})
		if err != nil {
			t.Fatal(err)
		}
		AddTeamMember(ctx, db, team.ID, ann.ID)
		if err := SyncOIDCTeams(ctx, db, bob.ID, []string{"eng"}); err != nil {
			t.Fatal(err)
		}
		empty, _ := CreateTeam(ctx, db, "empty", Limits{})

		today := time.Now().UTC().Truncate(Day)
		yesterday := today.Add(-Day)
		insert := func(span string, start time.Time, user, key uint, cost int64) {
			t.Helper()
			err := db.Exec("INSERT INTO usage_people (span, start, user_id, key_id, requests, prompt_tokens, completion_tokens, cost) VALUES (?, ?, ?, ?, 1, 1, 1, ?)",
				span, start, user, key, cost).Error
			if err != nil {
				t.Fatal(err)
			}
		}
		insert(SpanDay, today, ann.ID, 1, 100)
		insert(SpanDay, today, ann.ID, 0, 20) // ann's chat
		insert(SpanDay, yesterday, ann.ID, 1, 1000)
		insert(SpanDay, today, bob.ID, 2, 3)
		insert(SpanDay, today, cid.ID, 3, 50_000) // not in the team
		insert(SpanHour, today, ann.ID, 1, 7)     // hourly rows are not summed
		insert(SpanDay, today.Add(-40*Day), bob.ID, 2, 1<<40)

		for _, c := range []struct {
			scope string
			id    uint
			since time.Time
			want  int64
		}{
			{ScopeKey, 1, today, 100},
			{ScopeKey, 1, today.Add(5 * time.Hour), 100}, // since is taken to its day
			{ScopeKey, 1, yesterday, 1100},
			{ScopeKey, 99, yesterday, 0},
			{ScopePerson, ann.ID, today, 120},
			{ScopePerson, ann.ID, time.Time{}, 1120},
			{ScopePerson, bob.ID, time.Time{}, 3 + 1<<40},
			{ScopeTeam, team.ID, today, 123},
			{ScopeTeam, team.ID, BudgetPeriodStart(BudgetTotal, today), 1123 + 1<<40},
			{ScopeTeam, empty.ID, time.Time{}, 0},
		} {
			got, err := SpentSince(ctx, db, c.scope, c.id, c.since)
			if err != nil || got != c.want {
				t.Errorf("SpentSince(%s %d, %v) = %d, %v; want %d", c.scope, c.id, c.since, got, err, c.want)
			}
		}
		if _, err := SpentSince(ctx, db, "org", 1, today); !errors.Is(err, ErrInvalid) {
			t.Errorf("unknown scope: %v", err)
		}
		if _, err := SpentSince(ctx, db, ScopeKey, 0, today); !errors.Is(err, ErrInvalid) {
			t.Errorf("key 0 (every chat): %v", err)
		}
	})
}
