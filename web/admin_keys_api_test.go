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

	"moonji/internal/apikey"
	"moonji/internal/audit"
	"moonji/models"
)

// adminClient calls /api/v1/admin with one key.
type adminClient struct {
	t   *testing.T
	e   *testEnv
	key string
}

// call sends method path with body (JSON, "" for none) and returns the
// status, the body decoded (nil when it is not a JSON object) and as text.
func (a adminClient) call(method, path, body string) (int, map[string]any, string) {
	a.t.Helper()
	hdr := map[string]string{}
	if a.key != "" {
		hdr["Authorization"] = "Bearer " + a.key
	}
	resp, text := haDo(a.t, a.e, nil, method, path, body, hdr)
	var obj map[string]any
	_ = json.Unmarshal([]byte(text), &obj)
	return resp.StatusCode, obj, text
}

// must is call that fails the test unless the status is want.
func (a adminClient) must(want int, method, path, body string) map[string]any {
	a.t.Helper()
	status, obj, text := a.call(method, path, body)
	if status != want {
		a.t.Fatalf("%s %s %s: %d %s, want %d", method, path, body, status, text, want)
	}
	return obj
}

// wantError checks an answer is an error in OpenAI's shape with status
// and code (and param, when given).
func wantError(t *testing.T, what string, status int, obj map[string]any, text string, wantStatus int, code, param string) {
	t.Helper()
	e, _ := obj["error"].(map[string]any)
	if status != wantStatus || e == nil || e["message"] == "" || e["type"] == nil || e["code"] != code ||
		(param != "" && e["param"] != param) {
		t.Errorf("%s: %d %s; want %d with code %q param %q", what, status, clipText(text), wantStatus, code, param)
	}
}

