// Package devidp is a small embedded OpenID Connect provider for development and e2e tests.
//
// When Moonji runs without an oidc configuration it mounts this provider (by default at /idp on
// its own server), so a newcomer can sign in with nothing else installed. The app signs in through
// it with the same relying-party code (authorization code + PKCE) it uses for Keycloak or
// Zitadel, so the provider is a standard one built on zitadel/oidc's pkg/op: discovery, authorize
// with an email + password form, token (PKCE S256; public and confidential clients), JWKS,
// userinfo and end_session.
//
// All provider state (auth requests, codes, access tokens, login sessions and the RS256 signing
// key) lives in memory and is lost on restart. Users are not stored here: the app keeps them and
// hands them in through Accounts.
package devidp

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Account is a user as the app stores it.
type Account struct {
	Subject      string
	Email        string
	Name         string
	Admin        bool
	PasswordHash []byte // bcrypt, see HashPassword
}

// Accounts looks up the app's users. Both methods return (nil, nil) for an unknown user; an error
// means the look-up itself failed. The email is passed trimmed but otherwise as typed, so
// case-insensitive matching is up to the implementation.
type Accounts interface {
	AccountByEmail(ctx context.Context, email string) (*Account, error)
	AccountBySubject(ctx context.Context, subject string) (*Account, error)
}

// Client is a relying party allowed to sign in through the provider. An empty Secret makes it a
// public client that must use PKCE; with a Secret it authenticates with client_secret_basic or
// client_secret_post (PKCE optional but verified when sent). Redirect and post-logout URIs must
// match a registered one exactly, port included, loopback ones too.
type Client struct {
	ID                     string
	Secret                 string
	RedirectURIs           []string
	PostLogoutRedirectURIs []string
}

// Options configures New.
type Options struct {
	// Issuer is the provider's full external URL including its mount path, e.g.
	// http://127.0.0.1:8080/idp. It appears in discovery and tokens; plain http is allowed.
	Issuer string
	// Clients are the registered relying parties.
	Clients []Client
	// Accounts looks up users; required.
	Accounts Accounts
	// Logger receives sign-in events; nil means slog.Default(). (pkg/op itself logs through
	// slog.Default.)
	Logger *slog.Logger
	// CryptoKey encrypts authorization codes and opaque access tokens (op.Config.CryptoKey). The
	// zero value means a random key per start, which is fine since all state is in memory.
	CryptoKey [32]byte
}

// AdminGroup is the groups claim value of an admin account, so the app's admin-group setting works
// the same way as with a real provider.
const AdminGroup = "moonji-admins"

// Paths below the issuer that the provider serves itself; the OIDC endpoints are pkg/op's defaults
// (/.well-known/openid-configuration, /authorize, /authorize/callback, /oauth/token, /userinfo,
// /keys, /end_session, /oauth/introspect, /revoke).
const (
	loginPath     = "/login"
	loggedOutPath = "/logged-out"
	sessionCookie = "moonji_idp_session"
)

// Failed sign-ins allowed per client address and window before the form refuses to check more.
const (
	loginFailureLimit  = 10
	loginFailureWindow = 10 * time.Minute
)

// Provider is the embedded OpenID Connect provider.
type Provider struct {
	issuer    string
	basePath  string // URL path of the issuer, "" or e.g. "/idp"
	secure    bool   // issuer is https: mark the session cookie Secure
	store     *storage
	op        *op.Provider
	accounts  Accounts
	log       *slog.Logger
	limiter   *failureLimiter
	dummyHash []byte
	handler   http.Handler
}

