package handlers

import (
	"net/http"
	"net/url"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/models"
	"moonji/views"
)

// adminKeysLimit bounds /admin/keys; the owner filter finds the rest.
const adminKeysLimit = 500

// AdminKeys serves GET /admin/keys?owner=: everyone's keys, newest first,
// for admins; owner keeps those whose owner's email contains it.
func (h *Handler) AdminKeys(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d := views.KeysPage{Page: pageFor("All API keys", sess), All: true, Limit: adminKeysLimit}
	filter, ok := readFilter(c.Query("owner"))
	if !ok {
		d.Error = filterTooLong
		return render(c, http.StatusBadRequest, views.AdminKeys(d))
	}
	d.Filter = filter
	keys, more, err := models.ListAllAPIKeys(c.UserContext(), h.DB, filter, adminKeysLimit)
	if err != nil {
		return err
	}
	d.More = more
	now := time.Now()
	for i := range keys {
		d.Keys = append(d.Keys, viewKey(&keys[i], now))
	}
	return render(c, http.StatusOK, views.AdminKeys(d))
}

// AdminRevokeKey serves POST /admin/keys/:id/revoke: an admin revokes anyone's
// key. A plain form comes back to the list it was sent from (its owner filter).
func (h *Handler) AdminRevokeKey(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	back := "/admin/keys"
	// A filter too long to be one is dropped: the key is revoked anyway.
	filter, _ := readFilter(c.FormValue("owner"))
	if filter != "" {
		back += "?" + url.Values{"owner": {filter}}.Encode()
	}
	return h.revoke(c, sess, 0, back, true, filter)
}
