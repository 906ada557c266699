package chat

import (
	"context"
	"strings"

	"moonji/models"
)

// A person's default system prompt: the system prompt of their
// conversations that have none of their own, set on their settings page.

// systemPrompt is the system prompt conv's replies are asked with: its own
// when it has one, else its owner's default ("": none).
func (s *Service) systemPrompt(ctx context.Context, conv *models.Conversation) (string, error) {
	if conv.SystemPrompt != "" {
		return conv.SystemPrompt, nil
	}
	return models.DefaultSystemPrompt(ctx, s.o.DB, conv.UserID)
}

// DefaultSystemPrompt returns the person's default system prompt.
func (s *Service) DefaultSystemPrompt(ctx context.Context, userID uint) (string, error) {
	return models.DefaultSystemPrompt(ctx, s.o.DB, userID)
}

// SetDefaultSystemPrompt stores the person's default system prompt, trimmed
// ("": none), within the bounds of a conversation's own (a *SettingError of
// "system_prompt" otherwise).
func (s *Service) SetDefaultSystemPrompt(ctx context.Context, userID uint, prompt string) error {
	set := models.ConversationSettings{SystemPrompt: prompt}
	if err := checkSettings(set); err != nil {
		return err
	}
	return models.SetDefaultSystemPrompt(ctx, s.o.DB, userID, strings.TrimSpace(prompt))
}
