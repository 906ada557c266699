package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/audit"
	"moonji/internal/budget"
	"moonji/internal/money"
	"moonji/internal/spending"
	"moonji/models"
	"moonji/views"
)

// Budgets and model lists on the pages: the forms that set them (people's,
// keys', teams' in admin_teams.go) and what the /usage page shows of them.
// A form is read whole and checked before anything is stored: a refused
// one changes nothing and says why.

// maxAmountChars bounds the amount field: "9223372036.854775807" is the
// longest amount there is.
const maxAmountChars = 32

// Sentences for a refused budget form.
const (
	amountProblem = "The budget must be an amount such as 25 or 2.50: digits with at most 9 decimals, not negative, " +
		"no exponent. Leave it empty for no budget."
	periodProblem = "Choose the budget’s period: per day, per month or in total."
)

// readBudget reads a budget form: amount in currency units (empty: no
// budget) and period. problem is a sentence for the page when the form
// cannot be stored.
func readBudget(c *fiber.Ctx) (amount *int64, period, problem string) {
	raw := strings.TrimSpace(c.FormValue("amount"))
	if raw == "" {
		return nil, "", ""
	}
	if len(raw) > maxAmountChars {
		return nil, "", amountProblem
	}
	n, err := money.Parse(raw)
	if err != nil {
		return nil, "", amountProblem
	}
	period = c.FormValue("period")
	if !models.ValidBudgetPeriod(period) {
		return nil, "", periodProblem
	}
	return &n, period, ""
}

// maxListedModels is how many configured models a refusal lists.
const maxListedModels = 20

// readModelList reads a model list form: names separated by commas, ""
// for every model. Names must be configured models: a typo would
// otherwise allow nothing, silently.
func (h *Handler) readModelList(c *fiber.Ctx) (list, problem string) {
	names, err := models.ParseModelList(c.FormValue("models"))
	if err != nil {
		reason := strings.TrimPrefix(err.Error(), models.ErrInvalid.Error()+" model list: ")
		if utf8.RuneCountInString(reason) > 200 {
			reason = string([]rune(reason)[:200]) + "…"
		}
		return "", "The model list was refused (" + reason + "). Give model names separated by commas, or leave it empty for every model."
	}
	if problem := h.unknownModel(names); problem != "" {
		return "", problem
	}
	return strings.Join(names, ","), ""
}

// unknownModel says which of names is not a configured model, "" when all
// are: the pages and the admin API refuse a list with a typo alike.
func (h *Handler) unknownModel(names []string) string {
	known := h.Gateway.Models()
	for _, n := range names {
		if !slices.Contains(known, n) {
			msg := fmt.Sprintf("There is no model %q", n)
			if len(known) <= maxListedModels {
				msg += ": the models are " + strings.Join(known, ", ")
			}
			return msg + "."
		}
	}
	return ""
}

// forgetPolicies makes this replica read budgets and model lists anew
// after a page changed one.
func (h *Handler) forgetPolicies() {
	if h.Policies != nil {
		h.Policies.Forget()
	}
}

// budgetStatus is each limit with what its period has spent. unknown is
// true when that could not be read (Redis away): the amounts are still
// shown, the page is not refused.
func (h *Handler) budgetStatus(ctx context.Context, limits []budget.Limit, now time.Time) (out []views.BudgetStatus, unknown bool) {
	if len(limits) == 0 {
		return nil, false
	}
	var states []budget.State
	if h.Budgets != nil {
		var err error
		if states, err = h.Budgets.Status(ctx, limits, now); err != nil {
			h.Log.Warn("budgets' spending not read", "err", err)
			states = nil
		}
	}
	unknown = len(states) != len(limits)
	out = make([]views.BudgetStatus, len(limits))
	for i, l := range limits {
		_, renews := l.Window(now)
		out[i] = views.BudgetStatus{Scope: string(l.Scope), Name: l.Name, Amount: l.Amount, Period: string(l.Period), Renews: renews}
		if !unknown {
			s := states[i]
			out[i].Known, out[i].Spent, out[i].Reserved, out[i].Left = true, s.Spent, s.Reserved, s.Left()
		}
	}
	return out, unknown
}

// personBudgets are every budget user's spending counts against: their
// own, each of their teams', each of their active keys'.
func (h *Handler) personBudgets(ctx context.Context, userID uint, now time.Time) ([]views.BudgetStatus, bool, error) {
	u, err := models.UserByID(ctx, h.DB, userID)
	if err != nil {
		return nil, false, err
	}
	var limits []budget.Limit
	if l, ok := spending.LimitOf(budget.ScopePerson, u.ID, u.Email, u.Budget, u.BudgetPeriod); ok {
		limits = append(limits, l)
	}
	teams, err := models.TeamsOf(ctx, h.DB, userID)
	if err != nil {
		return nil, false, err
	}
	for _, t := range teams {
		if l, ok := spending.LimitOf(budget.ScopeTeam, t.ID, t.Name, t.Budget, t.BudgetPeriod); ok {
			limits = append(limits, l)
		}
	}
	keys, err := models.ListAPIKeys(ctx, h.DB, userID)
	if err != nil {
		return nil, false, err
	}
	for i := range keys {
		k := &keys[i]
		if !k.Active(now) {
			continue
		}
		if l, ok := spending.LimitOf(budget.ScopeKey, k.ID, k.Name, k.Budget, k.BudgetPeriod); ok {
			limits = append(limits, l)
		}
	}
	out, unknown := h.budgetStatus(ctx, limits, now)
	return out, unknown, nil
}