func clipText(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// adminKeyOf makes email an admin and gives them an admin-scoped key.
func (e *testEnv) adminKeyOf(email string) (string, *models.APIKey) {
	e.t.Helper()
	e.addPerson(email, true)
	u, err := models.UserByEmail(context.Background(), e.DB, email)
	if err != nil {
		e.t.Fatal(err)
	}
	secret, key, err := apikey.CreateScoped(context.Background(), e.DB, u, models.ScopeAdmin, "admin api", 0, 0, models.Limits{})
	if err != nil {
		e.t.Fatal(err)
	}
	return secret, key
}

// auditOf is the audit log's events of action, oldest first.
func (e *testEnv) auditOf(action string) []models.AuditEvent {
	e.t.Helper()
	var rows []models.AuditEvent
	if err := e.DB.Where("action = ?", action).Order("id").Find(&rows).Error; err != nil {
		e.t.Fatal(err)
	}
	return rows
}

// TestAdminKeysAPILifecycle: an admin-scoped key creates a key for someone
// (its secret in that answer only), lists, reads and changes it; the key
// works on /v1 within the limits set, the changes apply at once; revoking
// it (twice: the same answer) stops it. Every change is in the audit log
// with the admin, their key and the client's address, and no secret.
func TestAdminKeysAPILifecycle(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		adminSecret, adminRow := e.adminKeyOf("boss@example.com")
		a := adminClient{t, e, adminSecret}
		if _, err := models.EnsureUser(context.Background(), e.DB, "worker@example.com"); err != nil {
			t.Fatal(err)
		}

		created := a.must(http.StatusCreated, http.MethodPost, "/api/v1/admin/keys",
			`{"owner":"Worker@example.com","name":"ci","models":["m1"],"budget":"5","expires_in":"30d"}`)
		secret, _ := created["key"].(string)
		id := uint(created["id"].(float64))
		if !strings.HasPrefix(secret, apikey.Prefix) || created["prefix"] != secret[:11] || created["scope"] != "inference" ||
			created["owner"] != "worker@example.com" || created["status"] != "active" || created["budget"] != "5.000000" ||
			created["budget_period"] != "month" || fmt.Sprint(created["models"]) != "[m1]" || created["expires_at"] == nil ||
			created["rpm"] != 0.0 || created["object"] != "api_key" {
			t.Fatalf("created: %v", created)
		}
		path := fmt.Sprintf("/api/v1/admin/keys/%d", id)

		// The secret never again: not in the list, not in the key's answer.
		for _, p := range []string{"/api/v1/admin/keys", "/api/v1/admin/keys?owner=worker", path} {
			_, obj, text := a.call(http.MethodGet, p, "")
			if strings.Contains(text, secret[11:]) || strings.Contains(text, `"key"`) {
				t.Fatalf("GET %s shows the secret: %s", p, text)
			}
			if p == path && obj["name"] != "ci" {
				t.Errorf("GET %s: %v", p, obj)
			}
		}
		list := a.must(http.StatusOK, http.MethodGet, "/api/v1/admin/keys?owner=worker&scope=inference&status=active", "")
		if data, _ := list["data"].([]any); len(data) != 1 || list["has_more"] != false || list["last_id"] != float64(id) {
			t.Errorf("filtered list: %v", list)
		}

		// On /v1: the model list applies.
		if models := v1Models(t, e, secret); models != "[m1]" {
			t.Errorf("/v1/models with the new key: %s", models)
		}
		if resp := e.postWith(context.Background(), secret, chatBody); resp.StatusCode != http.StatusOK {
			t.Fatalf("chat with the new key: %d %s", resp.StatusCode, readAll(t, resp.Body))
		} else {
			resp.Body.Close()
		}
		resp := e.postWith(context.Background(), secret, strings.Replace(chatBody, `"m1"`, `"renamed"`, 1))
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("a model off the key's list: %d", resp.StatusCode)
		}
		resp.Body.Close()

		// A merge patch: rpm and models change, the name too, the budget
		// (absent) stays; the gateway sees it at once.
		patched := a.must(http.StatusOK, http.MethodPatch, path, `{"name":"ci-2","rpm":1,"models":null}`)
		if patched["name"] != "ci-2" || patched["rpm"] != 1.0 || fmt.Sprint(patched["models"]) != "[]" || patched["budget"] != "5.000000" {
			t.Fatalf("patched: %v", patched)
		}
		if models := v1Models(t, e, secret); models != "[m1 renamed]" {
			t.Errorf("/v1/models after the patch: %s", models)
		}
		limited := false
		for range 3 {
			resp := e.postWith(context.Background(), secret, chatBody)
			limited = limited || resp.StatusCode == http.StatusTooManyRequests
			resp.Body.Close()
		}
		if !limited {
			t.Error("rpm 1 set by the patch: three requests, none refused")
		}
		budget := a.must(http.StatusOK, http.MethodPatch, path, `{"budget":0.25,"budget_period":"day"}`)
		if budget["budget"] != "0.250000" || budget["budget_period"] != "day" || budget["rpm"] != 1.0 {
			t.Errorf("budget patch: %v", budget)
		}
		cleared := a.must(http.StatusOK, http.MethodPatch, path, `{"budget":null,"rpm":null}`)
		if cleared["budget"] != nil || cleared["budget_period"] != nil || cleared["rpm"] != 0.0 {
			t.Errorf("cleared: %v", cleared)
		}

		revoked := a.must(http.StatusOK, http.MethodDelete, path, "")
		if revoked["status"] != "revoked" || revoked["revoked_at"] == nil {
			t.Fatalf("revoked: %v", revoked)
		}
		if again := a.must(http.StatusOK, http.MethodDelete, path, ""); again["revoked_at"] != revoked["revoked_at"] {
			t.Errorf("revoked twice: %v, then %v", revoked, again)
		}
		if resp := e.postWith(context.Background(), secret, chatBody); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("revoked key on /v1: %d", resp.StatusCode)
		} else {
			resp.Body.Close()
		}
		status, obj, text := a.call(http.MethodGet, "/api/v1/admin/keys/999999", "")
		wantError(t, "unknown id", status, obj, text, http.StatusNotFound, "not_found", "")
		status, obj, text = a.call(http.MethodDelete, "/api/v1/admin/keys/abc", "")
		wantError(t, "id not a number", status, obj, text, http.StatusNotFound, "not_found", "")

		// The audit log: who (the admin, with their key), what, from where.
		target := fmt.Sprintf(`key %d "ci" of worker@example.com`, id)
		for action, want := range map[string][]string{
			audit.KeyCreate:    {"scope inference", "models m1", "budget 5.000000"},
			audit.KeyUpdate:    {`name "ci" → "ci-2"`, "rpm default → 1"},
			audit.ModelsUpdate: {"models m1 → all"},
			audit.BudgetUpdate: {"budget 5.000000 USD per month → 0.250000 USD per day", "budget 0.250000 USD per day → none"},
			audit.KeyRevoke:    {"revoked"},
		} {
			rows := e.auditOf(action)
			if action == audit.KeyRevoke && len(rows) != 1 {
				t.Errorf("revoking twice: %d audit events, want 1", len(rows))
			}
			all := ""
			for _, r := range rows {
				all += r.Detail + "\n"
				if r.ActorID != adminRow.UserID || r.Actor != "boss@example.com" || r.KeyID != adminRow.ID || r.Address != "127.0.0.1" ||
					!strings.HasPrefix(r.Target, fmt.Sprintf(`key %d "`, id)) || !strings.HasSuffix(r.Target, "of worker@example.com") {
					t.Errorf("%s event: %+v", action, r)
				}
				if strings.Contains(r.Detail+r.Target, secret[11:]) || strings.Contains(r.Detail+r.Target, adminSecret[11:]) {
					t.Errorf("%s event holds a secret: %+v", action, r)
				}
			}
			for _, w := range want {
				if !strings.Contains(all, w) {
					t.Errorf("%s events lack %q:\n%s", action, w, all)
				}
			}
		}
		if rows := e.auditOf(audit.KeyCreate); len(rows) != 1 || rows[0].Target != target {
			t.Errorf("create event: %+v", rows)
		}
	})
}

