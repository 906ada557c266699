package models

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"
)

// Roles of a chat message.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// States of a chat message. A user's message is done at once; an
// assistant's is streaming while its generation runs.
const (
	MessageStreaming = "streaming"
	MessageDone      = "done"
	MessageStopped   = "stopped"
	MessageError     = "error"
)

// Conversation is one chat of a person with a model.
type Conversation struct {
	// ID is random ("c_" and 26 base32 characters): ids appear in URLs and
	// must not be guessable.
	ID     string `gorm:"primaryKey;size:40"`
	UserID uint   `gorm:"not null"`
	Title  string `gorm:"size:200"`
	Model  string `gorm:"size:200"`
	// Pinned conversations come first in every list; Folder is the one
	// folder it is in ("": none). Both are indexed with the list's order
	// (migrateConversationIndexes).
	Pinned bool   `gorm:"not null;default:false"`
	Folder string `gorm:"size:64;not null;default:''"`
	// Settings of its replies: a system prompt ("": the person's default),
	// a temperature and a maximum answer length (nil: the engine's own).
	SystemPrompt string `gorm:"type:text"`
	Temperature  *float64
	MaxTokens    *int
	// CurrentLeaf is the last message of the path shown (see
	// internal/thread): "" means the newest message, as in a conversation
	// stored before messages had versions.
	CurrentLeaf string `gorm:"size:40"`
	// UpdatedAt moves with every new message, so the list shows the
	// conversations last used first; its own index finds those retention
	// deletes (models.PruneConversations).
	CreatedAt time.Time
	UpdatedAt time.Time `gorm:"index:idx_conversations_updated"`
}

// Message is one turn of a conversation.
type Message struct {
	// ID sorts in creation order (a time prefix), so a conversation's
	// messages are read back in order whatever the clock's resolution.
	ID             string `gorm:"primaryKey;size:40"`
	ConversationID string `gorm:"size:40;not null;index"`
	// ParentID is the message this one follows (nil for the first): a
	// conversation is a tree whose siblings are versions (internal/thread).
	ParentID *string `gorm:"size:40"`
	Role     string  `gorm:"size:16"`
	Content  string  `gorm:"type:text"`
	Status   string  `gorm:"size:16;index"`
	Reason   string  `gorm:"size:200"`
	Model    string  `gorm:"size:200"`
	// InferenceID is the generation's id (and its usage row's); nil for a
	// person's message, so that the unique index holds only real ids.
	InferenceID      *string `gorm:"size:40;uniqueIndex"`
	PromptTokens     int
	CompletionTokens int
	// Cost is its usage row's cost (nano-units of the currency).
	Cost int64
	// Replica runs the generation of a streaming message; a dead replica's
	// messages are closed like its usage rows.
	Replica   string `gorm:"size:200"`
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Sanitize makes a message storable: the short columns as usage rows are
// (Storable), the content as any valid UTF-8 without NUL (PostgreSQL refuses
// both invalid UTF-8 and NUL in text).
func (m *Message) Sanitize() {
	m.Content = StorableText(m.Content)
	m.Reason = Storable(m.Reason, 200)
	m.Model = Storable(m.Model, 200)
	m.Replica = Storable(m.Replica, 200)
}

// Sanitize makes a conversation's strings storable.
func (c *Conversation) Sanitize() {
	c.Title = Storable(c.Title, 200)
	c.Model = Storable(c.Model, 200)
	c.Folder = Storable(c.Folder, 64)
}

// StorableText returns s as valid UTF-8 (invalid bytes become U+FFFD)
// without NUL bytes; newlines and tabs stay, unlike Storable.
func StorableText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, string(utf8.RuneError)), "\x00", "")
}

var chatIDEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewConversationID returns "c_" and 26 characters of crypto-random base32.
func NewConversationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	return "c_" + chatIDEncoding.EncodeToString(b[:])
}

var (
	messageClock sync.Mutex
	lastMessage  int64
)

// NewMessageID returns "m_" and the base32 of the time in nanoseconds
// (strictly increasing in this process) followed by 10 random bytes; the
// alphabet is in ASCII order and the time comes first, big-endian, so ids
// sort by creation.
func NewMessageID() string {
	messageClock.Lock()
	now := time.Now().UnixNano()
	if now <= lastMessage {
		now = lastMessage + 1
	}
	lastMessage = now
	messageClock.Unlock()
	var b [18]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now))
	_, _ = rand.Read(b[8:])
	return "m_" + chatIDEncoding.EncodeToString(b[:])
}

