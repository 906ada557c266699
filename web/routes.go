package web

import (
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"

	"moonji/handlers"
)

// routes mounts every endpoint.
func (s *Server) routes(h *handlers.Handler) {
	app := s.App
	app.Get("/healthz", func(c *fiber.Ctx) error { return c.SendString("ok") })
	app.Get("/readyz", s.ready)
	app.Get("/metrics", adaptor.HTTPHandler(s.Metrics.Handler()))

	v1 := app.Group("/v1")
	v1.Post("/chat/completions", h.ChatCompletions)
	v1.Get("/models", h.Models)
	v1.Get("/models/*", h.Model)
	v1.Post("/inferences/:id/cancel", h.CancelInference)

	// The stop for people authenticates itself (session + CSRF header), so
	// it does not depend on the /api group's middleware order.
	app.Post("/api/v1/inference/stop", h.StopInference)
}
