package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"moonji/internal/audit"
	"moonji/internal/devidp"
	"moonji/models"
)

// stdin is where --dev-password-stdin reads; tests replace it.
var stdin io.Reader = os.Stdin

func cmdPeople(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: people needs add, list, budget, disable or enable", ErrUsage)
	}
	switch args[0] {
	case "add":
		return peopleAdd(ctx, args[1:], stdout)
	case "list":
		return peopleList(ctx, args[1:], stdout)
	case "budget":
		return peopleBudget(ctx, args[1:], stdout)
	case "disable", "enable":
		return peopleSwitch(ctx, args[0], args[1:], stdout)
	default:
		return fmt.Errorf("%w: unknown people command %q", ErrUsage, args[0])
	}
}

// peopleAdd creates a person (or updates one): for a deployment whose
// provider does not create people before their first sign-in, and for the
// embedded development provider, whose passwords live in Moonji's database.
// The password is read from stdin, never from the command line, where
// other users of the machine could read it.
func peopleAdd(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("people add")
	email := fs.String("email", "", "the person's email address")
	admin := fs.Bool("admin", false, "make them an admin (an OIDC provider's admin rule decides again at each sign-in)")
	withPassword := fs.Bool("dev-password-stdin", false, "read their password for the embedded development provider from stdin")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: people add takes no arguments", ErrUsage)
	}
	if strings.TrimSpace(*email) == "" || len(*email) > 320 {
		return fmt.Errorf("%w: people add needs --email (at most 320 characters)", ErrUsage)
	}
	var hash []byte
	if *withPassword {
		line, err := bufio.NewReader(io.LimitReader(stdin, 1024)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read the password: %w", err)
		}
		password := strings.TrimRight(line, "\r\n")
		if len(password) < 8 {
			return fmt.Errorf("%w: the password must have at least 8 characters", ErrUsage)
		}
		if hash, err = devidp.HashPassword(password); err != nil {
			return err
		}
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	user, err := models.EnsureUser(ctx, db, *email)
	if err != nil {
		return err
	}
	wasAdmin := user.Admin
	set := map[string]any{"admin": *admin}
	if hash != nil {
		set["password_hash"] = hash
	}
	if err := db.WithContext(ctx).Model(user).Updates(set).Error; err != nil {
		return fmt.Errorf("update %s: %w", user.Email, err)
	}
	var ch audit.Changes
	ch.Set("admin", strconv.FormatBool(wasAdmin), strconv.FormatBool(*admin))
	if hash != nil {
		ch.Note("development password set")
	}
	if ch.Empty() {
		ch.Note("added or unchanged; admin %t", *admin)
	}
	record(ctx, db, audit.PersonUpdate, audit.PersonTarget(user.Email), ch.String())
	_, err = fmt.Fprintf(stdout, "person %d: %s\n", user.ID, user.Email)
	return err
}

func peopleList(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("people list")
	filter := fs.String("filter", "", "only people whose email contains this")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: people list takes no arguments", ErrUsage)
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	people, more, err := models.ListPeople(ctx, db, *filter, 10_000, time.Now())
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEMAIL\tADMIN\tDISABLED\tLAST LOGIN\tACTIVE KEYS\tBUDGET\tPERIOD")
	for _, p := range people {
		fmt.Fprintf(tw, "%d\t%s\t%t\t%s\t%s\t%d\t%s\t%s\n", p.ID, p.Email, p.Admin, fmtTime(p.DisabledAt), fmtTime(p.LastLoginAt),
			p.ActiveKeys, fmtBudget(p.Budget), fmtPeriod(p.BudgetPeriod))
	}
	if more {
		fmt.Fprintln(tw, "…\t(more: use --filter)")
	}
	return tw.Flush()
}

// peopleSwitch disables or enables the person with an email. Their sessions
// end at once; running servers refuse their keys within the key cache's
// 5 s (the web page's switch does it at once on its own replica).
func peopleSwitch(ctx context.Context, verb string, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("people " + verb)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: people %s needs exactly one email", ErrUsage, verb)
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	user, err := personByEmail(ctx, db, pos[0])
	if err != nil {
		return err
	}
	if verb == "disable" {
		_, ended, err := models.DisableUser(ctx, db, user.ID, time.Now())
		if err != nil {
			return err
		}
		record(ctx, db, audit.PersonDisable, audit.PersonTarget(user.Email), fmt.Sprintf("%d sessions ended", ended))
		_, err = fmt.Fprintf(stdout, "disabled %s; %d sessions ended\n", user.Email, ended)
		return err
	}
	if _, err := models.EnableUser(ctx, db, user.ID); err != nil {
		return err
	}
	record(ctx, db, audit.PersonEnable, audit.PersonTarget(user.Email), "")
	_, err = fmt.Fprintf(stdout, "enabled %s\n", user.Email)
	return err
}

// peopleBudget sets or removes a person's budget: `people budget EMAIL
// AMOUNT PERIOD`, or `people budget EMAIL none`. It covers everything they
// spend, over all their keys and the chat; running servers see it within
// the key cache's few seconds.
func peopleBudget(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("people budget")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	var budget *int64
	var period string
	switch {
	case len(pos) >= 2 && len(pos) <= 3 && strings.EqualFold(pos[1], "none"):
		// No budget; a period after "none" means nothing and is let be.
	case len(pos) == 3:
		amount, err := parseAmount("AMOUNT", pos[1])
		if err != nil {
			return err
		}
		if period, err = parsePeriod("PERIOD", pos[2]); err != nil {
			return err
		}
		budget = &amount
	default:
		return fmt.Errorf("%w: people budget needs EMAIL AMOUNT PERIOD (day, month or total), or EMAIL none", ErrUsage)
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	user, err := personByEmail(ctx, db, pos[0])
	if err != nil {
		return err
	}
	if err := models.SetPersonBudget(ctx, db, user.ID, budget, period); err != nil {
		return err
	}
	var ch audit.Changes
	ch.Set("budget", audit.Budget(user.Budget, user.BudgetPeriod, ""), audit.Budget(budget, period, ""))
	if ch.Empty() {
		ch.Note("budget unchanged: %s", audit.Budget(budget, period, ""))
	}
	record(ctx, db, audit.BudgetUpdate, audit.PersonTarget(user.Email), ch.String())
	if budget == nil {
		_, err = fmt.Fprintf(stdout, "%s: no budget\n", user.Email)
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s: budget %s per %s\n", user.Email, fmtBudget(budget), period)
	return err
}

// personByEmail finds a person, or says that nobody has the email.
func personByEmail(ctx context.Context, db *gorm.DB, email string) (*models.User, error) {
	user, err := models.UserByEmail(ctx, db, email)
	if errors.Is(err, models.ErrNotFound) {
		return nil, fmt.Errorf("nobody with the email %q", email)
	}
	return user, err
}
