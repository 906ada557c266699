package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"moonji/internal/apikey"
	"moonji/internal/auth"
	"moonji/internal/config"
	"moonji/models"
)

// haBadKey is a well-formed key that names no key.
var haBadKey = apikey.Prefix + strings.Repeat("b", 43)

// haDo sends one request in browser c (nil: no cookies) with a body and
// headers, and returns the answer with its body read.
func haDo(t *testing.T, e *testEnv, c *http.Client, method, path, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	req, err := http.NewRequest(method, e.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noRedirects(c).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	return resp, readAll(t, resp.Body)
}

func haBearer(key string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + key}
}

// haFailKeys sends n bad keys to /v1/models with extra headers; each must
// be answered 401.
func haFailKeys(t *testing.T, e *testEnv, n int, hdr map[string]string) {
	t.Helper()
	h := haBearer(haBadKey)
	for k, v := range hdr {
		h[k] = v
	}
	for i := 0; i < n; i++ {
		if resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", h); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("bad key #%d: %d %s, want 401", i+1, resp.StatusCode, body)
		}
	}
}

// TestValidCredentialsWorkFromBlockedAddress checks that thirty bad keys
// from one address (everyone behind a NAT) block bad keys only: a valid key
// and a valid session from the same address still work.
func TestValidCredentialsWorkFromBlockedAddress(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	person := e.signedIn("nat@example.com", false)
	token := mustMe(e, person).CSRFToken

	haFailKeys(t, e, auth.DefaultFailureLimit, nil)
	if resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(haBadKey)); resp.StatusCode != http.StatusTooManyRequests ||
		!strings.Contains(body, "Too many failed authentications") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("bad key from a blocked address: %d %s, want 429 with Retry-After", resp.StatusCode, body)
	}

	// A valid key from the blocked address.
	if resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(e.Key)); resp.StatusCode != http.StatusOK {
		t.Errorf("valid key on /v1/models from a blocked address: %d %s", resp.StatusCode, body)
	}
	r := e.post(chatBody)
	body := readAll(t, r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Errorf("valid key on /v1/chat/completions from a blocked address: %d %s", r.StatusCode, body)
	}

	// A session signed in before the block, and one signed in after it.
	if status, _ := e.me(person); status != http.StatusOK {
		t.Errorf("valid session on /api/me from a blocked address: %d", status)
	}
	if resp, body := haDo(t, e, person, http.MethodPost, "/v1/chat/completions", chatBody,
		map[string]string{"X-CSRF-Token": token}); resp.StatusCode != http.StatusOK {
		t.Errorf("valid session on /v1 from a blocked address: %d %s", resp.StatusCode, body)
	}
	if resp, _ := e.fetch(person, http.MethodGet, "/keys", nil, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("valid session on /keys from a blocked address: %d", resp.StatusCode)
	}
	later := e.signedIn("later@example.com", false)
	if status, _ := e.me(later); status != http.StatusOK {
		t.Errorf("session started at a blocked address: %d", status)
	}

	// A stale cookie from the blocked address is a failed credential: 429,
	// and it is cleared so that the browser can sign in again.
	stale := browser(t)
	u, _ := url.Parse(e.URL)
	stale.Jar.SetCookies(u, []*http.Cookie{{Name: "moonji_session", Value: "stale-or-forged"}})
	if status, _ := e.me(stale); status != http.StatusTooManyRequests {
		t.Errorf("stale session cookie from a blocked address: %d, want 429", status)
	}
	if e.sessionCookie(stale) != "" {
		t.Error("the stale cookie was not cleared")
	}
}