// AdminPersonBudget serves POST /admin/people/:id/budget: an admin sets or
// removes a person's budget (everything they spend). A refused form shows
// the list again with the reason, nothing changed.
func (h *Handler) AdminPersonBudget(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id, ok := pathID(c)
	if !ok {
		return fiber.ErrNotFound
	}
	filter, _ := readFilter(c.FormValue("email"))
	amount, period, problem := readBudget(c)
	if problem != "" {
		d, err := h.peoplePage(c, sess, filter)
		if err != nil {
			return err
		}
		d.Error = problem
		return render(c, http.StatusUnprocessableEntity, views.People(d))
	}
	before, err := models.UserByID(c.UserContext(), h.DB, id)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	err = models.SetPersonBudget(c.UserContext(), h.DB, id, amount, period)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	h.forgetPolicies()
	h.Log.Info("person's budget set", "user", id, "budget", amount, "period", period, "by", sess.UserID)
	h.record(c, sess, audit.BudgetUpdate, audit.PersonTarget(before.Email),
		h.budgetChange(before.Budget, before.BudgetPeriod, amount, period))
	v := url.Values{"done": {"budget"}}
	if filter != "" {
		v.Set("email", filter)
	}
	return c.Redirect("/admin/people?"+v.Encode(), http.StatusSeeOther)
}

// AdminKeyBudget serves POST /admin/keys/:id/budget: an admin sets or
// removes any key's budget.
func (h *Handler) AdminKeyBudget(c *fiber.Ctx) error {
	return h.adminKeyChange(c, "budget", func(id uint) (string, error) {
		amount, period, problem := readBudget(c)
		if problem != "" {
			return problem, nil
		}
		return "", models.SetKeyBudget(c.UserContext(), h.DB, id, amount, period)
	})
}

// AdminKeyModels serves POST /admin/keys/:id/models: an admin sets the
// models a key may use.
func (h *Handler) AdminKeyModels(c *fiber.Ctx) error {
	return h.adminKeyChange(c, "models", func(id uint) (string, error) {
		list, problem := h.readModelList(c)
		if problem != "" {
			return problem, nil
		}
		return "", models.SetKeyModels(c.UserContext(), h.DB, id, list)
	})
}

// adminKeyChange runs change on key :id for /admin/keys's forms: change
// returns a sentence when the form is refused (the list is shown again
// with it, nothing changed); a stored change comes back to the list (its
// owner filter kept) saying so.
func (h *Handler) adminKeyChange(c *fiber.Ctx, done string, change func(id uint) (string, error)) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id, ok := pathID(c)
	if !ok {
		return fiber.ErrNotFound
	}
	filter, _ := readFilter(c.FormValue("owner"))
	before, err := models.APIKeyByID(c.UserContext(), h.DB, id)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	problem, err := change(id)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	if problem != "" {
		d, err := h.adminKeysPage(c, sess, filter)
		if err != nil {
			return err
		}
		d.Error = problem
		return render(c, http.StatusUnprocessableEntity, views.AdminKeys(d))
	}
	h.forgetPolicies()
	h.Log.Info("key's limits set", "key", id, "what", done, "by", sess.UserID)
	h.recordKeyChange(c, sess, before, done)
	v := url.Values{"done": {done}}
	if filter != "" {
		v.Set("owner", filter)
	}
	return c.Redirect("/admin/keys?"+v.Encode(), http.StatusSeeOther)
}

