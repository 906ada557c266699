package auth

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/zitadel/oidc/v3/pkg/client/rp"
	"github.com/zitadel/oidc/v3/pkg/oidc"

	"moonji/models"
)

// Errors of the sign-in flow.
var (
	// ErrProviderUnreachable means discovery failed: the provider is down or
	// misconfigured.
	ErrProviderUnreachable = errors.New("the sign-in provider cannot be reached")
	// ErrLoginExpired means the callback does not match a sign-in this
	// browser started, or it came too late; starting again fixes it.
	ErrLoginExpired = errors.New("this sign-in has expired or was not started here")
	// ErrProviderRefused means the provider answered with an error.
	ErrProviderRefused = errors.New("the sign-in provider refused the sign-in")
	// ErrDisabled means the provider vouched for the person, but an admin
	// disabled them here.
	ErrDisabled = errors.New("an admin has disabled this account")
)

// LoginFailure is a failed sign-in whose person is known, at least by the
// email the provider sent (the audit log records who tried). It wraps the
// reason: errors.Is finds ErrDisabled, ErrNoEmail… through it.
type LoginFailure struct {
	UserID uint   // 0: nobody here has this identity yet
	Email  string // what the provider said, maybe ""
	Err    error
}

func (f *LoginFailure) Error() string { return f.Err.Error() }
func (f *LoginFailure) Unwrap() error { return f.Err }

// BeginLogin starts a sign-in: it stores the PKCE verifier and the page to
// return to under a fresh state, and returns the provider URL to send the
// browser to and the state, which goes into the login cookie.
func (s *Service) BeginLogin(ctx context.Context, next string) (redirect, state string, err error) {
	party, err := s.rp.get(ctx)
	if err != nil {
		return "", "", err
	}
	state, err = randomToken()
	if err != nil {
		return "", "", err
	}
	verifier, err := randomToken()
	if err != nil {
		return "", "", err
	}
	now := time.Now().UTC()
	ls := &models.LoginState{ID: hashToken(state), Verifier: verifier, Next: SafeNext(next),
		CreatedAt: now, ExpiresAt: now.Add(DefaultLoginTimeout)}
	if err := models.CreateLoginState(ctx, s.db, ls); err != nil {
		return "", "", err
	}
	return rp.AuthURL(state, party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(verifier))), state, nil
}

// Callback is what the provider's redirect back brings, plus the cookies.
type Callback struct {
	CookieState      string // the login cookie
	State            string // the state query parameter
	Code             string
	Error            string // the provider's error code, when it refused
	ErrorDescription string
	OldSession       string // the session cookie the browser had, if any
}

// Login is a completed sign-in.
type Login struct {
	Cookie  string // the new session cookie's value
	Session *models.Session
	User    *models.User
	Next    string // the local page to go to
	// WasAdmin is the admin flag the person had before this sign-in, nil
	// for a new person: the provider's claim may have changed it.
	WasAdmin *bool
}

// FinishLogin completes a sign-in: it checks that the callback belongs to
// the sign-in this browser started, exchanges the code with the verifier,
// verifies the ID token, creates or updates the user and, unless an admin
// disabled them (ErrDisabled), starts a session and records the sign-in.
func (s *Service) FinishLogin(ctx context.Context, cb Callback) (*Login, error) {
	if cb.CookieState == "" || cb.State == "" || !equal(cb.CookieState, cb.State) {
		return nil, ErrLoginExpired
	}
	ls, err := models.TakeLoginState(ctx, s.db, hashToken(cb.State), time.Now())
	if errors.Is(err, models.ErrNotFound) {
		return nil, ErrLoginExpired
	}
	if err != nil {
		return nil, err
	}
	if cb.Error != "" {
		return nil, fmt.Errorf("%w: %s %s", ErrProviderRefused, cb.Error, cb.ErrorDescription)
	}
	if cb.Code == "" {
		return nil, fmt.Errorf("%w: no code in the callback", ErrProviderRefused)
	}
	party, err := s.rp.get(ctx)
	if err != nil {
		return nil, err
	}
	tokens, err := rp.CodeExchange[*oidc.IDTokenClaims](ctx, cb.Code, party, rp.WithCodeVerifier(ls.Verifier))
	if err != nil {
		return nil, fmt.Errorf("exchange the code: %w", err)
	}
	id := s.identity(ctx, party, tokens)
	user, wasAdmin, err := s.upsertUserWas(ctx, id)
	if err != nil {
		return nil, &LoginFailure{Email: models.NormalizeEmail(id.Email), Err: err}
	}
	if user.Disabled() {
		s.log.WarnContext(ctx, "sign-in refused: disabled by an admin", "user", user.ID, "email", user.Email)
		return nil, &LoginFailure{UserID: user.ID, Email: user.Email, Err: ErrDisabled}
	}
	// Disabled between the check and here, the person gets a session that
	// Session refuses: it reads the flag with every session.
	cookie, sess, err := s.CreateSession(ctx, user.ID, tokens.IDToken, cb.OldSession)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	if err := models.RecordLogin(ctx, s.db, user.ID, now); err != nil {
		// The sign-in itself worked; only the list of people is less exact.
		s.log.WarnContext(ctx, "record sign-in time", "user", user.ID, "err", err)
	} else {
		user.LastLoginAt = &now
	}
	sess.User = *user
	s.log.InfoContext(ctx, "signed in", "user", user.ID, "email", user.Email, "admin", user.Admin)
	return &Login{Cookie: cookie, Session: sess, User: user, Next: ls.Next, WasAdmin: wasAdmin}, nil
}

