package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"moonji/models"
)

// ErrBadFormat means an export format other than md or json.
var ErrBadFormat = errors.New("unknown export format")

// Export is a conversation as a file to download.
type Export struct {
	Filename    string
	ContentType string
	Body        []byte
}

// ExportMessage is one message in a JSON export (and in the API).
type ExportMessage struct {
	ID string `json:"id"`
	// ParentID is the message it follows (null for a first message):
	// siblings are versions of one another.
	ParentID    *string   `json:"parent_id"`
	Role        string    `json:"role"`
	Content     string    `json:"content"`
	Status      string    `json:"status"`
	Reason      string    `json:"reason"`
	InferenceID string    `json:"inference_id"`
	CreatedAt   time.Time `json:"created_at"`
}

// Export returns the person's conversation id as Markdown ("md": the path
// shown, as the page shows it) or JSON (every version, with each message's
// parent and the path shown as current_path).
func (s *Service) Export(ctx context.Context, userID uint, id, format string) (Export, error) {
	if format == "" {
		format = "md"
	}
	if format != "md" && format != "json" {
		return Export{}, ErrBadFormat
	}
	conv, t, err := s.Thread(ctx, userID, id)
	if err != nil {
		return Export{}, err
	}
	if format == "json" {
		out := struct {
			ID          string          `json:"id"`
			Title       string          `json:"title"`
			Model       string          `json:"model"`
			CreatedAt   time.Time       `json:"created_at"`
			Messages    []ExportMessage `json:"messages"`
			CurrentPath []string        `json:"current_path"`
		}{ID: conv.ID, Title: conv.Title, Model: conv.Model, CreatedAt: conv.CreatedAt, Messages: []ExportMessage{},
			CurrentPath: t.PathIDs()}
		for _, m := range t.All {
			out.Messages = append(out.Messages, ExportMessageOf(m))
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return Export{}, fmt.Errorf("encode export: %w", err)
		}
		return Export{Filename: conv.ID + ".json", ContentType: "application/json", Body: b}, nil
	}
	var b strings.Builder
	title := conv.Title
	if title == "" {
		title = "Conversation"
	}
	fmt.Fprintf(&b, "# %s\n\nModel: %s\n", title, conv.Model)
	for _, m := range t.Path {
		who := "You"
		if m.Role != models.RoleUser {
			who = "Assistant"
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s\n", who, m.Content)
		if m.Status != models.MessageDone {
			fmt.Fprintf(&b, "\n_(%s", m.Status)
			if m.Reason != "" {
				fmt.Fprintf(&b, ": %s", m.Reason)
			}
			b.WriteString(")_\n")
		}
	}
	return Export{Filename: conv.ID + ".md", ContentType: "text/markdown; charset=utf-8", Body: []byte(b.String())}, nil
}

// ExportMessageOf is m as the API and exports show it.
func ExportMessageOf(m models.Message) ExportMessage {
	e := ExportMessage{ID: m.ID, ParentID: m.ParentID, Role: m.Role, Content: m.Content, Status: m.Status, Reason: m.Reason, CreatedAt: m.CreatedAt}
	if m.InferenceID != nil {
		e.InferenceID = *m.InferenceID
	}
	return e
}
