// Package auth signs people in and keeps them signed in: the OpenID Connect
// relying party (authorization code + PKCE against any standard provider, the
// embedded development one included), server-side sessions with idle and
// absolute expiry, CSRF tokens, who is an admin, the users created from ID
// tokens, and a per-address limit on failed authentications. It knows nothing
// of Fiber: the handlers pass it strings and write out what it returns.
package auth

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"gorm.io/gorm"
)

// Cookie names. Over https the session cookie takes the __Host- prefix, which
// makes browsers refuse it unless it is Secure, host-only and for path /.
const (
	sessionCookieName       = "moonji_session"
	secureSessionCookieName = "__Host-moonji_session"
	// LoginCookieName carries the state of a sign-in in flight, from /login
	// to the provider's redirect back to /auth/callback.
	LoginCookieName = "moonji_login"
)

// CallbackPath is where the provider sends the browser back.
const CallbackPath = "/auth/callback"

// Defaults for Options.
const (
	DefaultIdleTimeout   = 12 * time.Hour
	DefaultMaxAge        = 7 * 24 * time.Hour
	DefaultLoginTimeout  = 10 * time.Minute
	DefaultFailureLimit  = 30
	DefaultFailureWindow = time.Minute
)

// Provider names the OpenID provider people sign in with.
type Provider struct {
	Issuer string
	// ClientID and ClientSecret identify Moonji at the provider; an empty
	// secret makes Moonji a public client that relies on PKCE alone.
	ClientID     string
	ClientSecret string
	Scopes       []string
}

// AdminRule says which signed-in people are admins: those whose claim
// (a dotted path such as "groups" or "realm_access.roles") has Value, and
// those whose verified email is in Emails.
type AdminRule struct {
	Claim  string
	Value  string
	Emails []string
}

// configured reports whether the rule can decide anything; when it cannot,
// the admin flag stored in the database stands.
func (r AdminRule) configured() bool {
	return (r.Claim != "" && r.Value != "") || len(r.Emails) > 0
}

// Options configures New.
type Options struct {
	DB  *gorm.DB
	Log *slog.Logger
	// PublicURL is where browsers reach Moonji (scheme, host, port); the
	// callback URL is built from it, and https makes cookies Secure.
	PublicURL string
	Provider  Provider
	Admin     AdminRule
	// TeamsClaim, when set, names the claim (a dotted path works) whose
	// values are the teams a person is placed in at each sign-in
	// (models.SyncOIDCTeams); teams an admin added them to stay.
	TeamsClaim string
	// IdleTimeout ends a session unused for this long; MaxAge ends it
	// whatever the activity. Zero means the defaults.
	IdleTimeout time.Duration
	MaxAge      time.Duration
	// FailureLimit failed authentications per address within FailureWindow
	// block that address until the window ends. Zero means the defaults.
	FailureLimit  int
	FailureWindow time.Duration
	// HTTPClient reaches the provider; nil means one with a 10 s timeout.
	HTTPClient *http.Client
}

// Service is the authentication service of one replica.
type Service struct {
	db       *gorm.DB
	log      *slog.Logger
	public   string
	secure   bool
	provider Provider
	admin    AdminRule
	teams    string // the teams claim; "": none
	idle     time.Duration
	maxAge   time.Duration
	rp       *lazyParty
	// Failures limits failed authentications per source address.
	Failures *FailureLimiter
}

// New builds the service. It does not contact the provider: that happens on
// the first sign-in, so the embedded provider can be served by the same
// server that is still starting.
func New(o Options) (*Service, error) {
	if o.DB == nil {
		return nil, errors.New("auth: DB is required")
	}
	u, err := url.Parse(o.PublicURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("auth: PublicURL must be an absolute http(s) URL")
	}
	if o.Provider.Issuer == "" || o.Provider.ClientID == "" {
		return nil, errors.New("auth: the provider's issuer and client id are required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.FailureLimit <= 0 {
		o.FailureLimit = DefaultFailureLimit
	}
	if o.FailureWindow <= 0 {
		o.FailureWindow = DefaultFailureWindow
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if len(o.Provider.Scopes) == 0 {
		o.Provider.Scopes = []string{"openid", "profile", "email"}
	}
	public := strings.TrimRight(o.PublicURL, "/")
	s := &Service{
		db:       o.DB,
		log:      o.Log.With("component", "auth"),
		public:   public,
		secure:   u.Scheme == "https",
		provider: o.Provider,
		admin:    o.Admin,
		teams:    o.TeamsClaim,
		idle:     o.IdleTimeout,
		maxAge:   o.MaxAge,
		Failures: NewFailureLimiter(o.FailureLimit, o.FailureWindow),
	}
	s.rp = &lazyParty{provider: o.Provider, redirectURI: public + CallbackPath, client: o.HTTPClient, log: s.log}
	return s, nil
}

// Secure reports whether cookies must be marked Secure (the public URL is https).
func (s *Service) Secure() bool { return s.secure }

// SessionCookieName is the name of the session cookie.
func (s *Service) SessionCookieName() string {
	if s.secure {
		return secureSessionCookieName
	}
	return sessionCookieName
}

// IdleTimeout is how long an unused session lasts.
func (s *Service) IdleTimeout() time.Duration { return s.idle }

// MaxAge is the longest a session lasts.
func (s *Service) MaxAge() time.Duration { return s.maxAge }
