package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"moonji/internal/apikey"
	"moonji/models"
)

// TestLoginThroughEmbeddedProvider signs in through the real server: the
// relying party discovers the embedded provider over HTTP, sends the browser
// to its form with a PKCE challenge, exchanges the code with the verifier and
// starts a session whose cookie is HttpOnly, SameSite=Lax and rotated.
func TestLoginThroughEmbeddedProvider(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		e.addPerson("admin@localhost", true)
		c := browser(t)

		resp, body := e.fetch(c, http.MethodGet, "/", nil, nil)
		if resp.StatusCode != 200 || !strings.Contains(body, `href="/login"`) {
			t.Fatalf("home signed out: %d\n%s", resp.StatusCode, body)
		}
		// /login sends the browser to the provider's authorize with a PKCE challenge.
		resp, _ = e.fetch(noRedirects(c), http.MethodGet, "/login", nil, nil)
		loc, _ := url.Parse(resp.Header.Get("Location"))
		if resp.StatusCode != http.StatusSeeOther || loc.Path != "/idp/authorize" || loc.Query().Get("code_challenge_method") != "S256" ||
			loc.Query().Get("code_challenge") == "" || loc.Query().Get("client_id") != "moonji" || loc.Query().Get("state") == "" {
			t.Fatalf("/login: %d → %s", resp.StatusCode, loc)
		}
		// A cookie planted before sign-in must not survive it.
		u, _ := url.Parse(e.URL)
		c.Jar.SetCookies(u, []*http.Cookie{{Name: "moonji_session", Value: "planted-by-an-attacker"}})

		resp, body = e.signIn(c, "/keys", "admin@localhost", testPassword)
		if resp.StatusCode != 200 || resp.Request.URL.Path != "/keys" || !strings.Contains(body, "Create key") {
			t.Fatalf("after sign-in: %s (%d)\n%s", resp.Request.URL, resp.StatusCode, body)
		}
		var setCookie string
		for r := resp.Request; r.Response != nil; r = r.Response.Request {
			if r.Response.Request.URL.Path == "/auth/callback" {
				for _, sc := range r.Response.Header.Values("Set-Cookie") {
					if strings.HasPrefix(sc, "moonji_session=") {
						setCookie = sc
					}
				}
			}
		}
		lc := strings.ToLower(setCookie)
		if !strings.Contains(lc, "httponly") || !strings.Contains(lc, "samesite=lax") || !strings.Contains(lc, "path=/") || strings.Contains(lc, "secure") {
			t.Errorf("session cookie %q: want HttpOnly, SameSite=Lax, Path=/ and not Secure over http", setCookie)
		}

		cookie := e.sessionCookie(c)
		if cookie == "" || cookie == "planted-by-an-attacker" {
			t.Fatalf("session cookie %q after sign-in", cookie)
		}
		var rows []models.Session
		e.DB.Find(&rows)
		if len(rows) != 1 || rows[0].ID == cookie || rows[0].IDToken == "" {
			t.Fatalf("session rows %+v: want one, stored by hash, with the ID token", rows)
		}
		status, who := e.me(c)
		if status != 200 || who.Email != "admin@localhost" || !who.Admin || who.CSRFToken == "" {
			t.Fatalf("/api/me = %d %+v", status, who)
		}
		user, _ := models.UserByEmail(context.Background(), e.DB, "admin@localhost")
		if user.Issuer != e.URL+"/idp" || user.Subject == "" {
			t.Errorf("user identity %q/%q", user.Issuer, user.Subject)
		}

		// Signed in, /login goes straight on.
		resp, _ = e.fetch(noRedirects(c), http.MethodGet, "/login", nil, nil)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
			t.Errorf("/login while signed in: %d → %s, want 303 → /", resp.StatusCode, resp.Header.Get("Location"))
		}

		// Logging out needs the CSRF token...
		resp, _ = e.fetch(c, http.MethodPost, "/logout", url.Values{}, nil)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("logout without CSRF token: %d, want 403", resp.StatusCode)
		}
		// ...then ends the session here and at the provider, and comes home.
		resp, body = e.fetch(c, http.MethodPost, "/logout", url.Values{"_csrf": {who.CSRFToken}}, nil)
		if resp.StatusCode != 200 || resp.Request.URL.Path != "/" || !strings.Contains(body, `href="/login"`) {
			t.Fatalf("logout ended at %s (%d)\n%s", resp.Request.URL, resp.StatusCode, body)
		}
		var passedEndSession bool
		for r := resp.Request; r.Response != nil; r = r.Response.Request {
			if strings.HasSuffix(r.Response.Request.URL.Path, "/idp/end_session") {
				passedEndSession = true
			}
		}
		if !passedEndSession {
			t.Error("logout did not go through the provider's end_session")
		}
		if status, _ := e.me(c); status != http.StatusUnauthorized {
			t.Errorf("/api/me after logout: %d, want 401", status)
		}
		var n int64
		e.DB.Model(&models.Session{}).Count(&n)
		if n != 0 {
			t.Errorf("%d session rows after logout", n)
		}
		// The provider's own session ended too: signing in shows the form again.
		e.signIn(c, "/login", "admin@localhost", testPassword)
	})
}

