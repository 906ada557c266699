package chat

import (
	"context"
	"errors"
	"strings"

	"moonji/internal/thread"
	"moonji/models"
)

// A conversation is a tree (internal/thread): Edit and Regenerate add
// versions beside a message instead of replacing it, Show switches the
// path shown, and every reply is asked with the path that leads to it.

// Errors of versions.
var (
	ErrNothingToRegenerate = errors.New("no reply to regenerate")
	ErrNotEditable         = errors.New("only a person's message can be edited")
	ErrNotAnswer           = errors.New("only an answer can be regenerated")
)

// Thread is a conversation's messages with the path shown.
type Thread struct {
	All  []models.Message // every version, in creation order
	Path []models.Message // the path shown, from the first message
	Tree *thread.Tree
}

// Version returns where message id stands among its versions.
func (t Thread) Version(id string) thread.Version { return t.Tree.VersionOf(id) }

// PathIDs returns the ids of the path shown, never nil.
func (t Thread) PathIDs() []string {
	ids := make([]string, 0, len(t.Path))
	for _, m := range t.Path {
		ids = append(ids, m.ID)
	}
	return ids
}

// threadOf builds conv's Thread from its messages.
func threadOf(conv *models.Conversation, msgs []models.Message) Thread {
	tree := models.TreeOf(msgs)
	byID := make(map[string]int, len(msgs))
	for i, m := range msgs {
		byID[m.ID] = i
	}
	t := Thread{All: msgs, Tree: tree}
	for _, id := range tree.Path(tree.Leaf(conv.CurrentLeaf)) {
		t.Path = append(t.Path, msgs[byID[id]])
	}
	return t
}

// Thread returns the person's conversation id with its tree and the path
// shown.
func (s *Service) Thread(ctx context.Context, userID uint, id string) (*models.Conversation, Thread, error) {
	conv, msgs, err := s.Get(ctx, userID, id)
	if err != nil {
		return nil, Thread{}, err
	}
	return conv, threadOf(conv, msgs), nil
}

// Outline is a conversation's tree without its texts: what a page needs
// to pick the messages it draws, and their versions.
type Outline struct {
	Tree *thread.Tree
	Path []string // the path shown, as ids from the first
}

// Outline returns the person's conversation id with its tree and the ids
// of its path shown; Messages then reads the texts of those a page draws.
func (s *Service) Outline(ctx context.Context, userID uint, id string) (*models.Conversation, Outline, error) {
	conv, err := models.ConversationOf(ctx, s.o.DB, userID, id)
	if err != nil {
		return nil, Outline{}, err
	}
	nodes, err := models.ConversationOutline(ctx, s.o.DB, id)
	if err != nil {
		return nil, Outline{}, err
	}
	tree := models.TreeOf(nodes)
	return conv, Outline{Tree: tree, Path: tree.Path(tree.Leaf(conv.CurrentLeaf))}, nil
}

// Messages returns messages ids of conversation conv (already checked to
// be the person's, by Outline), in order; one deleted meanwhile is left
// out.
func (s *Service) Messages(ctx context.Context, conv string, ids []string) ([]models.Message, error) {
	return models.MessagesIn(ctx, s.o.DB, conv, ids)
}

// Shown returns the person's conversation id with the messages of its path
// shown, in order: what the page shows, what a share snapshots.
func (s *Service) Shown(ctx context.Context, userID uint, id string) (*models.Conversation, []models.Message, error) {
	conv, t, err := s.Thread(ctx, userID, id)
	if err != nil {
		return nil, nil, err
	}
	return conv, t.Path, nil
}