// v1Models is the model ids GET /v1/models lists for key, as "[a b]".
func v1Models(t *testing.T, e *testEnv, key string) string {
	t.Helper()
	resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(key))
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("/v1/models: %d %s", resp.StatusCode, body)
	}
	ids := make([]string, len(list.Data))
	for i, m := range list.Data {
		ids[i] = m.ID
	}
	return fmt.Sprint(ids)
}

// TestAdminKeysAPIScopes: an admin-scoped key cannot call /v1 (no engine
// request, no row of its own); an inference key, a browser session, no key
// and a made-up key cannot call /api/v1/admin. An admin key stops at once
// when its owner is no longer an admin, or is disabled. The admin scope is
// for admins' keys only, through the API as through the CLI.
func TestAdminKeysAPIScopes(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		adminSecret, adminRow := e.adminKeyOf("boss@example.com")
		a := adminClient{t, e, adminSecret}
		ctx := context.Background()

		engineCalls := len(e.Mock.Requests())
		for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"} {
			resp, body := haDo(t, e, nil, http.MethodPost, p, chatBody, haBearer(adminSecret))
			var obj map[string]any
			_ = json.Unmarshal([]byte(body), &obj)
			wantError(t, "admin key on "+p, resp.StatusCode, obj, body, http.StatusForbidden, "insufficient_scope", "")
		}
		for _, p := range []string{"/v1/models", "/v1/models/m1"} {
			if resp, body := haDo(t, e, nil, http.MethodGet, p, "", haBearer(adminSecret)); resp.StatusCode != http.StatusForbidden {
				t.Errorf("admin key on %s: %d %s", p, resp.StatusCode, body)
			}
		}
		if n := len(e.Mock.Requests()); n != engineCalls {
			t.Errorf("the admin key reached the engine: %d requests", n-engineCalls)
		}
		_ = e.srv.Ledger.Flush(ctx)
		var charged int64
		if err := e.DB.Model(&models.Usage{}).Where("key_id = ?", adminRow.ID).Count(&charged).Error; err != nil || charged != 0 {
			t.Errorf("usage rows of the admin key: %d %v", charged, err)
		}

		for name, c := range map[string]adminClient{
			"an inference key": {t, e, e.Key},
		} {
			status, obj, text := c.call(http.MethodGet, "/api/v1/admin/keys", "")
			wantError(t, name, status, obj, text, http.StatusForbidden, "insufficient_scope", "")
		}
		for name, key := range map[string]string{"no key": "", "a made-up key": "mj-" + strings.Repeat("x", 43), "not a key": "sk-123"} {
			status, obj, text := adminClient{t, e, key}.call(http.MethodPost, "/api/v1/admin/keys", `{"owner":"boss@example.com","name":"x"}`)
			wantError(t, name, status, obj, text, http.StatusUnauthorized, "invalid_api_key", "")
		}
		// An admin's browser session, CSRF header and all, is not a key.
		boss := e.signedIn("boss@example.com", true)
		token := mustMe(e, boss).CSRFToken
		resp, body := e.fetch(boss, http.MethodGet, "/api/v1/admin/keys", nil, map[string]string{"X-CSRF-Token": token})
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, `"invalid_api_key"`) {
			t.Errorf("admin session on the admin API: %d %s", resp.StatusCode, body)
		}

		// The admin scope through the API: an admin's key only.
		if _, err := models.EnsureUser(ctx, e.DB, "worker@example.com"); err != nil {
			t.Fatal(err)
		}
		status, obj, text := a.call(http.MethodPost, "/api/v1/admin/keys", `{"owner":"worker@example.com","name":"x","scope":"admin"}`)
		wantError(t, "admin scope for a non-admin", status, obj, text, http.StatusBadRequest, "invalid_request", "scope")
		e.addPerson("deputy@example.com", true)
		deputy := a.must(http.StatusCreated, http.MethodPost, "/api/v1/admin/keys", `{"owner":"deputy@example.com","name":"tf","scope":"admin"}`)
		d := adminClient{t, e, deputy["key"].(string)}
		d.must(http.StatusOK, http.MethodGet, "/api/v1/admin/keys?scope=admin", "")
		status, obj, text = d.call(http.MethodGet, "/api/v1/admin/nothing-here", "")
		wantError(t, "unknown path", status, obj, text, http.StatusNotFound, "not_found", "")

		// Demoted: refused at once; an admin again: works; disabled: refused.
		if err := e.DB.Model(&models.User{}).Where("email = ?", "deputy@example.com").Update("admin", false).Error; err != nil {
			t.Fatal(err)
		}
		status, obj, text = d.call(http.MethodGet, "/api/v1/admin/keys", "")
		wantError(t, "demoted owner's key", status, obj, text, http.StatusForbidden, "insufficient_permissions", "")
		if err := e.DB.Model(&models.User{}).Where("email = ?", "deputy@example.com").Update("admin", true).Error; err != nil {
			t.Fatal(err)
		}
		d.must(http.StatusOK, http.MethodGet, "/api/v1/admin/keys", "")
		du, _ := models.UserByEmail(ctx, e.DB, "deputy@example.com")
		if _, _, err := models.DisableUser(ctx, e.DB, du.ID, du.CreatedAt); err != nil {
			t.Fatal(err)
		}
		status, obj, text = d.call(http.MethodGet, "/api/v1/admin/keys", "")
		wantError(t, "disabled owner's key", status, obj, text, http.StatusUnauthorized, "invalid_api_key", "")
	})
}

