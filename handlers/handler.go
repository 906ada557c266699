// Package handlers holds Moonji's HTTP handlers: thin functions that read
// the request, call into the domain packages and write the answer.
package handlers

import (
	"log/slog"

	"github.com/gofiber/fiber/v2"
	"gorm.io/gorm"

	"moonji/internal/apikey"
	"moonji/internal/auth"
	"moonji/internal/gateway"
)

// Handler carries what the handlers share.
type Handler struct {
	DB      *gorm.DB
	Gateway *gateway.Gateway
	APIKeys *apikey.Store
	Stopper *gateway.Stopper
	Log     *slog.Logger
	// Auth signs people in and holds their sessions; pages, /api and the
	// session path of /v1 need it.
	Auth *auth.Service
}

// apiError writes an error in OpenAI's format.
func apiError(c *fiber.Ctx, status int, message, typ, code string) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(status).Send(gateway.ErrorBody(message, typ, code))
}

// writeResponse writes a gateway response. A streamed body is pulled by
// fasthttp after the handler returns, chunk by chunk, each flushed.
func writeResponse(c *fiber.Ctx, r *gateway.Response) error {
	for k, vs := range r.Header {
		for _, v := range vs {
			c.Set(k, v)
		}
	}
	c.Status(r.Status)
	c.Set(fiber.HeaderContentType, r.ContentType)
	if r.BodyStream != nil {
		// Send the headers (X-Inference-Id among them) at once, not with the
		// first frame: a client may want to stop before the first token.
		c.Context().Response.ImmediateHeaderFlush = true
		c.Context().SetBodyStream(r.BodyStream, -1)
		return nil
	}
	return c.Send(r.Body)
}
