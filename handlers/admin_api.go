package handlers

import (
	_ "embed"
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/apikey"
	"moonji/internal/audit"
	"moonji/models"
)

// The admin API (/api/v1/admin): what admins do on the /admin pages, for
// programs, authenticated by an admin-scoped API key alone — never a
// session, never an inference key. Answers and errors are JSON in OpenAI's
// error shape, as on /v1.

// adminKeyLocal is where RequireAdminKey leaves the admin key it checked.
const adminKeyLocal = "moonji.admin_key"

// adminOpenAPI describes the admin API (OpenAPI 3.1); served as it is.
//
//go:embed admin_openapi.json
var adminOpenAPI []byte

// AdminOpenAPI serves GET /api/v1/admin/openapi.json: public, as it holds
// nothing a stranger could not learn from the README.
func (h *Handler) AdminOpenAPI(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	c.Set(fiber.HeaderCacheControl, "public, max-age=300")
	return c.Send(adminOpenAPI)
}

// RequireAdminKey guards /api/v1/admin: "Authorization: Bearer" with an
// admin-scoped key whose owner is an admin and not disabled, checked
// against the database on every request (apikey.AuthenticateAdmin). A
// missing or failed key is 401 (counted against its address as on /v1),
// a valid key of the wrong scope or whose owner is no longer an admin 403.
func (h *Handler) RequireAdminKey(c *fiber.Ctx) error {
	secret, ok := bearerToken(c.Get(fiber.HeaderAuthorization))
	if !ok {
		if ae := h.keyless(c); ae != nil {
			return authFailed(c, ae)
		}
		return apiError(c, http.StatusUnauthorized, "The admin API takes an admin-scoped API key in an Authorization header "+
			"(Authorization: Bearer YOUR_ADMIN_KEY); a login session is not accepted.", "invalid_request_error", "invalid_api_key")
	}
	key, err := h.APIKeys.AuthenticateAdmin(c.UserContext(), secret)
	switch {
	case err == nil:
		c.Locals(adminKeyLocal, key)
		return c.Next()
	case errors.Is(err, apikey.ErrWrongScope):
		return apiError(c, http.StatusForbidden, "This API key has the inference scope: it works on /v1 only. "+
			"The admin API takes a key created with the admin scope.", "invalid_request_error", "insufficient_scope")
	case errors.Is(err, apikey.ErrNotAdmin):
		return apiError(c, http.StatusForbidden, "The owner of this admin-scoped key is no longer an admin: the key does not work.",
			"invalid_request_error", "insufficient_permissions")
	}
	return authFailed(c, h.keyRefused(c, secret, err))
}

// adminKey is the admin key RequireAdminKey let through.
func adminKey(c *fiber.Ctx) *models.APIKey {
	k, _ := c.Locals(adminKeyLocal).(*models.APIKey)
	return k
}

// AdminAPINotFound answers a path under /api/v1/admin that is not one.
func (h *Handler) AdminAPINotFound(c *fiber.Ctx) error {
	return apiError(c, http.StatusNotFound, "There is no "+c.Method()+" "+clip(c.Path(), 200)+" in the admin API; "+
		"see /api/v1/admin/openapi.json.", "invalid_request_error", "not_found")
}

// recordByKey writes an audit event of a change made with the request's admin
// key: its owner acted, through it, from the client's address.
func (h *Handler) recordByKey(c *fiber.Ctx, action, target, detail string) {
	k := adminKey(c)
	e := audit.Event{Action: action, Target: target, Address: h.clientIP(c), Detail: detail}
	if k != nil {
		e.ActorID, e.Actor, e.KeyID = k.UserID, k.User.Email, k.ID
	}
	h.Audit.Record(c.UserContext(), e)
}
