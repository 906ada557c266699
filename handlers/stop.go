package handlers

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gofiber/fiber/v2"
	"github.com/tidwall/gjson"

	"moonji/internal/gateway"
	"moonji/internal/jsonguard"
)

// maxStopBody bounds the stop endpoint's body. {"inference_id":…,"seen":N}
// is under 100 bytes; anything near the cap is not a stop.
const maxStopBody = 64 << 10

// stopWatch lists the fields StopInference reads. A repeat is refused: gjson
// reads the first, most other JSON readers (a log pipeline, a proxy's
// filter) the last, and they should not disagree on which inference was
// stopped.
var stopWatch = jsonguard.Watch{{Name: "inference_id"}, {Name: "seen"}}

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
	body := c.Body()
	// The guard runs before gjson reads anything: gjson recurses once per
	// nesting level, and only a bounded depth keeps that safe.
	if err := jsonguard.Validate(body, stopWatch); err != nil {
		return stopBadRequest(c, err)
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

// stopBadRequest answers a stop body that jsonguard refused: 400 in OpenAI's
// shape, with param naming the repeated field when there is one.
func stopBadRequest(c *fiber.Ctx, err error) error {
	msg, param := "request body is not valid JSON", ""
	var e *jsonguard.Error
	if errors.As(err, &e) {
		switch e.Kind {
		case jsonguard.TooDeep:
			msg = "request body nests deeper than " + strconv.Itoa(jsonguard.MaxDepth) + " levels"
		case jsonguard.Duplicate:
			msg, param = fmt.Sprintf("duplicate key %q in the request body", e.Field), e.Field
		case jsonguard.CaseVariant:
			msg, param = fmt.Sprintf("key %q in the request body differs from %q only in letter case", e.Key, e.Field), e.Field
		default:
			msg = fmt.Sprintf("request body is not valid JSON: %s at byte %d", e.Detail, e.Offset)
		}
	}
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	in := inner{Message: msg, Type: "invalid_request_error", Code: "invalid_request"}
	if param != "" {
		in.Param = &param
	}
	b, _ := json.Marshal(map[string]inner{"error": in}) // strings always marshal
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(http.StatusBadRequest).Send(b)
}
