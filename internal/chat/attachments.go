package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"moonji/internal/attachment"
	"moonji/models"
)

// Attachments in the chat: a send checks the files the person attaches
// (theirs, unsent, few enough, images only for a model with vision), claims
// them for the person's message in the transaction's shadow (released if
// the message is not stored), and each request to the engine carries a
// message's files as content parts (attachment.Parts).

// ErrNoAttachments means the chat was built without an attachment service.
var ErrNoAttachments = errors.New("attachments are not enabled")

// sending is what a send carries beside its text.
type sending struct {
	s    *Service
	p    Person
	ids  []string
	rows []models.Attachment
}

// prepareAttachments checks the attachments ids sent with a message in
// conv, before anything is stored: a refusal is an
// *attachment.ClaimError naming the one at fault.
func (s *Service) prepareAttachments(ctx context.Context, p Person, conv *models.Conversation, ids []string) (sending, error) {
	a := sending{s: s, p: p, ids: ids}
	if len(ids) == 0 {
		return a, nil
	}
	if s.o.Attachments == nil {
		return a, ErrNoAttachments
	}
	rows, err := s.o.Attachments.Prepare(ctx, p.UserID, conv.Model, ids)
	if err != nil {
		return a, err
	}
	a.rows = rows
	return a, nil
}

// around claims the attachments for message msgID of conversation convID,
// then stores the message (store); when the message is not stored they are
// released, still the person's to send. A reply refused for the person's
// limit stores the message all the same: the attachments stay with it.
func (a sending) around(ctx context.Context, convID, msgID string, store func() error) error {
	if len(a.ids) == 0 {
		return store()
	}
	if err := a.s.o.Attachments.Claim(ctx, a.p.UserID, convID, msgID, a.ids); err != nil {
		return err
	}
	err := store()
	if err != nil && !errors.Is(err, models.ErrTooManyReplies) {
		if rerr := a.s.o.Attachments.Release(context.WithoutCancel(ctx), msgID); rerr != nil {
			a.s.log.Warn("release the attachments of a message not sent", "message", msgID, "err", rerr)
		}
	}
	return err
}

// title names a conversation whose first message has no text after its
// first attachment.
func (a sending) title(content string) string {
	if t := titleOf(content); t != "" || len(a.rows) == 0 {
		return t
	}
	return titleOf(a.rows[0].Name)
}

// AttachmentsOf lists the attachments of conversation id (which the caller
// checked is the person's) by message, without their bytes.
func (s *Service) AttachmentsOf(ctx context.Context, id string) (map[string][]models.Attachment, error) {
	out := map[string][]models.Attachment{}
	if s.o.Attachments == nil {
		return out, nil
	}
	rows, err := models.ConversationAttachments(ctx, s.o.DB, id)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		if r.MessageID != nil {
			out[*r.MessageID] = append(out[*r.MessageID], r)
		}
	}
	return out, nil
}

// Vision reports whether model is sent images.
func (s *Service) Vision(model string) bool {
	return s.o.Attachments != nil && s.o.Attachments.Vision(model)
}

// countAttachments adds to each user message of history what its
// attachments weigh in the context's estimate (their bytes are read only
// for the messages that fit: fillAttachments).
func (s *Service) countAttachments(ctx context.Context, conv *models.Conversation, history []wireMessage) error {
	if s.o.Attachments == nil {
		return nil
	}
	byMsg, err := s.AttachmentsOf(ctx, conv.ID)
	if err != nil || len(byMsg) == 0 {
		return err
	}
	for i := range history {
		for _, a := range byMsg[history[i].id] {
			history[i].attached++
			history[i].extraTokens += attachment.TokensOf(a.Kind, a.Bytes)
		}
	}
	return nil
}

// fillAttachments makes each message of history that has attachments a
// list of content parts: its text, then its files (images left out, with a
// note, for a model without vision).
func (s *Service) fillAttachments(ctx context.Context, conv *models.Conversation, history []wireMessage) error {
	var ids []string
	for _, m := range history {
		if m.attached > 0 {
			ids = append(ids, m.id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := models.MessageAttachments(ctx, s.o.DB, conv.ID, ids)
	if err != nil {
		return err
	}
	files := map[string][]attachment.Attached{}
	for _, r := range rows {
		files[*r.MessageID] = append(files[*r.MessageID], attachment.Attached{Kind: r.Kind, Name: r.Name, MIME: r.MIME, Data: r.Data})
	}
	vision := s.Vision(conv.Model)
	for i := range history {
		if f := files[history[i].id]; len(f) > 0 {
			history[i].parts = attachment.Parts(history[i].Content, f, vision)
		}
	}
	return nil
}

// MarshalJSON writes a message as the engine reads it: its content a
// string, or its parts when it has attachments.
func (m wireMessage) MarshalJSON() ([]byte, error) {
	type text struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	type parts struct {
		Role    string            `json:"role"`
		Content []attachment.Part `json:"content"`
	}
	var b []byte
	var err error
	if m.parts == nil {
		b, err = json.Marshal(text{m.Role, m.Content})
	} else {
		b, err = json.Marshal(parts{m.Role, m.parts})
	}
	if err != nil {
		return nil, fmt.Errorf("encode message: %w", err)
	}
	return b, nil
}
