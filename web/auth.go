package web

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2/middleware/adaptor"

	"moonji/handlers"
	"moonji/internal/auth"
	"moonji/internal/clientip"
	"moonji/internal/devidp"
	"moonji/models"
	"moonji/static"
)

// devClientID is Moonji's client id at the embedded development provider.
const devClientID = "moonji"

// auditSignInFailuresPerMinute bounds the failed sign-ins the audit log
// records per address and minute.
const auditSignInFailuresPerMinute = 20

// devIDPPath is where the embedded development provider is mounted.
const devIDPPath = "/idp"

// setupAuth mounts sign-in (with the embedded provider when no oidc section
// is configured), the pages, /api and the static files, and fills h.Auth and
// the handlers' limits on people and addresses.
// Pages and /api accept only a login session; inference keys work on /v1
// alone, admin-scoped keys on /api/v1/admin alone (adminAPIRoutes, mounted
// before this).
func (s *Server) setupAuth(ctx context.Context, h *handlers.Handler) error {
	app := s.App
	provider := auth.Provider{}
	admin := auth.AdminRule{}
	teamsClaim := ""
	if o := s.Config.OIDC; o != nil {
		provider = auth.Provider{Issuer: o.Issuer, ClientID: o.ClientID, ClientSecret: o.ClientSecret, Scopes: o.Scopes}
		admin = auth.AdminRule{Claim: o.AdminClaim, Value: o.AdminValue, Emails: o.AdminEmails}
		teamsClaim = o.TeamsClaim
	} else {
		idp, err := s.devProvider(ctx)
		if err != nil {
			return err
		}
		if !s.Config.DevIDP.AllowNonLoopback {
			// Outside the lazy build, so that a refused request costs no RSA key.
			idp = devidp.LoopbackOnly(idp, s.log)
		}
		app.All(devIDPPath+"/*", adaptor.HTTPHandler(idp))
		provider = auth.Provider{Issuer: s.Config.PublicURL + devIDPPath, ClientID: devClientID,
			Scopes: []string{"openid", "profile", "email"}}
		// The provider puts admins (users.admin) in this group, so the dev
		// path decides admin the same way a real provider's groups would.
		admin = auth.AdminRule{Claim: "groups", Value: devidp.AdminGroup}
	}
	svc, err := auth.New(auth.Options{DB: s.DB, Log: s.log, PublicURL: s.Config.PublicURL, Provider: provider, Admin: admin,
		TeamsClaim: teamsClaim})
	if err != nil {
		return fmt.Errorf("set up sign-in: %w", err)
	}
	h.Auth = svc
	if err := s.limitPeople(h); err != nil {
		return err
	}

	// Hashed and compressed here, once, so that no request waits for it.
	assetSet, err := static.Assets()
	if err != nil {
		return err
	}
	app.Get(static.Prefix+"*", serveAssets(assetSet))
	app.Get("/", h.Home)
	app.Get("/login", h.Login)
	app.Get(auth.CallbackPath, h.Callback)
	app.Post("/logout", h.Logout)

	api := app.Group("/api", h.RequireAPISession)
	api.Get("/me", h.Me)
	api.Post("/v1/conversations", h.CreateConversation)
	api.Get("/v1/conversations", h.ListConversations)
	api.Get("/v1/conversations/:id", h.Conversation)
	api.Patch("/v1/conversations/:id", h.PatchConversation)
	api.Delete("/v1/conversations/:id", h.DeleteConversation)
	api.Get("/v1/conversations/:id/export", h.ExportConversation)
	api.Post("/v1/conversations/:id/messages", h.SendMessage)
	api.Post("/v1/messages/:id/edit", h.EditMessage)
	api.Post("/v1/messages/:id/regenerate", h.RegenerateMessage)
	api.Post("/v1/messages/:id/show", h.ShowMessage)
	api.Delete("/v1/messages/:id", h.DeleteMessage)
	api.Get("/v1/generations/:id/events", h.GenerationEvents)
	api.Get("/v1/attachments/:id", h.Attachment)

	// The chat's pages; the guard goes on each route, as a group without a
	// prefix would put it in front of every path, /v1 included.
	page := h.RequirePageSession
	app.Post("/chat", page, h.ChatSend)
	app.Get("/c/:id", page, h.ChatConversation)
	app.Get("/c/:id/m/:mid", page, h.ChatMessage)
	app.Post("/c/:id/regenerate", page, h.ChatRegenerate)
	app.Get("/c/:id/earlier", page, h.ChatEarlier)
	app.Post("/c/:id/m/:mid/show", page, h.ChatShowVersion)
	app.Get("/c/:id/m/:mid/edit", page, h.ChatEditForm)
	app.Post("/c/:id/m/:mid/edit", page, h.ChatEdit)
	app.Post("/c/:id/m/:mid/regenerate", page, h.ChatRegenerateMessage)
	app.Post("/c/:id/m/:mid/delete", page, h.ChatDeleteMessage)
	app.Post("/c/:id/rename", page, h.RenameConversationPage)
	app.Get("/c/:id/settings", page, h.ChatSettings)
	app.Post("/c/:id/settings", page, h.ChatSaveSettings)
	app.Post("/c/:id/delete", page, h.DeleteConversationPage)
	app.Get("/history", page, h.History)
	s.shareRoutes(h)
	app.Post("/c/:id/pin", page, h.ChatPin)
	app.Post("/c/:id/folder", page, h.ChatMoveToFolder)
	app.Get("/sidebar", page, h.ChatSidebar)
	app.Get("/settings", page, h.Settings)
	app.Post("/settings", page, h.SaveSettings)

	keys := app.Group("/keys", page)
	keys.Get("", h.Keys)
	keys.Post("", h.CreateKey)
	keys.Post("/:id/revoke", h.RevokeKey)
	keys.Post("/:id/budget", h.KeyBudget)

	app.Get("/usage", page, h.Usage)
	app.Get("/usage/export", page, h.UsageExport)

	adminPages := app.Group("/admin", page, h.RequireAdmin)
	adminPages.Get("", h.AdminDashboard)
	adminPages.Get("/backends", h.AdminBackends)
	adminPages.Post("/reload", h.AdminReload)
	adminPages.Get("/keys", h.AdminKeys)
	adminPages.Post("/keys/:id/revoke", h.AdminRevokeKey)
	adminPages.Get("/people", h.AdminPeople)
	adminPages.Post("/people/:id/disable", h.AdminDisablePerson)
	adminPages.Post("/people/:id/enable", h.AdminEnablePerson)
	adminPages.Post("/people/:id/budget", h.AdminPersonBudget)
	adminPages.Post("/keys/:id/budget", h.AdminKeyBudget)
	adminPages.Post("/keys/:id/models", h.AdminKeyModels)
	adminPages.Get("/teams", h.AdminTeams)
	adminPages.Post("/teams", h.AdminCreateTeam)
	adminPages.Get("/teams/:id", h.AdminTeam)
	adminPages.Post("/teams/:id/budget", h.AdminTeamBudget)
	adminPages.Post("/teams/:id/models", h.AdminTeamModels)
	adminPages.Post("/teams/:id/members", h.AdminTeamAddMember)
	adminPages.Post("/teams/:id/members/:user/remove", h.AdminTeamRemoveMember)
	adminPages.Post("/teams/:id/delete", h.AdminDeleteTeam)
	adminPages.Get("/audit", h.AdminAudit)
	adminPages.Get("/audit/export", h.AdminAuditExport)
	return nil
}