// CreateConversation stores a new conversation.
func CreateConversation(ctx context.Context, db *gorm.DB, c *Conversation) error {
	c.Sanitize()
	if err := db.WithContext(ctx).Create(c).Error; err != nil {
		return fmt.Errorf("create conversation: %w", err)
	}
	return nil
}

// ConversationOf returns conversation id if it belongs to userID, and
// ErrNotFound otherwise: someone else's looks like none.
func ConversationOf(ctx context.Context, db *gorm.DB, userID uint, id string) (*Conversation, error) {
	var c Conversation
	err := db.WithContext(ctx).Where("id = ? AND user_id = ?", id, userID).Take(&c).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find conversation %s: %w", id, err)
	}
	return &c, nil
}

// ConversationCursor is where a page of conversations continues: after the
// one last shown (pinned first, then last used first: conversationOrder).
type ConversationCursor struct {
	Pinned    bool
	UpdatedAt time.Time
	ID        string
}

// ListConversations returns up to limit of the person's conversations,
// pinned first, then last used first, after cursor (nil: from the start).
// query, when not empty, keeps those whose title or one of whose messages
// holds each of its words as the start of a word, ignoring case (see
// search.go); a query without any word (only punctuation) keeps none.
func ListConversations(ctx context.Context, db *gorm.DB, userID uint, query string, after *ConversationCursor, limit int) ([]Conversation, error) {
	return ListConversationsIn(ctx, db, userID, "", query, after, limit)
}

// RenameConversation sets the title of the person's conversation id.
func RenameConversation(ctx context.Context, db *gorm.DB, userID uint, id, title string) error {
	res := db.WithContext(ctx).Model(&Conversation{}).Where("id = ? AND user_id = ?", id, userID).
		Update("title", Storable(title, 200))
	if res.Error != nil {
		return fmt.Errorf("rename conversation %s: %w", id, res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrNotFound
	}
	return nil
}

// DeleteConversation deletes the person's conversation id, its messages and
// their attachments.
// It starts with a plain write that also checks the owner, for SQLite's
// write lock (see StartExchange).
func DeleteConversation(ctx context.Context, db *gorm.DB, userID uint, id string) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&Conversation{}).Where("id = ? AND user_id = ?", id, userID).
			Update("updated_at", gorm.Expr("updated_at"))
		if res.Error != nil {
			return fmt.Errorf("delete conversation %s: %w", id, res.Error)
		}
		if res.RowsAffected == 0 {
			return ErrNotFound
		}
		if err := tx.Where("conversation_id = ?", id).Delete(&Attachment{}).Error; err != nil {
			return fmt.Errorf("delete attachments of conversation %s: %w", id, err)
		}
		if err := tx.Where("conversation_id = ?", id).Delete(&Message{}).Error; err != nil {
			return fmt.Errorf("delete messages of conversation %s: %w", id, err)
		}
		if err := tx.Where("conversation_id = ?", id).Delete(&Share{}).Error; err != nil {
			return fmt.Errorf("delete shares of conversation %s: %w", id, err)
		}
		if err := tx.Where("id = ?", id).Delete(&Conversation{}).Error; err != nil {
			return fmt.Errorf("delete conversation %s: %w", id, err)
		}
		return nil
	})
}

// ConversationMessages returns the messages of conversation id in order.
func ConversationMessages(ctx context.Context, db *gorm.DB, id string) ([]Message, error) {
	var out []Message
	if err := db.WithContext(ctx).Where("conversation_id = ?", id).Order("id").Find(&out).Error; err != nil {
		return nil, fmt.Errorf("read messages of conversation %s: %w", id, err)
	}
	return out, nil
}

// ErrBusy means a conversation already has a message being generated.
var ErrBusy = errors.New("a reply is still being generated in this conversation")

// oneStreamingIndex is the partial unique index that allows one streaming
// message per conversation (both dialects); the search migration creates
// it with its own objects (migrateSearch).
const oneStreamingIndex = "idx_messages_one_streaming"

