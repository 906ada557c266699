package web

import "moonji/handlers"

// adminAPIPrefix is where the admin API lives.
const adminAPIPrefix = "/api/v1/admin"

// adminAPIRoutes mounts the admin API. They come before setupAuth's /api
// group, whose session guard would otherwise run first: the admin API
// takes an admin-scoped key and nothing else, and every path under it —
// an unknown one too — is answered here, in OpenAI's error shape. The
// description is public; everything else goes through RequireAdminKey.
// Each route must be described in handlers/admin_openapi.json (a test
// checks it).
func (s *Server) adminAPIRoutes(h *handlers.Handler) {
	s.App.Get(adminAPIPrefix+"/openapi.json", h.AdminOpenAPI)
	admin := s.App.Group(adminAPIPrefix, h.RequireAdminKey)
	admin.Get("/keys", h.AdminAPIKeys)
	admin.Post("/keys", h.AdminAPICreateKey)
	admin.Get("/keys/:id", h.AdminAPIKey)
	admin.Patch("/keys/:id", h.AdminAPIUpdateKey)
	admin.Delete("/keys/:id", h.AdminAPIRevokeKey)
	admin.All("/*", h.AdminAPINotFound)
}
