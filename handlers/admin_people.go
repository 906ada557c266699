package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/audit"
	"moonji/models"
	"moonji/views"
)

// peopleLimit bounds /admin/people; the email filter finds the rest.
const peopleLimit = 200

// maxFilterChars bounds the email filter of the admin lists: no email is
// longer (models.User.Email holds 320).
const maxFilterChars = 320

// filterTooLong explains a refused filter.
const filterTooLong = "The filter is too long: an email address has at most 320 characters."

// readFilter cleans the email filter of an admin list: NUL and invalid
// UTF-8, which PostgreSQL refuses in any string, are dropped and blanks
// trimmed. ok is false when it is longer than any email could be. Nothing
// else is refused: the filter is a bound parameter whose LIKE wildcards the
// query escapes (models.ListPeople).
func readFilter(raw string) (filter string, ok bool) {
	if len(raw) > 4*maxFilterChars {
		return "", false
	}
	filter = strings.TrimSpace(models.StorableText(raw))
	if utf8.RuneCountInString(filter) > maxFilterChars {
		return "", false
	}
	return filter, true
}

// AdminPeople serves GET /admin/people?email=: everyone who has signed in or
// holds a key, by email, with their last login, admin flag, whether they are
// disabled and how many active keys they hold.
func (h *Handler) AdminPeople(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	filter, ok := readFilter(c.Query("email"))
	if !ok {
		d := views.PeoplePage{Page: dashboardPageFor("People", sess), Limit: peopleLimit, Error: filterTooLong}
		return render(c, http.StatusBadRequest, views.People(d))
	}
	d, err := h.peoplePage(c, sess, filter)
	if err != nil {
		return err
	}
	switch c.Query("done") {
	case "disabled":
		d.Notice = "Disabled: their sessions have ended and their keys no longer work."
	case "enabled":
		d.Notice = "Enabled: they can sign in again and their keys work."
	case "budget":
		d.Notice = "Budget saved: it applies from their next request."
	}
	return render(c, http.StatusOK, views.People(d))
}

// peoplePage is the list of people whose email contains filter.
func (h *Handler) peoplePage(c *fiber.Ctx, sess *models.Session, filter string) (views.PeoplePage, error) {
	d := views.PeoplePage{Page: dashboardPageFor("People", sess), Limit: peopleLimit, Filter: filter}
	people, more, err := models.ListPeople(c.UserContext(), h.DB, filter, peopleLimit, time.Now())
	if err != nil {
		return d, err
	}
	d.More = more
	for i := range people {
		d.People = append(d.People, h.viewPerson(&people[i], sess.UserID))
	}
	return d, nil
}

// AdminDisablePerson serves POST /admin/people/:id/disable. The person's
// sessions are deleted, which ends them on every replica at once (each
// request reads its session from the database); their keys stop at once on
// this replica, and on the others when their cached copy expires, within
// apikey.DefaultCacheTTL. What they hold running — requests on /v1, chat
// replies being written or queued, event streams — ends at once on this
// replica and within the same time on the others (fairshare.Withdrawals):
// rows cancelled, person_disabled. An admin cannot disable themself:
// someone must be left who can undo it.
func (h *Handler) AdminDisablePerson(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id, ok := pathID(c)
	if !ok {
		return fiber.ErrNotFound
	}
	if id == sess.UserID {
		h.Log.Info("person not disabled: an admin cannot disable themself", "user", id)
		return h.message(c, http.StatusBadRequest, "Not disabled",
			"You cannot disable yourself. Another admin can, if it must be done.", "People", "/admin/people")
	}
	u, ended, err := models.DisableUser(c.UserContext(), h.DB, id, time.Now())
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	// After the commit: a key look-up that read the owner before it is
	// neither kept nor cached (apikey.Store.ForgetUser).
	h.APIKeys.ForgetUser(id)
	held := h.Withdrawals.Withdraw(id)
	h.Log.Info("person disabled", "user", id, "email", u.Email, "by", sess.UserID, "by_email", sess.User.Email,
		"sessions_ended", ended, "running_ended", held)
	h.record(c, sess, audit.PersonDisable, audit.PersonTarget(u.Email), fmt.Sprintf("%d sessions ended", ended))
	return h.afterPersonChange(c, sess, id, "disabled")
}

// AdminEnablePerson serves POST /admin/people/:id/enable: the person may
// sign in again and their keys work again (not cached while refused, they
// need no forgetting). Their old sessions stay gone.
func (h *Handler) AdminEnablePerson(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id, ok := pathID(c)
	if !ok {
		return fiber.ErrNotFound
	}
	u, err := models.EnableUser(c.UserContext(), h.DB, id)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	h.Log.Info("person enabled", "user", id, "email", u.Email, "by", sess.UserID, "by_email", sess.User.Email)
	h.record(c, sess, audit.PersonEnable, audit.PersonTarget(u.Email), "")
	return h.afterPersonChange(c, sess, id, "enabled")
}

// afterPersonChange answers htmx with the person's updated row, and a plain
// form with a redirect to the list it came from (its filter kept).
func (h *Handler) afterPersonChange(c *fiber.Ctx, sess *models.Session, id uint, done string) error {
	filter, _ := readFilter(c.FormValue("email"))
	if !isHTMX(c) {
		v := url.Values{"done": {done}}
		if filter != "" {
			v.Set("email", filter)
		}
		return c.Redirect("/admin/people?"+v.Encode(), http.StatusSeeOther)
	}
	p, err := models.PersonByID(c.UserContext(), h.DB, id, time.Now())
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.PersonRow(sess.CSRFToken, filter, h.viewPerson(p, sess.UserID)))
}

func (h *Handler) viewPerson(p *models.Person, self uint) views.Person {
	return views.Person{ID: p.ID, Email: p.Email, Name: p.Name, Admin: p.Admin, Created: p.CreatedAt,
		LastLogin: p.LastLoginAt, DisabledAt: p.DisabledAt, ActiveKeys: p.ActiveKeys, Self: p.ID == self,
		Budget: p.Budget, BudgetPeriod: p.BudgetPeriod, Currency: h.Currency}
}
