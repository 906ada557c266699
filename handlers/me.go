package handlers

import (
	"github.com/gofiber/fiber/v2"
)

// meResponse is GET /api/me's answer.
type meResponse struct {
	ID    uint   `json:"id"`
	Email string `json:"email"`
	Name  string `json:"name"`
	Admin bool   `json:"admin"`
	// CSRFToken is what scripts send in X-CSRF-Token on state-changing
	// requests (a POST to /v1 with the session, for instance).
	CSRFToken string `json:"csrf_token"`
}

// Me serves GET /api/me: the signed-in person. It runs behind
// RequireAPISession, so there is a session.
func (h *Handler) Me(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	u := sess.User
	return c.JSON(meResponse{ID: u.ID, Email: u.Email, Name: u.Name, Admin: u.Admin, CSRFToken: sess.CSRFToken})
}
