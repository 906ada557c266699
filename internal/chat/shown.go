package chat

import (
	"context"

	"moonji/models"
)

// Shown returns the person's conversation id with the messages of the path
// the page shows, in order: what a share link copies. Until conversations
// are trees that is every message.
func (s *Service) Shown(ctx context.Context, userID uint, id string) (*models.Conversation, []models.Message, error) {
	return s.Get(ctx, userID, id)
}