// TestSessionRotation checks that a second sign-in in the same browser
// replaces the session instead of adding one.
func TestSessionRotation(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	c := e.signedIn("user@example.com", false)
	first := e.sessionCookie(c)
	// prompt=login at the provider is not needed: its session answers at once.
	e.DB.Where("1 = 1").Delete(&models.LoginState{})
	resp, _ := e.fetch(c, http.MethodPost, "/logout", url.Values{"_csrf": {mustMe(e, c).CSRFToken}}, nil)
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	u, _ := url.Parse(e.URL)
	c.Jar.SetCookies(u, []*http.Cookie{{Name: "moonji_session", Value: first}})
	e.signIn(c, "/login", "user@example.com", testPassword)
	second := e.sessionCookie(c)
	if second == "" || second == first {
		t.Fatalf("session cookie not rotated: %q → %q", first, second)
	}
	var n int64
	e.DB.Model(&models.Session{}).Count(&n)
	if n != 1 {
		t.Errorf("%d sessions after signing in twice, want 1", n)
	}
}

func mustMe(e *testEnv, c *http.Client) me {
	e.t.Helper()
	status, m := e.me(c)
	if status != 200 {
		e.t.Fatalf("/api/me: %d", status)
	}
	return m
}

// TestAccessRules is the table of who may use what: keys open /v1 only;
// pages and /api want a session; /admin wants an admin.
func TestAccessRules(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		ctx := context.Background()
		owner, _ := models.UserByEmail(ctx, e.DB, "owner@example.com")
		revoked, rk, _ := apikey.Create(ctx, e.DB, owner.ID, "revoked", 0, 0)
		models.RevokeAPIKey(ctx, e.DB, rk.ID, 0)
		expired, ek, _ := apikey.Create(ctx, e.DB, owner.ID, "expired", time.Hour, 0)
		e.DB.Model(ek).Update("expires_at", time.Now().Add(-time.Minute))
		user := e.signedIn("user@example.com", false)
		admin := e.signedIn("boss@example.com", true)

		type who struct {
			name   string
			key    string
			client *http.Client
		}
		anon := browser(t)
		callers := []who{
			{"no auth", "", anon},
			{"bad key", apikey.Prefix + strings.Repeat("x", 43), anon},
			{"revoked key", revoked, anon},
			{"expired key", expired, anon},
			{"valid key", e.Key, anon},
			{"session", "", user},
			{"admin session", "", admin},
		}
		endpoints := []struct {
			method, path string
			want         []int // per caller, in callers' order
		}{
			{"POST", "/v1/chat/completions", []int{401, 401, 401, 401, 200, 200, 200}},
			{"GET", "/v1/models", []int{401, 401, 401, 401, 200, 200, 200}},
			{"GET", "/api/me", []int{401, 401, 401, 401, 401, 200, 200}},
			// A key on a page is a program's mistake: 401, not the sign-in.
			{"GET", "/keys", []int{303, 401, 401, 401, 401, 200, 200}},
			{"GET", "/admin/keys", []int{303, 401, 401, 401, 401, 403, 200}},
		}
		for _, ep := range endpoints {
			for i, cl := range callers {
				t.Run(fmt.Sprintf("%s %s/%s", ep.method, ep.path, cl.name), func(t *testing.T) {
					hdr := map[string]string{"Content-Type": "application/json"}
					if cl.key != "" {
						hdr["Authorization"] = "Bearer " + cl.key
					}
					if cl.client != anon {
						// The chat page sends its session's CSRF token.
						hdr["X-CSRF-Token"] = mustMe(e, cl.client).CSRFToken
					}
					var resp *http.Response
					if ep.method == "POST" {
						req, _ := http.NewRequest(ep.method, e.URL+ep.path, strings.NewReader(chatBody))
						for k, v := range hdr {
							req.Header.Set(k, v)
						}
						var err error
						resp, err = noRedirects(cl.client).Do(req)
						if err != nil {
							t.Fatal(err)
						}
						resp.Body.Close()
					} else {
						resp, _ = e.fetch(noRedirects(cl.client), ep.method, ep.path, nil, hdr)
					}
					if resp.StatusCode != ep.want[i] {
						t.Errorf("%d, want %d", resp.StatusCode, ep.want[i])
					}
					if resp.StatusCode == 303 && !strings.HasPrefix(resp.Header.Get("Location"), "/login?next=") {
						t.Errorf("redirect to %q, want the sign-in", resp.Header.Get("Location"))
					}
					if resp.StatusCode == 401 && !strings.HasPrefix(ep.path, "/v1/") && !strings.HasPrefix(ep.path, "/api/") &&
						resp.Header.Get("WWW-Authenticate") != "Bearer" {
						t.Errorf("a key refused on a page: WWW-Authenticate %q, want Bearer", resp.Header.Get("WWW-Authenticate"))
					}
				})
			}
		}
	})
}

