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
	"moonji/internal/audit"
	"moonji/models"
	"moonji/views"
)

// Keys serves GET /keys: the signed-in person's keys and the create form.
func (h *Handler) Keys(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d, err := h.keysPage(c, sess)
	if err != nil {
		return err
	}
	if c.Query("done") == "budget" {
		d.Notice = "Budget saved: it applies from the key’s next request."
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
	form, problem := readKeyForm(c, h.maxRPM(sess))
	var secret string
	if problem == "" {
		secret, problem, err = h.createKey(c, sess, form)
		if err != nil {
			return err
		}
	}
	d, err := h.keysPage(c, sess)
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

// createKey creates the key of a valid form, unless a non-admin already
// holds as many live keys as they may; problem then says so.
func (h *Handler) createKey(c *fiber.Ctx, sess *models.Session, form views.KeyForm) (secret, problem string, err error) {
	if !sess.User.Admin {
		// Counting and creating are one step on this replica; two replicas
		// could still each pass the count once, which is tolerable.
		h.keyCreation.Lock()
		defer h.keyCreation.Unlock()
		keys, err := models.ListAPIKeys(c.UserContext(), h.DB, sess.UserID)
		if err != nil {
			return "", "", err
		}
		live, now := 0, time.Now()
		for i := range keys {
			if keys[i].Active(now) {
				live++
			}
		}
		if live >= h.MaxKeysPerPerson {
			h.Log.Info("api key refused: too many keys", "user", sess.UserID, "live", live, "max", h.MaxKeysPerPerson)
			return "", fmt.Sprintf("You already have %d active keys, the most one person may hold (%d). "+
				"Revoke a key you no longer use, then create this one.", live, h.MaxKeysPerPerson), nil
		}
	}
	var expires time.Duration
	if form.ExpiresDays > 0 {
		expires = time.Duration(form.ExpiresDays) * 24 * time.Hour
	}
	scope := models.ScopeInference
	if form.Scope == models.ScopeAdmin {
		scope = models.ScopeAdmin
	}
	secret, key, err := apikey.CreateScoped(c.UserContext(), h.DB, &sess.User, scope, form.Name, expires, form.RPM, models.Limits{})
	if errors.Is(err, apikey.ErrAdminScopeOwner) {
		return "", "Only admins may create a key with the admin scope.", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("create api key: %w", err)
	}
	h.Log.Info("api key created", "user", sess.UserID, "key", key.ID, "prefix", key.Prefix, "rpm", key.RPM, "scope", scope, "via", "web")
	h.record(c, sess, audit.KeyCreate, audit.KeyTarget(key.ID, key.Name, sess.User.Email), audit.KeyCreated(key.RPM, key.ExpiresAt, key.Budget, key.BudgetPeriod, key.Models, h.Currency))
	return secret, "", nil
}

// adminMaxRPM is the highest per-key requests per minute anyone may set.
const adminMaxRPM = 1_000_000

// maxRPM is the highest per-key requests per minute the person may set: an
// admin anything up to adminMaxRPM, anyone else keys.max_rpm, so that people
// can lower their limit but not raise it.
func (h *Handler) maxRPM(sess *models.Session) int {
	if sess.User.Admin {
		return adminMaxRPM
	}
	return h.MaxKeyRPM
}

// RevokeKey serves POST /keys/:id/revoke: a person revokes one of their own
// keys. Someone else's key is "not found", not "forbidden": ids reveal nothing.
func (h *Handler) RevokeKey(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	return h.revoke(c, sess, sess.UserID, "/keys", false, "")
}

// revoke revokes key :id (of owner, or anyone's when owner is 0) and answers
// htmx with the updated row, a plain form with a redirect to back.
func (h *Handler) revoke(c *fiber.Ctx, sess *models.Session, owner uint, back string, all bool, filter string) error {
	id, ok := pathID(c)
	if !ok {
		return fiber.ErrNotFound
	}
	err := models.RevokeAPIKey(c.UserContext(), h.DB, id, owner)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	// Authenticated keys are cached for a few seconds; this process stops
	// accepting the key now (other replicas and the CLI: within the TTL).
	h.APIKeys.Forget(id)
	h.Log.Info("api key revoked", "key", id, "by", sess.UserID, "admin", all)
	k, err := models.APIKeyByID(c.UserContext(), h.DB, id)
	if err != nil {
		// Revoked all the same: the record names the key by its id alone.
		h.record(c, sess, audit.KeyRevoke, fmt.Sprintf("key %d", id), "")
		return err
	}
	h.record(c, sess, audit.KeyRevoke, audit.KeyTarget(k.ID, k.Name, k.User.Email), "")
	if !isHTMX(c) {
		return c.Redirect(back, http.StatusSeeOther)
	}
	return render(c, http.StatusOK, views.KeyRow(all, sess.CSRFToken, filter, h.viewKey(k, time.Now())))
}

// pathID reads the :id of a row's path: digits only, 1 to MaxInt64 (a
// database integer; a larger one is refused by PostgreSQL's driver), else
// ok is false and the answer is 404.
func pathID(c *fiber.Ctx) (id uint, ok bool) { return paramID(c, "id") }

// paramID reads path parameter name as pathID reads :id.
func paramID(c *fiber.Ctx, name string) (id uint, ok bool) {
	s := c.Params(name)
	if s == "" || len(s) > 19 || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return uint(n), true
}

// keysPage loads a person's own keys.
func (h *Handler) keysPage(c *fiber.Ctx, sess *models.Session) (views.KeysPage, error) {
	keys, err := models.ListAPIKeys(c.UserContext(), h.DB, sess.UserID)
	if err != nil {
		return views.KeysPage{}, err
	}
	d := views.KeysPage{Page: dashboardPageFor("API keys", sess)}
	now := time.Now()
	for i := range keys {
		d.Keys = append(d.Keys, h.viewKey(&keys[i], now))
	}
	return d, nil
}

func (h *Handler) viewKey(k *models.APIKey, now time.Time) views.Key {
	return views.Key{ID: k.ID, Name: k.Name, Prefix: k.Prefix, Owner: k.User.Email, RPM: k.RPM,
		Status: k.Status(now), Created: k.CreatedAt, LastUsed: k.LastUsedAt, Expires: k.ExpiresAt,
		OwnerDisabled: k.User.Disabled(), Budget: k.Budget, BudgetPeriod: k.BudgetPeriod, Models: k.Models,
		Currency: h.Currency, Scope: k.KeyScope()}
}

// readKeyForm reads and checks the create form, with maxRPM the highest
// requests per minute the person may set; problem is a sentence for the
// person when something is wrong.
func readKeyForm(c *fiber.Ctx, maxRPM int) (form views.KeyForm, problem string) {
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
		switch {
		case err != nil || n < 0:
			return form, "Requests per minute must be a whole number (leave it empty for the default)."
		case n > maxRPM && maxRPM < adminMaxRPM:
			form.RPM = n
			return form, fmt.Sprintf("Requests per minute can be at most %d (leave it empty for the default). "+
				"You can lower a key's limit, not raise it; ask an admin if you need more.", maxRPM)
		case n > maxRPM:
			form.RPM = n
			return form, fmt.Sprintf("Requests per minute can be at most %d.", maxRPM)
		}
		form.RPM = n
	}
	switch scope := c.FormValue("scope"); scope {
	case "", models.ScopeInference:
	case models.ScopeAdmin:
		form.Scope = scope
	default:
		return form, "Choose the key's scope from the list."
	}
	switch {
	case form.Name == "":
		return form, "Give the key a name, so you know later where it is used."
	case len(form.Name) > 200:
		return form, "The name is too long (200 characters at most)."
	}
	return form, ""
}
