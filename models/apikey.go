package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Key scopes: what a key may call. A key's scope is chosen at its creation
// and never changes.
const (
	// ScopeInference keys call /v1 (every key made before scopes existed).
	ScopeInference = "inference"
	// ScopeAdmin keys call /api/v1/admin and nothing else; only an admin's
	// key may have it, and it works only while its owner is one.
	ScopeAdmin = "admin"
)

// ValidScope reports whether s is one of the key scopes.
func ValidScope(s string) bool { return s == ScopeInference || s == ScopeAdmin }

// APIKey is a key a program uses on /v1 (or, with the admin scope, on
// /api/v1/admin). Only the SHA-256 of the secret is stored; Prefix is the
// readable start shown in lists.
type APIKey struct {
	ID     uint   `gorm:"primaryKey"`
	UserID uint   `gorm:"index"`
	User   User   `gorm:"constraint:OnDelete:CASCADE"`
	Name   string `gorm:"size:200"`
	Prefix string `gorm:"size:32"`
	Hash   string `gorm:"size:64;uniqueIndex"`
	// Scope is ScopeInference or ScopeAdmin. The column's default makes
	// the keys that predate it inference keys when it is added.
	Scope string `gorm:"size:16;not null;default:inference"`
	RPM   int    // per-key requests-per-minute override; 0 = the configured default
	// Budget is what the key may spend per BudgetPeriod, in nano-units of
	// the currency (internal/money); nil: no budget of its own.
	Budget       *int64
	BudgetPeriod string `gorm:"size:8"` // BudgetDay, BudgetMonth or BudgetTotal; "" without a budget
	// Models are the models the key may use, comma-separated; "": all.
	Models     string
	ExpiresAt  *time.Time
	RevokedAt  *time.Time
	LastUsedAt *time.Time
	CreatedAt  time.Time
}

// KeyScope is the key's scope; a row read without the column (none should
// be) counts as an inference key, the scope that can do the least harm.
func (k *APIKey) KeyScope() string {
	if k.Scope == "" {
		return ScopeInference
	}
	return k.Scope
}

// Active reports whether the key may be used at time now.
func (k *APIKey) Active(now time.Time) bool {
	if k.RevokedAt != nil {
		return false
	}
	return k.ExpiresAt == nil || now.Before(*k.ExpiresAt)
}

// Status is a short word for lists: active, revoked or expired.
func (k *APIKey) Status(now time.Time) string {
	switch {
	case k.RevokedAt != nil:
		return "revoked"
	case k.ExpiresAt != nil && !now.Before(*k.ExpiresAt):
		return "expired"
	default:
		return "active"
	}
}

// CreateAPIKey stores a new key row (the caller has hashed the secret).
func CreateAPIKey(ctx context.Context, db *gorm.DB, k *APIKey) error {
	if err := db.WithContext(ctx).Create(k).Error; err != nil {
		return fmt.Errorf("create api key: %w", err)
	}
	return nil
}

// APIKeyByHash finds a key, with its user, by the SHA-256 of its secret.
func APIKeyByHash(ctx context.Context, db *gorm.DB, hash string) (*APIKey, error) {
	var k APIKey
	err := db.WithContext(ctx).Preload("User").Where("hash = ?", hash).Take(&k).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find api key: %w", err)
	}
	return &k, nil
}

// APIKeyByID finds a key by id.
func APIKeyByID(ctx context.Context, db *gorm.DB, id uint) (*APIKey, error) {
	var k APIKey
	err := db.WithContext(ctx).Preload("User").Take(&k, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find api key %d: %w", id, err)
	}
	return &k, nil
}

// ListAPIKeys lists keys, newest first; userID 0 lists everyone's.
func ListAPIKeys(ctx context.Context, db *gorm.DB, userID uint) ([]APIKey, error) {
	q := db.WithContext(ctx).Preload("User").Order("id DESC")
	if userID != 0 {
		q = q.Where("user_id = ?", userID)
	}
	var keys []APIKey
	if err := q.Find(&keys).Error; err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return keys, nil
}

// ListAllAPIKeys lists at most limit keys of everyone whose owner's email
// contains ownerFilter (all when it is empty), newest first, with their
// owners. more reports that others matched too.
func ListAllAPIKeys(ctx context.Context, db *gorm.DB, ownerFilter string, limit int) (keys []APIKey, more bool, err error) {
	q := db.WithContext(ctx).Preload("User").Order("id DESC").Limit(limit + 1)
	if ownerFilter != "" {
		q = q.Where("user_id IN (?)", db.WithContext(ctx).Model(&User{}).Select("id").Where(emailContains, likeContains(ownerFilter)))
	}
	if err := q.Find(&keys).Error; err != nil {
		return nil, false, fmt.Errorf("list api keys: %w", err)
	}
	if len(keys) > limit {
		keys, more = keys[:limit], true
	}
	return keys, more, nil
}

// RevokeAPIKey marks a key revoked. userID 0 may revoke anyone's key (an
// admin or the CLI); otherwise only the owner's. Revoking twice is harmless.
func RevokeAPIKey(ctx context.Context, db *gorm.DB, id, userID uint) error {
	// A fresh statement for each query: a gorm chain reused after Count
	// carries that query's state into the next and breaks the UPDATE.
	q := func() *gorm.DB {
		q := db.WithContext(ctx).Model(&APIKey{}).Where("id = ?", id)
		if userID != 0 {
			q = q.Where("user_id = ?", userID)
		}
		return q
	}
	var n int64
	if err := q().Count(&n).Error; err != nil {
		return fmt.Errorf("revoke api key %d: %w", id, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	now := time.Now().UTC()
	err := q().Where("revoked_at IS NULL").Update("revoked_at", now).Error
	if err != nil {
		return fmt.Errorf("revoke api key %d: %w", id, err)
	}
	return nil
}

// TouchAPIKeys writes last-used times in one transaction.
func TouchAPIKeys(ctx context.Context, db *gorm.DB, used map[uint]time.Time) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for id, at := range used {
			if err := tx.Model(&APIKey{}).Where("id = ?", id).Update("last_used_at", at).Error; err != nil {
				return fmt.Errorf("touch api key %d: %w", id, err)
			}
		}
		return nil
	})
}
