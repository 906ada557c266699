package devidp

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/zitadel/oidc/v3/pkg/client/rp"
	"github.com/zitadel/oidc/v3/pkg/oidc"
)

// fakeAccounts is an in-memory Accounts with real bcrypt hashes.
type fakeAccounts struct{ byEmail map[string]*Account }

func (f *fakeAccounts) AccountByEmail(_ context.Context, email string) (*Account, error) {
	return f.byEmail[strings.ToLower(email)], nil
}

func (f *fakeAccounts) AccountBySubject(_ context.Context, sub string) (*Account, error) {
	for _, a := range f.byEmail {
		if a.Subject == sub {
			return a, nil
		}
	}
	return nil, nil
}

const (
	adminEmail = "admin@example.com"
	adminPass  = "correct horse battery staple"
	userEmail  = "user@example.com"
	userPass   = "hunter2hunter2"
	publicID   = "moonji-public"
	confID     = "moonji-confidential"
	confSecret = "s3cret"
)

// env is one provider mounted under /idp of a test server that also plays the app's callback.
type env struct {
	srv       *httptest.Server
	issuer    string
	callback  string
	loggedOut string
	p         *Provider

	mu        sync.Mutex
	callbacks []url.Values // query of every request the app's /callback received
}

var (
	hashOnce   sync.Once
	adminHash  []byte
	userHash   []byte
	errHashing error
)

func newEnv(t *testing.T) *env {
	t.Helper()
	hashOnce.Do(func() {
		adminHash, errHashing = HashPassword(adminPass)
		if errHashing == nil {
			userHash, errHashing = HashPassword(userPass)
		}
	})
	if errHashing != nil {
		t.Fatal(errHashing)
	}
	e := &env{}
	mux := http.NewServeMux()
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	e.issuer = e.srv.URL + "/idp"
	e.callback = e.srv.URL + "/callback"
	e.loggedOut = e.srv.URL + "/bye"

	accounts := &fakeAccounts{byEmail: map[string]*Account{
		adminEmail: {Subject: "sub-admin", Email: adminEmail, Name: "Ada Admin", Admin: true, PasswordHash: adminHash},
		userEmail:  {Subject: "sub-user", Email: userEmail, Name: "Uma User", PasswordHash: userHash},
	}}
	p, err := New(Options{
		Issuer: e.issuer + "/", // trailing slash is normalized away
		Clients: []Client{
			{ID: publicID, RedirectURIs: []string{e.callback}, PostLogoutRedirectURIs: []string{e.loggedOut}},
			{ID: confID, Secret: confSecret, RedirectURIs: []string{e.callback}},
		},
		Accounts: accounts,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.p = p
	mux.Handle("/idp/", p.Handler())
	mux.HandleFunc("/callback", func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.callbacks = append(e.callbacks, r.URL.Query())
		e.mu.Unlock()
		io.WriteString(w, "app callback")
	})
	mux.HandleFunc("/bye", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app signed out") })
	return e
}

func (e *env) callbackCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.callbacks)
}

// browser is an HTTP client with a cookie jar that follows redirects, like a user's browser.
func browser(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar}
}

func (e *env) relyingParty(t *testing.T, clientID, secret string) rp.RelyingParty {
	t.Helper()
	party, err := rp.NewRelyingPartyOIDC(context.Background(), e.issuer, clientID, secret, e.callback,
		[]string{oidc.ScopeOpenID, oidc.ScopeProfile, oidc.ScopeEmail})
	if err != nil {
		t.Fatalf("relying party: %v", err)
	}
	return party
}

var (
	reAction = regexp.MustCompile(`<form[^>]*action="([^"]*)"`)
	reReqID  = regexp.MustCompile(`name="authRequestID" value="([^"]*)"`)
)

// loginForm is the sign-in form as parsed from the page.
type loginForm struct{ action, requestID string }

