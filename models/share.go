package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// ErrTooManyShares means the person keeps their maximum of share links.
var ErrTooManyShares = errors.New("too many share links")

// Share is a link to a read-only copy of a conversation as it was shown
// when the link was made (internal/share). The copy is the row's own:
// what the conversation becomes later does not change it, and the link
// works until it is revoked (the row deleted), it expires, or its
// conversation is deleted.
type Share struct {
	// Token is the link's secret: 128 random bits, URL-safe base64.
	Token          string `gorm:"primaryKey;size:32"`
	UserID         uint   `gorm:"not null;index:idx_shares_user_created,priority:1"`
	ConversationID string `gorm:"size:40;not null;index"`
	Title          string `gorm:"size:200"`
	// Snapshot is the messages shared, as JSON (internal/share.Message).
	Snapshot string `gorm:"type:text"`
	// ShowAuthor: the page names the person; otherwise it shows no name
	// nor email.
	ShowAuthor bool
	// ExpiresAt ends the link (nil: it lasts until revoked).
	ExpiresAt *time.Time
	CreatedAt time.Time `gorm:"index:idx_shares_user_created,priority:2"`
}

// SharedBy is a share with what its page may say of its owner.
type SharedBy struct {
	Share
	OwnerName, OwnerEmail string
}

// CreateShareWithin stores s unless its person keeps max shares already
// (ErrTooManyShares; max 0: no bound) or its conversation is no longer
// theirs (ErrNotFound). It touches the conversation first, as
// DeleteConversation does: a share cannot be stored beside a delete that
// would miss it.
func CreateShareWithin(ctx context.Context, db *gorm.DB, s *Share, max int) error {
	s.Title = Storable(s.Title, 200)
	s.Snapshot = StorableText(s.Snapshot)
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&Conversation{}).Where("id = ? AND user_id = ?", s.ConversationID, s.UserID).
			Update("updated_at", gorm.Expr("updated_at"))
		if res.Error != nil {
			return fmt.Errorf("lock conversation %s: %w", s.ConversationID, res.Error)
		}
		if res.RowsAffected == 0 {
			return ErrNotFound
		}
		if max > 0 {
			if err := lockPerson(tx, s.UserID); err != nil {
				return err
			}
			var n int64
			if err := tx.Model(&Share{}).Where("user_id = ?", s.UserID).Count(&n).Error; err != nil {
				return fmt.Errorf("count shares of person %d: %w", s.UserID, err)
			}
			if n >= int64(max) {
				return ErrTooManyShares
			}
		}
		if err := tx.Create(s).Error; err != nil {
			return fmt.Errorf("create share: %w", err)
		}
		return nil
	})
}

// SharesOf returns up to limit of the person's shares, newest first,
// without their snapshots.
func SharesOf(ctx context.Context, db *gorm.DB, userID uint, limit int) ([]Share, error) {
	var out []Share
	err := db.WithContext(ctx).Select("token", "user_id", "conversation_id", "title", "show_author", "expires_at", "created_at").
		Where("user_id = ?", userID).Order("created_at DESC, token").Limit(limit).Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list shares of person %d: %w", userID, err)
	}
	return out, nil
}

// OpenShare returns the share of token when it is live at now: not expired,
// its owner not disabled. Any other is ErrNotFound, the same for all.
func OpenShare(ctx context.Context, db *gorm.DB, token string, now time.Time) (*SharedBy, error) {
	var row SharedBy
	err := db.WithContext(ctx).Model(&Share{}).
		Select("shares.*, users.name AS owner_name, users.email AS owner_email").
		Joins("JOIN users ON users.id = shares.user_id").
		Where("shares.token = ? AND users.disabled_at IS NULL", token).
		Where("shares.expires_at IS NULL OR shares.expires_at > ?", now.UTC()).
		Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("open share: %w", err)
	}
	return &row, nil
}

// DeleteShare deletes the person's share token; someone else's, or none,
// is ErrNotFound.
func DeleteShare(ctx context.Context, db *gorm.DB, userID uint, token string) error {
	res := db.WithContext(ctx).Where("token = ? AND user_id = ?", token, userID).Delete(&Share{})
	if res.Error != nil {
		return fmt.Errorf("delete share: %w", res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrNotFound
	}
	return nil
}

// ShareOf returns the person's share token without its snapshot (for the
// audit log's record of a revoke); someone else's, or none, is ErrNotFound.
func ShareOf(ctx context.Context, db *gorm.DB, userID uint, token string) (*Share, error) {
	var s Share
	err := db.WithContext(ctx).Select("token, user_id, conversation_id, title, show_author, expires_at, created_at").
		Where("token = ? AND user_id = ?", token, userID).Take(&s).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find share: %w", err)
	}
	return &s, nil
}