// Edit adds a new version of the person's message msgID — a sibling with
// the same parent, content and attachments attachmentIDs (none given: the
// edited message's files) — shows it, and starts its answer.
func (s *Service) Edit(ctx context.Context, p Person, msgID, content string, attachmentIDs ...string) (Sent, error) {
	if len(content) > MaxContentBytes {
		return Sent{}, ErrTooLarge
	}
	content = models.StorableText(content)
	if strings.TrimSpace(content) == "" && len(attachmentIDs) == 0 {
		return Sent{}, ErrEmpty
	}
	old, conv, err := models.MessageOf(ctx, s.o.DB, p.UserID, msgID)
	if err != nil {
		return Sent{}, err
	}
	if old.Role != models.RoleUser {
		return Sent{}, ErrNotEditable
	}
	att, err := s.prepareAttachments(ctx, p, conv, attachmentIDs)
	if err != nil {
		return Sent{}, err
	}
	user := &models.Message{ID: models.NewMessageID(), ConversationID: conv.ID, ParentID: old.ParentID,
		Role: models.RoleUser, Content: content, Status: models.MessageDone}
	// Without files of its own, the new version keeps the edited one's.
	keep := ""
	if len(attachmentIDs) == 0 {
		keep = old.ID
	}
	sent, err := s.start(ctx, p, conv, func(reply *models.Message) error {
		return att.around(ctx, conv.ID, user.ID, func() error {
			return models.StartEdit(ctx, s.o.DB, conv, user, reply, s.replyCap(p), keep)
		})
	})
	if sent.MessageID != "" {
		sent.UserMessageID = user.ID
	}
	return sent, err
}

// RegenerateMessage adds a new version of answer msgID, asked with the
// same messages before it, and shows it; the earlier versions stay.
func (s *Service) RegenerateMessage(ctx context.Context, p Person, msgID string) (Sent, error) {
	old, conv, err := models.MessageOf(ctx, s.o.DB, p.UserID, msgID)
	if err != nil {
		return Sent{}, err
	}
	if old.Role != models.RoleAssistant || old.ParentID == nil {
		return Sent{}, ErrNotAnswer
	}
	return s.regenerate(ctx, p, conv, *old.ParentID)
}

// Regenerate writes the last answer of the path shown of conversation id
// again, as a new version (the page's Regenerate, and its Retry after an
// error); a path that ends with the person's message gets its answer.
func (s *Service) Regenerate(ctx context.Context, p Person, id string) (Sent, error) {
	conv, t, err := s.Thread(ctx, p.UserID, id)
	if err != nil {
		return Sent{}, err
	}
	if len(t.Path) == 0 {
		return Sent{}, ErrNothingToRegenerate
	}
	last := t.Path[len(t.Path)-1]
	parent := last.ID
	if last.Role == models.RoleAssistant {
		if last.ParentID == nil {
			return Sent{}, ErrNothingToRegenerate
		}
		parent = *last.ParentID
	}
	return s.regenerate(ctx, p, conv, parent)
}

// regenerate starts a new answer to the person's message question.
func (s *Service) regenerate(ctx context.Context, p Person, conv *models.Conversation, question string) (Sent, error) {
	return s.start(ctx, p, conv, func(reply *models.Message) error {
		reply.ParentID = &question
		return models.AddReplyVersion(ctx, s.o.DB, conv, reply, s.replyCap(p))
	})
}

// Show makes message msgID's version the one shown, with the conversation
// that followed it (its newest answers), and returns its conversation.
func (s *Service) Show(ctx context.Context, userID uint, msgID string) (*models.Conversation, error) {
	_, conv, err := models.MessageOf(ctx, s.o.DB, userID, msgID)
	if err != nil {
		return nil, err
	}
	nodes, err := models.ConversationOutline(ctx, s.o.DB, conv.ID)
	if err != nil {
		return nil, err
	}
	leaf := models.TreeOf(nodes).Newest(msgID)
	if leaf == "" {
		return nil, ErrNotFound // deleted meanwhile
	}
	if err := models.ShowMessage(ctx, s.o.DB, userID, conv.ID, leaf); err != nil {
		return nil, err
	}
	return conv, nil
}

// DeleteMessage deletes the person's message msgID and everything that
// followed it (a branch); its other versions stay, the newest shown.
func (s *Service) DeleteMessage(ctx context.Context, userID uint, msgID string) (*models.Conversation, error) {
	_, conv, err := models.MessageOf(ctx, s.o.DB, userID, msgID)
	if err != nil {
		return nil, err
	}
	if _, err := models.DeleteBranch(ctx, s.o.DB, userID, conv.ID, msgID); err != nil {
		return nil, err
	}
	return conv, nil
}
