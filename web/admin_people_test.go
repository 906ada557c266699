package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"moonji/internal/apikey"
	"moonji/models"
)

// TestDisablePerson is the people page over real HTTP, on two replicas that
// share one database (each with its own key cache): disabling a person ends
// their sessions everywhere at once, stops their key at once on the replica
// that disabled them and on the other within its cache's TTL, keeps them
// from signing in again; enabling gives them their key back and lets them
// sign in. An admin cannot disable themself, nor can a disabled admin go on.
func TestDisablePerson(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		a := startEnv(t, db)
		b := startEnv(t, db)
		// A keeps its cache for an hour: only ForgetUser can make it refuse
		// at once. B's short TTL stands for the 5 s default without the wait.
		a.srv.KeyStore().SetCacheTTL(time.Hour)
		b.srv.KeyStore().SetCacheTTL(200 * time.Millisecond)
		ctx := context.Background()

		person := a.signedIn("worker@example.com", false)
		boss := a.signedIn("boss@example.com", true)
		deputy := a.signedIn("deputy@example.com", true)
		bossToken := mustMe(a, boss).CSRFToken
		key := a.newKey("worker@example.com", 0)
		worker, _ := models.UserByEmail(ctx, a.DB, "worker@example.com")
		bossUser, _ := models.UserByEmail(ctx, a.DB, "boss@example.com")
		deputyUser, _ := models.UserByEmail(ctx, a.DB, "deputy@example.com")

		// The key is cached on both replicas, the session works on both.
		for _, e := range []*testEnv{a, b} {
			if resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(key)); resp.StatusCode != 200 {
				t.Fatalf("key before disabling on %s: %d %s", e.URL, resp.StatusCode, body)
			}
			if resp, _ := e.fetch(noRedirects(person), http.MethodGet, "/keys", nil, nil); resp.StatusCode != 200 {
				t.Fatalf("person's page before disabling on %s: %d", e.URL, resp.StatusCode)
			}
		}

		// The list: everyone, with their active keys; the admin's own row
		// has no button.
		resp, body := a.fetch(boss, http.MethodGet, "/admin/people", nil, nil)
		if resp.StatusCode != 200 || !strings.Contains(body, "worker@example.com") || !strings.Contains(body, "deputy@example.com") ||
			!strings.Contains(body, `href="/admin/keys?owner=worker%40example.com"`) ||
			!strings.Contains(body, personPath(worker.ID, "disable")) || strings.Contains(body, personPath(bossUser.ID, "disable")) {
			t.Fatalf("people page: %d\n%s", resp.StatusCode, body)
		}

		// Disable, as htmx does: the row comes back, disabled.
		htmx := map[string]string{"HX-Request": "true", "X-CSRF-Token": bossToken}
		resp, body = a.fetch(boss, http.MethodPost, personPath(worker.ID, "disable"), url.Values{}, htmx)
		if resp.StatusCode != 200 || strings.Contains(body, "<html") || !strings.Contains(body, `data-status="disabled"`) ||
			!strings.Contains(body, personPath(worker.ID, "enable")) {
			t.Fatalf("disable via htmx: %d\n%s", resp.StatusCode, body)
		}

		// The sessions are gone, on both replicas: a page goes to the sign-in,
		// /api answers 401.
		resp, _ = b.fetch(noRedirects(person), http.MethodGet, "/keys", nil, nil)
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login?next=") {
			t.Errorf("disabled person's page on the other replica: %d → %q, want 303 to the sign-in", resp.StatusCode, resp.Header.Get("Location"))
		}
		if status, _ := a.me(person); status != http.StatusUnauthorized {
			t.Errorf("disabled person's /api/me: %d, want 401", status)
		}
		var sessions int64
		a.DB.Model(&models.Session{}).Where("user_id = ?", worker.ID).Count(&sessions)
		if sessions != 0 {
			t.Errorf("%d sessions left for the disabled person", sessions)
		}

		// The key: refused at once here (its cache would keep it an hour),
		// in OpenAI's shape, with a ledger row like any refused key.
		r := a.postWith(ctx, key, chatBody)
		var e401 struct {
			Error struct{ Message, Type, Code string }
		}
		json.Unmarshal([]byte(readAll(t, r.Body)), &e401)
		r.Body.Close()
		if r.StatusCode != 401 || e401.Error.Code != "invalid_api_key" || e401.Error.Type != "invalid_request_error" ||
			!strings.Contains(e401.Error.Message, "owner of this API key has been disabled") {
			t.Errorf("disabled person's key on this replica: %d %+v", r.StatusCode, e401)
		}
		if row := a.final(r.Header.Get("X-Inference-Id")); row.Outcome != "rejected" || row.Reason != "unauthorized" || row.Status != 401 {
			t.Errorf("refused key's row: %+v", row)
		}
		// ...and on the other replica once its cached copy expires.
		waitStatus(t, b, key, http.StatusUnauthorized)

		// A disabled person cannot sign in again: the provider still vouches
		// for them (its own session in their browser), Moonji refuses.
		resp, body = a.fetch(person, http.MethodGet, "/login", nil, nil)
		if resp.StatusCode != http.StatusForbidden || resp.Request.URL.Path != "/auth/callback" || !strings.Contains(body, "disabled your Moonji account") {
			t.Errorf("sign-in of a disabled person: %d at %s\n%s", resp.StatusCode, resp.Request.URL.Path, body)
		}
		resp, _ = a.signIn(browser(t), "/login", "worker@example.com", testPassword)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("sign-in through the form of a disabled person: %d, want 403", resp.StatusCode)
		}
		sessions = 0
		a.DB.Model(&models.Session{}).Where("user_id = ?", worker.ID).Count(&sessions)
		if sessions != 0 {
			t.Errorf("a refused sign-in left %d sessions", sessions)
		}

		// An admin cannot disable themself.
		resp, body = a.fetch(boss, http.MethodPost, personPath(bossUser.ID, "disable"), url.Values{"_csrf": {bossToken}}, nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "You cannot disable yourself") {
			t.Errorf("self-disable: %d\n%s", resp.StatusCode, body)
		}
		if u, _ := models.UserByID(ctx, a.DB, bossUser.ID); u.Disabled() {
			t.Fatal("the admin disabled themself")
		}

		// Another admin can be disabled, and is then no admin of anything.
		resp, _ = a.fetch(boss, http.MethodPost, personPath(deputyUser.ID, "disable"), url.Values{"_csrf": {bossToken}}, nil)
		if resp.StatusCode != 200 || resp.Request.URL.Path != "/admin/people" {
			t.Fatalf("disable another admin: %d at %s", resp.StatusCode, resp.Request.URL)
		}
		resp, _ = b.fetch(noRedirects(deputy), http.MethodGet, "/admin/people", nil, nil)
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("disabled admin on /admin/people: %d, want 303 to the sign-in", resp.StatusCode)
		}

		// Enable, as a plain form: back to the list (filter kept), the key
		// works again at once on both replicas, sign-in works again.
		resp, body = a.fetch(boss, http.MethodPost, personPath(worker.ID, "enable"),
			url.Values{"_csrf": {bossToken}, "email": {"work"}}, nil)
		if resp.StatusCode != 200 || resp.Request.URL.RequestURI() != "/admin/people?done=enabled&email=work" ||
			!strings.Contains(body, "Enabled") || strings.Contains(body, "deputy@example.com") {
			t.Fatalf("enable: %d at %s\n%s", resp.StatusCode, resp.Request.URL, body)
		}
		for _, e := range []*testEnv{a, b} {
			if resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(key)); resp.StatusCode != 200 {
				t.Errorf("key after enabling on %s: %d %s", e.URL, resp.StatusCode, body)
			}
		}
		again := browser(t)
		if resp, _ := a.signIn(again, "/login", "worker@example.com", testPassword); resp.StatusCode != 200 || resp.Request.URL.Path != "/" {
			t.Errorf("sign-in after enabling: %d at %s", resp.StatusCode, resp.Request.URL)
		}
		if u, _ := models.UserByID(ctx, a.DB, worker.ID); u.Disabled() || u.LastLoginAt == nil {
			t.Errorf("after enabling and signing in: %+v", u)
		}
	})
}

