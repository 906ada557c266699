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

// teamPath is a team's page, or one of its forms' actions.
func teamPath(id uint, action string) string {
	if action == "" {
		return fmt.Sprintf("/admin/teams/%d", id)
	}
	return fmt.Sprintf("/admin/teams/%d/%s", id, action)
}

// mustTeam is team name as stored.
func mustTeam(t *testing.T, e *testEnv, name string) *models.Team {
	t.Helper()
	team, err := models.TeamByName(context.Background(), e.DB, name)
	if err != nil {
		t.Fatalf("team %q: %v", name, err)
	}
	return team
}

func countTeams(t *testing.T, e *testEnv) int64 {
	t.Helper()
	var n int64
	if err := e.DB.Model(&models.Team{}).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// wantRedirect fails unless resp is a 303 to a path starting with prefix.
func wantRedirect(t *testing.T, what string, resp *http.Response, body, prefix string) {
	t.Helper()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), prefix) {
		t.Fatalf("%s: %d → %q, want 303 to %s…\n%s", what, resp.StatusCode, resp.Header.Get("Location"), prefix, body)
	}
}

// wantRefused fails unless resp is a 422 page that says msg.
func wantRefused(t *testing.T, what string, resp *http.Response, body, msg string) {
	t.Helper()
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `role="alert"`) || !strings.Contains(body, msg) {
		t.Errorf("%s: %d, want 422 saying %q\n%.2000s", what, resp.StatusCode, msg, body)
	}
}

// The teams pages through their forms: create, members, budget, models,
// delete, each seen in the database; a change to a team's models holds
// for its member's next request on this replica (no 5 s cache).
func TestTeamPages(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL)
		ctx := context.Background()
		ada := e.signedIn("ada@example.com", true)
		key := e.newKey("pia@example.com", 0)
		pia, _ := models.UserByEmail(ctx, e.DB, "pia@example.com")

		body := e.adminPage(ada, "/admin/teams")
		if !strings.Contains(body, "No teams yet.") || !strings.Contains(body, `href="/admin/teams" aria-current="page"`) {
			t.Fatalf("empty teams page:\n%s", body)
		}
		resp, body := e.sendForm(ada, "/admin/teams", url.Values{"name": {"  crew  "}, "amount": {"12.5"}, "period": {"month"}, "models": {"m1, renamed, m1"}})
		wantRedirect(t, "create", resp, body, "/admin/teams/")
		crew := mustTeam(t, e, "crew")
		if crew.Budget == nil || *crew.Budget != 12_500_000_000 || crew.BudgetPeriod != models.BudgetMonth || crew.Models != "m1,renamed" {
			t.Fatalf("created team: %+v", crew)
		}
		body = e.adminPage(ada, resp.Header.Get("Location"))
		if !strings.Contains(body, "Team created.") || !strings.Contains(body, `value="12.5"`) || !strings.Contains(body, "m1, renamed") {
			t.Errorf("the new team's page:\n%s", body)
		}

		resp, body = e.sendForm(ada, teamPath(crew.ID, "members"), url.Values{"email": {"PIA@example.com"}})
		wantRedirect(t, "add member", resp, body, teamPath(crew.ID, "")+"?done=added")
		if teams, _ := models.TeamsOf(ctx, e.DB, pia.ID); len(teams) != 1 || teams[0].ID != crew.ID {
			t.Fatalf("pia's teams: %+v", teams)
		}
		body = e.adminPage(ada, teamPath(crew.ID, ""))
		if !strings.Contains(body, `data-member="pia@example.com"`) || !strings.Contains(body, "Remove pia@example.com from crew") {
			t.Errorf("member not listed:\n%s", body)
		}
		list := e.adminPage(ada, "/admin/teams")
		if row := rowOf(list, "data-team", "crew"); !strings.Contains(row, ">1<") || !strings.Contains(row, "12.50 USD per month") {
			t.Errorf("teams list row:\n%s", row)
		}

		// Models hold at once: renamed works, then the list drops it and
		// pia's next request for it is refused as an unknown model.
		e.sendAs(key, `{"model":"renamed","messages":[{"role":"user","content":"hi"}]}`, http.StatusOK)
		resp, body = e.sendForm(ada, teamPath(crew.ID, "models"), url.Values{"models": {"m1"}})
		wantRedirect(t, "models", resp, body, teamPath(crew.ID, "")+"?done=models")
		e.sendAs(key, `{"model":"renamed","messages":[{"role":"user","content":"hi"}]}`, http.StatusNotFound)
		if got := mustTeam(t, e, "crew").Models; got != "m1" {
			t.Errorf("models = %q", got)
		}

		// Budget: none, then 3 a day.
		resp, body = e.sendForm(ada, teamPath(crew.ID, "budget"), url.Values{"amount": {""}, "period": {"day"}})
		wantRedirect(t, "no budget", resp, body, teamPath(crew.ID, "")+"?done=budget")
		if got := mustTeam(t, e, "crew"); got.Budget != nil || got.BudgetPeriod != "" {
			t.Errorf("budget after removing it: %v %q", got.Budget, got.BudgetPeriod)
		}
		resp, body = e.sendForm(ada, teamPath(crew.ID, "budget"), url.Values{"amount": {"3"}, "period": {"day"}})
		wantRedirect(t, "budget", resp, body, teamPath(crew.ID, ""))
		if got := mustTeam(t, e, "crew"); got.Budget == nil || *got.Budget != 3_000_000_000 || got.BudgetPeriod != models.BudgetDay {
			t.Errorf("budget: %v %q", got.Budget, got.BudgetPeriod)
		}
		if body := e.adminPage(ada, teamPath(crew.ID, "")); !strings.Contains(body, `id="team-status"`) || !strings.Contains(body, "3.00 USD left") {
			t.Errorf("the team's budget status:\n%s", body)
		}

		// Remove the member, then delete the team.
		resp, body = e.sendForm(ada, fmt.Sprintf("/admin/teams/%d/members/%d/remove", crew.ID, pia.ID), url.Values{})
		wantRedirect(t, "remove", resp, body, teamPath(crew.ID, "")+"?done=removed")
		if teams, _ := models.TeamsOf(ctx, e.DB, pia.ID); len(teams) != 0 {
			t.Errorf("pia still in %+v", teams)
		}
		e.sendAs(key, `{"model":"renamed","messages":[{"role":"user","content":"hi"}]}`, http.StatusOK)
		resp, body = e.sendForm(ada, teamPath(crew.ID, "delete"), url.Values{})
		wantRedirect(t, "delete", resp, body, "/admin/teams?done=deleted")
		if _, err := models.TeamByID(ctx, e.DB, crew.ID); err != models.ErrNotFound {
			t.Errorf("deleted team: %v", err)
		}
		for _, path := range []string{teamPath(crew.ID, ""), "/admin/teams/0", "/admin/teams/x", "/admin/teams/99999999999999999999"} {
			if resp, _ := e.fetch(noRedirects(ada), http.MethodGet, path, nil, nil); resp.StatusCode != http.StatusNotFound {
				t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
			}
		}
	})
}

