package handlers

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/apikey"
	"moonji/models"
	"moonji/views"
)

// Keys serves GET /keys: the signed-in person's keys and the create form.
func (h *Handler) Keys(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d, err := h.keysPage(c, sess, false)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.Keys(d))
}

// CreateKey serves POST /keys. The answer shows the secret this once: to
// htmx as the key list fragment, to a plain form as the whole page. Neither
// is cached, and the secret is never stored or logged.
func (h *Handler) CreateKey(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	form, problem := readKeyForm(c)
	var secret string
	if problem == "" {
		var expires time.Duration
		if form.ExpiresDays > 0 {
			expires = time.Duration(form.ExpiresDays) * 24 * time.Hour
		}
		var key *models.APIKey
		secret, key, err = apikey.Create(c.UserContext(), h.DB, sess.UserID, form.Name, expires, form.RPM)
		if err != nil {
			return err
		}
		h.Log.Info("api key created", "user", sess.UserID, "key", key.ID, "prefix", key.Prefix, "via", "web")
	}
	d, err := h.keysPage(c, sess, false)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if problem != "" {
		d.Error, d.Form = problem, form
		status = http.StatusUnprocessableEntity
	} else {
		d.NewSecret, d.NewName = secret, form.Name
	}
	if isHTMX(c) {
		// htmx swaps only 2xx answers by default; the error is shown either way.
		return render(c, http.StatusOK, views.KeyList(d))
	}
	return render(c, status, views.Keys(d))
}

// RevokeKey serves POST /keys/:id/revoke: a person revokes one of their own
// keys. Someone else's key is "not found", not "forbidden": ids reveal nothing.
func (h *Handler) RevokeKey(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	return h.revoke(c, sess, sess.UserID, "/keys", false)
}

// revoke revokes key :id (of owner, or anyone's when owner is 0) and answers
// htmx with the updated row, a plain form with a redirect to back.
func (h *Handler) revoke(c *fiber.Ctx, sess *models.Session, owner uint, back string, all bool) error {
	id, err := strconv.ParseUint(c.Params("id"), 10, 64)
	if err != nil || id == 0 {
		return fiber.ErrNotFound
	}
	err = models.RevokeAPIKey(c.UserContext(), h.DB, uint(id), owner)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	// Authenticated keys are cached for a few seconds; this process stops
	// accepting the key now (other replicas and the CLI: within the TTL).
	h.APIKeys.Forget(uint(id))
	h.Log.Info("api key revoked", "key", id, "by", sess.UserID, "admin", all)
	if !isHTMX(c) {
		return c.Redirect(back, http.StatusSeeOther)
	}
	k, err := models.APIKeyByID(c.UserContext(), h.DB, uint(id))
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.KeyRow(all, sess.CSRFToken, viewKey(k, time.Now())))
}

// keysPage loads the list: the session's own keys, or everyone's when all.
func (h *Handler) keysPage(c *fiber.Ctx, sess *models.Session, all bool) (views.KeysPage, error) {
	owner, title := sess.UserID, "API keys"
	if all {
		owner, title = 0, "All API keys"
	}
	keys, err := models.ListAPIKeys(c.UserContext(), h.DB, owner)
	if err != nil {
		return views.KeysPage{}, err
	}
	d := views.KeysPage{Page: pageFor(title, sess), All: all}
	now := time.Now()
	for i := range keys {
		d.Keys = append(d.Keys, viewKey(&keys[i], now))
	}
	return d, nil
}

func viewKey(k *models.APIKey, now time.Time) views.Key {
	return views.Key{ID: k.ID, Name: k.Name, Prefix: k.Prefix, Owner: k.User.Email, RPM: k.RPM,
		Status: k.Status(now), Created: k.CreatedAt, LastUsed: k.LastUsedAt, Expires: k.ExpiresAt}
}

// readKeyForm reads and checks the create form; problem is a sentence for
// the person when something is wrong.
func readKeyForm(c *fiber.Ctx) (form views.KeyForm, problem string) {
	form.Name = strings.TrimSpace(c.FormValue("name"))
	if days := strings.TrimSpace(c.FormValue("expires_days")); days != "" {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > 3650 {
			return form, "Choose an expiry from the list."
		}
		form.ExpiresDays = n
	}
	if rpm := strings.TrimSpace(c.FormValue("rpm")); rpm != "" {
		n, err := strconv.Atoi(rpm)
		if err != nil || n < 0 || n > 1_000_000 {
			return form, "Requests per minute must be a whole number from 0 (the default) to 1000000."
		}
		form.RPM = n
	}
	switch {
	case form.Name == "":
		return form, "Give the key a name, so you know later where it is used."
	case len(form.Name) > 200:
		return form, "The name is too long (200 characters at most)."
	}
	return form, ""
}
