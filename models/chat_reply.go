package models

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"gorm.io/gorm"
)

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
