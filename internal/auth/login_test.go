package auth

import (
	"context"
	"errors"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"moonji/internal/devidp"
)

// idpEnv is the embedded provider under /idp of a test server whose
// /auth/callback completes the sign-in with a Service: the whole relying
// party over real HTTP, without Fiber.
type idpEnv struct {
	srv  *httptest.Server
	svc  *Service
	last *Login
	err  error
}

func newIDPEnv(t *testing.T, password string) *idpEnv {
	t.Helper()
	ctx := context.Background()
	db := testDB(t)
	if err := BootstrapDevAdmin(ctx, db, quietLog(), "admin@localhost", password, filepath.Join(t.TempDir(), DevAdminPasswordFile)); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	e := &idpEnv{srv: httptest.NewServer(mux)}
	t.Cleanup(e.srv.Close)
	p, err := devidp.New(devidp.Options{Issuer: e.srv.URL + "/idp", Accounts: DevAccounts{DB: db}, Logger: quietLog(),
		Clients: []devidp.Client{{ID: "moonji", RedirectURIs: []string{e.srv.URL + CallbackPath},
			PostLogoutRedirectURIs: []string{e.srv.URL + "/"}}}})
	if err != nil {
		t.Fatal(err)
	}
	e.svc, err = New(Options{DB: db, Log: quietLog(), PublicURL: e.srv.URL,
		Provider: Provider{Issuer: e.srv.URL + "/idp", ClientID: "moonji"},
		Admin:    AdminRule{Claim: "groups", Value: devidp.AdminGroup}})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/idp/", p.Handler())
	mux.HandleFunc("GET /login", func(w http.ResponseWriter, r *http.Request) {
		redirect, state, err := e.svc.BeginLogin(r.Context(), r.URL.Query().Get("next"))
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		http.SetCookie(w, e.svc.LoginCookie(state, 600))
		http.Redirect(w, r, redirect, http.StatusSeeOther)
	})
	mux.HandleFunc("GET "+CallbackPath, func(w http.ResponseWriter, r *http.Request) {
		cb := Callback{State: r.URL.Query().Get("state"), Code: r.URL.Query().Get("code"), Error: r.URL.Query().Get("error")}
		if c, err := r.Cookie(LoginCookieName); err == nil {
			cb.CookieState = c.Value
		}
		e.last, e.err = e.svc.FinishLogin(r.Context(), cb)
		if e.err != nil {
			http.Error(w, e.err.Error(), 400)
			return
		}
		io.WriteString(w, "signed in")
	})
	return e
}

var reReqID = regexp.MustCompile(`name="authRequestID" value="([^"]*)"`)

func jarClient(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar}
}

// signIn runs /login → provider form → POST → /auth/callback.
func (e *idpEnv) signIn(t *testing.T, c *http.Client, email, password string) *http.Response {
	t.Helper()
	resp, err := c.Get(e.srv.URL + "/login?next=/keys")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := reReqID.FindStringSubmatch(string(body))
	if m == nil || resp.Request.URL.Path != "/idp/login" {
		t.Fatalf("/login ended at %s without the form:\n%s", resp.Request.URL, body)
	}
	resp, err = c.PostForm(e.srv.URL+"/idp/login", url.Values{"authRequestID": {html.UnescapeString(m[1])},
		"email": {email}, "password": {password}})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestLoginThroughDevProvider(t *testing.T) {
	e := newIDPEnv(t, "right-password")
	c := jarClient(t)
	resp := e.signIn(t, c, "admin@localhost", "right-password")
	if resp.StatusCode != 200 || e.err != nil || e.last == nil {
		t.Fatalf("callback: %d, err %v", resp.StatusCode, e.err)
	}
	l := e.last
	if l.Next != "/keys" || !l.User.Admin || l.User.Email != "admin@localhost" || l.User.Issuer != e.srv.URL+"/idp" || l.User.Subject == "" {
		t.Fatalf("login %+v, user %+v", l, l.User)
	}
	if l.Session.IDToken == "" {
		t.Error("the ID token is not kept for the provider's logout")
	}
	sess, err := e.svc.Session(context.Background(), l.Cookie)
	if err != nil || sess.UserID != l.User.ID {
		t.Fatalf("session of the new cookie: %+v, %v", sess, err)
	}
	// The logout URL names the provider's end_session with the ID token.
	u, err := url.Parse(e.svc.LogoutURL(context.Background(), l.Session.IDToken))
	if err != nil || !strings.HasSuffix(u.Path, "/idp/end_session") || u.Query().Get("id_token_hint") != l.Session.IDToken ||
		u.Query().Get("post_logout_redirect_uri") != e.srv.URL+"/" {
		t.Errorf("logout URL %v (%v)", u, err)
	}
}

func TestCallbackNeedsTheBrowsersState(t *testing.T) {
	e := newIDPEnv(t, "right-password")
	c := jarClient(t)
	// Another browser's callback URL replayed in this one (login CSRF): no cookie.
	resp := e.signIn(t, c, "admin@localhost", "right-password")
	if resp.StatusCode != 200 {
		t.Fatal(e.err)
	}
	cb := Callback{State: "forged", CookieState: "forged", Code: "x"}
	if _, err := e.svc.FinishLogin(context.Background(), cb); !errors.Is(err, ErrLoginExpired) {
		t.Errorf("unknown state: %v, want ErrLoginExpired", err)
	}
	cb = Callback{State: "a", CookieState: "b", Code: "x"}
	if _, err := e.svc.FinishLogin(context.Background(), cb); !errors.Is(err, ErrLoginExpired) {
		t.Errorf("state differs from the cookie: %v, want ErrLoginExpired", err)
	}
	// A state completes one sign-in only.
	redirect, state, err := e.svc.BeginLogin(context.Background(), "/")
	if err != nil || !strings.Contains(redirect, "code_challenge=") || !strings.Contains(redirect, "code_challenge_method=S256") {
		t.Fatalf("BeginLogin = %q, %v", redirect, err)
	}
	e.svc.FinishLogin(context.Background(), Callback{State: state, CookieState: state, Error: "access_denied"})
	if _, err := e.svc.FinishLogin(context.Background(), Callback{State: state, CookieState: state, Code: "x"}); !errors.Is(err, ErrLoginExpired) {
		t.Errorf("reused state: %v, want ErrLoginExpired", err)
	}
}

func TestProviderUnreachable(t *testing.T) {
	s := testService(t, AdminRule{})
	s.rp.provider.Issuer = "http://127.0.0.1:1/idp"
	s.rp.client.Timeout = 0
	if _, _, err := s.BeginLogin(context.Background(), "/"); !errors.Is(err, ErrProviderUnreachable) {
		t.Errorf("BeginLogin with the provider down: %v, want ErrProviderUnreachable", err)
	}
	if u := s.LogoutURL(context.Background(), "tok"); u != "" {
		t.Errorf("LogoutURL with the provider down = %q, want empty", u)
	}
}
