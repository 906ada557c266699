package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/audit"
	"moonji/internal/budget"
	"moonji/internal/spending"
	"moonji/models"
	"moonji/views"
)

// The teams pages (/admin/teams): an admin makes teams, puts people in
// them and gives each a budget and a model list. Every form is a plain
// POST (CSRF in its hidden field, checked by the page guard); a stored
// change goes back to the page that shows it with a notice (post, redirect,
// get), a refused one shows the page again with the reason and changes
// nothing. Every change makes this replica read policies anew
// (forgetPolicies), so the next request of a member is held to it.

// teamMembersLimit bounds a team's member list: a team a provider's claim
// fills may hold thousands.
const teamMembersLimit = 500

// teamNameProblem explains a refused team name.
var teamNameProblem = fmt.Sprintf("A team’s name is 1 to %d characters, without control or invisible characters.", models.MaxTeamNameLen)

// AdminTeams serves GET /admin/teams: every team, and the create form.
func (h *Handler) AdminTeams(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d, err := h.teamsPage(c, sess)
	if err != nil {
		return err
	}
	if c.Query("done") == "deleted" {
		d.Notice = "Team deleted: its budget and models no longer apply to its members."
	}
	return render(c, http.StatusOK, views.Teams(d))
}

func (h *Handler) teamsPage(c *fiber.Ctx, sess *models.Session) (views.TeamsPage, error) {
	d := views.TeamsPage{Page: dashboardPageFor("Teams", sess), Currency: h.Currency, KnownModels: h.Gateway.Models()}
	teams, err := models.ListTeams(c.UserContext(), h.DB)
	if err != nil {
		return d, err
	}
	for _, t := range teams {
		d.Teams = append(d.Teams, views.TeamRow{ID: t.ID, Name: t.Name, Members: t.Members,
			Budget: views.BudgetText(t.Budget, t.BudgetPeriod, h.Currency), Models: strings.ReplaceAll(t.Models, ",", ", ")})
	}
	return d, nil
}

// AdminCreateTeam serves POST /admin/teams: a new team with its budget
// and models; its page is next, to add its members.
func (h *Handler) AdminCreateTeam(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	form := views.TeamForm{Name: c.FormValue("name"), Amount: c.FormValue("amount"), Period: c.FormValue("period"),
		Models: c.FormValue("models")}
	amount, period, problem := readBudget(c)
	var list string
	if problem == "" {
		list, problem = h.readModelList(c)
	}
	var team *models.Team
	if problem == "" {
		team, err = models.CreateTeam(c.UserContext(), h.DB, form.Name, models.Limits{Budget: amount, BudgetPeriod: period, Models: list})
		switch {
		case errors.Is(err, models.ErrInvalid):
			problem = teamNameProblem
		case errors.Is(err, models.ErrTeamExists):
			problem = fmt.Sprintf("A team named “%s” exists already.", strings.TrimSpace(form.Name))
		case err != nil:
			return err
		}
	}
	if problem != "" {
		d, err := h.teamsPage(c, sess)
		if err != nil {
			return err
		}
		// Echo what fits the fields back; a name too long to be one is
		// dropped rather than sent back whole.
		if utf8.RuneCountInString(form.Name) > models.MaxTeamNameLen || !utf8.ValidString(form.Name) {
			form.Name = ""
		}
		if len(form.Amount) > maxAmountChars {
			form.Amount = ""
		}
		if len(form.Models) > 4096 {
			form.Models = ""
		}
		d.Error, d.Form = problem, form
		return render(c, http.StatusUnprocessableEntity, views.Teams(d))
	}
	h.forgetPolicies()
	h.Log.Info("team created", "team", team.ID, "name", team.Name, "by", sess.UserID)
	var ch audit.Changes
	ch.Note("budget %s", audit.Budget(team.Budget, team.BudgetPeriod, h.Currency))
	ch.Note("models %s", audit.Models(team.Models))
	h.record(c, sess, audit.TeamCreate, audit.TeamTarget(team.ID, team.Name), ch.String())
	return c.Redirect(fmt.Sprintf("/admin/teams/%d?done=created", team.ID), http.StatusSeeOther)
}

