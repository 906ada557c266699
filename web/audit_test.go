package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"moonji/internal/audit"
	"moonji/models"
)

// auditRows is every audit event, oldest first.
func (e *testEnv) auditRows() []models.AuditEvent {
	e.t.Helper()
	var rows []models.AuditEvent
	if err := e.DB.Order("id").Find(&rows).Error; err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// auditOf is the events of action, oldest first.
func auditOf(rows []models.AuditEvent, action string) []models.AuditEvent {
	var out []models.AuditEvent
	for _, r := range rows {
		if r.Action == action {
			out = append(out, r)
		}
	}
	return out
}

// oneAudit fails unless exactly one event of action has a target that
// contains target, and its actor contains actor and its address is
// 127.0.0.1; it returns it.
func oneAudit(t *testing.T, rows []models.AuditEvent, action, actor, target string) models.AuditEvent {
	t.Helper()
	var got []models.AuditEvent
	for _, r := range auditOf(rows, action) {
		if strings.Contains(r.Target, target) {
			got = append(got, r)
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d events %s, want 1: %+v", len(got), action, got)
	}
	r := got[0]
	if !strings.Contains(r.Actor, actor) || !strings.Contains(r.Target, target) || r.Address != "127.0.0.1" || r.At.IsZero() {
		t.Fatalf("%s: %+v, want actor ~%q, target ~%q, address 127.0.0.1", action, r, actor, target)
	}
	return r
}

var reTeamPath = regexp.MustCompile(`^/admin/teams/(\d+)\?`)

// TestAuditRecordsChanges makes each kind of change over real HTTP, the way
// people make them, and finds exactly one event for each: who, what, which
// target, from which address (never a forwarded one from a stranger), what
// changed — and no key secret, share token or session cookie anywhere in
// the rows nor in their exports.
func TestAuditRecordsChanges(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		ctx := context.Background()
		boss := e.signedIn("boss@example.com", true)
		bossCSRF := mustMe(e, boss).CSRFToken

		// Keys: created on /keys, budget and models and revoke on /admin/keys.
		resp, body := e.fetch(boss, http.MethodPost, "/keys", url.Values{"name": {"ci"}, "rpm": {"60"}, "_csrf": {bossCSRF}}, nil)
		m := reSecret.FindStringSubmatch(body)
		if resp.StatusCode != http.StatusOK || m == nil {
			t.Fatalf("create key: %d\n%s", resp.StatusCode, body)
		}
		secret := m[1]
		keys, _ := models.ListAPIKeys(ctx, e.DB, mustUser(t, e, "boss@example.com").ID)
		keyID := keys[0].ID
		keyPath := fmt.Sprintf("/admin/keys/%d/", keyID)
		for path, form := range map[string]url.Values{
			keyPath + "budget": {"amount": {"5"}, "period": {"month"}},
			keyPath + "models": {"models": {"m1"}},
		} {
			if resp, body := e.sendForm(boss, path, form); resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("POST %s: %d\n%s", path, resp.StatusCode, body)
			}
		}
		if resp, body := e.sendForm(boss, keyPath+"revoke", url.Values{}); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("revoke: %d\n%s", resp.StatusCode, body)
		}

		// Share links, made and revoked by a person.
		p := e.chatter("worker@example.com")
		conv := p.answered("hello")
		token := p.share(conv, `{}`)
		if status, body := p.do(http.MethodDelete, "/api/v1/shares/"+token, ""); status != http.StatusNoContent {
			t.Fatalf("revoke share: %d %s", status, body)
		}

		// People: disabled, enabled, their budget.
		worker := mustUser(t, e, "worker@example.com")
		for _, action := range []string{"disable", "enable"} {
			if resp, body := e.sendForm(boss, personPath(worker.ID, action), url.Values{}); resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("%s: %d\n%s", action, resp.StatusCode, body)
			}
		}
		if resp, body := e.sendForm(boss, personPath(worker.ID, "budget"), url.Values{"amount": {"12.5"}, "period": {"day"}}); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("person budget: %d\n%s", resp.StatusCode, body)
		}

		// Teams: made, changed, members in and out, deleted.
		resp, body = e.sendForm(boss, "/admin/teams", url.Values{"name": {"Research"}})
		tm := reTeamPath.FindStringSubmatch(resp.Header.Get("Location"))
		if resp.StatusCode != http.StatusSeeOther || tm == nil {
			t.Fatalf("create team: %d %q\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
		}
		team := "/admin/teams/" + tm[1]
		for _, step := range []struct {
			path string
			form url.Values
		}{
			{team + "/budget", url.Values{"amount": {"100"}, "period": {"total"}}},
			{team + "/models", url.Values{"models": {"m1"}}},
			{team + "/members", url.Values{"email": {"worker@example.com"}}},
			{fmt.Sprintf("%s/members/%d/remove", team, worker.ID), url.Values{}},
			{team + "/delete", url.Values{}},
		} {
			if resp, body := e.sendForm(boss, step.path, step.form); resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("POST %s: %d\n%s", step.path, resp.StatusCode, body)
			}
		}

		// A failed sign-in, whose forwarded address nobody vouches for.
		resp, _ = e.fetch(noRedirects(browser(t)), http.MethodGet, "/auth/callback?state=made-up&code=x", nil,
			map[string]string{"X-Forwarded-For": "6.6.6.6"})
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("made-up callback: %d", resp.StatusCode)
		}
		// A disabled person's sign-in fails too, naming them.
		e.addPerson("gone@example.com", false)
		if _, _, err := models.DisableUser(ctx, e.DB, mustUser(t, e, "gone@example.com").ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		if resp, _ := e.signIn(browser(t), "/login", "gone@example.com", testPassword); resp.StatusCode != http.StatusForbidden {
			t.Fatalf("disabled sign-in: %d", resp.StatusCode)
		}
		session := e.sessionCookie(boss)
		// Sign-out.
		if resp, body := e.sendForm(boss, "/logout", url.Values{}); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("logout: %d\n%s", resp.StatusCode, body)
		}

		rows := e.auditRows()
		keyTarget := fmt.Sprintf(`key %d "ci" of boss@example.com`, keyID)
		if r := oneAudit(t, rows, audit.KeyCreate, "boss@example.com", keyTarget); !strings.Contains(r.Detail, "rpm 60") {
			t.Errorf("key.create detail %q", r.Detail)
		}
		if r := oneAudit(t, rows, audit.ModelsUpdate, "boss", keyTarget); r.Detail != "models all→m1" {
			t.Errorf("key models detail %q", r.Detail)
		}
		oneAudit(t, rows, audit.KeyRevoke, "boss", keyTarget)
		if r := oneAudit(t, rows, audit.ShareCreate, "worker@example.com", conv); !strings.Contains(r.Detail, "expires never") {
			t.Errorf("share.create detail %q", r.Detail)
		}
		oneAudit(t, rows, audit.ShareRevoke, "worker@example.com", conv)
		if r := oneAudit(t, rows, audit.PersonDisable, "boss", "person worker@example.com"); r.ActorID != mustUser(t, e, "boss@example.com").ID {
			t.Errorf("disable actor id %d", r.ActorID)
		}
		oneAudit(t, rows, audit.PersonEnable, "boss", "person worker@example.com")
		if r := oneAudit(t, rows, audit.TeamCreate, "boss", `"Research"`); r.Detail != "budget none; models all" {
			t.Errorf("team.create detail %q", r.Detail)
		}
		if r := oneAudit(t, rows, audit.TeamMemberAdd, "boss", "Research"); r.Detail != "added worker@example.com" {
			t.Errorf("member add detail %q", r.Detail)
		}
		oneAudit(t, rows, audit.TeamMemberRemove, "boss", "Research")
		oneAudit(t, rows, audit.TeamDelete, "boss", "Research")
		oneAudit(t, rows, audit.SignOut, "boss", "person boss@example.com")
		// Budgets: the key's, the person's, the team's; model lists: the key's and the team's.
		budgets := auditOf(rows, audit.BudgetUpdate)
		if len(budgets) != 3 || budgets[0].Detail != "budget none→5.00 USD/month" || !strings.Contains(budgets[1].Target, "worker") ||
			budgets[1].Detail != "budget none→12.50 USD/day" || budgets[2].Detail != "budget none→100.00 USD/total" {
			t.Errorf("budget events: %+v", budgets)
		}
		if r := oneAudit(t, rows, audit.ModelsUpdate, "boss", "Research"); r.Detail != "models all→m1" {
			t.Errorf("team models detail %q", r.Detail)
		}
		signins := auditOf(rows, audit.SignIn)
		if len(signins) != 2 || signins[0].Actor != "boss@example.com" || signins[0].Detail != "admin" || signins[1].Actor != "worker@example.com" {
			t.Errorf("sign-ins: %+v", signins)
		}
		failed := auditOf(rows, audit.SignInFailed)
		if len(failed) != 2 || failed[0].Address != "127.0.0.1" || failed[0].Actor != "" || failed[0].Detail != "expired or unknown sign-in state" ||
			failed[1].Actor != "gone@example.com" || failed[1].Detail != "account disabled" {
			t.Errorf("failed sign-ins: %+v", failed)
		}

		// No secret: not in the rows, not in the exports.
		secrets := map[string]string{"key secret": secret, "share token": token, "session": session}
		admin := e.signedIn("auditor@example.com", true)
		_, csvOut := e.fetch(admin, http.MethodGet, "/admin/audit/export?format=csv", nil, nil)
		_, jsonOut := e.fetch(admin, http.MethodGet, "/admin/audit/export?format=jsonl", nil, nil)
		raw, _ := json.Marshal(rows)
		for what, s := range secrets {
			if s == "" || len(s) < 16 {
				t.Fatalf("%s %q: nothing to look for", what, s)
			}
			for where, text := range map[string]string{"rows": string(raw), "csv": csvOut, "jsonl": jsonOut} {
				if strings.Contains(text, s) || strings.Contains(text, s[:16]) {
					t.Errorf("the %s is in the %s", what, where)
				}
			}
		}
		if !strings.Contains(csvOut, "key.create") || !strings.Contains(jsonOut, `"action":"team.delete"`) {
			t.Errorf("exports lack events:\n%s\n%s", csvOut, jsonOut)
		}
	})
}

// mustUser is the person with email.
func mustUser(t *testing.T, e *testEnv, email string) *models.User {
	t.Helper()
	u, err := models.UserByEmail(context.Background(), e.DB, email)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestAuditFailedSignInFlood: made-up callbacks from one address are
// recorded up to the bound, then once more to say the rest are not.
func TestAuditFailedSignInFlood(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	c := noRedirects(browser(t))
	long := strings.Repeat("%3D", 600) // "=" × 600, past any bound
	for i := 0; i < 30; i++ {
		resp, _ := e.fetch(c, http.MethodGet, "/auth/callback?state=s&code=c&error="+long, nil, nil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("callback %d: %d", i, resp.StatusCode)
		}
	}
	failed := auditOf(e.auditRows(), audit.SignInFailed)
	if len(failed) != 21 || !strings.Contains(failed[20].Detail, "not recorded") {
		t.Fatalf("%d failed sign-ins recorded, want 20 and a note: last %+v", len(failed), failed[len(failed)-1])
	}
	for _, f := range failed {
		if len(f.Detail) > 1000 || len(f.Target) > 320 {
			t.Fatalf("unbounded event: %+v", f)
		}
	}
}