// limitPeople gives the handlers what bounds people and addresses: the
// trusted proxies that decide the client's address, the budget of requests
// without a valid credential, and what non-admins may do with their keys.
func (s *Server) limitPeople(h *handlers.Handler) error {
	trusted, err := clientip.ParsePrefixes(s.Config.TrustedProxies)
	if err != nil {
		return fmt.Errorf("trusted_proxies: %w", err)
	}
	h.TrustedProxies = trusted
	if n := s.Config.RateLimit.UnauthenticatedPerMinute; n > 0 {
		h.Keyless = auth.NewRequestLimiter(n, time.Minute)
	}
	h.MaxKeysPerPerson, h.MaxKeyRPM = s.Config.Keys.MaxPerPerson, s.Config.Keys.MaxRPM
	// Failed sign-ins cost an attacker nothing: the audit log keeps at most
	// this many per address (an IPv6 /64) a minute.
	h.AuditSignInFailures = auth.NewRequestLimiter(auditSignInFailuresPerMinute, time.Minute)
	return nil
}

// devProvider prepares the embedded development provider: it makes sure its
// admin exists (password from MOONJI_DEV_ADMIN_PASSWORD, else generated and
// written to a file only this user can read) and returns its handler. The
// provider itself is built on the first request, because generating its RSA
// key takes a noticeable moment that a server which nobody signs in to (most
// tests) need not spend.
func (s *Server) devProvider(ctx context.Context) (http.Handler, error) {
	if err := auth.BootstrapDevAdmin(ctx, s.DB, s.log, s.Config.DevIDP.AdminEmail, os.Getenv(auth.DevAdminPasswordEnv),
		auth.DevAdminPasswordPath(s.Config.DatabaseURL)); err != nil {
		if models.Reachable(ctx, s.DB, 2*time.Second) {
			return nil, err
		}
		// PostgreSQL is away: the replica serves anyway (the admin was
		// made by an earlier start, or is at the next).
		s.log.Warn("development admin not checked: the database is unreachable", "err", err)
	}
	public := s.Config.PublicURL
	opts := devidp.Options{
		Issuer: public + devIDPPath,
		Clients: []devidp.Client{{ID: devClientID, RedirectURIs: []string{public + auth.CallbackPath},
			PostLogoutRedirectURIs: []string{public + auth.PostLogoutPath}}},
		Accounts: auth.DevAccounts{DB: s.DB},
		Logger:   s.log,
	}
	s.log.Info("embedded development sign-in provider enabled", "issuer", opts.Issuer, "admin", s.Config.DevIDP.AdminEmail)
	return &lazyIDP{opts: opts}, nil
}

// lazyIDP builds the development provider on first use; a failure is
// answered with 500 and retried on the next request.
type lazyIDP struct {
	opts devidp.Options
	mu   sync.Mutex
	h    http.Handler
}

func (l *lazyIDP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	if l.h == nil {
		p, err := devidp.New(l.opts)
		if err != nil {
			l.mu.Unlock()
			l.opts.Logger.Error("start the development sign-in provider", "err", err)
			http.Error(w, "sign-in provider unavailable", http.StatusInternalServerError)
			return
		}
		l.h = p.Handler()
	}
	h := l.h
	l.mu.Unlock()
	h.ServeHTTP(w, detach(r))
}
