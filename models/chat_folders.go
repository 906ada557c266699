package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// A person finds their conversations by pinning them (pinned ones come
// first in every list) and by putting them in folders: one level, a
// folder being only a name on its conversations ("" for none), so a folder
// exists while a conversation is in it.

// conversationOrder is the order of a person's conversations in every
// list: pinned first, then last used, ties broken by id. The cursor
// (ConversationCursor) follows the same three columns.
const conversationOrder = "conversations.pinned DESC, conversations.updated_at DESC, conversations.id DESC"

// Indexes of the lists (migrateConversationIndexes): one person's
// conversations in list order, and those of one folder in list order
// (which also walks their folders' names, ConversationFolders).
const (
	idxConversationsList   = "idx_conversations_user_pinned_updated"
	idxConversationsFolder = "idx_conversations_user_folder_pinned_updated"
	// idxConversationsOld served the list before pins: (user_id,
	// updated_at). Nothing orders by it alone any more, and every message
	// moves updated_at, so it is dropped rather than kept up for nothing.
	idxConversationsOld = "idx_conversations_user_updated"
)

// ErrTooManyFolders means the person has their maximum of folders and
// asked for one more.
var ErrTooManyFolders = errors.New("too many folders")

// migrateConversationIndexes creates the list's indexes and drops the one
// they replace. It only reads when that is done, so a second process
// opening the database does not wait for a write lock.
func migrateConversationIndexes(db *gorm.DB) error {
	m := db.Migrator()
	for name, cols := range map[string]string{
		idxConversationsList:   "user_id, pinned, updated_at, id",
		idxConversationsFolder: "user_id, folder, pinned, updated_at, id",
	} {
		if m.HasIndex(&Conversation{}, name) {
			continue
		}
		if err := db.Exec("CREATE INDEX IF NOT EXISTS " + name + " ON conversations (" + cols + ")").Error; err != nil {
			return fmt.Errorf("create index %s: %w", name, err)
		}
	}
	if m.HasIndex(&Conversation{}, idxConversationsOld) {
		if err := m.DropIndex(&Conversation{}, idxConversationsOld); err != nil {
			return fmt.Errorf("drop index %s: %w", idxConversationsOld, err)
		}
	}
	return nil
}

// afterCursor keeps the conversations after c in list order. A row value:
// both dialects read it as a range of the list's indexes. After an unpinned
// cursor only unpinned conversations follow, said as such: PostgreSQL
// estimates a row value by its first column, and "pinned < false" keeps
// nothing, so the planner would take every later page for one row and may
// walk the wrong index.
func afterCursor(q *gorm.DB, c *ConversationCursor) *gorm.DB {
	if !c.Pinned {
		return q.Where("conversations.pinned = ? AND (conversations.updated_at, conversations.id) < (?, ?)", false, c.UpdatedAt.UTC(), c.ID)
	}
	return q.Where("(conversations.pinned, conversations.updated_at, conversations.id) < (?, ?, ?)", c.Pinned, c.UpdatedAt.UTC(), c.ID)
}

// upToCursor keeps the conversations up to c in list order, c included.
func upToCursor(q *gorm.DB, c *ConversationCursor) *gorm.DB {
	return q.Where("(conversations.pinned, conversations.updated_at, conversations.id) >= (?, ?, ?)", c.Pinned, c.UpdatedAt.UTC(), c.ID)
}

// CursorOf is where a list continues after conversation c.
func CursorOf(c *Conversation) ConversationCursor {
	return ConversationCursor{Pinned: c.Pinned, UpdatedAt: c.UpdatedAt, ID: c.ID}
}

// ConversationChange is what a change of a conversation sets: each field
// when not nil.
type ConversationChange struct {
	Title    *string
	Settings *ConversationSettings
	Pinned   *bool
	Folder   *string
}

