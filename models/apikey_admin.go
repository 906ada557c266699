package models

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// What the admin API (/api/v1/admin/keys) reads and changes of keys. The
// checks of budgets and model lists are budget.go's, the same the pages and
// the CLI go through.

// Key statuses a list can be filtered by (APIKey.Status).
const (
	KeyActive  = "active"
	KeyRevoked = "revoked"
	KeyExpired = "expired"
)

// KeyFilter selects keys for ListAPIKeysFiltered. Zero fields select all.
type KeyFilter struct {
	Owner  string // the owner's email contains it
	Scope  string // ScopeInference or ScopeAdmin
	Status string // KeyActive, KeyRevoked or KeyExpired, at Now
	Now    time.Time
	// Before keeps the keys with a smaller id: the cursor of the next page
	// (ids only grow, so a page never repeats or skips a key).
	Before uint
	Limit  int
}

// ListAPIKeysFiltered lists at most f.Limit keys that match f, newest (the
// highest id) first, with their owners; more reports that others follow.
func ListAPIKeysFiltered(ctx context.Context, db *gorm.DB, f KeyFilter) (keys []APIKey, more bool, err error) {
	if f.Limit <= 0 {
		return nil, false, fmt.Errorf("list api keys: %w limit %d", ErrInvalid, f.Limit)
	}
	q := db.WithContext(ctx).Preload("User").Order("id DESC").Limit(f.Limit + 1)
	if f.Owner != "" {
		q = q.Where("user_id IN (?)", db.WithContext(ctx).Model(&User{}).Select("id").Where(emailContains, likeContains(f.Owner)))
	}
	if f.Scope != "" {
		q = q.Where("scope = ?", f.Scope)
	}
	now := f.Now.UTC()
	switch f.Status {
	case "":
	case KeyActive:
		q = q.Where("revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)", now)
	case KeyRevoked:
		q = q.Where("revoked_at IS NOT NULL")
	case KeyExpired:
		q = q.Where("revoked_at IS NULL AND expires_at IS NOT NULL AND expires_at <= ?", now)
	default:
		return nil, false, fmt.Errorf("list api keys: %w status %q", ErrInvalid, f.Status)
	}
	if f.Before != 0 {
		q = q.Where("id < ?", f.Before)
	}
	if err := q.Find(&keys).Error; err != nil {
		return nil, false, fmt.Errorf("list api keys: %w", err)
	}
	if len(keys) > f.Limit {
		keys, more = keys[:f.Limit], true
	}
	return keys, more, nil
}

// KeyChange is what an update of a key sets; nil fields are left as they
// are. Budget and BudgetPeriod go together (SetBudget): a nil Budget with
// SetBudget removes the budget.
type KeyChange struct {
	Name         *string
	RPM          *int
	SetBudget    bool
	Budget       *int64
	BudgetPeriod string
	Models       *string // comma-separated, "" for every model
}

// Empty reports whether the change sets nothing.
func (c KeyChange) Empty() bool {
	return c.Name == nil && c.RPM == nil && !c.SetBudget && c.Models == nil
}

// UpdateAPIKey applies change to key id in one statement, after checking
// all of it (a refused change changes nothing), and returns the key as it
// is now. The budget and the model list are checked as everywhere else
// (checkBudget, ParseModelList); that the models exist is the caller's
// business (the configuration).
func UpdateAPIKey(ctx context.Context, db *gorm.DB, id uint, change KeyChange) (*APIKey, error) {
	set := map[string]any{}
	if change.Name != nil {
		name := strings.TrimSpace(*change.Name)
		if name == "" {
			return nil, fmt.Errorf("%w name: empty", ErrInvalid)
		}
		set["name"] = name
	}
	if change.RPM != nil {
		if *change.RPM < 0 {
			return nil, fmt.Errorf("%w rpm: negative", ErrInvalid)
		}
		set["rpm"] = *change.RPM
	}
	if change.SetBudget {
		cols, err := budgetColumns(change.Budget, change.BudgetPeriod)
		if err != nil {
			return nil, err
		}
		for k, v := range cols {
			set[k] = v
		}
	}
	if change.Models != nil {
		norm, err := normalizeModelList(*change.Models)
		if err != nil {
			return nil, err
		}
		set["models"] = norm
	}
	if len(set) > 0 {
		if err := setColumns(ctx, db, &APIKey{}, "key", id, set); err != nil {
			return nil, err
		}
	}
	return APIKeyByID(ctx, db, id)
}
