package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// LoginState is one sign-in in flight: the PKCE verifier and the page to
// return to, between the redirect to the provider and its callback. It lives
// in the database rather than in process memory so that the callback may land
// on any replica.
type LoginState struct {
	ID        string `gorm:"primaryKey;size:64"` // SHA-256 of the state parameter
	Verifier  string `gorm:"size:128"`
	Next      string `gorm:"size:2000"`
	CreatedAt time.Time
	ExpiresAt time.Time `gorm:"index"`
}

// CreateLoginState stores a sign-in in flight.
func CreateLoginState(ctx context.Context, db *gorm.DB, s *LoginState) error {
	if err := db.WithContext(ctx).Create(s).Error; err != nil {
		return fmt.Errorf("create login state: %w", err)
	}
	return nil
}

// TakeLoginState returns the sign-in stored under id and deletes it, so that
// a state value can complete at most one login. An expired or unknown id
// gives ErrNotFound.
func TakeLoginState(ctx context.Context, db *gorm.DB, id string, now time.Time) (*LoginState, error) {
	var s LoginState
	err := db.WithContext(ctx).Where("id = ?", id).Take(&s).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find login state: %w", err)
	}
	// Only the request that deletes the row may use it: two callbacks racing
	// with the same state cannot both pass.
	res := db.WithContext(ctx).Where("id = ?", id).Delete(&LoginState{})
	if res.Error != nil {
		return nil, fmt.Errorf("delete login state: %w", res.Error)
	}
	if res.RowsAffected == 0 || !now.Before(s.ExpiresAt) {
		return nil, ErrNotFound
	}
	return &s, nil
}

// DeleteExpiredLoginStates removes sign-ins that were never completed.
func DeleteExpiredLoginStates(ctx context.Context, db *gorm.DB, now time.Time) error {
	if err := db.WithContext(ctx).Where("expires_at < ?", now.UTC()).Delete(&LoginState{}).Error; err != nil {
		return fmt.Errorf("delete expired login states: %w", err)
	}
	return nil
}
