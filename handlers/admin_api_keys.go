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
	"moonji/internal/money"
	"moonji/models"
)

// /api/v1/admin/keys: everyone's keys for programs (Terraform, scripts).
// Ids are the keys' database ids: stable, never reused. The secret is in
// the answer to the POST that creates a key, and nowhere else ever.

// Page sizes of the key list.
const (
	adminAPIDefaultLimit = 100
	adminAPIMaxLimit     = 500
)

// keyObject is a key as the admin API shows it.
type keyObject struct {
	ID     uint   `json:"id"`
	Object string `json:"object"` // "api_key"
	// Key is the secret: only in the answer that creates the key.
	Key     string `json:"key,omitempty"`
	Name    string `json:"name"`
	Prefix  string `json:"prefix"`
	Scope   string `json:"scope"`
	Owner   string `json:"owner"`
	OwnerID uint   `json:"owner_id"`
	Status  string `json:"status"`
	RPM     int    `json:"rpm"`
	// Budget is an exact decimal in the currency, null for none.
	Budget       *string    `json:"budget"`
	BudgetPeriod *string    `json:"budget_period"`
	Currency     string     `json:"currency"`
	Models       []string   `json:"models"` // []: every model
	CreatedAt    time.Time  `json:"created_at"`
	ExpiresAt    *time.Time `json:"expires_at"`
	RevokedAt    *time.Time `json:"revoked_at"`
	LastUsedAt   *time.Time `json:"last_used_at"`
}