// TestForwardedForNeedsATrustedProxy checks whose address X-Forwarded-For
// may name: from an untrusted peer the header is ignored (a client cannot
// dodge its block by inventing addresses); from a trusted proxy it tells
// the clients behind it apart.
func TestForwardedForNeedsATrustedProxy(t *testing.T) {
	t.Run("untrusted peer", func(t *testing.T) {
		e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) {
			c.TrustedProxies = []string{"10.0.0.0/8"} // not the test's 127.0.0.1
		})
		for i := 0; i < auth.DefaultFailureLimit; i++ {
			haFailKeys(t, e, 1, map[string]string{"X-Forwarded-For": "198.51.100." + strconv.Itoa(i+1)})
		}
		resp, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "",
			map[string]string{"Authorization": "Bearer " + haBadKey, "X-Forwarded-For": "198.51.100.200"})
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("invented X-Forwarded-For escaped the block: %d, want 429", resp.StatusCode)
		}
	})
	t.Run("trusted proxy", func(t *testing.T) {
		e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) {
			c.TrustedProxies = []string{"127.0.0.1"}
		})
		// The client's own claim (left) is ignored; the proxy's entry counts.
		haFailKeys(t, e, auth.DefaultFailureLimit, map[string]string{"X-Forwarded-For": "192.0.2.99, 198.51.100.1"})
		blocked := map[string]string{"Authorization": "Bearer " + haBadKey, "X-Forwarded-For": "198.51.100.1"}
		if resp, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "", blocked); resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("the client behind the proxy is not blocked: %d, want 429", resp.StatusCode)
		}
		other := map[string]string{"Authorization": "Bearer " + haBadKey, "X-Forwarded-For": "198.51.100.2"}
		if resp, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "", other); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("another client behind the same proxy is blocked too: %d, want 401", resp.StatusCode)
		}
		// Without the header the proxy itself is the client, not blocked.
		if resp, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(haBadKey)); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("the proxy's own address is blocked: %d, want 401", resp.StatusCode)
		}
	})
}

// TestKeylessRequestsAreLimited checks the per-address budget of requests
// without a valid credential: over it, 429 in OpenAI's shape with
// Retry-After, while valid keys and sessions from the same address are never
// counted or refused.
func TestKeylessRequestsAreLimited(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) {
		c.RateLimit.UnauthenticatedPerMinute = 5
	})
	person := e.signedIn("chat@example.com", false)
	token := mustMe(e, person).CSRFToken
	for i := 0; i < 5; i++ {
		if resp, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "", nil); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("key-less request #%d: %d, want 401", i+1, resp.StatusCode)
		}
		// Valid credentials in between are not counted.
		if resp, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(e.Key)); resp.StatusCode != http.StatusOK {
			t.Fatalf("valid key: %d", resp.StatusCode)
		}
	}
	for _, req := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/models", ""},
		{http.MethodPost, "/v1/chat/completions", chatBody},
		{http.MethodPost, "/v1/inferences/inf_x/cancel", ""},
	} {
		resp, body := haDo(t, e, nil, req.method, req.path, req.body, nil)
		var got struct {
			Error struct{ Message, Type, Code string }
		}
		json.Unmarshal([]byte(body), &got)
		retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		if resp.StatusCode != http.StatusTooManyRequests || got.Error.Code != "rate_limit_exceeded" || got.Error.Message == "" ||
			got.Error.Type == "" || retry < 1 || retry > 60 {
			t.Errorf("%s %s over the key-less limit: %d Retry-After %q %s, want 429 in OpenAI's shape with Retry-After",
				req.method, req.path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	// A failed key is no way around it.
	if resp, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(haBadKey)); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("bad key over the key-less limit: %d, want 429", resp.StatusCode)
	}
	// Valid credentials still work.
	if resp, body := haDo(t, e, nil, http.MethodPost, "/v1/chat/completions", chatBody, haBearer(e.Key)); resp.StatusCode != http.StatusOK {
		t.Errorf("valid key after the limit: %d %s", resp.StatusCode, body)
	}
	if resp, body := haDo(t, e, person, http.MethodPost, "/v1/chat/completions", chatBody,
		map[string]string{"X-CSRF-Token": token}); resp.StatusCode != http.StatusOK {
		t.Errorf("valid session after the limit: %d %s", resp.StatusCode, body)
	}
}