// identity reads the signed-in identity from the verified ID token, asking
// userinfo for what the token lacks: some providers (Zitadel by default) put
// only the subject in the ID token.
func (s *Service) identity(ctx context.Context, party rp.RelyingParty, tokens *oidc.Tokens[*oidc.IDTokenClaims]) Identity {
	c := tokens.IDTokenClaims
	id := Identity{Issuer: c.Issuer, Subject: c.Subject, Email: c.Email, EmailVerified: bool(c.EmailVerified),
		Name: c.Name, Claims: mergeClaims(nil, c.Claims)}
	_, hasAdminClaim := lookupClaim(id.Claims, s.admin.Claim)
	_, hasTeamsClaim := lookupClaim(id.Claims, s.teams)
	needInfo := id.Email == "" || (s.admin.Claim != "" && !hasAdminClaim) || (s.teams != "" && !hasTeamsClaim)
	if !needInfo || party.UserinfoEndpoint() == "" || tokens.Token == nil || tokens.AccessToken == "" {
		return id
	}
	info, err := rp.Userinfo[*oidc.UserInfo](ctx, tokens.AccessToken, tokens.TokenType, c.Subject, party)
	if err != nil {
		s.log.WarnContext(ctx, "userinfo failed; using the ID token alone", "err", err)
		id.userinfoFailed = true
		return id
	}
	if id.Email == "" {
		id.Email, id.EmailVerified = info.Email, bool(info.EmailVerified)
	}
	if id.Name == "" {
		id.Name = info.Name
	}
	id.Claims = mergeClaims(id.Claims, info.Claims)
	return id
}

// PostLogoutPath is where the provider sends the browser after signing out.
const PostLogoutPath = "/"

// RedirectURI is the callback URL to register at the provider.
func (s *Service) RedirectURI() string { return s.public + CallbackPath }

// PostLogoutRedirectURI is the URL to register at the provider for
// RP-initiated logout.
func (s *Service) PostLogoutRedirectURI() string { return s.public + PostLogoutPath }

// LogoutURL returns the provider's end-session URL for an ID token, where the
// browser must go to end its sign-in at the provider too, or "" when the
// provider offers none (or cannot be reached: the local session is over
// anyway). It is a browser redirect, not a server call, because the
// provider's own session lives in the browser's cookies.
func (s *Service) LogoutURL(ctx context.Context, idToken string) string {
	party, err := s.rp.get(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "skip logout at the provider", "err", err)
		return ""
	}
	endpoint := party.GetEndSessionEndpoint()
	if endpoint == "" {
		return ""
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return ""
	}
	q := u.Query()
	if idToken != "" {
		q.Set("id_token_hint", idToken)
	}
	q.Set("client_id", s.provider.ClientID)
	q.Set("post_logout_redirect_uri", s.PostLogoutRedirectURI())
	u.RawQuery = q.Encode()
	return u.String()
}

// SafeNext keeps a return-to address only when it is a path on this site,
// so that /login?next= cannot send people elsewhere; anything else becomes
// "/". Browsers parse a Location by the WHATWG URL rules, which drop tab, CR
// and LF anywhere and read a backslash as a slash: "/\t/evil.example" and
// "/\\evil.example" both lead to evil.example. So the address must be
// visible ASCII without a backslash, start with exactly one slash, have no
// scheme or host, and its path, once percent-decoded, must still pass the
// same checks (a later hop that decodes it must not find "//" or a dot
// segment either).
func SafeNext(next string) string {
	if next == "" || len(next) > 1000 || !safeNextChars(next) ||
		next[0] != '/' || strings.HasPrefix(next, "//") {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "/"
	}
	// u.Path is the percent-decoded path.
	p := u.Path
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") ||
		strings.ContainsAny(p, "\\") || strings.IndexFunc(p, isControl) >= 0 {
		return "/"
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return "/"
		}
	}
	return next
}

// safeNextChars reports whether s is visible ASCII without a backslash: what
// a request target holds (browsers percent-encode the rest), and nothing a
// URL parser strips or reinterprets.
func safeNextChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b <= ' ' || b >= 0x7f || b == '\\' {
			return false
		}
	}
	return true
}

// isControl reports a C0 or C1 control character or DEL.
func isControl(r rune) bool { return r < ' ' || (r >= 0x7f && r <= 0x9f) }