func parseForm(t *testing.T, page string) loginForm {
	t.Helper()
	a, id := reAction.FindStringSubmatch(page), reReqID.FindStringSubmatch(page)
	if a == nil || id == nil {
		t.Fatalf("no login form in page:\n%s", page)
	}
	return loginForm{action: html.UnescapeString(a[1]), requestID: html.UnescapeString(id[1])}
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// openLogin starts the flow at the authorize endpoint and returns the form it lands on.
func (e *env) openLogin(t *testing.T, c *http.Client, authURL string) loginForm {
	t.Helper()
	resp, body := get(t, c, authURL)
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/idp/login" {
		t.Fatalf("authorize landed on %s (%d), want the login form:\n%s", resp.Request.URL, resp.StatusCode, body)
	}
	for _, label := range []string{">Email<", ">Password<", ">Sign in<"} {
		if !strings.Contains(body, label) {
			t.Errorf("login page lacks %q", label)
		}
	}
	return parseForm(t, body)
}

func (e *env) submit(t *testing.T, c *http.Client, f loginForm, email, password string) (*http.Response, string) {
	t.Helper()
	resp, err := c.PostForm(e.srv.URL+f.action, url.Values{
		"authRequestID": {f.requestID}, "email": {email}, "password": {password},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// login runs authorize → form → POST and returns the code and state the app's callback got.
func (e *env) login(t *testing.T, c *http.Client, authURL, email, password string) (code, state string) {
	t.Helper()
	f := e.openLogin(t, c, authURL)
	resp, body := e.submit(t, c, f, email, password)
	if resp.Request.URL.Path != "/callback" {
		t.Fatalf("login ended at %s (%d), want the app callback:\n%s", resp.Request.URL, resp.StatusCode, body)
	}
	q := resp.Request.URL.Query()
	if q.Get("code") == "" {
		t.Fatalf("callback without code: %v", q)
	}
	return q.Get("code"), q.Get("state")
}

func TestDiscovery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	resp, body := get(t, e.srv.Client(), e.issuer+"/.well-known/openid-configuration")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("discovery: %d %s", resp.StatusCode, body)
	}
	var d oidc.DiscoveryConfiguration
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if d.Issuer != e.issuer || e.p.Issuer() != e.issuer {
		t.Errorf("issuer = %q (provider %q), want %q", d.Issuer, e.p.Issuer(), e.issuer)
	}
	for name, ep := range map[string]string{"authorization": d.AuthorizationEndpoint, "token": d.TokenEndpoint,
		"userinfo": d.UserinfoEndpoint, "jwks": d.JwksURI, "end_session": d.EndSessionEndpoint} {
		if !strings.HasPrefix(ep, e.issuer+"/") {
			t.Errorf("%s endpoint %q is not under the issuer", name, ep)
		}
	}
	if !slices.Contains(d.CodeChallengeMethodsSupported, oidc.CodeChallengeMethodS256) {
		t.Errorf("code_challenge_methods_supported = %v, want S256", d.CodeChallengeMethodsSupported)
	}
	if !slices.Contains(d.ClaimsSupported, "groups") {
		t.Errorf("claims_supported lacks groups: %v", d.ClaimsSupported)
	}
	resp, _ = get(t, e.srv.Client(), d.JwksURI)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("jwks: %d", resp.StatusCode)
	}
	// Without the prefix nothing is served: the handler expects the full path.
	if resp, _ := get(t, e.srv.Client(), e.srv.URL+"/.well-known/openid-configuration"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("discovery outside /idp: %d, want 404", resp.StatusCode)
	}
}