// ChangeConversation applies ch to the person's conversation id in one
// statement (all or nothing), ErrNotFound when it is not theirs. A title
// or settings count as using the conversation (updated_at moves, as a
// rename always did); a pin or a folder do not, so the conversation keeps
// its place among the others. A folder the person does not use yet is
// refused with ErrTooManyFolders when they use maxFolders already (0: no
// bound).
func ChangeConversation(ctx context.Context, db *gorm.DB, userID uint, id string, ch ConversationChange, maxFolders int) error {
	set := map[string]any{}
	if ch.Title != nil {
		set["title"] = Storable(*ch.Title, 200)
	}
	if s := ch.Settings; s != nil {
		set["system_prompt"], set["temperature"], set["max_tokens"] = StorableText(s.SystemPrompt), s.Temperature, s.MaxTokens
	}
	if len(set) > 0 {
		set["updated_at"] = time.Now().UTC()
	}
	if ch.Pinned != nil {
		set["pinned"] = *ch.Pinned
	}
	if ch.Folder != nil {
		set["folder"] = Storable(*ch.Folder, 64)
	}
	if len(set) == 0 {
		return nil
	}
	update := func(tx *gorm.DB) error {
		res := tx.Model(&Conversation{}).Where("id = ? AND user_id = ?", id, userID).UpdateColumns(set)
		if res.Error != nil {
			return fmt.Errorf("change conversation %s: %w", id, res.Error)
		}
		if res.RowsAffected == 0 {
			return ErrNotFound
		}
		return nil
	}
	if ch.Folder == nil || set["folder"] == "" || maxFolders <= 0 {
		return update(db.WithContext(ctx))
	}
	folder := set["folder"].(string)
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Two changes of the person's take turns, so that both cannot
		// see room for one more folder.
		if err := lockPerson(tx, userID); err != nil {
			return err
		}
		var used []string
		if err := tx.Model(&Conversation{}).Where("user_id = ? AND folder = ?", userID, folder).
			Limit(1).Pluck("id", &used).Error; err != nil {
			return fmt.Errorf("look up folder of person %d: %w", userID, err)
		}
		if len(used) == 0 {
			names, err := conversationFolders(tx, userID, maxFolders)
			if err != nil {
				return err
			}
			if len(names) >= maxFolders {
				return ErrTooManyFolders
			}
		}
		return update(tx)
	})
}

// ConversationFolders returns the names of the person's folders (those of
// their conversations, "" left out), at most limit of them, in the
// database's order of text.
func ConversationFolders(ctx context.Context, db *gorm.DB, userID uint, limit int) ([]string, error) {
	return conversationFolders(db.WithContext(ctx), userID, limit)
}

// conversationFolders walks the folder index from one name to the next (a
// loose index scan: one index seek per folder, however many conversations
// each holds), where SELECT DISTINCT would read every conversation of the
// person.
func conversationFolders(db *gorm.DB, userID uint, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, nil
	}
	var names []string
	err := db.Raw(`WITH RECURSIVE f(name, n) AS (
		SELECT (SELECT MIN(folder) FROM conversations WHERE user_id = ? AND folder > ''), 1
		UNION ALL
		SELECT (SELECT MIN(folder) FROM conversations WHERE user_id = ? AND folder > f.name), f.n + 1
		FROM f WHERE f.name IS NOT NULL AND f.n < ?
	) SELECT name FROM f WHERE name IS NOT NULL`, userID, userID, limit).Scan(&names).Error
	if err != nil {
		return nil, fmt.Errorf("list folders of person %d: %w", userID, err)
	}
	return names, nil
}

// ListConversationsIn is ListConversations within folder ("": in any
// folder or none).
func ListConversationsIn(ctx context.Context, db *gorm.DB, userID uint, folder, query string, after *ConversationCursor, limit int) ([]Conversation, error) {
	base := func() *gorm.DB { return listQuery(db.WithContext(ctx), userID, folder, after) }
	var out []Conversation
	var err error
	if strings.TrimSpace(query) == "" {
		err = base().Limit(limit).Find(&out).Error
	} else {
		out, err = searchConversations(ctx, db, userID, base, query, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("list conversations: %w", err)
	}
	return out, nil
}

// listQuery is the person's conversations (of folder, unless "") after the
// cursor (unless nil), in list order.
func listQuery(db *gorm.DB, userID uint, folder string, after *ConversationCursor) *gorm.DB {
	q := db.Model(&Conversation{}).Where("conversations.user_id = ?", userID)
	if folder != "" {
		q = q.Where("conversations.folder = ?", folder)
	}
	if after != nil {
		q = afterCursor(q, after)
	}
	return q.Order(conversationOrder)
}
