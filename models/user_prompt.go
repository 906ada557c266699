package models

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// SetDefaultSystemPrompt stores the default system prompt of person id.
func SetDefaultSystemPrompt(ctx context.Context, db *gorm.DB, id uint, prompt string) error {
	res := db.WithContext(ctx).Model(&User{}).Where("id = ?", id).Update("default_system_prompt", StorableText(prompt))
	if res.Error != nil {
		return fmt.Errorf("set default system prompt of user %d: %w", id, res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrNotFound
	}
	return nil
}

// DefaultSystemPrompt returns the default system prompt of person id ("":
// none), reading that column alone.
func DefaultSystemPrompt(ctx context.Context, db *gorm.DB, id uint) (string, error) {
	var prompt string
	res := db.WithContext(ctx).Model(&User{}).Where("id = ?", id).Select("default_system_prompt").Limit(1).Scan(&prompt)
	if res.Error != nil {
		return "", fmt.Errorf("read default system prompt of user %d: %w", id, res.Error)
	}
	if res.RowsAffected == 0 {
		return "", ErrNotFound
	}
	return prompt, nil
}
