package handlers

import (
	"bytes"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/tidwall/gjson"

	"moonji/internal/connwatch"
	"moonji/internal/gateway"
)

// ChatCompletions serves POST /v1/chat/completions. Every request gets an
// X-Inference-Id and leaves exactly one usage row, whatever happens.
func (h *Handler) ChatCompletions(c *fiber.Ctx) error {
	call := gateway.Call{ID: gateway.NewInferenceID(), Start: time.Now()}
	c.Set("X-Inference-Id", call.ID)
	// Fiber reuses the request buffer after the handler returns, and a
	// stream outlives the handler: the gateway gets its own copy.
	call.Body = bytes.Clone(c.Body())

	p, err := h.principal(c)
	if err != nil {
		ae := asAuthError(err)
		model := gjson.GetBytes(call.Body, "model").Str
		return writeResponse(c, h.Gateway.Reject(call, model, ae.status, ae.reason,
			ae.Error(), "invalid_request_error", ae.code, ae.header()))
	}
	call.Principal = p
	conn := c.Context().Conn()
	call.Watch = func(onClose func()) func() { return connwatch.Watch(conn, onClose) }
	return writeResponse(c, h.Gateway.ChatCompletions(call))
}