// createOneStreamingIndex closes the streaming messages that would break
// the one-per-conversation rule (all but the newest of a conversation:
// left by a race this index now prevents) and creates the index.
func createOneStreamingIndex(tx *gorm.DB) error {
	err := tx.Exec(`UPDATE messages SET status = ?, reason = ?, updated_at = ? WHERE status = ? AND id NOT IN
		(SELECT MAX(id) FROM messages WHERE status = ? GROUP BY conversation_id)`,
		MessageError, "gateway_restart", time.Now().UTC(), MessageStreaming, MessageStreaming).Error
	if err != nil {
		return fmt.Errorf("close duplicate streaming messages: %w", err)
	}
	if err := tx.Exec("CREATE UNIQUE INDEX IF NOT EXISTS " + oneStreamingIndex +
		" ON messages (conversation_id) WHERE status = '" + MessageStreaming + "'").Error; err != nil {
		return fmt.Errorf("create index %s: %w", oneStreamingIndex, err)
	}
	return nil
}

// isOneStreamingViolation tells whether err is the partial unique index
// refusing a second streaming message in a conversation (SQLite names the
// column, PostgreSQL the index).
func isOneStreamingViolation(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	return strings.Contains(s, oneStreamingIndex) || strings.Contains(s, "UNIQUE constraint failed: messages.conversation_id")
}

// StartExchange stores a person's message, after the last message of the
// path shown, and the assistant's streaming reply to it in conversation c,
// and shows them, in one transaction that fails with ErrBusy when another
// reply is still streaming there (on any replica). The first message names
// an untitled conversation (title).
//
// The transaction starts by touching the conversation, a plain write:
// SQLite then takes its write lock first, waiting for it as long as
// busy_timeout (a transaction that reads before it writes, or whose first
// write reads the FTS index — the messages' trigger — fails with "database
// is locked" at once when another connection writes); PostgreSQL locks the
// conversation's row, so exchanges in one conversation take turns and the
// count of streaming messages below sees the one before. The partial
// unique index idx_messages_one_streaming (one streaming message per
// conversation) backs that count against any other writer; its refusal is
// ErrBusy too.
func StartExchange(ctx context.Context, db *gorm.DB, c *Conversation, user, reply *Message, title string) error {
	return StartExchangeWithin(ctx, db, c, user, reply, title, ReplyCap{})
}

// StartExchangeWithin is StartExchange for a person bound by rc: when they
// have rc.Max replies streaming already, both messages are stored all the
// same — nothing the person wrote is lost — the reply as an error with
// rc.Refusal, and it returns ErrTooManyReplies.
func StartExchangeWithin(ctx context.Context, db *gorm.DB, c *Conversation, user, reply *Message, title string, rc ReplyCap) error {
	return startExchange(ctx, db, c, user, reply, title, rc, true)
}

// StartEdit is StartExchangeWithin for a new version of a person's
// message: user.ParentID is already the edited message's parent, so the
// new message is its sibling. keepFrom, when not "", is the message edited:
// its attachments are copied to the new version in the same transaction
// (an edit of the text keeps the files it was sent with).
func StartEdit(ctx context.Context, db *gorm.DB, c *Conversation, user, reply *Message, rc ReplyCap, keepFrom string) error {
	return startExchange(ctx, db, c, user, reply, "", rc, false, keepFrom)
}

func startExchange(ctx context.Context, db *gorm.DB, c *Conversation, user, reply *Message, title string, rc ReplyCap, afterLeaf bool, keepFrom ...string) error {
	user.Sanitize()
	reply.Sanitize()
	refused := false
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		full, err := beginReply(tx, c.ID, rc)
		if err != nil {
			return err
		}
		if full {
			refused = true
			reply.Status, reply.Reason, reply.Replica = MessageError, Storable(rc.Refusal, 200), ""
		}
		if afterLeaf {
			// Read under the conversation's lock: a send on another
			// replica that just finished is followed, not forked.
			leaf, err := leafIn(tx, c.ID)
			if err != nil {
				return err
			}
			user.ParentID = nil
			if leaf != "" {
				user.ParentID = &leaf
			}
		}
		reply.ParentID = &user.ID
		if err := tx.Create(user).Error; err != nil {
			return fmt.Errorf("store message: %w", err)
		}
		for _, from := range keepFrom {
			if err := copyAttachments(tx, c.ID, from, user.ID); err != nil {
				return err
			}
		}
		if err := tx.Create(reply).Error; err != nil {
			if isOneStreamingViolation(err) {
				return ErrBusy
			}
			return fmt.Errorf("store reply: %w", err)
		}
		if err := setLeaf(tx, c.ID, reply.ID); err != nil {
			return err
		}
		if c.Title == "" && title != "" {
			if err := tx.Model(&Conversation{}).Where("id = ?", c.ID).Update("title", Storable(title, 200)).Error; err != nil {
				return fmt.Errorf("name conversation: %w", err)
			}
		}
		return nil
	})
	if err == nil && refused {
		return ErrTooManyReplies
	}
	return err
}