// teamNotices are what ?done= says on a team's page.
var teamNotices = map[string]string{
	"created": "Team created. Add its members below.",
	"budget":  "Budget saved: it applies from its members’ next request.",
	"models":  "Models saved: they apply from its members’ next request.",
	"added":   "Member added: the team’s budget and models apply to them from their next request.",
	"removed": "Member removed: the team’s budget and models no longer apply to them.",
}

// AdminTeam serves GET /admin/teams/:id: the team's budget (with what its
// period has spent), models and members.
func (h *Handler) AdminTeam(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d, err := h.teamPage(c, sess)
	if err != nil {
		return err
	}
	d.Notice = teamNotices[c.Query("done")]
	return render(c, http.StatusOK, views.Team(d))
}

// teamPage loads team :id's page; a team that does not exist is 404.
func (h *Handler) teamPage(c *fiber.Ctx, sess *models.Session) (views.TeamPage, error) {
	id, ok := pathID(c)
	if !ok {
		return views.TeamPage{}, fiber.ErrNotFound
	}
	ctx := c.UserContext()
	t, err := models.TeamByID(ctx, h.DB, id)
	if errors.Is(err, models.ErrNotFound) {
		return views.TeamPage{}, fiber.ErrNotFound
	}
	if err != nil {
		return views.TeamPage{}, err
	}
	d := views.TeamPage{Page: dashboardPageFor("Team "+t.Name, sess), ID: t.ID, Name: t.Name, Currency: h.Currency,
		Models: strings.ReplaceAll(t.Models, ",", ", "), MemberLimit: teamMembersLimit, KnownModels: h.Gateway.Models()}
	if t.Budget != nil {
		d.Budget = views.BudgetForm{Amount: views.AmountInput(*t.Budget), Period: t.BudgetPeriod}
		l, _ := spending.LimitOf(budget.ScopeTeam, t.ID, t.Name, t.Budget, t.BudgetPeriod)
		if st, unknown := h.budgetStatus(ctx, []budget.Limit{l}, time.Now()); !unknown {
			d.Status = &st[0]
		}
	}
	rows, more, err := models.TeamMemberRows(ctx, h.DB, t.ID, teamMembersLimit)
	if err != nil {
		return d, err
	}
	d.MoreMembers = more
	for _, r := range rows {
		d.Members = append(d.Members, views.TeamMember{UserID: r.UserID, Email: r.Email, FromSignIn: r.Source == models.SourceOIDC})
	}
	return d, nil
}

// teamChange runs change on the team :id was before for one of its
// page's forms: change returns a sentence when the form is refused (the
// page is shown again with it), else what it changed, which the audit log
// records under done's action, and the page is shown with done's notice.
func (h *Handler) teamChange(c *fiber.Ctx, done string, change func(before *models.Team) (problem, detail string, err error)) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id, ok := pathID(c)
	if !ok {
		return fiber.ErrNotFound
	}
	before, err := models.TeamByID(c.UserContext(), h.DB, id)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	problem, detail, err := change(before)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	if problem != "" {
		d, err := h.teamPage(c, sess)
		if err != nil {
			return err
		}
		d.Error = problem
		if done == "added" {
			if email := c.FormValue("email"); len(email) <= maxFilterChars && utf8.ValidString(email) {
				d.AddEmail = email
			}
		}
		return render(c, http.StatusUnprocessableEntity, views.Team(d))
	}
	h.forgetPolicies()
	h.Log.Info("team changed", "team", id, "what", done, "by", sess.UserID)
	h.record(c, sess, teamActions[done], audit.TeamTarget(before.ID, before.Name), detail)
	return c.Redirect(fmt.Sprintf("/admin/teams/%d?done=%s", id, done), http.StatusSeeOther)
}

// teamActions are the audit actions of teamChange's forms.
var teamActions = map[string]string{
	"budget":  audit.BudgetUpdate,
	"models":  audit.ModelsUpdate,
	"added":   audit.TeamMemberAdd,
	"removed": audit.TeamMemberRemove,
}