// TestKeysPageScope: on /keys an admin may create an admin-scoped key for
// themself (it works on the admin API, not on /v1, and its row says so);
// anyone else sending the scope is refused and no key is made.
func TestKeysPageScope(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	boss := e.signedIn("boss@example.com", true)
	token := mustMe(e, boss).CSRFToken
	_, page := e.fetch(boss, http.MethodGet, "/keys", nil, nil)
	if !strings.Contains(page, `name="scope"`) {
		t.Fatal("no scope choice on an admin's /keys")
	}
	resp, body := e.fetch(boss, http.MethodPost, "/keys", url.Values{"name": {"tf"}, "scope": {"admin"}, "_csrf": {token}}, nil)
	secret := regexp.MustCompile(`mj-[A-Za-z0-9_-]{43}`).FindString(body)
	if resp.StatusCode != http.StatusOK || secret == "" || !strings.Contains(body, "(admin scope)") {
		t.Fatalf("admin-scoped key from the page: %d %s", resp.StatusCode, clipText(body))
	}
	adminClient{t, e, secret}.must(http.StatusOK, http.MethodGet, "/api/v1/admin/keys", "")
	if r, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(secret)); r.StatusCode != http.StatusForbidden {
		t.Errorf("page's admin key on /v1: %d", r.StatusCode)
	}

	worker := e.signedIn("worker@example.com", false)
	wtoken := mustMe(e, worker).CSRFToken
	if _, page := e.fetch(worker, http.MethodGet, "/keys", nil, nil); strings.Contains(page, `name="scope"`) {
		t.Error("a scope choice on a non-admin's /keys")
	}
	resp, body = e.fetch(worker, http.MethodPost, "/keys", url.Values{"name": {"sneaky"}, "scope": {"admin"}, "_csrf": {wtoken}}, nil)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "Only admins") {
		t.Errorf("admin scope from a non-admin: %d %s", resp.StatusCode, clipText(body))
	}
	var n int64
	e.DB.Model(&models.APIKey{}).Where("name = ?", "sneaky").Count(&n)
	if n != 0 {
		t.Error("a non-admin made an admin-scoped key")
	}
}
