package models

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// What one person may hold of the chat, counted in the database so that
// the bounds hold across every replica.

// ErrTooManyReplies means the person has their ReplyCap of replies
// streaming already.
var ErrTooManyReplies = errors.New("too many replies being written at once")

// ErrTooManyConversations means the person keeps their maximum of
// conversations already.
var ErrTooManyConversations = errors.New("too many conversations")

// ReplyCap bounds a person's replies streaming at once, across all their
// conversations and every replica: a generation running or queued is a
// streaming reply, and a dead replica's are closed within a minute
// (CloseUnfinishedMessages).
type ReplyCap struct {
	Person uint
	Max    int // 0: no bound
	// Refusal is the reason a refused reply is stored with.
	Refusal string
}

// reached tells whether person holds rc.Max streaming replies already.
// It locks the person first (lockPerson), so that two of their sends on
// two replicas cannot both see room for one.
func (rc ReplyCap) reached(tx *gorm.DB) (bool, error) {
	if rc.Max <= 0 {
		return false, nil
	}
	if err := lockPerson(tx, rc.Person); err != nil {
		return false, err
	}
	var n int64
	err := tx.Model(&Message{}).Joins("JOIN conversations ON conversations.id = messages.conversation_id").
		Where("messages.status = ? AND conversations.user_id = ?", MessageStreaming, rc.Person).Count(&n).Error
	if err != nil {
		return false, fmt.Errorf("count streaming replies of person %d: %w", rc.Person, err)
	}
	return n >= int64(rc.Max), nil
}

// lockPerson makes the transactions that count what one person holds take
// turns. On PostgreSQL it locks their user row (FOR NO KEY UPDATE: rows
// that reference it can still be inserted); a SQLite transaction here holds
// the database's write lock already (_txlock=immediate).
func lockPerson(tx *gorm.DB, person uint) error {
	if tx.Dialector.Name() != "postgres" {
		return nil
	}
	var id uint
	if err := tx.Raw("SELECT id FROM users WHERE id = ? FOR NO KEY UPDATE", person).Scan(&id).Error; err != nil {
		return fmt.Errorf("lock person %d: %w", person, err)
	}
	return nil
}

// CreateConversationWithin creates c unless its person keeps max
// conversations already (ErrTooManyConversations; max 0: no bound).
func CreateConversationWithin(ctx context.Context, db *gorm.DB, c *Conversation, max int) error {
	if max <= 0 {
		return CreateConversation(ctx, db, c)
	}
	c.Sanitize()
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := lockPerson(tx, c.UserID); err != nil {
			return err
		}
		var n int64
		if err := tx.Model(&Conversation{}).Where("user_id = ?", c.UserID).Count(&n).Error; err != nil {
			return fmt.Errorf("count conversations of person %d: %w", c.UserID, err)
		}
		if n >= int64(max) {
			return ErrTooManyConversations
		}
		if err := tx.Create(c).Error; err != nil {
			return fmt.Errorf("create conversation: %w", err)
		}
		return nil
	})
}
