package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"moonji/internal/audit"
	"moonji/internal/money"
	"moonji/models"
)

func cmdTeams(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: teams needs create, add, remove or list", ErrUsage)
	}
	switch args[0] {
	case "create":
		return teamsCreate(ctx, args[1:], stdout)
	case "add", "remove":
		return teamsMember(ctx, args[0], args[1:], stdout)
	case "list":
		return teamsList(ctx, args[1:], stdout)
	default:
		return fmt.Errorf("%w: unknown teams command %q", ErrUsage, args[0])
	}
}

// teamsCreate makes a team: `teams create NAME [--budget X [--budget-period
// P]] [--models a,b]`; the flags may follow the name.
func teamsCreate(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("teams create")
	budget := addBudgetFlags(fs)
	list := fs.String("models", "", "the models the members may use, comma-separated (default: all)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: teams create needs exactly one team name", ErrUsage)
	}
	name, err := models.CheckTeamName(pos[0])
	if err != nil {
		return fmt.Errorf("%w: NAME: %v", ErrUsage, err)
	}
	limits, err := budget.limits()
	if err != nil {
		return err
	}
	if limits.Models, err = modelsFlag(*path, *list); err != nil {
		return err
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	team, err := models.CreateTeam(ctx, db, name, limits)
	if err != nil {
		return err
	}
	record(ctx, db, audit.TeamCreate, audit.TeamTarget(team.ID, team.Name),
		fmt.Sprintf("budget %s; models %s", audit.Budget(team.Budget, team.BudgetPeriod, ""), audit.Models(team.Models)))
	_, err = fmt.Fprintf(stdout, "team %d: %s\n", team.ID, team.Name)
	return err
}

// teamsMember adds a person to a team (creating the person, as keys create
// does, when the email is new) or removes them from it.
func teamsMember(ctx context.Context, verb string, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("teams " + verb)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return fmt.Errorf("%w: teams %s needs a team name and an email", ErrUsage, verb)
	}
	if _, err := models.CheckTeamName(pos[0]); err != nil {
		return fmt.Errorf("%w: NAME: %v", ErrUsage, err)
	}
	if email := strings.TrimSpace(pos[1]); email == "" || len(email) > 320 {
		return fmt.Errorf("%w: EMAIL: empty or over 320 characters", ErrUsage)
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	team, err := models.TeamByName(ctx, db, pos[0])
	if errors.Is(err, models.ErrNotFound) {
		return fmt.Errorf("no team named %q", pos[0])
	}
	if err != nil {
		return err
	}
	if verb == "add" {
		user, err := models.EnsureUser(ctx, db, pos[1])
		if err != nil {
			return err
		}
		if err := models.AddTeamMember(ctx, db, team.ID, user.ID); err != nil {
			return err
		}
		record(ctx, db, audit.TeamMemberAdd, audit.TeamTarget(team.ID, team.Name), "added "+user.Email)
		_, err = fmt.Fprintf(stdout, "added %s to team %s\n", user.Email, team.Name)
		return err
	}
	user, err := personByEmail(ctx, db, pos[1])
	if err != nil {
		return err
	}
	if err := models.RemoveTeamMember(ctx, db, team.ID, user.ID); errors.Is(err, models.ErrNotFound) {
		return fmt.Errorf("%s is not in team %s", user.Email, team.Name)
	} else if err != nil {
		return err
	}
	record(ctx, db, audit.TeamMemberRemove, audit.TeamTarget(team.ID, team.Name), "removed "+user.Email)
	_, err = fmt.Fprintf(stdout, "removed %s from team %s\n", user.Email, team.Name)
	return err
}

func teamsList(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("teams list")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: teams list takes no arguments", ErrUsage)
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	teams, err := models.ListTeams(ctx, db)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tMEMBERS\tBUDGET\tPERIOD\tMODELS")
	for _, t := range teams {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", t.ID, t.Name, t.Members, fmtBudget(t.Budget), fmtPeriod(t.BudgetPeriod), fmtModels(t.Models))
	}
	return tw.Flush()
}

// budgetFlags are --budget and --budget-period of a command that sets a
// budget.
type budgetFlags struct {
	fs             *flag.FlagSet
	amount, period *string
}

func addBudgetFlags(fs *flag.FlagSet) *budgetFlags {
	return &budgetFlags{
		fs:     fs,
		amount: fs.String("budget", "", "the most it may spend per period, in the currency (e.g. 5.00)"),
		period: fs.String("budget-period", "", "the budget's period: day, month (the default) or total"),
	}
}

// limits reads the flags, once parsed: no --budget is no budget, and a
// period without one is a usage error.
func (b *budgetFlags) limits() (models.Limits, error) {
	set := map[string]bool{}
	b.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["budget"] {
		if set["budget-period"] {
			return models.Limits{}, fmt.Errorf("%w: --budget-period needs --budget", ErrUsage)
		}
		return models.Limits{}, nil
	}
	amount, err := parseAmount("--budget", *b.amount)
	if err != nil {
		return models.Limits{}, err
	}
	period := models.BudgetMonth
	if set["budget-period"] {
		if period, err = parsePeriod("--budget-period", *b.period); err != nil {
			return models.Limits{}, err
		}
	}
	return models.Limits{Budget: &amount, BudgetPeriod: period}, nil
}

// parseAmount reads an amount of money in currency units ("5.00").
func parseAmount(what, s string) (int64, error) {
	n, err := money.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrUsage, what, err)
	}
	return n, nil
}

func parsePeriod(what, s string) (string, error) {
	if !models.ValidBudgetPeriod(s) {
		return "", fmt.Errorf("%w: %s: want %s, %s or %s, got %q", ErrUsage, what,
			models.BudgetDay, models.BudgetMonth, models.BudgetTotal, s)
	}
	return s, nil
}

// modelsFlag checks the value of --models and returns it as it is stored.
// The names must be models of the configuration at path: a typo would
// otherwise allow nothing, silently.
func modelsFlag(path, s string) (string, error) {
	names, err := models.ParseModelList(s)
	if err != nil {
		return "", fmt.Errorf("%w: --models: %v", ErrUsage, err)
	}
	if len(names) == 0 {
		return "", nil
	}
	cfg, err := loadConfig(path)
	if err != nil {
		return "", err
	}
	known := map[string]bool{}
	var all []string
	for _, m := range cfg.Models {
		known[m.Name] = true
		all = append(all, m.Name)
	}
	for _, n := range names {
		if !known[n] {
			return "", fmt.Errorf("%w: --models: there is no model %q (the models are %s)", ErrUsage, n, strings.Join(all, ", "))
		}
	}
	return strings.Join(names, ","), nil
}

// fmtBudget writes a budget exactly, with at least two decimals ("5.00",
// "0.0025"), or "-" for none.
func fmtBudget(b *int64) string {
	if b == nil {
		return "-"
	}
	whole, frac, _ := strings.Cut(money.Format(*b), ".")
	frac = strings.TrimRight(frac, "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return whole + "." + frac
}

func fmtPeriod(p string) string {
	if p == "" {
		return "-"
	}
	return p
}

func fmtModels(list string) string {
	if list == "" {
		return "all"
	}
	return list
}
