package handlers

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/tidwall/gjson"

	"moonji/internal/apikey"
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
		model := gjson.GetBytes(call.Body, "model").Str
		return writeResponse(c, h.Gateway.Reject(call, model, http.StatusUnauthorized, "unauthorized",
			err.Error(), "invalid_request_error", "invalid_api_key", nil))
	}
	call.Principal = p
	conn := c.Context().Conn()
	call.Watch = func(onClose func()) func() { return connwatch.Watch(conn, onClose) }
	return writeResponse(c, h.Gateway.ChatCompletions(call))
}

// errNoKey is the message OpenAI gives for a missing key.
var errNoKey = errors.New("You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")

// principal identifies the caller of a /v1 endpoint by its API key.
func (h *Handler) principal(c *fiber.Ctx) (gateway.Principal, error) {
	auth := c.Get(fiber.HeaderAuthorization)
	secret, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || strings.TrimSpace(secret) == "" {
		if p, ok := h.sessionPrincipal(c); ok {
			return p, nil
		}
		return gateway.Principal{}, errNoKey
	}
	key, err := h.APIKeys.Authenticate(c.UserContext(), strings.TrimSpace(secret))
	if err != nil {
		switch {
		case errors.Is(err, apikey.ErrRevoked):
			return gateway.Principal{}, errors.New("This API key has been revoked.")
		case errors.Is(err, apikey.ErrExpired):
			return gateway.Principal{}, errors.New("This API key has expired.")
		case errors.Is(err, apikey.ErrMalformed), errors.Is(err, apikey.ErrUnknown):
			return gateway.Principal{}, errors.New("Incorrect API key provided.")
		}
		h.Log.Error("authenticate api key", "err", err)
		return gateway.Principal{}, errors.New("The API key could not be checked; try again.")
	}
	id := key.ID
	return gateway.Principal{UserID: key.UserID, Email: key.User.Email, Admin: key.User.Admin, KeyID: &id,
		Source: gateway.SourceAPI, RPM: key.RPM}, nil
}