// New builds a provider: it validates the options, generates the RS256 signing key and sets up
// the routes.
func New(o Options) (*Provider, error) {
	issuer := strings.TrimRight(o.Issuer, "/")
	u, err := url.Parse(issuer)
	if err != nil || u.Scheme == "" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("devidp: issuer %q must be an absolute URL without query or fragment", o.Issuer)
	}
	if o.Accounts == nil {
		return nil, errors.New("devidp: Accounts is required")
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}

	clients := make(map[string]*client, len(o.Clients))
	for _, c := range o.Clients {
		switch {
		case c.ID == "":
			return nil, errors.New("devidp: client without ID")
		case clients[c.ID] != nil:
			return nil, fmt.Errorf("devidp: client %q registered twice", c.ID)
		case len(c.RedirectURIs) == 0:
			return nil, fmt.Errorf("devidp: client %q has no redirect URI", c.ID)
		}
		clients[c.ID] = &client{
			id:                     c.ID,
			secret:                 c.Secret,
			redirectURIs:           slices.Clone(c.RedirectURIs),
			postLogoutRedirectURIs: slices.Clone(c.PostLogoutRedirectURIs),
			loginURL:               issuer + loginPath + "?authRequestID=",
		}
	}

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("devidp: generate signing key: %w", err)
	}
	// Unknown emails are checked against this hash so that they cost as much time as a wrong
	// password and do not reveal which accounts exist.
	dummyHash, err := HashPassword(GeneratePassword())
	if err != nil {
		return nil, err
	}
	cryptoKey := o.CryptoKey
	if cryptoKey == ([32]byte{}) {
		if _, err := rand.Read(cryptoKey[:]); err != nil {
			return nil, fmt.Errorf("devidp: generate crypto key: %w", err)
		}
	}

	p := &Provider{
		issuer:    issuer,
		basePath:  strings.TrimRight(u.Path, "/"),
		secure:    u.Scheme == "https",
		store:     newStorage(o.Accounts, clients, signingKey{id: newID(), key: rsaKey}),
		accounts:  o.Accounts,
		log:       logger.With("component", "devidp"),
		limiter:   newFailureLimiter(loginFailureLimit, loginFailureWindow),
		dummyHash: dummyHash,
	}
	config := &op.Config{
		CryptoKey:                cryptoKey,
		DefaultLogoutRedirectURI: issuer + loggedOutPath,
		CodeMethodS256:           true,
		AuthMethodPost:           true,
		SupportedScopes:          []string{oidc.ScopeOpenID, oidc.ScopeProfile, oidc.ScopeEmail, groupsScope},
		SupportedClaims:          append(slices.Clone(op.DefaultSupportedClaims), "groups"),
	}
	p.op, err = op.NewProvider(config, p.store, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		return nil, fmt.Errorf("devidp: create provider: %w", err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET "+loginPath, p.showLogin)
	mux.HandleFunc("POST "+loginPath, p.submitLogin)
	mux.HandleFunc("GET "+loggedOutPath, p.showLoggedOut)
	mux.Handle(p.op.EndSessionEndpoint().Relative(), p.endBrowserSession(p.op))
	mux.Handle("/", p.op)
	p.handler = mux
	if p.basePath != "" {
		p.handler = http.StripPrefix(p.basePath, mux)
	}
	return p, nil
}

// Issuer returns the normalized issuer URL (without trailing slash).
func (p *Provider) Issuer() string { return p.issuer }

// Handler serves the provider. It expects the full request path, prefix included: for issuer
// http://127.0.0.1:8080/idp it answers /idp/.well-known/openid-configuration, /idp/authorize,
// /idp/login and so on, and 404 for paths outside the prefix. Mount it WITHOUT stripping the
// prefix, e.g. mux.Handle("/idp/", p.Handler()) or, in Fiber,
// app.All("/idp/*", adaptor.HTTPHandler(p.Handler())).
func (p *Provider) Handler() http.Handler { return p.handler }

// showLogin renders the sign-in form for an authorization request, or completes the request at
// once when the browser still has a provider login session that the request accepts.
func (p *Provider) showLogin(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	req, err := p.store.authRequest(r.URL.Query().Get("authRequestID"))
	if err != nil {
		p.renderExpired(w, r)
		return
	}
	if se, ok := p.browserSession(r); ok && req.sessionUsable(se.authTime) {
		acc, err := p.accounts.AccountBySubject(ctx, se.subject)
		if err != nil {
			p.log.ErrorContext(ctx, "look up session account", "subject", se.subject, "error", err)
			p.renderMessage(w, r, http.StatusInternalServerError, "Something went wrong", "The account could not be loaded. Try again.")
			return
		}
		if acc != nil {
			p.finishLogin(w, r, req.id, acc.Subject, se.authTime)
			return
		}
	}
	if slices.Contains(req.prompt, oidc.PromptNone) {
		// prompt=none forbids showing UI: answer the client with login_required.
		op.AuthRequestError(w, r, req, oidc.ErrLoginRequired(), p.op)
		return
	}
	p.renderLogin(w, r, http.StatusOK, loginData{AuthRequestID: req.id, Email: req.loginHint})
}

// submitLogin checks the posted email and password. The auth request id comes from the form's
// hidden field; an unknown or expired id is refused, so a forged POST cannot complete a request
// the browser never started.
func (p *Provider) submitLogin(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		p.renderMessage(w, r, http.StatusBadRequest, "Bad request", "The form could not be read.")
		return
	}
	req, err := p.store.authRequest(r.PostFormValue("authRequestID"))
	if err != nil {
		p.renderExpired(w, r)
		return
	}
	email := strings.TrimSpace(r.PostFormValue("email"))
	password := r.PostFormValue("password")
	addr := clientAddr(r)
	data := loginData{AuthRequestID: req.id, Email: email}
	now := time.Now()

	if p.limiter.blocked(addr, now) {
		p.log.WarnContext(ctx, "sign-in refused: too many failures", "email", email, "remote", addr)
		data.Error = "Too many failed sign-in attempts. Wait a few minutes and try again."
		p.renderLogin(w, r, http.StatusTooManyRequests, data)
		return
	}

	acc, err := p.accounts.AccountByEmail(ctx, email)
	if err != nil {
		p.log.ErrorContext(ctx, "look up account", "email", email, "error", err)
		p.renderMessage(w, r, http.StatusInternalServerError, "Something went wrong", "The account could not be loaded. Try again.")
		return
	}
	hash := p.dummyHash
	if acc != nil && len(acc.PasswordHash) > 0 {
		hash = acc.PasswordHash
	}
	// bcrypt runs for unknown users too, so the answer takes as long either way.
	ok := CheckPassword(hash, password) && acc != nil && len(acc.PasswordHash) > 0
	if !ok {
		p.limiter.fail(addr, now)
		reason := "wrong password"
		if acc == nil {
			reason = "unknown email"
		}
		p.log.WarnContext(ctx, "sign-in failed", "email", email, "remote", addr, "reason", reason)
		data.Error = "Invalid email or password."
		p.renderLogin(w, r, http.StatusOK, data)
		return
	}

	p.limiter.reset(addr)
	http.SetCookie(w, p.sessionCookie(p.store.createSession(acc.Subject, now), int(sessionLifetime/time.Second)))
	p.log.InfoContext(ctx, "signed in", "email", email, "subject", acc.Subject, "client", req.clientID, "remote", addr)
	p.finishLogin(w, r, req.id, acc.Subject, now)
}

