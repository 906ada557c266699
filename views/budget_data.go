package views

import (
	"fmt"
	"strings"
	"time"

	"moonji/internal/money"
)

// Money on the pages: amounts are nano-units of the deployment's one
// currency (internal/money), shown with money.FormatShort; tables name the
// currency once, in their heading, and sentences after each amount.

// BudgetStatus is one budget that applies to a person, with what its
// current period has spent (the /usage page's Budgets).
type BudgetStatus struct {
	// Scope is "person", "team" or "key"; Name the team's or key's name.
	Scope, Name string
	Amount      int64
	Period      string // day, month or total
	// Spent, Reserved (held by requests still running) and Left are known
	// when Known; Renews is zero for a total budget.
	Known                 bool
	Spent, Reserved, Left int64
	Renews                time.Time
}

// Whose says whose budget it is, for its row.
func (b BudgetStatus) Whose() string {
	switch b.Scope {
	case "person":
		return "You"
	case "team":
		return "Team " + b.Name
	default:
		return "Key " + b.Name
	}
}

// BudgetText is a budget for a person to read ("5.00 USD per day"), or
// "none" when there is no budget.
func BudgetText(amount *int64, period, currency string) string {
	if amount == nil {
		return "none"
	}
	return amountText(*amount, currency) + " " + periodLabel(period)
}

// amountText is an amount with its currency: "5.00 USD".
func amountText(n int64, currency string) string {
	return strings.TrimSpace(money.FormatShort(n) + " " + currency)
}

// costHead is a cost column's heading, naming the currency.
func costHead(currency string) string {
	if currency == "" {
		return "Cost"
	}
	return "Cost (" + currency + ")"
}

// cost is a cost in a table cell, its currency in the column's heading.
func cost(n int64) string { return money.FormatShort(n) }

// PeriodLabel says how often a budget renews ("per day").
func PeriodLabel(p string) string { return periodLabel(p) }

func periodLabel(p string) string {
	switch p {
	case "day":
		return "per day"
	case "month":
		return "per month"
	case "total":
		return "in total"
	}
	return p
}

// renewsText is when a budget's period ends.
func renewsText(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

// BudgetPeriods are the choices of a budget form's period (short: the
// form may sit in a table cell on a phone). Periods renew at 00:00 UTC.
var BudgetPeriods = []struct{ Value, Label string }{
	{"day", "Per day"}, {"month", "Per month"}, {"total", "In total"},
}

// BudgetForm is what a budget form shows: the current budget, as a
// person would type it back.
type BudgetForm struct {
	// Amount is "" without a budget, else exact ("2.5").
	Amount string
	Period string
}

// AmountInput writes an amount as a form field holds it: exact, without
// trailing zeros ("2.5", "0.000001", "5").
func AmountInput(n int64) string {
	s := strings.TrimRight(money.Format(n), "0")
	return strings.TrimSuffix(s, ".")
}

// TeamsPage is /admin/teams: every team, and the form that creates one.
type TeamsPage struct {
	Page
	Teams    []TeamRow
	Currency string
	// Notice says what was just done; Error why a form was refused, and
	// Form echoes the refused create form.
	Notice, Error string
	Form          TeamForm
	// KnownModels are the configured models, the names a list may hold.
	KnownModels []string
}

// TeamRow is one team in the list.
type TeamRow struct {
	ID      uint
	Name    string
	Members int64
	Budget  string // BudgetText
	Models  string // "" for every model
}

// TeamForm is the create-team form's values.
type TeamForm struct {
	Name   string
	Amount string
	Period string
	Models string
}

// TeamPage is /admin/teams/{id}: one team, its members and its limits.
type TeamPage struct {
	Page
	ID       uint
	Name     string
	Currency string
	Budget   BudgetForm
	// Status is the team's budget now; nil without a budget or when it
	// could not be read.
	Status  *BudgetStatus
	Models  string
	Members []TeamMember
	// MoreMembers says the list stops at MemberLimit.
	MoreMembers bool
	MemberLimit int
	Notice      string
	Error       string
	// AddEmail echoes a refused add-member form.
	AddEmail string
	// KnownModels are the configured models, the names a list may hold.
	KnownModels []string
}

// TeamMember is one member of a team.
type TeamMember struct {
	UserID uint
	Email  string
	// FromSignIn: the provider's teams claim put them there; they come
	// back at their next sign-in if removed while it still names the team.
	FromSignIn bool
}

// teamURL is a team's page, or one of its forms' actions.
func teamURL(id uint, action string) string {
	if action == "" {
		return fmt.Sprintf("/admin/teams/%d", id)
	}
	return fmt.Sprintf("/admin/teams/%d/%s", id, action)
}

// memberRemoveURL is where a member's remove button posts.
func memberRemoveURL(team, user uint) string {
	return fmt.Sprintf("/admin/teams/%d/members/%d/remove", team, user)
}

// keyBudgetURL is where a key's budget form posts: the person's own page
// or the admin's.
func keyBudgetURL(all bool, id uint) string {
	if all {
		return fmt.Sprintf("/admin/keys/%d/budget", id)
	}
	return fmt.Sprintf("/keys/%d/budget", id)
}

// keyModelsURL is where the admin's model-list form of a key posts.
func keyModelsURL(id uint) string { return fmt.Sprintf("/admin/keys/%d/models", id) }

// budgetValue is a budget's amount for a data-value attribute: "" for none.
func budgetValue(amount *int64) string {
	if amount == nil {
		return ""
	}
	return i64(*amount)
}