// Hostile forms get a sentence and change nothing.
func TestTeamPagesHostileInput(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL)
		ada := e.signedIn("ada@example.com", true)
		resp, body := e.sendForm(ada, "/admin/teams", url.Values{"name": {"crew"}, "amount": {"1"}, "period": {"total"}})
		wantRedirect(t, "create", resp, body, "/admin/teams/")
		crew := mustTeam(t, e, "crew")

		long := strings.Repeat("n", 10_000)
		for _, c := range []struct {
			what   string
			fields url.Values
			msg    string
		}{
			{"negative amount", url.Values{"name": {"a"}, "amount": {"-1"}, "period": {"day"}}, "not negative"},
			{"exponent", url.Values{"name": {"a"}, "amount": {"1e9"}, "period": {"day"}}, "no exponent"},
			{"ten decimals", url.Values{"name": {"a"}, "amount": {"0.0000000001"}, "period": {"day"}}, "at most 9 decimals"},
			{"huge amount", url.Values{"name": {"a"}, "amount": {strings.Repeat("9", 40)}, "period": {"day"}}, "amount such as"},
			{"unknown period", url.Values{"name": {"a"}, "amount": {"1"}, "period": {"week"}}, "Choose the budget’s period"},
			{"10k-character name", url.Values{"name": {long}}, "1 to 100 characters"},
			{"control character in name", url.Values{"name": {"a\x00b"}}, "without control"},
			{"bidi override in name", url.Values{"name": {"a\u202eb"}}, "without control"},
			{"blank name", url.Values{"name": {"   "}}, "1 to 100 characters"},
			{"taken name", url.Values{"name": {"crew"}}, "exists already"},
			{"control character in models", url.Values{"name": {"a"}, "models": {"m1,\x07bad"}}, "control character"},
			{"unknown model", url.Values{"name": {"a"}, "models": {"m1, nope"}}, `There is no model &#34;nope&#34;`},
			{"only commas", url.Values{"name": {"a"}, "models": {",,,"}}, "names no model"},
			{"model list of 10k characters", url.Values{"name": {"a"}, "models": {long}}, "model list was refused"},
		} {
			resp, body := e.sendForm(ada, "/admin/teams", c.fields)
			wantRefused(t, c.what, resp, body, c.msg)
			if strings.Contains(body, long[:300]) {
				t.Errorf("%s: the refusal echoes the whole input", c.what)
			}
		}
		if n := countTeams(t, e); n != 1 {
			t.Errorf("%d teams after refused forms, want 1", n)
		}

		// The team's own forms.
		for _, c := range []struct {
			what, path string
			fields     url.Values
			msg        string
		}{
			{"negative budget", "budget", url.Values{"amount": {"-1"}, "period": {"day"}}, "not negative"},
			{"exponent budget", "budget", url.Values{"amount": {"1e9"}, "period": {"day"}}, "no exponent"},
			{"control models", "models", url.Values{"models": {"m1\x1b[31m"}}, "control character"},
			{"unknown member", "members", url.Values{"email": {"nobody@example.com"}}, "Nobody with the email"},
			{"10k-character email", "members", url.Values{"email": {long}}, "Give the email of someone"},
			{"NUL in email", "members", url.Values{"email": {"ada@example.com\x00"}}, "Give the email of someone"},
		} {
			resp, body := e.sendForm(ada, teamPath(crew.ID, c.path), c.fields)
			wantRefused(t, c.what, resp, body, c.msg)
		}
		if got := mustTeam(t, e, "crew"); got.Budget == nil || *got.Budget != 1_000_000_000 || got.BudgetPeriod != "total" || got.Models != "" {
			t.Errorf("the team changed: %+v", got)
		}
		if members, _ := models.MembersOf(context.Background(), e.DB, crew.ID); len(members) != 0 {
			t.Errorf("members after refused forms: %+v", members)
		}
		// Someone not in the team: said so.
		ada2, _ := models.UserByEmail(context.Background(), e.DB, "ada@example.com")
		resp, body = e.sendForm(ada, fmt.Sprintf("/admin/teams/%d/members/%d/remove", crew.ID, ada2.ID), url.Values{})
		wantRefused(t, "remove a non-member", resp, body, "not in this team")
		// A form without its CSRF token is refused and changes nothing.
		resp, _ = e.fetch(noRedirects(ada), http.MethodPost, "/admin/teams", url.Values{"name": {"sneaky"}}, nil)
		if resp.StatusCode != http.StatusForbidden || countTeams(t, e) != 1 {
			t.Errorf("a form without CSRF token: %d, %d teams", resp.StatusCode, countTeams(t, e))
		}
	})
}