// TestBearerSchemeAnyCase checks that the Authorization scheme is matched
// case-insensitively (RFC 9110 11.1), with blanks around the token.
func TestBearerSchemeAnyCase(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	for _, v := range []string{"bearer " + e.Key, "BEARER " + e.Key, "bEaReR " + e.Key, "Bearer   " + e.Key + "  ", "  bearer " + e.Key} {
		if resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", map[string]string{"Authorization": v}); resp.StatusCode != http.StatusOK {
			t.Errorf("Authorization %q: %d %s", v, resp.StatusCode, body)
		}
	}
	r, body := haDo(t, e, nil, http.MethodPost, "/v1/chat/completions", chatBody, map[string]string{"Authorization": "bearer " + e.Key})
	if r.StatusCode != http.StatusOK {
		t.Errorf("chat with a lower-case scheme: %d %s", r.StatusCode, body)
	}
	for _, v := range []string{"Basic " + e.Key, "Bearer", "Bearer ", "Bearer" + e.Key, e.Key} {
		if resp, _ := haDo(t, e, nil, http.MethodGet, "/v1/models", "", map[string]string{"Authorization": v}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", v, resp.StatusCode)
		}
	}
}

// TestPeopleCannotRaiseTheirLimits checks the key form: a non-admin may set
// a key's requests per minute only to the default or up to keys.max_rpm,
// and may hold at most keys.max_per_person live keys; admins are bound by
// neither.
func TestPeopleCannotRaiseTheirLimits(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) {
		c.Keys.MaxPerPerson = 2
		c.Keys.MaxRPM = 50
	})
	person := e.signedIn("pat@example.com", false)
	token := mustMe(e, person).CSRFToken
	create := func(c *http.Client, tok, name, rpm string, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		return e.fetch(c, http.MethodPost, "/keys", url.Values{"name": {name}, "rpm": {rpm}, "_csrf": {tok}}, hdr)
	}

	for _, rpm := range []string{"1000000", "51", "-1", "lots"} {
		resp, body := create(person, token, "greedy", rpm, nil)
		if resp.StatusCode != http.StatusUnprocessableEntity || strings.Contains(body, `id="new-key"`) {
			t.Errorf("non-admin rpm %s: %d, want 422", rpm, resp.StatusCode)
		}
		if rpm == "1000000" && !strings.Contains(body, "at most 50") {
			t.Errorf("the refusal does not say the maximum:\n%s", body)
		}
	}
	if resp, body := create(person, token, "modest", "50", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="new-key"`) {
		t.Fatalf("non-admin rpm 50: %d\n%s", resp.StatusCode, body)
	}
	if resp, body := create(person, token, "default", "", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="new-key"`) {
		t.Fatalf("non-admin default rpm: %d\n%s", resp.StatusCode, body)
	}
	resp, body := create(person, token, "third", "", nil)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, "already have 2 active keys") {
		t.Errorf("third key of a person allowed two: %d\n%s", resp.StatusCode, body)
	}
	// htmx gets the same sentence in the fragment it swaps in.
	resp, body = create(person, token, "third", "", map[string]string{"HX-Request": "true"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "already have 2 active keys") || !strings.Contains(body, `role="alert"`) {
		t.Errorf("htmx third key: %d\n%s", resp.StatusCode, body)
	}

	ctx := context.Background()
	pat, _ := models.UserByEmail(ctx, e.DB, "pat@example.com")
	keys, _ := models.ListAPIKeys(ctx, e.DB, pat.ID)
	if len(keys) != 2 {
		t.Fatalf("pat holds %d keys, want 2", len(keys))
	}
	for _, k := range keys {
		if k.RPM > 50 {
			t.Errorf("key %q has rpm %d", k.Name, k.RPM)
		}
	}
	// Revoked keys do not count.
	if resp, _ := e.fetch(person, http.MethodPost, "/keys/"+strconv.FormatUint(uint64(keys[0].ID), 10)+"/revoke",
		url.Values{"_csrf": {token}}, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	if resp, body := create(person, token, "replacement", "10", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="new-key"`) {
		t.Errorf("key after a revoke: %d\n%s", resp.StatusCode, body)
	}

	admin := e.signedIn("boss@example.com", true)
	adminToken := mustMe(e, admin).CSRFToken
	for i := 0; i < 3; i++ {
		if resp, body := create(admin, adminToken, "batch-"+strconv.Itoa(i), "1000000", nil); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="new-key"`) {
			t.Fatalf("admin key #%d with rpm 1000000: %d\n%s", i+1, resp.StatusCode, body)
		}
	}
	if resp, _ := create(admin, adminToken, "too-much", "1000001", nil); resp.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("admin rpm 1000001: %d, want 422", resp.StatusCode)
	}
}

