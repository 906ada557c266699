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
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

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
