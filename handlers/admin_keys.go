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
	filter, ok := readFilter(c.Query("owner"))
	if !ok {
		d := views.KeysPage{Page: dashboardPageFor("All API keys", sess), All: true, Limit: adminKeysLimit, Error: filterTooLong}
		return render(c, http.StatusBadRequest, views.AdminKeys(d))
	}
	d, err := h.adminKeysPage(c, sess, filter)
	if err != nil {
		return err
	}
	switch c.Query("done") {
	case "budget":
		d.Notice = "Budget saved: it applies from the key’s next request."
	case "models":
		d.Notice = "Models saved: they apply from the key’s next request."
	}
	return render(c, http.StatusOK, views.AdminKeys(d))
}

// adminKeysPage is everyone's keys whose owner's email contains filter.
func (h *Handler) adminKeysPage(c *fiber.Ctx, sess *models.Session, filter string) (views.KeysPage, error) {
	d := views.KeysPage{Page: dashboardPageFor("All API keys", sess), All: true, Limit: adminKeysLimit, Filter: filter}
	keys, more, err := models.ListAllAPIKeys(c.UserContext(), h.DB, filter, adminKeysLimit)
	if err != nil {
		return d, err
	}
	d.More = more
	now := time.Now()
	for i := range keys {
		d.Keys = append(d.Keys, h.viewKey(&keys[i], now))
	}
	return d, nil
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