// AdminTeamBudget serves POST /admin/teams/:id/budget: the team's budget,
// or none (an empty amount).
func (h *Handler) AdminTeamBudget(c *fiber.Ctx) error {
	return h.teamChange(c, "budget", func(t *models.Team) (string, string, error) {
		amount, period, problem := readBudget(c)
		if problem != "" {
			return problem, "", nil
		}
		return "", h.budgetChange(t.Budget, t.BudgetPeriod, amount, period), models.SetTeamBudget(c.UserContext(), h.DB, t.ID, amount, period)
	})
}

// AdminTeamModels serves POST /admin/teams/:id/models: the models the
// team's members may use ("" for every one).
func (h *Handler) AdminTeamModels(c *fiber.Ctx) error {
	return h.teamChange(c, "models", func(t *models.Team) (string, string, error) {
		list, problem := h.readModelList(c)
		if problem != "" {
			return problem, "", nil
		}
		return "", modelsChange(t.Models, list), models.SetTeamModels(c.UserContext(), h.DB, t.ID, list)
	})
}

// AdminTeamAddMember serves POST /admin/teams/:id/members: puts the person
// with this email in the team (someone who has signed in or holds a key;
// nobody is made up here).
func (h *Handler) AdminTeamAddMember(c *fiber.Ctx) error {
	return h.teamChange(c, "added", func(t *models.Team) (string, string, error) {
		ctx := c.UserContext()
		raw := strings.TrimSpace(c.FormValue("email"))
		email := models.StorableText(raw)
		if email == "" || len(raw) > maxFilterChars || email != raw {
			return "Give the email of someone who has signed in or holds a key.", "", nil
		}
		u, err := models.UserByEmail(ctx, h.DB, email)
		if errors.Is(err, models.ErrNotFound) {
			return fmt.Sprintf("Nobody with the email “%s” has signed in or holds a key.", email), "", nil
		}
		if err != nil {
			return "", "", err
		}
		return "", "added " + u.Email, models.AddTeamMember(ctx, h.DB, t.ID, u.ID)
	})
}

// AdminTeamRemoveMember serves POST /admin/teams/:id/members/:user/remove.
// Someone the provider's teams claim placed in the team is back at their
// next sign-in if the claim still names it.
func (h *Handler) AdminTeamRemoveMember(c *fiber.Ctx) error {
	return h.teamChange(c, "removed", func(t *models.Team) (string, string, error) {
		user, ok := paramID(c, "user")
		if !ok {
			return "", "", models.ErrNotFound
		}
		ctx := c.UserContext()
		who := fmt.Sprintf("person %d", user)
		if u, err := models.UserByID(ctx, h.DB, user); err == nil {
			who = u.Email
		}
		err := models.RemoveTeamMember(ctx, h.DB, t.ID, user)
		if errors.Is(err, models.ErrNotFound) {
			return "They are not in this team (any more).", "", nil
		}
		return "", "removed " + who, err
	})
}

// AdminDeleteTeam serves POST /admin/teams/:id/delete. htmx (which asked
// for a confirmation) is sent to the list with HX-Redirect; a plain form
// is redirected there.
func (h *Handler) AdminDeleteTeam(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id, ok := pathID(c)
	if !ok {
		return fiber.ErrNotFound
	}
	before, err := models.TeamByID(c.UserContext(), h.DB, id)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	err = models.DeleteTeam(c.UserContext(), h.DB, id)
	if errors.Is(err, models.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	h.forgetPolicies()
	h.Log.Info("team deleted", "team", id, "by", sess.UserID)
	h.record(c, sess, audit.TeamDelete, audit.TeamTarget(before.ID, before.Name),
		fmt.Sprintf("had budget %s; models %s", audit.Budget(before.Budget, before.BudgetPeriod, h.Currency), audit.Models(before.Models)))
	if isHTMX(c) {
		c.Set("HX-Redirect", "/admin/teams?done=deleted")
		return c.SendStatus(http.StatusOK)
	}
	return c.Redirect("/admin/teams?done=deleted", http.StatusSeeOther)
}
