package handlers

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/gateway"
)

// maxStopBody bounds the stop endpoint's body. {"inference_id":…,"seen":N}
// is under 100 bytes; anything near the cap is not a stop.
const maxStopBody = 64 << 10

// StopInference serves POST /api/v1/inference/stop for a signed-in person:
// {"inference_id": "...", "seen": N}. seen, optional, is how many content
// chunks the page had shown; exactly those are kept.
func (h *Handler) StopInference(c *fiber.Ctx) error {
	p, ok := h.sessionPrincipal(c)
	if !ok {
		return c.Status(http.StatusUnauthorized).JSON(fiber.Map{"error": "sign in first: this endpoint accepts only a login session (and its CSRF header)"})
	}
	// The endpoint's own bound, whatever the server's: the announced
	// length, then what was read (a chunked body announces none).
	if c.Request().Header.ContentLength() > maxStopBody || len(c.Body()) > maxStopBody {
		return apiError(c, http.StatusRequestEntityTooLarge, "request body is larger than "+strconv.Itoa(maxStopBody>>10)+" KiB",
			"invalid_request_error", "request_too_large")
	}
	req, err := parseStopBody(c.Body())
	if err != nil {
		return badBody(c, err)
	}
	return h.stop(c, p, req.InferenceID, req.Seen)
}

// CancelInference serves POST /v1/inferences/{id}/cancel for programs with
// an API key; the id comes from the X-Inference-Id response header.
func (h *Handler) CancelInference(c *fiber.Ctx) error {
	SetRequestID(c, gateway.NewInferenceID()) // this answer's own id, as on every /v1 answer
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
		// The cause (a Redis address, a dial error) is for the logs, not
		// for the client.
		h.Log.Warn("stop unavailable", "inference_id", id, "err", err)
		return apiError(c, http.StatusServiceUnavailable, "The stop could not reach the replica running this inference. Try again in a few seconds.", "server_error", "stop_unavailable")
	case err != nil:
		return err
	}
	status := http.StatusOK
	if !res.Acknowledged {
		status = http.StatusAccepted
	}
	return c.Status(status).JSON(res)
}
