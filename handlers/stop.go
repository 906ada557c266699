package handlers

import (
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"
	"github.com/tidwall/gjson"

	"moonji/internal/gateway"
)

// StopInference serves POST /api/v1/inference/stop for a signed-in person:
// {"inference_id": "...", "seen": N}. seen, optional, is how many content
// chunks the page had shown; exactly those are kept.
func (h *Handler) StopInference(c *fiber.Ctx) error {
	p, ok := h.sessionPrincipal(c)
	if !ok {
		return c.Status(http.StatusUnauthorized).JSON(fiber.Map{"error": "sign in first: this endpoint accepts only a login session (and its CSRF header)"})
	}
	body := c.Body()
	if !gjson.ValidBytes(body) {
		return apiError(c, http.StatusBadRequest, "request body is not valid JSON", "invalid_request_error", "invalid_request")
	}
	id := gjson.GetBytes(body, "inference_id")
	if id.Type != gjson.String || id.Str == "" {
		return apiError(c, http.StatusBadRequest, "inference_id is required", "invalid_request_error", "invalid_request")
	}
	seen := -1
	switch v := gjson.GetBytes(body, "seen"); v.Type {
	case gjson.Null:
	case gjson.Number:
		if v.Int() < 0 || float64(v.Int()) != v.Num {
			return apiError(c, http.StatusBadRequest, "seen must be a non-negative integer", "invalid_request_error", "invalid_request")
		}
		seen = int(v.Int())
	default:
		return apiError(c, http.StatusBadRequest, "seen must be a non-negative integer", "invalid_request_error", "invalid_request")
	}
	return h.stop(c, p, id.Str, seen)
}

// CancelInference serves POST /v1/inferences/{id}/cancel for programs with
// an API key; the id comes from the X-Inference-Id response header.
func (h *Handler) CancelInference(c *fiber.Ctx) error {
	p, err := h.principal(c)
	if err != nil {
		return authFailed(c, err)
	}
	return h.stop(c, p, c.Params("id"), -1)
}

func (h *Handler) stop(c *fiber.Ctx, p gateway.Principal, id string, seen int) error {
	res, err := h.Stopper.Stop(c.UserContext(), p, id, seen)
	switch {
	case errors.Is(err, gateway.ErrNotFound):
		return apiError(c, http.StatusNotFound, "No inference with id "+id+".", "invalid_request_error", "inference_not_found")
	case errors.Is(err, gateway.ErrStopUnavailable):
		h.Log.Warn("stop unavailable", "inference_id", id, "err", err)
		return apiError(c, http.StatusServiceUnavailable, "The stop could not reach the replica running this inference: "+err.Error(), "server_error", "stop_unavailable")
	case err != nil:
		return err
	}
	status := http.StatusOK
	if !res.Acknowledged {
		status = http.StatusAccepted
	}
	return c.Status(status).JSON(res)
}
