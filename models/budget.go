package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gorm.io/gorm"
)

// Budgets: a key, a person and a team may each have one, an amount in
// nano-units of the deployment's currency (internal/money) over a period;
// nil is no budget. What was spent is read from the day rollup of people
// and keys (usage_people's cost), so a budget's period starts at a UTC day.
// The gateway decides what a budget allows; this file stores them.

// Budget periods.
const (
	BudgetDay   = "day"   // since today's UTC midnight
	BudgetMonth = "month" // since the first of this UTC month
	BudgetTotal = "total" // everything ever spent
)

// ValidBudgetPeriod reports whether p is one of the budget periods.
func ValidBudgetPeriod(p string) bool {
	return p == BudgetDay || p == BudgetMonth || p == BudgetTotal
}

// BudgetPeriodStart is when the period of a budget that runs at now began:
// today's or this month's first instant in UTC, or the zero time for a
// total budget (and for an unknown period, so that it limits the most).
func BudgetPeriodStart(period string, now time.Time) time.Time {
	now = now.UTC()
	switch period {
	case BudgetDay:
		return time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	case BudgetMonth:
		return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Time{}
}

// ErrInvalid is wrapped by the errors of a budget, a model list or a team
// name that cannot be stored.
var ErrInvalid = errors.New("invalid")

// Bounds of a model list.
const (
	MaxModelNames   = 100
	MaxModelNameLen = 200 // characters, as the rollups' model column
)

// ParseModelList reads a comma-separated list of model names: each trimmed,
// repeats dropped (the first kept), empty entries skipped. An empty or blank
// list is nil: every model. A list that is not blank but names no model,
// more than MaxModelNames names, a name over MaxModelNameLen characters, and
// invalid UTF-8, control or invisible formatting characters are refused.
func ParseModelList(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if !utf8.ValidString(s) {
		return nil, fmt.Errorf("%w model list: not UTF-8", ErrInvalid)
	}
	var names []string
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		name := strings.TrimSpace(part)
		if name == "" {
			continue
		}
		if hasControl(name) {
			return nil, fmt.Errorf("%w model list: %q has a control character", ErrInvalid, name)
		}
		if n := utf8.RuneCountInString(name); n > MaxModelNameLen {
			return nil, fmt.Errorf("%w model list: a name of %d characters (at most %d)", ErrInvalid, n, MaxModelNameLen)
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		names = append(names, name)
		if len(names) > MaxModelNames {
			return nil, fmt.Errorf("%w model list: more than %d models", ErrInvalid, MaxModelNames)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w model list: %q names no model", ErrInvalid, s)
	}
	return names, nil
}

// hasControl reports whether s has a control character, or an invisible
// formatting one (a bidirectional override, a zero-width joiner) that
// would make a name shown in a list read as another.
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) })
}

// normalizeModelList is the stored form of a model list: its names, joined
// by commas ("" for every model).
func normalizeModelList(s string) (string, error) {
	names, err := ParseModelList(s)
	if err != nil {
		return "", err
	}
	return strings.Join(names, ","), nil
}

// checkBudget validates a budget and its period: nil with no period (none),
// or an amount ≥ 0 with one of the periods.
func checkBudget(budget *int64, period string) error {
	if budget == nil {
		if period != "" {
			return fmt.Errorf("%w budget: a period (%q) without an amount", ErrInvalid, period)
		}
		return nil
	}
	if *budget < 0 {
		return fmt.Errorf("%w budget: negative", ErrInvalid)
	}
	if !ValidBudgetPeriod(period) {
		return fmt.Errorf("%w budget period %q (want %s, %s or %s)", ErrInvalid, period, BudgetDay, BudgetMonth, BudgetTotal)
	}
	return nil
}

// Limits are what a new key or team may be given at its creation: a budget
// (nil: none) with its period, and the models it may use (comma-separated,
// "" for all).
type Limits struct {
	Budget       *int64
	BudgetPeriod string
	Models       string
}