func (h *Handler) keyObject(k *models.APIKey, now time.Time) keyObject {
	o := keyObject{ID: k.ID, Object: "api_key", Name: k.Name, Prefix: k.Prefix, Scope: k.KeyScope(), Owner: k.User.Email,
		OwnerID: k.UserID, Status: k.Status(now), RPM: k.RPM, Currency: h.Currency, Models: []string{},
		CreatedAt: k.CreatedAt.UTC(), ExpiresAt: utc(k.ExpiresAt), RevokedAt: utc(k.RevokedAt), LastUsedAt: utc(k.LastUsedAt)}
	if k.Budget != nil {
		b, p := money.Format(*k.Budget), k.BudgetPeriod
		o.Budget, o.BudgetPeriod = &b, &p
	}
	if k.Models != "" {
		o.Models = strings.Split(k.Models, ",")
	}
	return o
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// keyTarget names a key in the audit log.
func keyTarget(k *models.APIKey) string {
	return audit.KeyTarget(k.ID, k.Name, k.User.Email)
}

func invalid(c *fiber.Ctx, msg, param string) error {
	return apiErrorParam(c, http.StatusBadRequest, msg, "invalid_request_error", "invalid_request", param)
}

func keyNotFound(c *fiber.Ctx) error {
	return apiError(c, http.StatusNotFound, "No key with id "+clip(c.Params("id"), 40)+".", "invalid_request_error", "not_found")
}

// AdminAPIKeys serves GET /api/v1/admin/keys?owner=&scope=&status=&after=&limit=:
// keys newest first; after is the last id of the previous page.
func (h *Handler) AdminAPIKeys(c *fiber.Ctx) error {
	f := models.KeyFilter{Limit: adminAPIDefaultLimit, Now: time.Now()}
	owner, ok := readFilter(c.Query("owner"))
	if !ok {
		return invalid(c, fmt.Sprintf("owner is too long (at most %d characters)", maxFilterChars), "owner")
	}
	f.Owner = owner
	if f.Scope = c.Query("scope"); f.Scope != "" && !models.ValidScope(f.Scope) {
		return invalid(c, fmt.Sprintf("scope must be %q or %q", models.ScopeInference, models.ScopeAdmin), "scope")
	}
	switch f.Status = c.Query("status"); f.Status {
	case "", models.KeyActive, models.KeyRevoked, models.KeyExpired:
	default:
		return invalid(c, "status must be active, revoked or expired", "status")
	}
	if s := c.Query("after"); s != "" {
		n, err := strconv.ParseUint(s, 10, 63)
		if err != nil || n == 0 {
			return invalid(c, "after must be the id of a key (a positive integer)", "after")
		}
		f.Before = uint(n)
	}
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > adminAPIMaxLimit {
			return invalid(c, fmt.Sprintf("limit must be from 1 to %d", adminAPIMaxLimit), "limit")
		}
		f.Limit = n
	}
	keys, more, err := models.ListAPIKeysFiltered(c.UserContext(), h.DB, f)
	if err != nil {
		return err
	}
	data := make([]keyObject, len(keys))
	for i := range keys {
		data[i] = h.keyObject(&keys[i], f.Now)
	}
	list := fiber.Map{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(keys) > 0 {
		list["first_id"], list["last_id"] = keys[0].ID, keys[len(keys)-1].ID
	}
	return c.JSON(list)
}

// AdminAPIKey serves GET /api/v1/admin/keys/{id}.
func (h *Handler) AdminAPIKey(c *fiber.Ctx) error {
	k, err := h.pathKey(c)
	if err != nil || k == nil {
		return err
	}
	return c.JSON(h.keyObject(k, time.Now()))
}

// pathKey reads the key of :id; nil (answered 404) when there is none.
func (h *Handler) pathKey(c *fiber.Ctx) (*models.APIKey, error) {
	id, ok := pathID(c)
	if !ok {
		return nil, keyNotFound(c)
	}
	k, err := models.APIKeyByID(c.UserContext(), h.DB, id)
	if errors.Is(err, models.ErrNotFound) {
		return nil, keyNotFound(c)
	}
	return k, err
}

// AdminAPICreateKey serves POST /api/v1/admin/keys: {owner, name, scope?,
// expires_in?, rpm?, budget?, budget_period?, models?} → 201 with the key
// and, this once, its secret.
func (h *Handler) AdminAPICreateKey(c *fiber.Ctx) error {
	b, err := parseKeyCreate(c.Body(), adminMaxRPM)
	if err != nil {
		return badBody(c, err)
	}
	ctx := c.UserContext()
	owner, err := models.UserByEmail(ctx, h.DB, *b.Owner)
	if errors.Is(err, models.ErrNotFound) {
		return invalid(c, fmt.Sprintf("There is no person with the email %q; they appear once they sign in, "+
			"or with moonji people add.", clip(*b.Owner, 100)), "owner")
	}
	if err != nil {
		return err
	}
	if owner.Disabled() {
		return invalid(c, owner.Email+" is disabled: enable them before giving them a key.", "owner")
	}
	scope := models.ScopeInference
	if b.Scope != nil {
		scope = *b.Scope
	}
	if problem := h.unknownModel(b.Models); problem != "" {
		return invalid(c, problem, "models")
	}
	rpm := 0
	if b.RPM != nil {
		rpm = *b.RPM
	}
	limits := models.Limits{Budget: b.Budget, Models: strings.Join(b.Models, ",")}
	if b.Period != nil {
		limits.BudgetPeriod = *b.Period
	}
	secret, key, err := apikey.CreateScoped(ctx, h.DB, owner, scope, *b.Name, b.Expires, rpm, limits)
	switch {
	case errors.Is(err, apikey.ErrAdminScopeOwner):
		return invalid(c, "Only an admin's key may have the admin scope, and "+owner.Email+" is not an admin.", "scope")
	case errors.Is(err, models.ErrInvalid):
		return invalid(c, err.Error(), "")
	case err != nil:
		return err
	}
	key.User = *owner
	h.Log.Info("api key created", "user", owner.ID, "key", key.ID, "prefix", key.Prefix, "scope", scope,
		"via", "admin_api", "by_key", adminKey(c).ID)
	h.recordByKey(c, audit.KeyCreate, keyTarget(key), createDetail(key, h.Currency))
	o := h.keyObject(key, time.Now())
	o.Key = secret
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Status(http.StatusCreated).JSON(o)
}

// createDetail is what the audit log says of a new key: its scope and
// limits, never its secret.
func createDetail(k *models.APIKey, currency string) string {
	d := fmt.Sprintf("scope %s, rpm %s, budget %s, models %s", k.KeyScope(), rpmText(k.RPM),
		budgetText(k.Budget, k.BudgetPeriod, currency), modelsText(k.Models))
	if k.ExpiresAt != nil {
		d += ", expires " + k.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return d
}

func rpmText(n int) string {
	if n == 0 {
		return "default"
	}
	return strconv.Itoa(n)
}

func budgetText(b *int64, period, currency string) string {
	if b == nil {
		return "none"
	}
	return money.Format(*b) + " " + currency + " per " + period
}

func modelsText(list string) string {
	if list == "" {
		return "all"
	}
	return list
}

// AdminAPIUpdateKey serves PATCH /api/v1/admin/keys/{id}: a merge patch of
// name, rpm, budget, budget_period and models. Each kind of change is
// recorded on its own (key.update, budget.update, models.update).
func (h *Handler) AdminAPIUpdateKey(c *fiber.Ctx) error {
	b, err := parseKeyPatch(c.Body(), adminMaxRPM)
	if err != nil {
		return badBody(c, err)
	}
	old, err := h.pathKey(c)
	if err != nil || old == nil {
		return err
	}
	if problem := h.unknownModel(b.Models); problem != "" {
		return invalid(c, problem, "models")
	}
	change := models.KeyChange{Name: b.Name, RPM: b.RPM}
	if b.HasBudget || b.Period != nil {
		change.SetBudget = true
		change.Budget, change.BudgetPeriod = old.Budget, old.BudgetPeriod
		if b.HasBudget {
			change.Budget = b.Budget
		}
		switch {
		case change.Budget == nil && b.Period != nil:
			return invalid(c, "budget_period needs a budget: the key has none", "budget_period")
		case change.Budget == nil:
			change.BudgetPeriod = ""
		case b.Period != nil:
			change.BudgetPeriod = *b.Period
		case change.BudgetPeriod == "":
			change.BudgetPeriod = models.BudgetMonth
		}
	}
	if b.HasModels {
		list := strings.Join(b.Models, ",")
		change.Models = &list
	}
	k, err := models.UpdateAPIKey(c.UserContext(), h.DB, old.ID, change)
	switch {
	case errors.Is(err, models.ErrNotFound):
		return keyNotFound(c)
	case errors.Is(err, models.ErrInvalid):
		return invalid(c, err.Error(), "")
	case err != nil:
		return err
	}
	// This replica applies the change at once: the key's rpm is cached
	// with it, budgets and model lists by the policies.
	h.APIKeys.Forget(k.ID)
	h.forgetPolicies()
	h.recordUpdate(c, old, k)
	return c.JSON(h.keyObject(k, time.Now()))
}

// recordUpdate writes what a PATCH changed to the audit log.
func (h *Handler) recordUpdate(c *fiber.Ctx, old, k *models.APIKey) {
	var changed []string
	if old.Name != k.Name {
		changed = append(changed, fmt.Sprintf("name %q → %q", old.Name, k.Name))
	}
	if old.RPM != k.RPM {
		changed = append(changed, fmt.Sprintf("rpm %s → %s", rpmText(old.RPM), rpmText(k.RPM)))
	}
	target := keyTarget(k)
	if len(changed) > 0 {
		h.recordByKey(c, audit.KeyUpdate, target, strings.Join(changed, ", "))
	}
	before, after := budgetText(old.Budget, old.BudgetPeriod, h.Currency), budgetText(k.Budget, k.BudgetPeriod, h.Currency)
	if before != after {
		h.recordByKey(c, audit.BudgetUpdate, target, "budget "+before+" → "+after)
	}
	if old.Models != k.Models {
		h.recordByKey(c, audit.ModelsUpdate, target, "models "+modelsText(old.Models)+" → "+modelsText(k.Models))
	}
	h.Log.Info("key changed", "key", k.ID, "via", "admin_api", "by_key", adminKey(c).ID)
}

// AdminAPIRevokeKey serves DELETE /api/v1/admin/keys/{id}: revokes the key
// and answers it. Revoking a revoked key changes nothing and answers the
// same.
func (h *Handler) AdminAPIRevokeKey(c *fiber.Ctx) error {
	old, err := h.pathKey(c)
	if err != nil || old == nil {
		return err
	}
	ctx := c.UserContext()
	err = h.APIKeys.Revoke(ctx, old.ID, 0)
	if errors.Is(err, models.ErrNotFound) {
		return keyNotFound(c)
	}
	if err != nil {
		return err
	}
	k, err := models.APIKeyByID(ctx, h.DB, old.ID)
	if err != nil {
		return err
	}
	if old.RevokedAt == nil {
		h.Log.Info("api key revoked", "key", k.ID, "via", "admin_api", "by_key", adminKey(c).ID)
		h.recordByKey(c, audit.KeyRevoke, keyTarget(k), "revoked (was "+old.Status(time.Now())+")")
	}
	return c.JSON(h.keyObject(k, time.Now()))
}