// SaveMessageContent stores the partial content of a streaming message.
func SaveMessageContent(ctx context.Context, db *gorm.DB, id, content string) error {
	err := db.WithContext(ctx).Model(&Message{}).Where("id = ? AND status = ?", id, MessageStreaming).
		Updates(map[string]any{"content": StorableText(content), "updated_at": time.Now().UTC()}).Error
	if err != nil {
		return fmt.Errorf("save content of message %s: %w", id, err)
	}
	return nil
}

// MessageEnd is how a streaming message ended.
type MessageEnd struct {
	Status           string
	Content          string
	Reason           string
	PromptTokens     int
	CompletionTokens int
	Cost             int64
}

// FinishMessage stores the final state of a streaming message. A message
// already finished (closed as a restart's leftover meanwhile) keeps its
// state.
func FinishMessage(ctx context.Context, db *gorm.DB, id string, end MessageEnd) error {
	err := db.WithContext(ctx).Model(&Message{}).Where("id = ? AND status = ?", id, MessageStreaming).
		Updates(map[string]any{
			"status": end.Status, "content": StorableText(end.Content), "reason": Storable(end.Reason, 200),
			"prompt_tokens": end.PromptTokens, "completion_tokens": end.CompletionTokens, "cost": end.Cost,
			"updated_at": time.Now().UTC(),
		}).Error
	if err != nil {
		return fmt.Errorf("finish message %s: %w", id, err)
	}
	return nil
}

// MessageByInference returns the assistant message of inference id and the
// id of the person whose conversation holds it.
func MessageByInference(ctx context.Context, db *gorm.DB, id string) (*Message, uint, error) {
	var row struct {
		Message
		OwnerID uint
	}
	err := db.WithContext(ctx).Model(&Message{}).
		Select("messages.*, conversations.user_id AS owner_id").
		Joins("JOIN conversations ON conversations.id = messages.conversation_id").
		Where("messages.inference_id = ?", id).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, 0, ErrNotFound
	}
	if err != nil {
		return nil, 0, fmt.Errorf("find message of inference %s: %w", id, err)
	}
	return &row.Message, row.OwnerID, nil
}

// CloseUnfinishedMessages marks the streaming messages of dead replicas as
// errors with reason gateway_restart, the twin of CloseUnfinishedUsage:
// replicas silent since staleBefore, and at start-up (restarted = this
// replica's id) this replica's previous life. Their text so far stays.
func CloseUnfinishedMessages(ctx context.Context, db *gorm.DB, restarted string, staleBefore time.Time) (int64, error) {
	live := db.Model(&Replica{}).Select("id").Where("seen_at >= ? AND id <> ?", staleBefore.UTC(), restarted)
	res := db.WithContext(ctx).Model(&Message{}).Where("status = ?", MessageStreaming).
		Where("replica NOT IN (?)", live).
		Updates(map[string]any{"status": MessageError, "reason": "gateway_restart", "updated_at": time.Now().UTC()})
	if res.Error != nil {
		return 0, fmt.Errorf("close unfinished messages: %w", res.Error)
	}
	return res.RowsAffected, nil
}

// ConversationSettings are what a conversation's replies are asked with.
type ConversationSettings struct {
	SystemPrompt string
	Temperature  *float64
	MaxTokens    *int
}

// SetConversationSettings stores the person's conversation id's settings.
func SetConversationSettings(ctx context.Context, db *gorm.DB, userID uint, id string, s ConversationSettings) error {
	res := db.WithContext(ctx).Model(&Conversation{}).Where("id = ? AND user_id = ?", id, userID).
		Updates(map[string]any{"system_prompt": StorableText(s.SystemPrompt), "temperature": s.Temperature, "max_tokens": s.MaxTokens})
	if res.Error != nil {
		return fmt.Errorf("set conversation %s's settings: %w", id, res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrNotFound
	}
	return nil
}
