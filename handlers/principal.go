package handlers

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/apikey"
	"moonji/internal/gateway"
)

// authError says why a /v1 caller was not identified and how to answer.
type authError struct {
	status int
	reason string // the ledger's reason
	code   string // OpenAI's error code
	msg    string
}

func (e *authError) Error() string { return e.msg }

// header carries Retry-After for a blocked address.
func (e *authError) header() http.Header {
	if e.status != http.StatusTooManyRequests {
		return nil
	}
	return http.Header{"Retry-After": {"60"}}
}

func unauthorized(msg string) *authError {
	return &authError{status: http.StatusUnauthorized, reason: "unauthorized", code: "invalid_api_key", msg: msg}
}

// asAuthError returns err as an *authError (a plain error becomes a 401).
func asAuthError(err error) *authError {
	var ae *authError
	if errors.As(err, &ae) {
		return ae
	}
	return unauthorized(err.Error())
}

var (
	// errNoKey is the message OpenAI gives for a missing key.
	errNoKey = unauthorized("You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
	// errKeysBlocked answers an address that failed too often.
	errKeysBlocked = &authError{status: http.StatusTooManyRequests, reason: "auth_blocked", code: "rate_limit_exceeded",
		msg: "Too many failed authentications from your address; try again in a minute."}
)

// principal identifies the caller of a /v1 endpoint: by its API key, or
// else by a login session (the chat page) with its CSRF header. Failed keys
// count against the caller's address, and are logged by their public
// prefix only, never the secret.
func (h *Handler) principal(c *fiber.Ctx) (gateway.Principal, error) {
	secret, ok := strings.CutPrefix(c.Get(fiber.HeaderAuthorization), "Bearer ")
	secret = strings.TrimSpace(secret)
	if !ok || secret == "" {
		if p, ok := h.sessionPrincipal(c); ok {
			return p, nil
		}
		return gateway.Principal{}, errNoKey
	}
	addr := c.IP()
	if h.Auth != nil && h.Auth.Failures.Blocked(addr, time.Now()) {
		return gateway.Principal{}, errKeysBlocked
	}
	key, err := h.APIKeys.Authenticate(c.UserContext(), secret)
	if err == nil {
		id := key.ID
		return gateway.Principal{UserID: key.UserID, Email: key.User.Email, Admin: key.User.Admin, KeyID: &id,
			Source: gateway.SourceAPI, RPM: key.RPM}, nil
	}
	var ae *authError
	switch {
	case errors.Is(err, apikey.ErrRevoked):
		ae = unauthorized("This API key has been revoked.")
	case errors.Is(err, apikey.ErrExpired):
		ae = unauthorized("This API key has expired.")
	case errors.Is(err, apikey.ErrMalformed), errors.Is(err, apikey.ErrUnknown):
		ae = unauthorized("Incorrect API key provided.")
	default:
		h.Log.Error("authenticate api key", "err", err)
		return gateway.Principal{}, &authError{status: http.StatusServiceUnavailable, reason: "internal_error",
			code: "internal_error", msg: "The API key could not be checked; try again."}
	}
	blocked := false
	if h.Auth != nil {
		blocked = h.Auth.Failures.Fail(addr, time.Now())
	}
	h.Log.Warn("authentication failed", "kind", "api_key", "key_prefix", apikey.PublicPrefix(secret),
		"reason", ae.msg, "remote", addr, "path", c.Path(), "now_blocked", blocked)
	return gateway.Principal{}, ae
}

// authFailed answers a /v1 request whose caller was not identified.
func authFailed(c *fiber.Ctx, err error) error {
	ae := asAuthError(err)
	if ae.status == http.StatusTooManyRequests {
		c.Set("Retry-After", "60")
	}
	return apiError(c, ae.status, ae.msg, "invalid_request_error", ae.code)
}
