package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// User is a person known to Moonji: created on first OIDC login, or by the
// CLI when an operator issues a key for an email address.
type User struct {
	ID      uint   `gorm:"primaryKey"`
	Email   string `gorm:"size:320;uniqueIndex"`
	Name    string `gorm:"size:200"`
	Issuer  string `gorm:"size:500;index:idx_user_identity"`
	Subject string `gorm:"size:255;index:idx_user_identity"`
	Admin   bool
	// PasswordHash is used only by the embedded development provider.
	PasswordHash []byte
	// LastLoginAt is the last successful sign-in; nil for people who never
	// signed in (a key issued by the CLI).
	LastLoginAt *time.Time
	// DisabledAt is set when an admin disabled the person: no sign-in, no
	// session, no key works until an admin enables them again.
	DisabledAt *time.Time
	// Budget is what the person may spend per BudgetPeriod over all their
	// keys and the chat, in nano-units of the currency (internal/money);
	// nil: no budget of their own.
	Budget       *int64
	BudgetPeriod string `gorm:"size:8"` // BudgetDay, BudgetMonth or BudgetTotal; "" without a budget
	// DefaultSystemPrompt is the system prompt of the person's
	// conversations that have none of their own ("": none).
	DefaultSystemPrompt string `gorm:"type:text;not null;default:''"`
	CreatedAt           time.Time
	UpdatedAt           time.Time
}

// Disabled reports whether an admin has disabled the person.
func (u *User) Disabled() bool { return u.DisabledAt != nil }

// ErrNotFound is returned by look-ups that find nothing.
var ErrNotFound = errors.New("not found")

// NormalizeEmail lower-cases and trims an email address.
func NormalizeEmail(email string) string {
	return strings.ToLower(strings.TrimSpace(email))
}

// UserByEmail finds a user by email address.
func UserByEmail(ctx context.Context, db *gorm.DB, email string) (*User, error) {
	var u User
	err := db.WithContext(ctx).Where("email = ?", NormalizeEmail(email)).Take(&u).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find user by email: %w", err)
	}
	return &u, nil
}

// UserByID finds a user by id.
func UserByID(ctx context.Context, db *gorm.DB, id uint) (*User, error) {
	var u User
	err := db.WithContext(ctx).Take(&u, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find user %d: %w", id, err)
	}
	return &u, nil
}

// EnsureUser returns the user with this email, creating it when missing.
func EnsureUser(ctx context.Context, db *gorm.DB, email string) (*User, error) {
	email = NormalizeEmail(email)
	if email == "" {
		return nil, errors.New("email is required")
	}
	u, err := UserByEmail(ctx, db, email)
	if err == nil {
		return u, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	u = &User{Email: email}
	if err := db.WithContext(ctx).Create(u).Error; err != nil {
		// Another process may have created it meanwhile.
		if again, err2 := UserByEmail(ctx, db, email); err2 == nil {
			return again, nil
		}
		return nil, fmt.Errorf("create user %s: %w", email, err)
	}
	return u, nil
}

// RecordLogin notes a successful sign-in of user id at time at.
func RecordLogin(ctx context.Context, db *gorm.DB, id uint, at time.Time) error {
	err := db.WithContext(ctx).Model(&User{}).Where("id = ?", id).Update("last_login_at", at.UTC()).Error
	if err != nil {
		return fmt.Errorf("record sign-in of user %d: %w", id, err)
	}
	return nil
}

// DisableUser marks user id disabled (a user already disabled keeps its
// first time) and deletes all their sessions, in one transaction. Every
// replica reads sessions from the database, so the person's pages and /api
// stop working everywhere at once; their keys are the caller's business (the
// apikey.Store caches them). It returns the user and how many sessions ended.
func DisableUser(ctx context.Context, db *gorm.DB, id uint, at time.Time) (*User, int64, error) {
	var u User
	var ended int64
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Take(&u, id).Error; err != nil {
			return err
		}
		if u.DisabledAt == nil {
			at := at.UTC()
			if err := tx.Model(&User{}).Where("id = ? AND disabled_at IS NULL", id).Update("disabled_at", at).Error; err != nil {
				return err
			}
			u.DisabledAt = &at
		}
		// Always, even when already disabled: a sign-in that raced an
		// earlier disable may have left a session (auth refuses it anyway).
		res := tx.Where("user_id = ?", id).Delete(&Session{})
		ended = res.RowsAffected
		return res.Error
	})
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("disable user %d: %w", id, err)
	}
	return &u, ended, nil
}

