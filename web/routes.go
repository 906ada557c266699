package web

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"

	"moonji/handlers"
	"moonji/internal/proxy"
)

// smallBodyLimit bounds the body of every request but a chat completion:
// forms, the stop endpoint's JSON, the sign-in provider's token requests
// take a few hundred bytes.
const smallBodyLimit = 64 << 10

// routes mounts every endpoint. Fiber runs handlers in the order they are
// mounted, which matters here: CORS comes first on /v1, then the chat
// endpoint, which reads its own body after checking the key (and the
// attachments' upload, after checking the session), then compression and
// smallBodies, which every later route (including those setupAuth mounts)
// goes through.
func (s *Server) routes(h *handlers.Handler) {
	app := s.App
	// A handler's panic fails its request alone (a 500, in OpenAI's shape
	// on /v1 and /api), never the process and every stream in it.
	app.Use(recover.New(recover.Config{EnableStackTrace: true, StackTraceHandler: s.logPanic}))
	app.Use(clearWriteDeadline)
	if len(s.Config.CORS.AllowedOrigins) > 0 {
		app.Use("/v1", cors(s.Config.CORS.AllowedOrigins))
	}
	v1 := app.Group("/v1")
	v1.Post("/chat/completions", h.ChatCompletions(s.Config.MaxBodyBytes))
	v1.Post("/completions", h.Inference(proxy.APICompletions, s.Config.MaxBodyBytes))
	v1.Post("/embeddings", h.Inference(proxy.APIEmbeddings, s.Config.MaxBodyBytes))
	v1.Post("/responses", h.Inference(proxy.APIResponses, s.Config.MaxBodyBytes))
	// An upload is larger than smallBodies allows: it authenticates itself
	// and reads its own body, within the attachments' bound.
	app.Post("/api/v1/attachments", h.UploadAttachment)

	// Pages, /api and the rest go compressed to browsers that take it;
	// never /v1 (see compressResponses).
	app.Use(compressResponses)
	app.Use(smallBodies(smallBodyLimit))
	app.Get("/healthz", func(c *fiber.Ctx) error { return c.SendString("ok") })
	app.Get("/readyz", s.ready)
	app.Get("/metrics", adaptor.HTTPHandler(s.Metrics.Handler()))

	v1.Get("/models", h.Models)
	v1.Get("/models/*", h.Model)
	v1.Post("/inferences/:id/cancel", h.CancelInference)
	v1.Post("/responses/:id/cancel", h.CancelResponse)
	v1.Get("/responses/:id", h.StoredResponse)
	v1.Delete("/responses/:id", h.StoredResponse)

	s.adminAPIRoutes(h)

	// The stop for people authenticates itself (session + CSRF header), so
	// it does not depend on the /api group's middleware order.
	app.Post("/api/v1/inference/stop", h.StopInference)
}

// logPanic logs a handler's panic with its stack; the recover middleware
// then answers the request with a 500.
func (s *Server) logPanic(c *fiber.Ctx, p any) {
	s.Metrics.Panics.Inc()
	s.log.Error("handler panicked; the request alone fails", "method", c.Method(), "path", c.Path(),
		"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
}

// smallBodies reads the request body, at most limit bytes, before the
// handler runs. The server streams request bodies, and fasthttp would
// otherwise read one whole (with no bound) the first time a handler asks
// for it — c.Body(), a form value, Fiber's adaptor for the sign-in
// provider. Reading it here also empties the connection for the next
// request when a handler ignores the body. A larger body is refused from
// its Content-Length, or as soon as a chunked one passes the limit.
func smallBodies(limit int64) fiber.Handler {
	return func(c *fiber.Ctx) error {
		body, err := handlers.ReadBody(c, limit)
		var be *handlers.BodyError
		if errors.As(err, &be) {
			return fiber.NewError(be.Status, be.Message)
		}
		if err != nil {
			return fiber.NewError(fiber.StatusBadRequest, err.Error())
		}
		if c.Context().RequestBodyStream() != nil {
			c.Request().SetBodyRaw(body)
		}
		return c.Next()
	}
}

// clearWriteDeadline starts every request with no write deadline on its
// connection. Streams (a /v1 relay, a chat's event stream) set one per
// write to notice a client that stopped reading, and the last one would
// otherwise outlive them on a keep-alive connection and cut the next
// answer. The previous response is fully written by then: fasthttp serves
// a connection's requests one after another.
func clearWriteDeadline(c *fiber.Ctx) error {
	_ = c.Context().Conn().SetWriteDeadline(time.Time{})
	return c.Next()
}