// personPath is a people row's action.
func personPath(id uint, action string) string {
	return fmt.Sprintf("/admin/people/%d/%s", id, action)
}

// waitStatus polls e with key on /v1/models until it answers want; the
// other replica's key cache decides when, within its TTL.
func waitStatus(t *testing.T, e *testEnv, key string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(key))
		if resp.StatusCode == want {
			if want == http.StatusUnauthorized && !strings.Contains(body, "disabled") {
				t.Errorf("refused on %s, but not for the owner: %s", e.URL, body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still answers %d (%s) after 10 s, want %d", e.URL, resp.StatusCode, body, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPeopleRequests checks what the people and keys pages make of hostile
// requests: ids that are not rows or not numbers are 404, a missing or
// wrong CSRF token is 403, a person who is no admin gets 403, filters of
// any kind are a list (or a 400 sentence when too long), never an error,
// and whatever was typed comes back escaped.
func TestPeopleRequests(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		person := e.signedIn("plain@example.com", false)
		boss := e.signedIn("boss@example.com", true)
		token := mustMe(e, boss).CSRFToken
		personToken := mustMe(e, person).CSRFToken
		plain, _ := models.UserByEmail(context.Background(), e.DB, "plain@example.com")

		for _, id := range []string{"0", "-1", "abc", "1e3", "+1", "%2B1", "0x10", "1.0", "%20", "99999999",
			"9223372036854775807", "9223372036854775808", "18446744073709551615", "1%00", "1;DROP%20TABLE%20users"} {
			for _, action := range []string{"disable", "enable"} {
				path := "/admin/people/" + id + "/" + action
				if resp, body := e.fetch(boss, http.MethodPost, path, url.Values{"_csrf": {token}}, nil); resp.StatusCode != http.StatusNotFound {
					t.Errorf("POST %s: %d, want 404\n%s", path, resp.StatusCode, body)
				}
			}
			path := "/admin/keys/" + id + "/revoke"
			if resp, body := e.fetch(boss, http.MethodPost, path, url.Values{"_csrf": {token}}, nil); resp.StatusCode != http.StatusNotFound {
				t.Errorf("POST %s: %d, want 404\n%s", path, resp.StatusCode, body)
			}
		}

		target := personPath(plain.ID, "disable")
		for name, form := range map[string]url.Values{"no token": {}, "wrong token": {"_csrf": {"wrong"}},
			"another session's token": {"_csrf": {personToken}}} {
			if resp, _ := e.fetch(boss, http.MethodPost, target, form, nil); resp.StatusCode != http.StatusForbidden {
				t.Errorf("disable with %s: %d, want 403", name, resp.StatusCode)
			}
		}
		if resp, _ := e.fetch(person, http.MethodPost, personPath(plain.ID+1, "disable"), url.Values{"_csrf": {personToken}}, nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a non-admin disables someone: %d, want 403", resp.StatusCode)
		}
		if u, _ := models.UserByID(context.Background(), e.DB, plain.ID); u.Disabled() {
			t.Fatal("a refused request disabled the person")
		}

		for _, page := range []struct{ path, param string }{{"/admin/people", "email"}, {"/admin/keys", "owner"}} {
			for _, filter := range []string{"%", "_", `\`, "' OR 1=1 --", "\x00", "a\x00b", "\xff\xfe", "%%%%%%%%",
				"<script>alert(1)</script>", "\"><img src=x>", "PLAIN@EXAMPLE.COM", strings.Repeat("é", 320)} {
				path := page.path + "?" + url.Values{page.param: {filter}}.Encode()
				resp, body := e.fetch(boss, http.MethodGet, path, nil, nil)
				if resp.StatusCode != 200 {
					t.Errorf("GET %s: %d, want 200\n%s", path, resp.StatusCode, body)
				}
				if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x>") {
					t.Errorf("GET %s: the filter came back unescaped", path)
				}
			}
			// An exact (and differently written) email finds its row.
			_, body := e.fetch(boss, http.MethodGet, page.path+"?"+url.Values{page.param: {"PLAIN@example.com"}}.Encode(), nil, nil)
			if page.path == "/admin/people" && (!strings.Contains(body, "<td>plain@example.com</td>") || strings.Contains(body, "<td>boss@example.com</td>")) {
				t.Errorf("people filtered by an exact email:\n%s", body)
			}
			// Longer than any email: a sentence, not an error.
			path := page.path + "?" + url.Values{page.param: {strings.Repeat("a", 321)}}.Encode()
			if resp, body := e.fetch(boss, http.MethodGet, path, nil, nil); resp.StatusCode != http.StatusBadRequest ||
				!strings.Contains(body, "The filter is too long") {
				t.Errorf("GET %s…: %d, want 400 with a sentence", path[:40], resp.StatusCode)
			}
		}

		// The keys page's owner filter keeps the owner's keys only, and a
		// revoke from it comes back to the same list.
		e.newKey("plain@example.com", 0)
		_, body := e.fetch(boss, http.MethodGet, "/admin/keys?owner=plain", nil, nil)
		if !strings.Contains(body, "plain@example.com") || strings.Contains(body, "owner@example.com") {
			t.Errorf("keys filtered by owner:\n%s", body)
		}
		k, _ := models.APIKeyByHash(context.Background(), e.DB, apikey.Hash(e.Key))
		resp, _ := e.fetch(boss, http.MethodPost, fmt.Sprintf("/admin/keys/%d/revoke", k.ID),
			url.Values{"_csrf": {token}, "owner": {"owner@"}}, nil)
		if resp.StatusCode != 200 || resp.Request.URL.RequestURI() != "/admin/keys?owner=owner%40" {
			t.Errorf("revoke from a filtered list: %d at %s", resp.StatusCode, resp.Request.URL)
		}
	})
}
