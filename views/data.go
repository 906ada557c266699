// Package views holds Moonji's HTML pages as templ components. They take
// plain data (this file's types), never database models, so that a page shows
// exactly what its handler chose to show.
package views

import (
	"fmt"
	"net/url"
	"time"

	"moonji/internal/csrfmask"
)

// Page is what every page's layout needs.
type Page struct {
	Title string
	// User is the signed-in person, nil when signed out.
	User *User
	// CSRF is the session's CSRF token, sent by htmx in a header and by
	// plain forms in a hidden field.
	CSRF string
	// Wide pages (the chat) use the whole window instead of a column.
	Wide bool
	// Dashboard pages (usage, keys, admin) load dashboard.css; the chat
	// and the others do without it.
	Dashboard bool
}

// User is the signed-in person as pages show them.
type User struct {
	Email string
	Name  string
	Admin bool
}

// Key is one row of a key list.
type Key struct {
	ID       uint
	Name     string
	Prefix   string
	Owner    string
	RPM      int
	Status   string // active, revoked or expired
	Created  time.Time
	LastUsed *time.Time
	Expires  *time.Time
	// OwnerDisabled: an admin disabled the owner, so even an active key
	// is refused.
	OwnerDisabled bool
	// Budget (nil: none) and BudgetPeriod limit what the key spends, in
	// Currency; Models are the models it may use ("": every one).
	Budget       *int64
	BudgetPeriod string
	Models       string
	Currency     string
	// Scope is the key's scope: inference, or admin (/api/v1/admin only).
	Scope string
}

// BudgetForm is the key's budget as its form shows it.
func (k Key) BudgetForm() BudgetForm { return budgetForm(k.Budget, k.BudgetPeriod) }

func budgetForm(amount *int64, period string) BudgetForm {
	if amount == nil {
		return BudgetForm{Period: "month"}
	}
	return BudgetForm{Amount: AmountInput(*amount), Period: period}
}

// KeysPage is the keys page: a person's own keys (/keys) or everyone's
// (/admin/keys, All true).
type KeysPage struct {
	Page
	All  bool
	Keys []Key
	// NewSecret is the key just created, shown this once.
	NewSecret string
	NewName   string
	Error     string
	// Notice says what a form just did.
	Notice string
	// Form echoes the create form after an error.
	Form KeyForm
	// Filter is /admin/keys's owner filter, as typed (cleaned).
	Filter string
	// More says the list stops at Limit keys and others matched too.
	More  bool
	Limit int
}

// KeyForm is the create-key form's values.
type KeyForm struct {
	Name        string
	ExpiresDays int
	RPM         int
	// Scope is "admin" for an admin-scoped key (admins only), else "".
	Scope string
}

// Person is one row of the people list (/admin/people).
type Person struct {
	ID         uint
	Email      string
	Name       string
	Admin      bool
	Created    time.Time
	LastLogin  *time.Time
	DisabledAt *time.Time
	ActiveKeys int64
	// Self is the admin looking at the list, who cannot disable themself.
	Self bool
	// Budget (nil: none) limits everything they spend, in Currency.
	Budget       *int64
	BudgetPeriod string
	Currency     string
}

// BudgetForm is the person's budget as its form shows it.
func (p Person) BudgetForm() BudgetForm { return budgetForm(p.Budget, p.BudgetPeriod) }

// Status is a short word for the list: active or disabled.
func (p Person) Status() string {
	if p.DisabledAt != nil {
		return "disabled"
	}
	return "active"
}

// PeoplePage is /admin/people: everyone, filtered by email.
type PeoplePage struct {
	Page
	Filter string
	People []Person
	// More says the list stops at Limit people and others matched too.
	More  bool
	Limit int
	// Notice says what was just done; Error why the request failed.
	Notice string
	Error  string
}

// ExpiryChoices are the create form's expiry options, in days (0: never).
var ExpiryChoices = []int{0, 7, 30, 90, 365}

// revokeURL is where a row's revoke button posts.
func revokeURL(all bool, id uint) string {
	if all {
		return fmt.Sprintf("/admin/keys/%d/revoke", id)
	}
	return fmt.Sprintf("/keys/%d/revoke", id)
}

// personURL is where a row of /admin/people posts action (disable, enable).
func personURL(id uint, action string) string {
	return fmt.Sprintf("/admin/people/%d/%s", id, action)
}

// filteredURL is path with its filter parameter, when there is one.
func filteredURL(path, param, filter string) string {
	if filter == "" {
		return path
	}
	return path + "?" + url.Values{param: {filter}}.Encode()
}

// when formats a time for a table cell.
func when(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

// shortTime is a time for a narrow cell: how long ago within the past
// week, else the day.
func shortTime(t time.Time) string {
	if d := time.Since(t); d >= 0 && d < 7*24*time.Hour {
		return ago(t)
	}
	return t.UTC().Format("2006-01-02")
}

func expiryLabel(days int) string {
	if days == 0 {
		return "Never"
	}
	return fmt.Sprintf("In %d days", days)
}

// maskCSRF is the session's CSRF token as a page carries it: masked afresh
// at every rendering (csrfmask), since pages are served compressed.
func maskCSRF(token string) string { return csrfmask.Mask(token) }

// csrfHeaders is the hx-headers value that makes htmx send the CSRF token,
// masked afresh (csrfmask: pages are compressed).
func csrfHeaders(token string) string {
	return fmt.Sprintf(`{"X-CSRF-Token": %q}`, csrfmask.Mask(token))
}