// TestCSRF checks that a session's state-changing requests need its token.
func TestCSRF(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	c := e.signedIn("user@example.com", false)
	token := mustMe(e, c).CSRFToken

	resp, _ := e.fetch(c, http.MethodPost, "/keys", url.Values{"name": {"x"}}, nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST /keys without token: %d, want 403", resp.StatusCode)
	}
	resp, _ = e.fetch(c, http.MethodPost, "/keys", url.Values{"name": {"x"}, "_csrf": {"wrong"}}, nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST /keys with a wrong token: %d, want 403", resp.StatusCode)
	}
	resp, _ = e.fetch(c, http.MethodPost, "/keys", url.Values{"name": {"x"}}, map[string]string{"X-CSRF-Token": token})
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST /keys with the header: %d, want 200", resp.StatusCode)
	}
	// /v1 with a session and no token is as if unauthenticated.
	req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	r2, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /v1 with a session but no CSRF header: %d, want 401", r2.StatusCode)
	}
	// A session-authenticated inference is recorded as the person's, from the web.
	req, _ = http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-CSRF-Token", token)
	r3, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r3.Body.Close()
	if r3.StatusCode != 200 {
		t.Fatalf("POST /v1 with session and token: %d", r3.StatusCode)
	}
	row := e.final(r3.Header.Get("X-Inference-Id"))
	if row.Source != "web" || row.KeyID != nil || row.User != "user@example.com" {
		t.Errorf("ledger row %+v: want source web, no key, the person", row)
	}
}

var reSecret = regexp.MustCompile(`value="(mj-[A-Za-z0-9_-]{43})"`)

