package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/apikey"
	"moonji/internal/gateway"
)

// authError says why a /v1 caller was not identified and how to answer.
type authError struct {
	status     int
	reason     string // the ledger's reason
	code       string // OpenAI's error code
	msg        string
	retryAfter int // seconds, for a 429; 0 means 60
}

func (e *authError) Error() string { return e.msg }

// header carries Retry-After for a blocked or limited address.
func (e *authError) header() http.Header {
	if e.status != http.StatusTooManyRequests {
		return nil
	}
	return http.Header{"Retry-After": {strconv.Itoa(e.retrySeconds())}}
}

func (e *authError) retrySeconds() int {
	if e.retryAfter > 0 {
		return e.retryAfter
	}
	return 60
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
	// errKeysBlocked answers a failed credential from an address that failed too often.
	errKeysBlocked = &authError{status: http.StatusTooManyRequests, reason: "auth_blocked", code: "rate_limit_exceeded",
		msg: "Too many failed authentications from your address; try again in a minute."}
)

// keylessLimited answers an address over its budget of requests without a
// valid credential. The ledger reason is auth_blocked too: the address is
// refused for what it sent without valid credentials.
func keylessLimited(retry time.Duration) *authError {
	secs := int((retry + time.Second - 1) / time.Second)
	if secs < 1 {
		secs = 1
	}
	return &authError{status: http.StatusTooManyRequests, reason: "auth_blocked", code: "rate_limit_exceeded",
		msg:        fmt.Sprintf("Too many requests without a valid API key from your address; try again in %d seconds.", secs),
		retryAfter: secs}
}

// bearerToken reads "Authorization: Bearer <token>". The scheme is matched
// case-insensitively, as RFC 9110 (11.1) requires, and blanks around the
// token are ignored; ok is false without a Bearer token.
func bearerToken(header string) (token string, ok bool) {
	scheme, rest, found := strings.Cut(strings.TrimSpace(header), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(rest)
	return token, token != ""
}

// principal identifies the caller of a /v1 endpoint: by its API key, or
// else by a login session (the chat page) with its CSRF header.
//
// A credential is checked before anything about its address: a valid one is
// never refused because others behind the same address (a NAT, a proxy)
// sent bad ones. Only a failed credential counts against its address, and
// from an address that has failed too often it is answered 429, without a
// log line. A request with no valid credential at all takes one from its
// address's keyless budget and, over it, is answered 429 before any database
// look-up. Failed keys are logged by their public prefix only, never the
// secret.
func (h *Handler) principal(c *fiber.Ctx) (gateway.Principal, error) {
	if secret, ok := bearerToken(c.Get(fiber.HeaderAuthorization)); ok {
		return h.keyPrincipal(c, secret)
	}
	if h.Auth != nil && c.Cookies(h.Auth.SessionCookieName()) != "" {
		p, ok, err := h.webPrincipal(c)
		if ok {
			return p, nil
		}
		if errors.Is(err, errBlocked) {
			return gateway.Principal{}, errKeysBlocked
		}
	}
	if ae := h.keyless(c); ae != nil {
		return gateway.Principal{}, ae
	}
	return gateway.Principal{}, errNoKey
}

// keyPrincipal authenticates an inference API key (apikey.Authenticate
// refuses every other scope, so no /v1 path can forget the check).
func (h *Handler) keyPrincipal(c *fiber.Ctx, secret string) (gateway.Principal, error) {
	key, err := h.APIKeys.Authenticate(c.UserContext(), secret)
	if err == nil {
		id := key.ID
		return gateway.Principal{UserID: key.UserID, Email: key.User.Email, Admin: key.User.Admin, KeyID: &id,
			Source: gateway.SourceAPI, RPM: key.RPM}, nil
	}
	return gateway.Principal{}, h.keyRefused(c, secret, err)
}

// errWrongScopeOnV1 answers an admin-scoped key on /v1: the key is valid,
// so it is not a failed credential (its address is not counted).
var errWrongScopeOnV1 = &authError{status: http.StatusForbidden, reason: "wrong_key_scope", code: "insufficient_scope",
	msg: "This API key has the admin scope: it works on /api/v1/admin only. Use an inference key on /v1."}

// keyRefused says how to answer a key apikey refused with err (apikey's
// errors), and counts a failed credential against its address. Keys that
// are valid but of the wrong scope are answered by the caller.
func (h *Handler) keyRefused(c *fiber.Ctx, secret string, err error) *authError {
	var ae *authError
	switch {
	case errors.Is(err, apikey.ErrWrongScope):
		return errWrongScopeOnV1
	case errors.Is(err, apikey.ErrRevoked):
		ae = unauthorized("This API key has been revoked.")
	case errors.Is(err, apikey.ErrExpired):
		ae = unauthorized("This API key has expired.")
	case errors.Is(err, apikey.ErrOwnerDisabled):
		ae = unauthorized("The owner of this API key has been disabled by an admin.")
	case errors.Is(err, apikey.ErrMalformed), errors.Is(err, apikey.ErrUnknown):
		ae = unauthorized("Incorrect API key provided.")
	case errors.Is(err, apikey.ErrUnavailable):
		// Not the caller's fault, and not a verdict on the key: a key
		// seen recently is still served (apikey.StaleIfError).
		return &authError{status: http.StatusServiceUnavailable, reason: "internal_error",
			code: "database_unavailable", msg: "The API key could not be checked: the database is unavailable. Try again shortly."}
	default:
		h.Log.Error("authenticate api key", "err", err)
		return &authError{status: http.StatusServiceUnavailable, reason: "internal_error",
			code: "internal_error", msg: "The API key could not be checked; try again."}
	}
	if h.Auth == nil {
		return ae
	}
	now, addr := time.Now(), h.limitKey(c)
	if h.Auth.Failures.Blocked(addr, now) {
		return errKeysBlocked
	}
	blocked := h.Auth.Failures.Fail(addr, now)
	h.Log.Warn("authentication failed", "kind", "api_key", "key_prefix", apikey.PublicPrefix(secret),
		"reason", ae.msg, "remote", h.clientIP(c), "path", c.Path(), "now_blocked", blocked)
	if limited := h.keyless(c); limited != nil {
		return limited
	}
	return ae
}

// keyless counts a request without a valid credential against its
// address's budget and returns the 429 to answer when it is over, nil
// otherwise. The first refusal of a window is logged; the rest are not, so a
// flood costs no more than the map look-up.
func (h *Handler) keyless(c *fiber.Ctx) *authError {
	if h.Keyless == nil {
		return nil
	}
	ok, retry, first := h.Keyless.Allow(h.limitKey(c), time.Now())
	if ok {
		return nil
	}
	if first {
		h.Log.Warn("requests without a valid credential limited", "remote", h.clientIP(c), "path", c.Path(),
			"retry_after", retry.Round(time.Second).String())
	}
	return keylessLimited(retry)
}

// authFailed answers a /v1 request whose caller was not identified.
func authFailed(c *fiber.Ctx, err error) error {
	ae := asAuthError(err)
	for k, vs := range ae.header() {
		for _, v := range vs {
			c.Set(k, v)
		}
	}
	typ := "invalid_request_error"
	if ae.status >= 500 {
		typ = "server_error" // the key could not be checked: not the caller's fault
	}
	return apiError(c, ae.status, ae.msg, typ, ae.code)
}