func TestLoginPublicClientPKCE(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, publicID, "")
	verifier := GeneratePassword() + GeneratePassword()
	authURL := rp.AuthURL("st4te", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(verifier)))
	c := browser(t)
	code, state := e.login(t, c, authURL, adminEmail, adminPass)
	if state != "st4te" {
		t.Errorf("state = %q", state)
	}

	ctx := context.Background()
	tokens, err := rp.CodeExchange[*oidc.IDTokenClaims](ctx, code, party, rp.WithCodeVerifier(verifier))
	if err != nil {
		t.Fatalf("code exchange: %v", err)
	}
	cl := tokens.IDTokenClaims
	if cl.Issuer != e.issuer || cl.Subject != "sub-admin" || cl.Email != adminEmail || cl.Name != "Ada Admin" || !bool(cl.EmailVerified) {
		t.Errorf("claims: iss=%q sub=%q email=%q name=%q verified=%v", cl.Issuer, cl.Subject, cl.Email, cl.Name, cl.EmailVerified)
	}
	if got := groupsOf(cl.Claims); !slices.Equal(got, []string{AdminGroup}) {
		t.Errorf("groups = %v, want [%s]", got, AdminGroup)
	}

	info, err := rp.Userinfo[*oidc.UserInfo](ctx, tokens.AccessToken, tokens.TokenType, cl.Subject, party)
	if err != nil {
		t.Fatalf("userinfo: %v", err)
	}
	if info.Email != adminEmail || info.Name != "Ada Admin" || !slices.Equal(groupsOf(info.Claims), []string{AdminGroup}) {
		t.Errorf("userinfo: email=%q name=%q claims=%v", info.Email, info.Name, info.Claims)
	}

	// A code works once.
	if _, err := rp.CodeExchange[*oidc.IDTokenClaims](ctx, code, party, rp.WithCodeVerifier(verifier)); err == nil {
		t.Error("second exchange of the same code succeeded")
	}

	// The provider's login session answers the next authorization without the form.
	resp, body := get(t, c, rp.AuthURL("again", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(verifier))))
	if resp.Request.URL.Path != "/callback" || resp.Request.URL.Query().Get("code") == "" {
		t.Errorf("second authorize with session ended at %s:\n%s", resp.Request.URL, body)
	}
	// prompt=login asks for the form anyway.
	e.openLogin(t, c, rp.AuthURL("fresh", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(verifier)),
		rp.AuthURLOpt(rp.WithPromptURLParam(oidc.PromptLogin))))
}

func groupsOf(claims map[string]any) []string {
	raw, ok := claims["groups"].([]any)
	if !ok {
		return nil
	}
	out := []string{}
	for _, g := range raw {
		s, _ := g.(string)
		out = append(out, s)
	}
	return out
}

func TestNonAdminHasEmptyGroups(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, publicID, "")
	verifier := GeneratePassword() + GeneratePassword()
	code, _ := e.login(t, browser(t), rp.AuthURL("s", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(verifier))), userEmail, userPass)
	tokens, err := rp.CodeExchange[*oidc.IDTokenClaims](context.Background(), code, party, rp.WithCodeVerifier(verifier))
	if err != nil {
		t.Fatal(err)
	}
	if g := groupsOf(tokens.IDTokenClaims.Claims); g == nil || len(g) != 0 {
		t.Errorf("groups = %#v, want an empty list", tokens.IDTokenClaims.Claims["groups"])
	}
}

func TestWrongVerifierRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, publicID, "")
	verifier := GeneratePassword() + GeneratePassword()
	code, _ := e.login(t, browser(t), rp.AuthURL("s", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(verifier))), adminEmail, adminPass)
	_, err := rp.CodeExchange[*oidc.IDTokenClaims](context.Background(), code, party, rp.WithCodeVerifier(verifier+"x"))
	if err == nil || !strings.Contains(err.Error(), "invalid_grant") {
		t.Fatalf("exchange with wrong verifier: %v, want invalid_grant", err)
	}
}

func TestPublicClientNeedsPKCE(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, publicID, "")
	code, _ := e.login(t, browser(t), rp.AuthURL("s", party), adminEmail, adminPass)
	if _, err := rp.CodeExchange[*oidc.IDTokenClaims](context.Background(), code, party); err == nil {
		t.Fatal("public client exchanged a code without PKCE")
	}
}

func TestWrongPasswordShowsFormAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, publicID, "")
	c := browser(t)
	f := e.openLogin(t, c, rp.AuthURL("s", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge("v"+GeneratePassword()+GeneratePassword()))))
	for _, tc := range []struct{ email, password string }{{adminEmail, "wrong"}, {"nobody@example.com", adminPass}} {
		resp, body := e.submit(t, c, f, tc.email, tc.password)
		if resp.Request.URL.Path != "/idp/login" || !strings.Contains(body, "Invalid email or password.") {
			t.Fatalf("%s: ended at %s (%d):\n%s", tc.email, resp.Request.URL, resp.StatusCode, body)
		}
		if again := parseForm(t, body); again.requestID != f.requestID {
			t.Errorf("form lost the auth request id")
		}
		if strings.Contains(body, tc.password) {
			t.Errorf("page echoes the password")
		}
	}
	if n := e.callbackCount(); n != 0 {
		t.Fatalf("app callback reached %d times after failed logins", n)
	}
	// The request is not authenticated: the op's callback refuses to issue a code.
	resp, _ := get(t, c, e.issuer+"/authorize/callback?id="+url.QueryEscape(f.requestID))
	if q := resp.Request.URL.Query(); q.Get("code") != "" || q.Get("error") == "" {
		t.Errorf("callback for an unauthenticated request: %s", resp.Request.URL)
	}
	// The same form still works with the right password.
	resp, _ = e.submit(t, c, f, adminEmail, adminPass)
	if resp.Request.URL.Query().Get("code") == "" {
		t.Errorf("correct password after failures ended at %s", resp.Request.URL)
	}
}

func TestFailureLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, publicID, "")
	c := browser(t)
	f := e.openLogin(t, c, rp.AuthURL("s", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(GeneratePassword()+GeneratePassword()))))
	for range loginFailureLimit {
		e.submit(t, c, f, adminEmail, "wrong")
	}
	resp, body := e.submit(t, c, f, adminEmail, adminPass)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "Too many failed sign-in attempts") {
		t.Fatalf("after %d failures: %d at %s", loginFailureLimit, resp.StatusCode, resp.Request.URL)
	}
	if e.callbackCount() != 0 {
		t.Fatal("blocked address still signed in")
	}
}

func TestUnknownClientRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	q := url.Values{"client_id": {"nope"}, "redirect_uri": {e.callback}, "response_type": {"code"},
		"scope": {"openid"}, "state": {"s"}}
	resp, body := get(t, browser(t), e.issuer+"/authorize?"+q.Encode())
	if resp.StatusCode != http.StatusBadRequest || e.callbackCount() != 0 {
		t.Fatalf("unknown client: %d at %s:\n%s", resp.StatusCode, resp.Request.URL, body)
	}
	// A known client with an unregistered redirect URI is refused the same way.
	q.Set("client_id", publicID)
	q.Set("redirect_uri", e.srv.URL+"/evil")
	if resp, _ := get(t, browser(t), e.issuer+"/authorize?"+q.Encode()); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unregistered redirect_uri: %d at %s", resp.StatusCode, resp.Request.URL)
	}
}

func TestConfidentialClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, confID, confSecret)
	code, _ := e.login(t, browser(t), rp.AuthURL("s", party), adminEmail, adminPass)
	tokens, err := rp.CodeExchange[*oidc.IDTokenClaims](context.Background(), code, party)
	if err != nil {
		t.Fatalf("code exchange with secret: %v", err)
	}
	if tokens.IDTokenClaims.Email != adminEmail {
		t.Errorf("email = %q", tokens.IDTokenClaims.Email)
	}

	bad := e.relyingParty(t, confID, "wrong")
	code, _ = e.login(t, browser(t), rp.AuthURL("s", bad), adminEmail, adminPass)
	if _, err := rp.CodeExchange[*oidc.IDTokenClaims](context.Background(), code, bad); err == nil {
		t.Fatal("code exchange with a wrong secret succeeded")
	}
}

func TestEndSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, publicID, "")
	verifier := GeneratePassword() + GeneratePassword()
	authURL := rp.AuthURL("s", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(verifier)))
	c := browser(t)
	code, _ := e.login(t, c, authURL, adminEmail, adminPass)
	tokens, err := rp.CodeExchange[*oidc.IDTokenClaims](context.Background(), code, party, rp.WithCodeVerifier(verifier))
	if err != nil {
		t.Fatal(err)
	}

	// The browser goes to end_session (RP-initiated logout) and lands on the registered URI.
	q := url.Values{"id_token_hint": {tokens.IDToken}, "post_logout_redirect_uri": {e.loggedOut}, "state": {"bye"}}
	noFollow := *c
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, _ := get(t, &noFollow, party.GetEndSessionEndpoint()+"?"+q.Encode())
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || loc != e.loggedOut+"?state=bye" {
		t.Fatalf("end_session: %d Location %q", resp.StatusCode, loc)
	}
	// The provider's login session is gone: the next authorization shows the form again.
	e.openLogin(t, c, authURL)

	// An unregistered post_logout_redirect_uri is not followed.
	q.Set("post_logout_redirect_uri", e.srv.URL+"/evil")
	if resp, _ := get(t, &noFollow, party.GetEndSessionEndpoint()+"?"+q.Encode()); resp.StatusCode == http.StatusFound &&
		strings.HasPrefix(resp.Header.Get("Location"), e.srv.URL+"/evil") {
		t.Error("end_session redirected to an unregistered URI")
	}

	// Without a redirect URI the provider shows its own signed-out page.
	resp, body := get(t, c, party.GetEndSessionEndpoint())
	if resp.Request.URL.Path != "/idp/logged-out" || !strings.Contains(body, "signed out") {
		t.Errorf("end_session without redirect: %s:\n%s", resp.Request.URL, body)
	}

	// The RP's server-side call works too and reports where the browser would go.
	u, err := rp.EndSession(context.Background(), party, tokens.IDToken, e.loggedOut, "", "", nil)
	if err != nil || u == nil || u.String() != e.loggedOut {
		t.Errorf("rp.EndSession = %v, %v", u, err)
	}
}

func TestPromptNoneWithoutSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	party := e.relyingParty(t, publicID, "")
	authURL := rp.AuthURL("s", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(GeneratePassword()+GeneratePassword())),
		rp.AuthURLOpt(rp.WithPromptURLParam(oidc.PromptNone)))
	resp, _ := get(t, browser(t), authURL)
	if q := resp.Request.URL.Query(); resp.Request.URL.Path != "/callback" || q.Get("error") != "login_required" || q.Get("state") != "s" {
		t.Fatalf("prompt=none ended at %s", resp.Request.URL)
	}
}

func TestExpiredAuthRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	resp, body := get(t, browser(t), e.issuer+"/login?authRequestID=unknown")
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "expired") {
		t.Errorf("unknown auth request: %d\n%s", resp.StatusCode, body)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	acc := &fakeAccounts{}
	for name, o := range map[string]Options{
		"no issuer":       {Accounts: acc},
		"relative issuer": {Issuer: "/idp", Accounts: acc},
		"no accounts":     {Issuer: "http://127.0.0.1/idp"},
		"client no id":    {Issuer: "http://127.0.0.1/idp", Accounts: acc, Clients: []Client{{RedirectURIs: []string{"http://x/cb"}}}},
		"client no uri":   {Issuer: "http://127.0.0.1/idp", Accounts: acc, Clients: []Client{{ID: "a"}}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

func TestPasswords(t *testing.T) {
	t.Parallel()
	pw := GeneratePassword()
	if len(pw) < 20 || pw == GeneratePassword() {
		t.Fatalf("weak or repeated generated password %q", pw)
	}
	h, err := HashPassword(pw)
	if err != nil {
		t.Fatal(err)
	}
	if !CheckPassword(h, pw) || CheckPassword(h, pw+"x") || CheckPassword(nil, pw) {
		t.Error("CheckPassword gives wrong answers")
	}
	if _, err := HashPassword(strings.Repeat("x", 100)); err == nil {
		t.Error("HashPassword accepted a password longer than bcrypt's 72 bytes")
	}
}