// Only admins reach the teams pages and the budget forms of others.
func TestTeamPagesAdminsOnly(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	ctx := context.Background()
	crew, err := models.CreateTeam(ctx, e.DB, "crew", models.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pat := e.signedIn("pat@example.com", false)
	patUser, _ := models.UserByEmail(ctx, e.DB, "pat@example.com")
	owner := keyOf(t, e, "owner@example.com")
	for _, path := range []string{"/admin/teams", teamPath(crew.ID, "")} {
		if resp, _ := e.fetch(noRedirects(pat), http.MethodGet, path, nil, nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a non-admin got %d on GET %s, want 403", resp.StatusCode, path)
		}
		if resp, _ := e.fetch(noRedirects(browser(t)), http.MethodGet, path, nil, nil); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("signed out GET %s: %d, want the sign-in", path, resp.StatusCode)
		}
	}
	for path, fields := range map[string]url.Values{
		"/admin/teams":                                 {"name": {"mine"}},
		teamPath(crew.ID, "members"):                   {"email": {"pat@example.com"}},
		teamPath(crew.ID, "budget"):                    {"amount": {"100"}, "period": {"day"}},
		teamPath(crew.ID, "delete"):                    {},
		personPath(patUser.ID, "budget"):               {"amount": {"100"}, "period": {"day"}},
		fmt.Sprintf("/admin/keys/%d/budget", owner.ID): {"amount": {""}},
		fmt.Sprintf("/admin/keys/%d/models", owner.ID): {"models": {""}},
	} {
		if resp, _ := e.sendForm(pat, path, fields); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a non-admin got %d on POST %s, want 403", resp.StatusCode, path)
		}
	}
	if n := countTeams(t, e); n != 1 {
		t.Errorf("%d teams", n)
	}
	if teams, _ := models.TeamsOf(ctx, e.DB, patUser.ID); len(teams) != 0 {
		t.Error("a non-admin put themself in a team")
	}
	if u, _ := models.UserByID(ctx, e.DB, patUser.ID); u.Budget != nil {
		t.Error("a non-admin set their own budget")
	}
	body := e.adminPage(pat, "/keys")
	if strings.Contains(body, "/admin/teams") {
		t.Error("a non-admin's page links the teams")
	}
}