// TestLoginKeepsOnlyLocalNext checks /login?next= end to end: hostile
// return addresses are stored as "/" in the login state, and the browser
// lands on this site's home after signing in; a local path is kept.
func TestLoginKeepsOnlyLocalNext(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	e.addPerson("next@example.com", false)
	for _, next := range []string{"/\t/evil.example", "/\r\n/evil.example", "/\\evil.example", "//evil.example",
		"/%2F%2Fevil.example", "https:evil.example", "/%09/evil.example", "/\u2028/evil.example"} {
		resp, _ := e.fetch(noRedirects(browser(t)), http.MethodGet, "/login?next="+url.QueryEscape(next), nil, nil)
		loc, _ := url.Parse(resp.Header.Get("Location"))
		if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Query().Get("state") == "" {
			t.Fatalf("/login?next=%q: %d", next, resp.StatusCode)
		}
		var states []models.LoginState
		e.DB.Find(&states)
		for _, s := range states {
			if s.Next != "/" {
				t.Errorf("login state for next=%q keeps %q, want /", next, s.Next)
			}
		}
	}

	// The whole sign-in with a tab trick ends at home, on this site.
	c := browser(t)
	resp, body := e.signIn(c, "/login?next="+url.QueryEscape("/\t/evil.example"), "next@example.com", testPassword)
	if resp.StatusCode != http.StatusOK || resp.Request.URL.String() != e.URL+"/" {
		t.Errorf("sign-in with a hostile next ended at %s (%d)\n%.300s", resp.Request.URL, resp.StatusCode, body)
	}
	// A local page is kept.
	resp, _ = e.signIn(browser(t), "/login?next="+url.QueryEscape("/keys?x=1"), "next@example.com", testPassword)
	if resp.Request.URL.String() != e.URL+"/keys?x=1" {
		t.Errorf("sign-in with next=/keys?x=1 ended at %s", resp.Request.URL)
	}
}

// TestDevProviderAnswersOnlyLocalRequests checks the guard in front of the
// embedded provider: a request that came through a proxy is refused unless
// dev_idp.allow_non_loopback says otherwise.
func TestDevProviderAnswersOnlyLocalRequests(t *testing.T) {
	const discovery = "/idp/.well-known/openid-configuration"
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	if resp, body := haDo(t, e, nil, http.MethodGet, discovery, "", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("local discovery: %d %s", resp.StatusCode, body)
	}
	for _, h := range []string{"X-Forwarded-For", "Forwarded", "X-Real-IP"} {
		for _, path := range []string{discovery, "/idp/authorize", "/idp/login"} {
			if resp, _ := haDo(t, e, nil, http.MethodGet, path, "", map[string]string{h: "203.0.113.7"}); resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s with %s: %d, want 403", path, h, resp.StatusCode)
			}
		}
	}
	// Sign-in through the guarded provider still works.
	e.signedIn("local@example.com", false)

	open := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) { c.DevIDP.AllowNonLoopback = true })
	if resp, _ := haDo(t, open, nil, http.MethodGet, discovery, "", map[string]string{"X-Forwarded-For": "203.0.113.7"}); resp.StatusCode != http.StatusOK {
		t.Errorf("allow_non_loopback: %d, want 200", resp.StatusCode)
	}
}

// TestDevAdminPasswordInFile checks that a generated development admin
// password lands in a 0600 file next to the database, and works.
func TestDevAdminPasswordInFile(t *testing.T) {
	t.Setenv(auth.DevAdminPasswordEnv, "")
	dir := t.TempDir()
	e := startEnv(t, "sqlite://"+filepath.Join(dir, "moonji.db"))
	path := filepath.Join(dir, auth.DevAdminPasswordFile)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("no password file next to the database: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("password file mode %v, want 0600", st.Mode().Perm())
	}
	b, _ := os.ReadFile(path)
	c := browser(t)
	resp, body := e.signIn(c, "/login", "admin@localhost", strings.TrimSpace(string(b)))
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/" {
		t.Fatalf("sign-in with the file's password ended at %s (%d)\n%.300s", resp.Request.URL, resp.StatusCode, body)
	}
	if status, who := e.me(c); status != http.StatusOK || !who.Admin {
		t.Errorf("/api/me = %d %+v, want the admin", status, who)
	}
}
