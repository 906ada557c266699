package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Session is a person's login session. The cookie holds only an opaque
// random id; the row lets any replica accept it.
type Session struct {
	ID         string `gorm:"primaryKey;size:64"` // SHA-256 of the cookie value
	UserID     uint   `gorm:"index"`
	User       User   `gorm:"constraint:OnDelete:CASCADE"`
	CSRFToken  string `gorm:"size:64"`
	IDToken    string // kept for RP-initiated logout (id_token_hint)
	CreatedAt  time.Time
	LastSeenAt time.Time
	ExpiresAt  time.Time `gorm:"index"` // the absolute end, whatever the activity
}

// CreateSession stores a new session row.
func CreateSession(ctx context.Context, db *gorm.DB, s *Session) error {
	if err := db.WithContext(ctx).Create(s).Error; err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	return nil
}

// SessionByID finds a session, with its user, by the hash of its cookie.
func SessionByID(ctx context.Context, db *gorm.DB, id string) (*Session, error) {
	var s Session
	err := db.WithContext(ctx).Preload("User").Where("id = ?", id).Take(&s).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find session: %w", err)
	}
	return &s, nil
}

// TouchSession records activity on a session, which pushes back its idle end.
func TouchSession(ctx context.Context, db *gorm.DB, id string, at time.Time) error {
	err := db.WithContext(ctx).Model(&Session{}).Where("id = ?", id).Update("last_seen_at", at.UTC()).Error
	if err != nil {
		return fmt.Errorf("touch session: %w", err)
	}
	return nil
}

// DeleteSession ends a session. Deleting a missing session is harmless.
func DeleteSession(ctx context.Context, db *gorm.DB, id string) error {
	if err := db.WithContext(ctx).Where("id = ?", id).Delete(&Session{}).Error; err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

// DeleteExpiredSessions removes sessions past their absolute end or idle
// since before idleSince.
func DeleteExpiredSessions(ctx context.Context, db *gorm.DB, now, idleSince time.Time) error {
	err := db.WithContext(ctx).Where("expires_at < ? OR last_seen_at < ?", now.UTC(), idleSince.UTC()).
		Delete(&Session{}).Error
	if err != nil {
		return fmt.Errorf("delete expired sessions: %w", err)
	}
	return nil
}
