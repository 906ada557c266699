package devidp

import (
	"context"
	"crypto/rsa"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Lifetimes of the provider's in-memory state. Everything is lost on restart, which is fine for a
// development provider: the app simply sends the user through the login again.
const (
	authRequestLifetime = 10 * time.Minute
	codeLifetime        = 2 * time.Minute
	accessTokenLifetime = 15 * time.Minute
	idTokenLifetime     = time.Hour
	sessionLifetime     = 12 * time.Hour
)

// groupsScope is accepted so an app that asks for a "groups" scope (as some providers want) is
// not refused; the groups claim itself is always present.
const groupsScope = "groups"

var errNotFound = errors.New("devidp: not found")

// storage is the small in-memory op.Storage behind the provider. One mutex guards all maps;
// account look-ups go to Accounts outside the lock because they may hit the database.
type storage struct {
	accounts Accounts
	clients  map[string]*client
	key      signingKey

	mu           sync.Mutex
	authRequests map[string]*authRequest // by request id
	codes        map[string]string       // code -> request id
	tokens       map[string]*accessToken // by token id
	sessions     map[string]*session     // by cookie value
}

var (
	_ op.Storage                   = (*storage)(nil)
	_ op.CanSetUserinfoFromRequest = (*storage)(nil)
)

func newStorage(accounts Accounts, clients map[string]*client, key signingKey) *storage {
	return &storage{
		accounts:     accounts,
		clients:      clients,
		key:          key,
		authRequests: make(map[string]*authRequest),
		codes:        make(map[string]string),
		tokens:       make(map[string]*accessToken),
		sessions:     make(map[string]*session),
	}
}

// authRequest is one pending or completed authorization request (op.AuthRequest).
type authRequest struct {
	id            string
	created       time.Time
	clientID      string
	redirectURI   string
	state         string
	nonce         string
	scopes        []string
	responseType  oidc.ResponseType
	responseMode  oidc.ResponseMode
	codeChallenge *oidc.CodeChallenge
	prompt        []string
	maxAge        *time.Duration
	loginHint     string

	done     bool
	subject  string
	authTime time.Time
	codeTime time.Time
}

func (a *authRequest) GetID() string                         { return a.id }
func (a *authRequest) GetACR() string                        { return "" }
func (a *authRequest) GetAudience() []string                 { return []string{a.clientID} }
func (a *authRequest) GetAuthTime() time.Time                { return a.authTime }
func (a *authRequest) GetClientID() string                   { return a.clientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge { return a.codeChallenge }
func (a *authRequest) GetNonce() string                      { return a.nonce }
func (a *authRequest) GetRedirectURI() string                { return a.redirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType    { return a.responseType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode    { return a.responseMode }
func (a *authRequest) GetScopes() []string                   { return a.scopes }
func (a *authRequest) GetState() string                      { return a.state }
func (a *authRequest) GetSubject() string                    { return a.subject }
func (a *authRequest) Done() bool                            { return a.done }

// GetAMR reports password authentication once the user has signed in.
func (a *authRequest) GetAMR() []string {
	if a.done {
		return []string{"pwd"}
	}
	return nil
}

// sessionUsable reports whether an existing provider login from authTime may answer this request
// without showing the form: prompt=login and max_age ask for a fresh login.
func (a *authRequest) sessionUsable(authTime time.Time) bool {
	if slices.Contains(a.prompt, oidc.PromptLogin) {
		return false
	}
	return a.maxAge == nil || time.Since(authTime) <= *a.maxAge
}

// accessToken is an opaque bearer token's server-side record.
type accessToken struct {
	id       string
	clientID string
	subject  string
	audience []string
	scopes   []string
	expires  time.Time
}

// session is the provider's own login session (the cookie set after a successful sign-in).
type session struct {
	subject  string
	authTime time.Time
	expires  time.Time
}

// CreateAuthRequest stores a validated authorization request until the login completes.
func (s *storage) CreateAuthRequest(_ context.Context, req *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	var challenge *oidc.CodeChallenge
	if req.CodeChallenge != "" {
		// The method is passed through so oidc.VerifyCodeChallenge refuses an unsupported one
		// instead of treating it as plain.
		challenge = &oidc.CodeChallenge{Challenge: req.CodeChallenge, Method: req.CodeChallengeMethod}
	}
	var maxAge *time.Duration
	if req.MaxAge != nil {
		d := time.Duration(*req.MaxAge) * time.Second
		maxAge = &d
	}
	a := &authRequest{
		id:            newID(),
		created:       time.Now(),
		clientID:      req.ClientID,
		redirectURI:   req.RedirectURI,
		state:         req.State,
		nonce:         req.Nonce,
		scopes:        slices.Clone(req.Scopes),
		responseType:  req.ResponseType,
		responseMode:  req.ResponseMode,
		codeChallenge: challenge,
		prompt:        slices.Clone(req.Prompt),
		maxAge:        maxAge,
		loginHint:     req.LoginHint,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(time.Now())
	s.authRequests[a.id] = a
	cp := *a
	return &cp, nil
}

// sweepLocked drops expired state. It runs on every new authorization request, which bounds
// memory without a background goroutine to stop.
func (s *storage) sweepLocked(now time.Time) {
	for id, a := range s.authRequests {
		if now.Sub(a.created) > authRequestLifetime {
			delete(s.authRequests, id)
		}
	}
	for code, id := range s.codes {
		if _, ok := s.authRequests[id]; !ok {
			delete(s.codes, code)
		}
	}
	for id, t := range s.tokens {
		if now.After(t.expires) {
			delete(s.tokens, id)
		}
	}
	for id, se := range s.sessions {
		if now.After(se.expires) {
			delete(s.sessions, id)
		}
	}
}

// authRequestLocked returns the live request with the given id, or nil.
func (s *storage) authRequestLocked(id string) *authRequest {
	a, ok := s.authRequests[id]
	if !ok || time.Since(a.created) > authRequestLifetime {
		return nil
	}
	return a
}

// authRequest returns a copy of a live authorization request, so callers never race with the
// login handler that completes it.
func (s *storage) authRequest(id string) (*authRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.authRequestLocked(id)
	if a == nil {
		return nil, fmt.Errorf("auth request %q: %w", id, errNotFound)
	}
	cp := *a
	return &cp, nil
}

// completeAuthRequest marks a request as authenticated for subject.
func (s *storage) completeAuthRequest(id, subject string, authTime time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.authRequestLocked(id)
	if a == nil {
		return fmt.Errorf("auth request %q: %w", id, errNotFound)
	}
	a.done, a.subject, a.authTime = true, subject, authTime
	return nil
}

// AuthRequestByID implements op.Storage.
func (s *storage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	return s.authRequest(id)
}

// AuthRequestByCode implements op.Storage; a code is valid for codeLifetime after it was issued.
func (s *storage) AuthRequestByCode(_ context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.codes[code]
	if !ok {
		return nil, fmt.Errorf("code: %w", errNotFound)
	}
	a := s.authRequestLocked(id)
	if a == nil || !a.done || time.Since(a.codeTime) > codeLifetime {
		return nil, errors.New("code expired")
	}
	cp := *a
	return &cp, nil
}

// SaveAuthCode implements op.Storage.
func (s *storage) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.authRequestLocked(id)
	if a == nil {
		return fmt.Errorf("auth request %q: %w", id, errNotFound)
	}
	a.codeTime = time.Now()
	s.codes[code] = id
	return nil
}

// DeleteAuthRequest implements op.Storage; the op calls it once the code was exchanged, which is
// what makes a code single-use.
func (s *storage) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.authRequests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

// CreateAccessToken implements op.Storage with an opaque token; the op wraps the id with the
// crypto key before handing it out.
func (s *storage) CreateAccessToken(_ context.Context, req op.TokenRequest) (string, time.Time, error) {
	clientID := ""
	if a, ok := req.(*authRequest); ok {
		clientID = a.clientID
	}
	t := &accessToken{
		id:       newID(),
		clientID: clientID,
		subject:  req.GetSubject(),
		audience: slices.Clone(req.GetAudience()),
		scopes:   slices.Clone(req.GetScopes()),
		expires:  time.Now().Add(accessTokenLifetime),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[t.id] = t
	return t.id, t.expires, nil
}

// errNoRefresh explains why refresh grants fail: clients are registered without the
// refresh_token grant, so the op never asks for one, and these methods only guard the interface.
var errNoRefresh = errors.New("devidp: refresh tokens are not supported")

// CreateAccessAndRefreshTokens implements op.Storage; see errNoRefresh.
func (s *storage) CreateAccessAndRefreshTokens(context.Context, op.TokenRequest, string) (string, string, time.Time, error) {
	return "", "", time.Time{}, errNoRefresh
}

// TokenRequestByRefreshToken implements op.Storage; see errNoRefresh.
func (s *storage) TokenRequestByRefreshToken(context.Context, string) (op.RefreshTokenRequest, error) {
	return nil, errNoRefresh
}

// GetRefreshTokenInfo implements op.Storage; no token is ever a refresh token here.
func (s *storage) GetRefreshTokenInfo(context.Context, string, string) (string, string, error) {
	return "", "", op.ErrInvalidRefreshToken
}

// TerminateSession implements op.Storage: it revokes the user's access tokens for the client.
// The browser's login session is ended by the handler, which can see the cookie.
func (s *storage) TerminateSession(_ context.Context, userID, clientID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, t := range s.tokens {
		if t.subject == userID && t.clientID == clientID {
			delete(s.tokens, id)
		}
	}
	return nil
}

// RevokeToken implements op.Storage for access tokens.
func (s *storage) RevokeToken(_ context.Context, tokenOrID, _, clientID string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[tokenOrID]
	if !ok {
		// Unknown tokens count as revoked (RFC 7009, section 2.2).
		return nil
	}
	if t.clientID != clientID {
		return oidc.ErrInvalidClient().WithDescription("token was not issued for this client")
	}
	delete(s.tokens, tokenOrID)
	return nil
}

// signingKey is the RS256 key generated at start; it implements op.SigningKey.
type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k signingKey) Key() any                                    { return k.key }
func (k signingKey) ID() string                                  { return k.id }

// publicKey is the JWKS view of signingKey (op.Key).
type publicKey struct{ signingKey }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.key.PublicKey }

// SigningKey implements op.Storage.
func (s *storage) SigningKey(context.Context) (op.SigningKey, error) { return s.key, nil }

// SignatureAlgorithms implements op.Storage.
func (s *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

// KeySet implements op.Storage.
func (s *storage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{s.key}}, nil
}

// GetClientByClientID implements op.Storage. An unknown client is a plain error: the op turns a
// server_error into a 500.
func (s *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	c, ok := s.clients[id]
	if !ok {
		return nil, fmt.Errorf("client %q: %w", id, errNotFound)
	}
	return c, nil
}

// AuthorizeClientIDSecret implements op.Storage with a constant-time secret comparison.
func (s *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	c, ok := s.clients[id]
	if !ok {
		return fmt.Errorf("client %q: %w", id, errNotFound)
	}
	if c.secret == "" || subtle.ConstantTimeCompare([]byte(c.secret), []byte(secret)) != 1 {
		return errors.New("invalid client secret")
	}
	return nil
}

// SetUserinfoFromScopes implements op.Storage; it is deprecated there and left empty in favour of
// SetUserinfoFromRequest.
func (s *storage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

// SetUserinfoFromRequest implements op.CanSetUserinfoFromRequest: the ID token's claims.
func (s *storage) SetUserinfoFromRequest(ctx context.Context, info *oidc.UserInfo, req op.IDTokenRequest, scopes []string) error {
	return s.setUserinfo(ctx, info, req.GetSubject(), scopes)
}

// SetUserinfoFromToken implements op.Storage: the userinfo endpoint's claims.
func (s *storage) SetUserinfoFromToken(ctx context.Context, info *oidc.UserInfo, tokenID, _, _ string) error {
	t, err := s.liveToken(tokenID)
	if err != nil {
		return err
	}
	return s.setUserinfo(ctx, info, t.subject, t.scopes)
}

// SetIntrospectionFromToken implements op.Storage.
func (s *storage) SetIntrospectionFromToken(ctx context.Context, resp *oidc.IntrospectionResponse, tokenID, subject, clientID string) error {
	t, err := s.liveToken(tokenID)
	if err != nil {
		return err
	}
	if !slices.Contains(t.audience, clientID) {
		return errors.New("token is not valid for this client")
	}
	info := new(oidc.UserInfo)
	if err := s.setUserinfo(ctx, info, subject, t.scopes); err != nil {
		return err
	}
	resp.SetUserInfo(info)
	resp.Scope = t.scopes
	resp.ClientID = t.clientID
	resp.Expiration = oidc.FromTime(t.expires)
	return nil
}

func (s *storage) liveToken(id string) (accessToken, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[id]
	if !ok || time.Now().After(t.expires) {
		return accessToken{}, errors.New("token is invalid or has expired")
	}
	return *t, nil
}

// setUserinfo fills the standard claims from the app's account. groups is always set (empty for
// non-admins) so the claim has one stable type for the app's admin-group check.
func (s *storage) setUserinfo(ctx context.Context, info *oidc.UserInfo, subject string, scopes []string) error {
	acc, err := s.accounts.AccountBySubject(ctx, subject)
	if err != nil {
		return fmt.Errorf("devidp: look up account %q: %w", subject, err)
	}
	if acc == nil {
		return fmt.Errorf("devidp: account %q: %w", subject, errNotFound)
	}
	info.Subject = acc.Subject
	for _, sc := range scopes {
		switch sc {
		case oidc.ScopeEmail:
			info.Email = acc.Email
			info.EmailVerified = true
		case oidc.ScopeProfile:
			info.Name = acc.Name
			info.PreferredUsername = acc.Email
		}
	}
	groups := []string{}
	if acc.Admin {
		groups = append(groups, AdminGroup)
	}
	info.AppendClaims("groups", groups)
	return nil
}

// GetPrivateClaimsFromScopes implements op.Storage; access tokens are opaque, so there are none.
func (s *storage) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

// GetKeyByIDAndClientID implements op.Storage; JWT client authentication is not offered.
func (s *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errors.New("devidp: private_key_jwt is not supported")
}

// ValidateJWTProfileScopes implements op.Storage; the JWT profile grant is not offered.
func (s *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("devidp: JWT profile grant is not supported")
}

// Health implements op.Storage.
func (s *storage) Health(context.Context) error { return nil }

// createSession starts a provider login session and returns its cookie value.
func (s *storage) createSession(subject string, authTime time.Time) string {
	id := newID()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions[id] = &session{subject: subject, authTime: authTime, expires: authTime.Add(sessionLifetime)}
	return id
}

// session returns a live session, or false.
func (s *storage) session(id string) (session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.sessions[id]
	if !ok || time.Now().After(se.expires) {
		return session{}, false
	}
	return *se, true
}

func (s *storage) deleteSession(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, id)
}

// client is a registered relying party (op.Client).
type client struct {
	id                     string
	secret                 string
	redirectURIs           []string
	postLogoutRedirectURIs []string
	loginURL               string // prefix; the auth request id is appended
}

func (c *client) GetID() string                    { return c.id }
func (c *client) RedirectURIs() []string           { return c.redirectURIs }
func (c *client) PostLogoutRedirectURIs() []string { return c.postLogoutRedirectURIs }

// ApplicationType is "web" for every client, public ones included, so that redirect and
// post-logout URIs must match a registered one exactly. A "native" client would get RFC 8252's
// loopback rule — any port on 127.0.0.1 matches — and then any local program listening on a port
// of its choosing could receive the authorization code. Moonji registers its own callback, port
// and all, so it needs no such leeway. (Web clients may use plain http only in DevMode, below;
// the application type decides nothing else in pkg/op.)
func (c *client) ApplicationType() op.ApplicationType { return op.ApplicationTypeWeb }

// AuthMethod is none (PKCE only) without a secret, else client_secret_basic; the provider also
// accepts client_secret_post (Config.AuthMethodPost).
func (c *client) AuthMethod() oidc.AuthMethod {
	if c.secret == "" {
		return oidc.AuthMethodNone
	}
	return oidc.AuthMethodBasic
}

func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType { return []oidc.GrantType{oidc.GrantTypeCode} }
func (c *client) LoginURL(id string) string    { return c.loginURL + url.QueryEscape(id) }
func (c *client) AccessTokenType() op.AccessTokenType {
	return op.AccessTokenTypeBearer
}
func (c *client) IDTokenLifetime() time.Duration { return idTokenLifetime }

// DevMode lets registered plain-http redirect URIs through: this provider exists for local use.
func (c *client) DevMode() bool { return true }

func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}

func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}

func (c *client) IsScopeAllowed(scope string) bool { return scope == groupsScope }

// IDTokenUserinfoClaimsAssertion puts email, name and groups into the ID token even though an
// access token is issued too, because the app reads them from the ID token.
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return true }
func (c *client) ClockSkew() time.Duration             { return 0 }