// TestKeysPages creates, uses and revokes a key on the pages, and checks
// that people see their own keys and admins everyone's.
func TestKeysPages(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	c := e.signedIn("user@example.com", false)
	token := mustMe(e, c).CSRFToken

	resp, body := e.fetch(c, http.MethodPost, "/keys", url.Values{"name": {"ci-runner-7"}, "expires_days": {"30"}, "rpm": {"7"}, "_csrf": {token}}, nil)
	m := reSecret.FindStringSubmatch(body)
	if resp.StatusCode != 200 || m == nil || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("create: %d (Cache-Control %q)\n%s", resp.StatusCode, resp.Header.Get("Cache-Control"), body)
	}
	secret := m[1]
	_, list := e.fetch(c, http.MethodGet, "/keys", nil, nil)
	if strings.Contains(list, secret) || !strings.Contains(list, secret[:11]) || !strings.Contains(list, "ci-runner-7") {
		t.Fatalf("list shows the secret again, or not the key:\n%s", list)
	}
	key, err := models.APIKeyByHash(context.Background(), e.DB, apikey.Hash(secret))
	if err != nil || key.RPM != 7 || key.ExpiresAt == nil || time.Until(*key.ExpiresAt) < 29*24*time.Hour {
		t.Fatalf("stored key %+v, %v", key, err)
	}
	if r := e.postWith(context.Background(), secret, chatBody); r.StatusCode != 200 {
		t.Fatalf("new key on /v1: %d", r.StatusCode)
	}

	// htmx gets the fragment; an invalid form is explained, nothing created.
	resp, body = e.fetch(c, http.MethodPost, "/keys", url.Values{"name": {""}}, map[string]string{"HX-Request": "true", "X-CSRF-Token": token})
	if resp.StatusCode != 200 || strings.Contains(body, "<html") || !strings.Contains(body, "Give the key a name") {
		t.Errorf("htmx create without name: %d\n%s", resp.StatusCode, body)
	}

	// Someone else's key cannot be revoked from /keys; one's own can.
	other := e.signedIn("other@example.com", false)
	otherToken := mustMe(e, other).CSRFToken
	path := fmt.Sprintf("/keys/%d/revoke", key.ID)
	if resp, _ := e.fetch(other, http.MethodPost, path, url.Values{"_csrf": {otherToken}}, nil); resp.StatusCode != 404 {
		t.Errorf("revoking another's key: %d, want 404", resp.StatusCode)
	}
	if _, body := e.fetch(other, http.MethodGet, "/keys", nil, nil); strings.Contains(body, "ci-runner-7") {
		t.Error("another person sees the key")
	}
	resp, body = e.fetch(c, http.MethodPost, path, nil, map[string]string{"HX-Request": "true", "X-CSRF-Token": token})
	if resp.StatusCode != 200 || !strings.Contains(body, `data-status="revoked"`) || strings.Contains(body, "<html") {
		t.Fatalf("revoke via htmx: %d\n%s", resp.StatusCode, body)
	}
	if r := e.postWith(context.Background(), secret, chatBody); r.StatusCode != 401 {
		t.Fatalf("revoked key on /v1: %d, want 401", r.StatusCode)
	}

	// Admins see everyone's keys and revoke any.
	admin := e.signedIn("boss@example.com", true)
	_, body = e.fetch(admin, http.MethodGet, "/admin/keys", nil, nil)
	if !strings.Contains(body, "ci-runner-7") || !strings.Contains(body, "owner@example.com") || !strings.Contains(body, "user@example.com") {
		t.Fatalf("admin list lacks keys:\n%s", body)
	}
	ownerKey, _ := models.APIKeyByHash(context.Background(), e.DB, apikey.Hash(e.Key))
	resp, _ = e.fetch(admin, http.MethodPost, fmt.Sprintf("/admin/keys/%d/revoke", ownerKey.ID), url.Values{"_csrf": {mustMe(e, admin).CSRFToken}}, nil)
	if resp.StatusCode != 200 || resp.Request.URL.Path != "/admin/keys" {
		t.Fatalf("admin revoke: %d at %s", resp.StatusCode, resp.Request.URL)
	}
	if r := e.post(chatBody); r.StatusCode != 401 {
		t.Errorf("key revoked by an admin still works: %d", r.StatusCode)
	}
	if resp, _ := e.fetch(c, http.MethodPost, fmt.Sprintf("/admin/keys/%d/revoke", key.ID), url.Values{"_csrf": {token}}, nil); resp.StatusCode != 403 {
		t.Errorf("non-admin on /admin revoke: %d, want 403", resp.StatusCode)
	}
}

// TestFailedKeysAreLimited checks that an address sending bad keys is
// refused for a while, and that good keys from elsewhere are not affected.
func TestFailedKeysAreLimited(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	bad := apikey.Prefix + strings.Repeat("b", 43)
	for i := 0; i < 30; i++ {
		r := e.postWith(context.Background(), bad, chatBody)
		r.Body.Close()
		if r.StatusCode != 401 {
			t.Fatalf("bad key #%d: %d, want 401", i+1, r.StatusCode)
		}
	}
	r := e.postWith(context.Background(), bad, chatBody)
	body := readAll(t, r.Body)
	if r.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "Too many failed authentications") {
		t.Fatalf("after 30 failures: %d %s, want 429", r.StatusCode, body)
	}
	// Refused, but still one ledger row like every request.
	if row := e.final(r.Header.Get("X-Inference-Id")); row.Outcome != "rejected" || row.Reason != "auth_blocked" || row.Status != 429 {
		t.Errorf("blocked request's row = %+v", row)
	}
	// Requests without credentials are not the limiter's business.
	if resp, _ := e.fetch(browser(t), http.MethodGet, "/healthz", nil, nil); resp.StatusCode != 200 {
		t.Errorf("/healthz from a blocked address: %d", resp.StatusCode)
	}
}

// TestStaticFiles checks the embedded assets, vendored htmx included.
func TestStaticFiles(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	for path, want := range map[string]string{
		"/static/app.css":                    "color-scheme",
		"/static/app.js":                     "data-copy",
		"/static/vendor/htmx.min.js":         "htmx",
		"/static/vendor/htmx-ext-sse.min.js": "sse",
	} {
		resp, body := e.fetch(browser(t), http.MethodGet, path, nil, nil)
		if resp.StatusCode != 200 || !strings.Contains(body, want) {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
	}
}
