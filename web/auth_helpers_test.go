package web_test

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"moonji/internal/devidp"
	"moonji/models"
)

// Hashing is slow on purpose; every test's users share one hash.
const testPassword = "test-password-123"

var (
	testHashOnce sync.Once
	testHash     []byte
)

// addPerson gives email a password for the embedded provider (creating the
// user if needed) and sets its admin flag.
func (e *testEnv) addPerson(email string, admin bool) {
	e.t.Helper()
	testHashOnce.Do(func() {
		var err error
		if testHash, err = devidp.HashPassword(testPassword); err != nil {
			panic(err)
		}
	})
	u, err := models.EnsureUser(context.Background(), e.DB, email)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.DB.Model(u).Updates(map[string]any{"password_hash": testHash, "admin": admin}).Error; err != nil {
		e.t.Fatal(err)
	}
}

// browser is an http.Client with a cookie jar that follows redirects, as a
// person's browser does.
func browser(t testing.TB) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar}
}

// noRedirects returns a copy of c that stops at the first answer.
func noRedirects(c *http.Client) *http.Client {
	cp := *c
	cp.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cp
}

var reAuthRequestID = regexp.MustCompile(`name="authRequestID" value="([^"]*)"`)

// signIn signs email in through /login and the embedded provider's form, in
// browser c, and returns the last answer (the page after the callback).
func (e *testEnv) signIn(c *http.Client, path, email, password string) (*http.Response, string) {
	e.t.Helper()
	resp, body := e.fetch(c, http.MethodGet, path, nil, nil)
	if resp.Request.URL.Path != "/idp/login" {
		e.t.Fatalf("GET %s ended at %s (%d), want the provider's form:\n%s", path, resp.Request.URL, resp.StatusCode, body)
	}
	m := reAuthRequestID.FindStringSubmatch(body)
	if m == nil {
		e.t.Fatalf("no authRequestID in the form:\n%s", body)
	}
	return e.fetch(c, http.MethodPost, "/idp/login", url.Values{"authRequestID": {html.UnescapeString(m[1])},
		"email": {email}, "password": {password}}, nil)
}

// signedIn is a browser already signed in as email.
func (e *testEnv) signedIn(email string, admin bool) *http.Client {
	e.t.Helper()
	e.addPerson(email, admin)
	c := browser(e.t)
	resp, body := e.signIn(c, "/login", email, testPassword)
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/" {
		e.t.Fatalf("sign-in of %s ended at %s (%d):\n%s", email, resp.Request.URL, resp.StatusCode, body)
	}
	return c
}

// fetch sends a request in browser c: a form when form is not nil, extra
// headers from hdr; it returns the answer and its body.
func (e *testEnv) fetch(c *http.Client, method, path string, form url.Values, hdr map[string]string) (*http.Response, string) {
	e.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, e.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	return resp, readAll(e.t, resp.Body)
}

// me is GET /api/me in browser c.
type me struct {
	ID        uint   `json:"id"`
	Email     string `json:"email"`
	Admin     bool   `json:"admin"`
	CSRFToken string `json:"csrf_token"`
}

func (e *testEnv) me(c *http.Client) (int, me) {
	e.t.Helper()
	resp, body := e.fetch(c, http.MethodGet, "/api/me", nil, nil)
	var m me
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			e.t.Fatalf("/api/me: %v in %s", err, body)
		}
	}
	return resp.StatusCode, m
}

// sessionCookie is the browser's session cookie value, "" when none.
func (e *testEnv) sessionCookie(c *http.Client) string {
	u, _ := url.Parse(e.URL)
	for _, ck := range c.Jar.Cookies(u) {
		if ck.Name == "moonji_session" {
			return ck.Value
		}
	}
	return ""
}

// chatBody is a small non-streaming chat request.
const chatBody = `{"model":"m1","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
