package chat

import (
	"context"
	"fmt"
	"math"
	"unicode/utf8"

	"moonji/models"
)

// A conversation's settings: the system prompt, temperature and maximum
// answer length its replies are asked with. They are the person's to set
// and go to the engine with every reply (requestBody).

// Bounds of the settings.
const (
	// MaxSystemPromptBytes bounds a system prompt: it is sent with every
	// reply, ahead of the conversation.
	MaxSystemPromptBytes = 16 << 10
	MaxTemperature       = 2.0
	// MaxAnswerTokens bounds the maximum answer length one may ask for.
	MaxAnswerTokens = 1_000_000
)

// SettingError is a setting refused, naming its field.
type SettingError struct {
	Field, Message string
}

func (e *SettingError) Error() string { return e.Field + ": " + e.Message }

// checkSettings checks s; a refusal is a *SettingError.
func checkSettings(s models.ConversationSettings) error {
	if len(s.SystemPrompt) > MaxSystemPromptBytes {
		return &SettingError{"system_prompt", fmt.Sprintf("at most %d KiB", MaxSystemPromptBytes>>10)}
	}
	if !utf8.ValidString(s.SystemPrompt) {
		return &SettingError{"system_prompt", "must be valid UTF-8 text"}
	}
	if t := s.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > MaxTemperature) {
		return &SettingError{"temperature", fmt.Sprintf("a number from 0 to %g", MaxTemperature)}
	}
	if m := s.MaxTokens; m != nil && (*m < 1 || *m > MaxAnswerTokens) {
		return &SettingError{"max_tokens", fmt.Sprintf("a whole number from 1 to %d", MaxAnswerTokens)}
	}
	return nil
}

// Update changes the person's conversation id: its title and its settings,
// each when not nil (its next reply is asked with the settings). Both are
// checked before either is stored.
func (s *Service) Update(ctx context.Context, userID uint, id string, title *string, set *models.ConversationSettings) error {
	return s.Change(ctx, userID, id, Change{Title: title, Settings: set})
}