// KeyBudget serves POST /keys/:id/budget: a person gives one of their own
// keys a budget, or lowers it. They cannot remove or raise one (an admin
// may have set it), make its period shorter (the same amount per day
// allows more than per month), nor set one above their own budget's
// amount. Admins are bound by none of this, as on /admin/keys. Someone
// else's key is "not found". Two forms sent at once may each pass the
// check, which is harmless: each only lowers.
func (h *Handler) KeyBudget(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id, ok := pathID(c)
	if !ok {
		return fiber.ErrNotFound
	}
	ctx := c.UserContext()
	k, err := models.APIKeyByID(ctx, h.DB, id)
	if errors.Is(err, models.ErrNotFound) || err == nil && k.UserID != sess.UserID {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	amount, period, problem := readBudget(c)
	if problem == "" && !k.Active(time.Now()) {
		problem = "This key is revoked or expired: it can no longer spend anything."
	}
	if problem == "" && !sess.User.Admin {
		problem, err = h.ownKeyBudgetProblem(ctx, sess.UserID, k, amount, period)
		if err != nil {
			return err
		}
	}
	if problem != "" {
		h.Log.Info("key budget refused", "user", sess.UserID, "key", id, "reason", problem)
		d, err := h.keysPage(c, sess)
		if err != nil {
			return err
		}
		d.Error = problem
		return render(c, http.StatusUnprocessableEntity, views.Keys(d))
	}
	if err := models.SetKeyBudget(ctx, h.DB, id, amount, period); err != nil {
		return err
	}
	h.forgetPolicies()
	h.record(c, sess, audit.BudgetUpdate, audit.KeyTarget(k.ID, k.Name, k.User.Email),
		h.budgetChange(k.Budget, k.BudgetPeriod, amount, period))
	h.Log.Info("key's budget set by its owner", "user", sess.UserID, "key", id, "budget", amount, "period", period)
	return c.Redirect("/keys?done=budget", http.StatusSeeOther)
}

// periodRank orders periods by how little the same amount allows: per day
// the most, in total the least.
func periodRank(p string) int {
	switch p {
	case models.BudgetDay:
		return 0
	case models.BudgetMonth:
		return 1
	}
	return 2
}

// ownKeyBudgetProblem says why a person may not give key k this budget,
// or "" when they may.
func (h *Handler) ownKeyBudgetProblem(ctx context.Context, userID uint, k *models.APIKey, amount *int64, period string) (string, error) {
	cur := h.Currency
	if amount == nil {
		if k.Budget != nil {
			return "Only an admin can remove a key’s budget. You can lower it instead.", nil
		}
		return "Give the key a budget: an amount such as 25 or 2.50, and its period.", nil
	}
	if k.Budget != nil {
		if *amount > *k.Budget {
			return fmt.Sprintf("%s is above the key’s budget of %s: you can lower a key’s budget, not raise it. Ask an admin if you need more.",
				views.BudgetText(amount, period, cur), views.BudgetText(k.Budget, k.BudgetPeriod, cur)), nil
		}
		if periodRank(period) < periodRank(k.BudgetPeriod) {
			return fmt.Sprintf("The key’s budget is %s: the same amount %s would allow more. Keep its period or choose a longer one.",
				views.BudgetText(k.Budget, k.BudgetPeriod, cur), views.PeriodLabel(period)), nil
		}
	}
	u, err := models.UserByID(ctx, h.DB, userID)
	if err != nil {
		return "", err
	}
	own, ok := spending.LimitOf(budget.ScopePerson, u.ID, u.Email, u.Budget, u.BudgetPeriod)
	if !ok {
		return "", nil
	}
	// At most what is left of their own budget now: a key cannot promise
	// more than its owner still has.
	left := own.Amount
	if h.Budgets != nil {
		states, err := h.Budgets.Status(ctx, []budget.Limit{own}, time.Now())
		if err != nil {
			h.Log.Warn("own budget's spending not read", "user", userID, "err", err)
			return "What is left of your own budget cannot be read right now; try again shortly.", nil
		}
		left = states[0].Left()
	}
	if *amount > left {
		return fmt.Sprintf("%s is above what is left of your own budget of %s (%s %s): a key’s budget can be at most that.",
			views.BudgetText(amount, period, cur), views.BudgetText(u.Budget, u.BudgetPeriod, cur), money.FormatShort(left), cur), nil
	}
	return "", nil
}

// budgetChange is a budget's change as an audit detail: "budget
// none→5.00 USD/month".
func (h *Handler) budgetChange(oldAmount *int64, oldPeriod string, amount *int64, period string) string {
	var ch audit.Changes
	ch.Set("budget", audit.Budget(oldAmount, oldPeriod, h.Currency), audit.Budget(amount, period, h.Currency))
	if ch.Empty() {
		return "budget unchanged: " + audit.Budget(amount, period, h.Currency)
	}
	return ch.String()
}

// recordKeyChange records what an admin's form (done: "budget" or
// "models") changed of key before, read back after the change.
func (h *Handler) recordKeyChange(c *fiber.Ctx, sess *models.Session, before *models.APIKey, done string) {
	target := audit.KeyTarget(before.ID, before.Name, before.User.Email)
	action := audit.BudgetUpdate
	if done == "models" {
		action = audit.ModelsUpdate
	}
	after, err := models.APIKeyByID(c.UserContext(), h.DB, before.ID)
	if err != nil {
		h.Log.Warn("key re-read for the audit log failed", "key", before.ID, "err", err)
		h.record(c, sess, action, target, "changed; the new value could not be read")
		return
	}
	if action == audit.BudgetUpdate {
		h.record(c, sess, action, target, h.budgetChange(before.Budget, before.BudgetPeriod, after.Budget, after.BudgetPeriod))
		return
	}
	h.record(c, sess, action, target, modelsChange(before.Models, after.Models))
}

// modelsChange is a model list's change as an audit detail.
func modelsChange(before, after string) string {
	var ch audit.Changes
	ch.Set("models", audit.Models(before), audit.Models(after))
	if ch.Empty() {
		return "models unchanged: " + audit.Models(after)
	}
	return ch.String()
}
