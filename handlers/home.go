package handlers

import (
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/views"
)

// Home serves GET /: a way to sign in, or the ways on.
func (h *Handler) Home(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil && !errors.Is(err, errBlocked) {
		return err
	}
	return render(c, http.StatusOK, views.Home(pageFor("Home", sess)))
}
