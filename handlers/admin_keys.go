package handlers

import (
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/views"
)

// AdminKeys serves GET /admin/keys: everyone's keys, for admins.
func (h *Handler) AdminKeys(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d, err := h.keysPage(c, sess, true)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.Keys(d))
}

// AdminRevokeKey serves POST /admin/keys/:id/revoke: an admin revokes anyone's key.
func (h *Handler) AdminRevokeKey(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	return h.revoke(c, sess, 0, "/admin/keys", true)
}