// finishLogin marks the auth request as authenticated and sends the browser to pkg/op's callback,
// which issues the code and redirects to the client. 303 turns the form POST into a GET.
func (p *Provider) finishLogin(w http.ResponseWriter, r *http.Request, id, subject string, authTime time.Time) {
	if err := p.store.completeAuthRequest(id, subject, authTime); err != nil {
		p.renderExpired(w, r)
		return
	}
	callback := op.AuthCallbackURL(p.op)(op.ContextWithIssuer(r.Context(), p.issuer), id)
	http.Redirect(w, r, callback, http.StatusSeeOther)
}

// endBrowserSession ends the provider's own login session before pkg/op handles end_session
// (token revocation and the redirect to post_logout_redirect_uri). It clears the cookie even if
// the request later turns out invalid: the user asked to be signed out.
func (p *Provider) endBrowserSession(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, err := r.Cookie(sessionCookie); err == nil {
			p.store.deleteSession(c.Value)
			p.log.InfoContext(r.Context(), "signed out", "remote", clientAddr(r))
		}
		http.SetCookie(w, p.sessionCookie("", -1))
		next.ServeHTTP(w, r)
	})
}

func (p *Provider) showLoggedOut(w http.ResponseWriter, r *http.Request) {
	p.renderMessage(w, r, http.StatusOK, "Signed out", "You are signed out. You can close this window.")
}

// browserSession returns the provider login session named by the request's cookie.
func (p *Provider) browserSession(r *http.Request) (session, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return session{}, false
	}
	return p.store.session(c.Value)
}

// sessionCookie builds the session cookie, scoped to the provider's path. SameSite=Lax still
// sends it on the top-level navigation from the app to /authorize, which is all it is needed for.
func (p *Provider) sessionCookie(value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name:     sessionCookie,
		Value:    value,
		Path:     p.basePath + "/",
		MaxAge:   maxAge,
		HttpOnly: true,
		Secure:   p.secure,
		SameSite: http.SameSiteLaxMode,
	}
}

func (p *Provider) renderLogin(w http.ResponseWriter, r *http.Request, status int, d loginData) {
	d.Action = p.basePath + loginPath
	p.render(w, r, status, loginPage(d))
}

func (p *Provider) renderExpired(w http.ResponseWriter, r *http.Request) {
	p.renderMessage(w, r, http.StatusBadRequest, "Sign-in expired",
		"This sign-in link has expired or is unknown. Go back to the application and sign in again.")
}

func (p *Provider) renderMessage(w http.ResponseWriter, r *http.Request, status int, title, msg string) {
	p.render(w, r, status, messagePage(title, msg))
}

// render writes an HTML page with headers that keep it out of caches and frames. The CSP has no
// form-action on purpose: browsers apply it to the redirects after the POST, and the final
// redirect goes to the app, which may be on another origin.
func (p *Provider) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'")
	w.WriteHeader(status)
	if err := c.Render(r.Context(), w); err != nil {
		p.log.ErrorContext(r.Context(), "render page", "error", err)
	}
}

// clientAddr is the peer's IP for the failure limit. Forwarded headers are ignored because
// anyone can set them; behind a proxy all clients share the proxy's limit.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