// EnableUser clears the disabled mark of user id. Their keys work again;
// their sessions, deleted when they were disabled, do not come back.
func EnableUser(ctx context.Context, db *gorm.DB, id uint) (*User, error) {
	res := db.WithContext(ctx).Model(&User{}).Where("id = ?", id).Update("disabled_at", nil)
	if res.Error != nil {
		return nil, fmt.Errorf("enable user %d: %w", id, res.Error)
	}
	if res.RowsAffected == 0 {
		return nil, ErrNotFound
	}
	return UserByID(ctx, db, id)
}

// Person is one row of the people list: a user and how many of their keys
// are active (neither revoked nor expired).
type Person struct {
	User
	ActiveKeys int64
}

// ListPeople lists at most limit users whose email contains filter (all
// when it is empty), by email, with their active keys counted: two queries
// whatever the number of people. more reports that others matched too.
func ListPeople(ctx context.Context, db *gorm.DB, filter string, limit int, now time.Time) (people []Person, more bool, err error) {
	q := db.WithContext(ctx).Order("email").Limit(limit + 1)
	if filter != "" {
		q = q.Where(emailContains, likeContains(filter))
	}
	var users []User
	if err := q.Find(&users).Error; err != nil {
		return nil, false, fmt.Errorf("list people: %w", err)
	}
	if len(users) > limit {
		users, more = users[:limit], true
	}
	ids := make([]uint, len(users))
	for i := range users {
		ids[i] = users[i].ID
	}
	counts, err := activeKeyCounts(ctx, db, ids, now)
	if err != nil {
		return nil, false, err
	}
	people = make([]Person, len(users))
	for i := range users {
		people[i] = Person{User: users[i], ActiveKeys: counts[users[i].ID]}
	}
	return people, more, nil
}

// PersonByID is one row of the people list.
func PersonByID(ctx context.Context, db *gorm.DB, id uint, now time.Time) (*Person, error) {
	u, err := UserByID(ctx, db, id)
	if err != nil {
		return nil, err
	}
	counts, err := activeKeyCounts(ctx, db, []uint{id}, now)
	if err != nil {
		return nil, err
	}
	return &Person{User: *u, ActiveKeys: counts[id]}, nil
}

// activeKeyCounts counts the active keys of each user in ids, in one query.
func activeKeyCounts(ctx context.Context, db *gorm.DB, ids []uint, now time.Time) (map[uint]int64, error) {
	counts := make(map[uint]int64, len(ids))
	if len(ids) == 0 {
		return counts, nil
	}
	var rows []struct {
		UserID uint
		N      int64
	}
	err := db.WithContext(ctx).Model(&APIKey{}).Select("user_id, COUNT(*) AS n").
		Where("user_id IN ? AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)", ids, now.UTC()).
		Group("user_id").Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("count active keys: %w", err)
	}
	for _, r := range rows {
		counts[r.UserID] = r.N
	}
	return counts, nil
}

// emailContains is the condition of an email filter; its argument comes
// from likeContains. The backslash escapes LIKE's wildcards in the filter,
// on SQLite and PostgreSQL alike.
const emailContains = `email LIKE ? ESCAPE '\'`

// likeContains is a LIKE pattern that matches an email filter anywhere, its
// own % and _ taken literally. Emails are stored lower-case
// (NormalizeEmail), so a lower-cased filter matches the same way on
// PostgreSQL, whose LIKE tells cases apart, as on SQLite, whose LIKE does
// not. NUL and invalid UTF-8, which PostgreSQL refuses in any string, are
// dropped.
func likeContains(filter string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return "%" + r.Replace(NormalizeEmail(StorableText(filter))) + "%"
}

// DisabledAmong returns those of people an admin has disabled.
func DisabledAmong(ctx context.Context, db *gorm.DB, people []uint) ([]uint, error) {
	var out []uint
	// In pieces: a statement's parameters are bounded (SQLite: 32,766).
	for len(people) > 0 {
		n := min(len(people), 500)
		var ids []uint
		err := db.WithContext(ctx).Model(&User{}).Where("id IN ? AND disabled_at IS NOT NULL", people[:n]).Pluck("id", &ids).Error
		if err != nil {
			return nil, fmt.Errorf("find disabled people: %w", err)
		}
		out = append(out, ids...)
		people = people[n:]
	}
	return out, nil
}