// Check validates the limits and returns them as they are stored (the model
// list normalized).
func (l Limits) Check() (Limits, error) {
	if err := checkBudget(l.Budget, l.BudgetPeriod); err != nil {
		return Limits{}, err
	}
	list, err := normalizeModelList(l.Models)
	if err != nil {
		return Limits{}, err
	}
	l.Models = list
	if l.Budget != nil {
		b := *l.Budget
		l.Budget = &b
	}
	return l, nil
}

// setColumns updates columns of the row id of model's table, or returns
// ErrNotFound.
func setColumns(ctx context.Context, db *gorm.DB, model any, what string, id uint, set map[string]any) error {
	res := db.WithContext(ctx).Model(model).Where("id = ?", id).Updates(set)
	if res.Error != nil {
		return fmt.Errorf("set %s %d: %w", what, id, res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrNotFound
	}
	return nil
}

func budgetColumns(budget *int64, period string) (map[string]any, error) {
	if err := checkBudget(budget, period); err != nil {
		return nil, err
	}
	set := map[string]any{"budget": nil, "budget_period": period}
	if budget != nil {
		set["budget"] = *budget
	}
	return set, nil
}

// SetKeyBudget sets the budget of key id (nil and "": none). Running
// servers see it within the key cache's few seconds.
func SetKeyBudget(ctx context.Context, db *gorm.DB, id uint, budget *int64, period string) error {
	set, err := budgetColumns(budget, period)
	if err != nil {
		return err
	}
	return setColumns(ctx, db, &APIKey{}, "budget of key", id, set)
}

// SetKeyModels sets the models key id may use (a comma-separated list, ""
// for all; see ParseModelList).
func SetKeyModels(ctx context.Context, db *gorm.DB, id uint, list string) error {
	norm, err := normalizeModelList(list)
	if err != nil {
		return err
	}
	return setColumns(ctx, db, &APIKey{}, "models of key", id, map[string]any{"models": norm})
}

// SetPersonBudget sets the budget of user id: everything they spend, over
// all their keys and the chat (nil and "": none).
func SetPersonBudget(ctx context.Context, db *gorm.DB, id uint, budget *int64, period string) error {
	set, err := budgetColumns(budget, period)
	if err != nil {
		return err
	}
	return setColumns(ctx, db, &User{}, "budget of user", id, set)
}

// Scopes of SpentSince.
const (
	ScopeKey    = "key"
	ScopePerson = "person"
	ScopeTeam   = "team"
)

// SpentSince sums what was spent since the UTC day of since (the day
// rollup's cost, in nano-units): by key id (ScopeKey), by person id over
// all their keys and their chat (ScopePerson), or by the members of team id
// (ScopeTeam: everything each of its present members spent, in any team).
// One indexed query; a zero since is everything.
func SpentSince(ctx context.Context, db *gorm.DB, scope string, id uint, since time.Time) (int64, error) {
	if id == 0 {
		return 0, fmt.Errorf("spent by %s 0: %w", scope, ErrInvalid)
	}
	q := db.WithContext(ctx).Model(&UsageByPerson{}).
		Select("CAST(COALESCE(SUM(cost), 0) AS BIGINT)").
		Where("span = ? AND start >= ?", SpanDay, since.UTC().Truncate(Day))
	switch scope {
	case ScopeKey:
		q = q.Where("key_id = ?", id)
	case ScopePerson:
		q = q.Where("user_id = ?", id)
	case ScopeTeam:
		q = q.Where("user_id IN (?)", db.WithContext(ctx).Model(&TeamMember{}).Select("user_id").Where("team_id = ?", id))
	default:
		return 0, fmt.Errorf("spent by %q: %w scope", scope, ErrInvalid)
	}
	var spent int64
	if err := q.Row().Scan(&spent); err != nil {
		return 0, fmt.Errorf("spent by %s %d: %w", scope, id, err)
	}
	return spent, nil
}
