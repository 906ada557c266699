package handlers

import (
	"net/http"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/gateway"
)

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// started is reported as every model's creation time: the models are
// configuration, and this is when it was loaded.
var started = time.Now().Unix()

// Models serves GET /v1/models: the configured model names. Like every /v1
// answer it carries a request id (it leaves no usage row).
func (h *Handler) Models(c *fiber.Ctx) error {
	SetRequestID(c, gateway.NewInferenceID())
	p, err := h.principal(c)
	if err != nil {
		return authFailed(c, err)
	}
	names, err := h.Gateway.ModelsFor(c.UserContext(), p)
	if err != nil {
		h.Log.Error("read the models a sender may use", "err", err)
		return apiError(c, http.StatusServiceUnavailable, "The models you may use could not be read; try again.", "server_error", "internal_error")
	}
	data := make([]modelObject, 0, len(names))
	for _, m := range names {
		data = append(data, modelObject{ID: m, Object: "model", Created: started, OwnedBy: "moonji"})
	}
	return c.JSON(fiber.Map{"object": "list", "data": data})
}

// Model serves GET /v1/models/{id}.
func (h *Handler) Model(c *fiber.Ctx) error {
	SetRequestID(c, gateway.NewInferenceID())
	p, err := h.principal(c)
	if err != nil {
		return authFailed(c, err)
	}
	names, err := h.Gateway.ModelsFor(c.UserContext(), p)
	if err != nil {
		h.Log.Error("read the models a sender may use", "err", err)
		return apiError(c, http.StatusServiceUnavailable, "The models you may use could not be read; try again.", "server_error", "internal_error")
	}
	id := c.Params("*")
	for _, m := range names {
		if m == id {
			return c.JSON(modelObject{ID: m, Object: "model", Created: started, OwnedBy: "moonji"})
		}
	}
	return apiError(c, http.StatusNotFound, "The model `"+id+"` does not exist or you do not have access to it.", "invalid_request_error", "model_not_found")
}
