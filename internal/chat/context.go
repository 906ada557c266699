package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	"moonji/internal/attachment"
	"moonji/models"
)

// tokensPerMessage is the framing a message costs beyond its text, as
// proxy.EstimatePromptTokens counts it.
const tokensPerMessage = 4

type wireMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// A message's attachments (attachments.go): its id, how many and what
	// they weigh, and its content parts once they are read (MarshalJSON).
	id                    string
	attached, extraTokens int
	parts                 []attachment.Part
}

// requestBody builds the generation's request from the conversation: its
// system prompt, then the messages of the path that leads to the reply (the
// person's, and the assistant's that finished or were stopped: exactly
// what the page shows above it, no other version), trimmed from
// the oldest to fit ContextTokens (the system prompt and the newest message
// always go), with its temperature and maximum answer length when set.
func (s *Service) requestBody(ctx context.Context, conv *models.Conversation, replyID string, extra map[string]any) ([]byte, error) {
	// The tree from ids alone, then the texts of the path only: the other
	// versions are never sent.
	nodes, err := models.ConversationOutline(ctx, s.o.DB, conv.ID)
	if err != nil {
		return nil, err
	}
	path := models.TreeOf(nodes).Path(replyID)
	if len(path) > 0 {
		path = path[:len(path)-1] // the reply itself
	}
	msgs, err := models.MessagesIn(ctx, s.o.DB, conv.ID, path)
	if err != nil {
		return nil, err
	}
	var history []wireMessage
	for i := range msgs {
		m := &msgs[i]
		switch {
		case m.Role == models.RoleUser:
		case m.Role == models.RoleAssistant && (m.Status == models.MessageDone || m.Status == models.MessageStopped) && m.Content != "":
		default:
			continue
		}
		history = append(history, wireMessage{Role: m.Role, Content: m.Content, id: m.ID})
	}
	if err := s.countAttachments(ctx, conv, history); err != nil {
		return nil, err
	}
	budget := s.o.ContextTokens
	var system []wireMessage
	if prompt, err := s.systemPrompt(ctx, conv); err != nil {
		return nil, err
	} else if prompt != "" {
		// Always sent, ahead of the conversation, within its budget.
		system = []wireMessage{{Role: "system", Content: prompt}}
		budget -= estimateTokens(system[0])
	}
	history = append(system, fitContext(history, budget)...)
	if err := s.fillAttachments(ctx, conv, history); err != nil {
		return nil, err
	}
	body := map[string]any{}
	maps.Copy(body, extra)
	body["model"] = conv.Model
	body["stream"] = true
	body["messages"] = history
	if conv.Temperature != nil {
		body["temperature"] = *conv.Temperature
	}
	if conv.MaxTokens != nil {
		body["max_tokens"] = *conv.MaxTokens
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode chat request: %w", err)
	}
	return b, nil
}

// estimateTokens guesses a message's tokens: about four bytes of text per
// token plus its framing. Bytes, not characters: it errs on the safe side
// for scripts that take more bytes per token.
func estimateTokens(m wireMessage) int { return len(m.Content)/4 + tokensPerMessage + m.extraTokens }

// fitContext drops the oldest messages until the estimate fits budget; the
// last message always stays.
func fitContext(history []wireMessage, budget int) []wireMessage {
	if len(history) == 0 {
		return history
	}
	total := 0
	start := len(history) - 1
	total += estimateTokens(history[start])
	for start > 0 {
		t := estimateTokens(history[start-1])
		if total+t > budget {
			break
		}
		total += t
		start--
	}
	return history[start:]
}
