package auth

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"gorm.io/gorm"

	"moonji/internal/devidp"
	"moonji/models"
)

// testServiceWithTeams is testService with a teams claim.
func testServiceWithTeams(t *testing.T, claim string) *Service {
	t.Helper()
	s, err := New(Options{DB: testDB(t), Log: quietLog(), PublicURL: "http://127.0.0.1:1",
		Provider: Provider{Issuer: "https://idp.example.com", ClientID: "moonji"}, TeamsClaim: claim})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func teamsOf(t *testing.T, s *Service, userID uint) []string {
	t.Helper()
	teams, err := models.TeamsOf(context.Background(), s.db, userID)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(teams))
	for i, team := range teams {
		names[i] = team.Name
	}
	return names
}

// With a teams claim, each sign-in places the person in the teams it names
// (a list, a string, a dotted path), replacing those of the last sign-in's
// claim and keeping those an admin added; values that are not names are
// skipped, and an absent claim is no teams — unless userinfo failed.
func TestSignInSyncsTeams(t *testing.T) {
	ctx := context.Background()
	s := testServiceWithTeams(t, "org.groups")
	iss := "https://idp.example.com"
	signIn := func(claims map[string]any) *models.User {
		t.Helper()
		u, err := s.upsertUser(ctx, Identity{Issuer: iss, Subject: "s1", Email: "ann@example.com", EmailVerified: true, Claims: claims})
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	nested := func(v any) map[string]any { return map[string]any{"org": map[string]any{"groups": v}} }

	u := signIn(nested([]any{"eng", "ops", 42.0, nil, "bad\x00name", strings.Repeat("x", 101)}))
	if got := teamsOf(t, s, u.ID); !slices.Equal(got, []string{"eng", "ops"}) {
		t.Fatalf("first sign-in: %v", got)
	}
	// An admin adds them to a team of their own choosing.
	picked, err := models.CreateTeam(ctx, s.db, "picked", models.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := models.AddTeamMember(ctx, s.db, picked.ID, u.ID); err != nil {
		t.Fatal(err)
	}
	signIn(nested("research")) // a string is one team
	if got := teamsOf(t, s, u.ID); !slices.Equal(got, []string{"picked", "research"}) {
		t.Errorf("second sign-in: %v", got)
	}
	// Userinfo failed and the claim is absent: nothing changes.
	if _, err := s.upsertUser(ctx, Identity{Issuer: iss, Subject: "s1", Email: "ann@example.com", EmailVerified: true,
		userinfoFailed: true}); err != nil {
		t.Fatal(err)
	}
	if got := teamsOf(t, s, u.ID); !slices.Equal(got, []string{"picked", "research"}) {
		t.Errorf("after a failed userinfo: %v", got)
	}
	signIn(map[string]any{}) // absent: no teams from the provider
	if got := teamsOf(t, s, u.ID); !slices.Equal(got, []string{"picked"}) {
		t.Errorf("sign-in without the claim: %v", got)
	}
	// 150 groups: the first 100 taken, the sign-in succeeds.
	many := make([]any, 150)
	for i := range many {
		many[i] = fmt.Sprintf("g%03d", i)
	}
	signIn(nested(many))
	if got := teamsOf(t, s, u.ID); len(got) != 101 || !slices.Contains(got, "g099") || slices.Contains(got, "g100") {
		t.Errorf("150 groups: %d teams", len(got))
	}
	// Zitadel-style object of roles: its keys.
	signIn(nested(map[string]any{"b-role": map[string]any{}, "a-role": map[string]any{}}))
	if got := teamsOf(t, s, u.ID); !slices.Equal(got, []string{"a-role", "b-role", "picked"}) {
		t.Errorf("object claim: %v", got)
	}

	// Without a teams claim configured, sign-ins leave teams alone.
	plain := testService(t, AdminRule{})
	v, err := plain.upsertUser(ctx, Identity{Issuer: iss, Subject: "s9", Email: "bo@example.com", EmailVerified: true,
		Claims: map[string]any{"groups": []any{"eng"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := teamsOf(t, plain, v.ID); len(got) != 0 {
		t.Errorf("teams without a teams claim: %v", got)
	}
}

// A sign-in does not undo a budget an admin sets while it runs: the row it
// saves was read before.
func TestSignInKeepsBudget(t *testing.T) {
	ctx := context.Background()
	s := testServiceWithTeams(t, "")
	id := Identity{Issuer: "https://idp.example.com", Subject: "s1", Email: "ann@example.com", EmailVerified: true}
	u, err := s.upsertUser(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// The admin's change lands between the sign-in's read and its save.
	budget := int64(5)
	raced := false
	err = s.db.Callback().Update().Before("gorm:update").Register("test:set_budget", func(tx *gorm.DB) {
		if _, ok := tx.Statement.Model.(*models.User); ok && !raced {
			raced = true
			if err := models.SetPersonBudget(ctx, s.db, u.ID, &budget, models.BudgetDay); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.upsertUser(ctx, id); err != nil {
		t.Fatal(err)
	}
	s.db.Callback().Update().Remove("test:set_budget")
	got, _ := models.UserByID(ctx, s.db, u.ID)
	if !raced || got.Budget == nil || *got.Budget != 5 || got.BudgetPeriod != models.BudgetDay {
		t.Errorf("budget after a sign-in (raced %v): %v %q", raced, got.Budget, got.BudgetPeriod)
	}
}

// The whole sign-in through the embedded provider: its groups claim places
// the admin in the team of the admin group.
func TestLoginSyncsTeams(t *testing.T) {
	e := newIDPEnv(t, "right-password")
	e.svc.teams = "groups"
	resp := e.signIn(t, jarClient(t), "admin@localhost", "right-password")
	if resp.StatusCode != 200 || e.err != nil || e.last == nil {
		t.Fatalf("callback: %d, err %v", resp.StatusCode, e.err)
	}
	if got := teamsOf(t, e.svc, e.last.User.ID); !slices.Equal(got, []string{devidp.AdminGroup}) {
		t.Errorf("teams after sign-in: %v", got)
	}
}
