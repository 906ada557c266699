package handlers

import (
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/gateway"
)

// CancelResponse serves POST /v1/responses/{id}/cancel: Moonji's Stop for
// a running Responses request, found by its response id. The answer is the
// stop's, as for /v1/inferences/{id}/cancel.
func (h *Handler) CancelResponse(c *fiber.Ctx) error {
	SetRequestID(c, gateway.NewInferenceID())
	p, err := h.principal(c)
	if err != nil {
		return authFailed(c, err)
	}
	id := c.Params("id")
	inf := h.Gateway.InferenceOfResponse(c.UserContext(), h.DB, id)
	if inf == "" {
		return apiError(c, http.StatusNotFound, "No running response found with that id; a response another replica runs can be stopped by its X-Inference-Id at /v1/inferences/{id}/cancel.",
			"invalid_request_error", "response_not_found")
	}
	return h.stop(c, p, inf, -1)
}

// StoredResponse serves GET and DELETE /v1/responses/{id}: passed to the
// engine that served the response, for its owner only.
func (h *Handler) StoredResponse(c *fiber.Ctx) error {
	SetRequestID(c, gateway.NewInferenceID())
	p, err := h.principal(c)
	if err != nil {
		return authFailed(c, err)
	}
	return writeResponse(c, h.Gateway.StoredResponse(c.UserContext(), h.DB, p, c.Method(), c.Params("id")))
}
