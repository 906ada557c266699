package models

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"
)

// ErrNoReply means a conversation has no assistant reply to replace.
var ErrNoReply = errors.New("no reply to replace")

// ReplaceLastReply deletes the last message of conversation c, which must
// be an assistant's reply that has ended, and stores reply (streaming) in
// its place, in one transaction that fails with ErrBusy while a reply
// streams there, and with ErrTooManyReplies, changing nothing, when the
// person has rc.Max replies streaming already.
func ReplaceLastReply(ctx context.Context, db *gorm.DB, c *Conversation, reply *Message, rc ReplyCap) error {
	reply.Sanitize()
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Touch the conversation first: a plain write takes SQLite's write
		// lock before the search index's triggers read anything.
		if err := tx.Model(&Conversation{}).Where("id = ?", c.ID).Update("updated_at", time.Now().UTC()).Error; err != nil {
			return fmt.Errorf("touch conversation: %w", err)
		}
		var last Message
		err := tx.Where("conversation_id = ?", c.ID).Order("id DESC").Take(&last).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return ErrNoReply
		}
		if err != nil {
			return fmt.Errorf("find last reply: %w", err)
		}
		switch {
		case last.Status == MessageStreaming:
			return ErrBusy
		case last.Role != RoleAssistant:
			return ErrNoReply
		}
		if full, err := rc.reached(tx); err != nil {
			return err
		} else if full {
			return ErrTooManyReplies
		}
		res := tx.Where("id = ? AND status <> ?", last.ID, MessageStreaming).Delete(&Message{})
		if res.Error != nil {
			return fmt.Errorf("delete last reply: %w", res.Error)
		}
		if res.RowsAffected == 0 {
			return ErrBusy
		}
		if err := tx.Create(reply).Error; err != nil {
			if isOneStreamingViolation(err) {
				return ErrBusy // another replica started a reply meanwhile
			}
			return fmt.Errorf("store reply: %w", err)
		}
		return nil
	})
}

// SetConversationModel switches the model of the person's conversation id.
func SetConversationModel(ctx context.Context, db *gorm.DB, userID uint, id, model string) error {
	res := db.WithContext(ctx).Model(&Conversation{}).Where("id = ? AND user_id = ?", id, userID).
		Update("model", Storable(model, 200))
	if res.Error != nil {
		return fmt.Errorf("set model of conversation %s: %w", id, res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrNotFound
	}
	return nil
}

// StreamingMessagesOf returns the streaming messages that replica runs.
func StreamingMessagesOf(ctx context.Context, db *gorm.DB, replica string) ([]Message, error) {
	var out []Message
	err := db.WithContext(ctx).Select("id", "inference_id", "content").
		Where("status = ? AND replica = ?", MessageStreaming, replica).Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("list streaming messages of %s: %w", replica, err)
	}
	return out, nil
}

// LastMessages returns the last n messages of conversation id, in order.
func LastMessages(ctx context.Context, db *gorm.DB, id string, n int) ([]Message, error) {
	var out []Message
	if err := db.WithContext(ctx).Where("conversation_id = ?", id).Order("id DESC").Limit(n).Find(&out).Error; err != nil {
		return nil, fmt.Errorf("read last messages of conversation %s: %w", id, err)
	}
	slices.Reverse(out)
	return out, nil
}

// MessageIn returns message msgID of conversation id, or ErrNotFound.
func MessageIn(ctx context.Context, db *gorm.DB, id, msgID string) (*Message, error) {
	var m Message
	err := db.WithContext(ctx).Where("id = ? AND conversation_id = ?", msgID, id).Take(&m).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find message %s: %w", msgID, err)
	}
	return &m, nil
}
