package web

import (
	"moonji/handlers"
	"moonji/internal/markdown"
	"moonji/internal/share"
)

// shareRoutes mounts share links: their JSON API on the /api group, the
// chat's Share panel and the person's list behind the page guard, and the
// page a link opens, which guards itself (share.public decides whether a
// signed-out visitor may open it).
func (s *Server) shareRoutes(h *handlers.Handler) {
	sh := &handlers.Shares{Handler: h, Public: s.Config.Share.Public, PublicURL: s.Config.PublicURL,
		Service: share.New(share.Options{DB: s.DB, Shown: s.Chat.Shown, Render: markdown.Render,
			Log: s.log.With("component", "share")})}
	app, page := s.App, h.RequirePageSession
	api := h.RequireAPISession
	app.Post("/api/v1/conversations/:id/shares", api, sh.CreateShare)
	app.Delete("/api/v1/shares/:token", api, sh.DeleteShare)
	app.Get("/c/:id/share", page, sh.SharePanel)
	app.Post("/c/:id/share", page, sh.CreateSharePage)
	app.Get("/shares", page, sh.SharesList)
	app.Post("/shares/:token/revoke", page, sh.RevokeSharePage)
	app.Get("/s/:token", sh.Shared)
}
