package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"moonji/internal/thread"
)

// A conversation is a tree of messages (internal/thread): a send follows
// the last message of the path shown, an edit adds a sibling to a person's
// message, a regenerate a sibling to an answer, and the conversation's
// CurrentLeaf names the path shown. Every write below runs in one
// transaction that starts by touching the conversation (SQLite's write
// lock, PostgreSQL's row lock: see StartExchange), so the one-reply-at-a-
// time rule and the leaf move together.

// TreeOf indexes msgs (a conversation's messages in id order) as a tree.
func TreeOf(msgs []Message) *thread.Tree {
	nodes := make([]thread.Node, len(msgs))
	for i, m := range msgs {
		nodes[i] = thread.Node{ID: m.ID}
		if m.ParentID != nil {
			nodes[i].ParentID = *m.ParentID
		}
	}
	return thread.New(nodes)
}

// ConversationOutline returns conversation id's messages with only their
// id and parent, in order: the tree, without reading every text.
func ConversationOutline(ctx context.Context, db *gorm.DB, id string) ([]Message, error) {
	var out []Message
	if err := db.WithContext(ctx).Select("id", "parent_id").Where("conversation_id = ?", id).Order("id").
		Find(&out).Error; err != nil {
		return nil, fmt.Errorf("read the outline of conversation %s: %w", id, err)
	}
	return out, nil
}

// MessagesIn returns the messages ids of conversation id, in id order.
func MessagesIn(ctx context.Context, db *gorm.DB, id string, ids []string) ([]Message, error) {
	out := make([]Message, 0, len(ids))
	for start := 0; start < len(ids); start += 500 {
		var batch []Message
		if err := db.WithContext(ctx).Where("conversation_id = ? AND id IN ?", id, ids[start:min(start+500, len(ids))]).
			Order("id").Find(&batch).Error; err != nil {
			return nil, fmt.Errorf("read messages of conversation %s: %w", id, err)
		}
		out = append(out, batch...)
	}
	return out, nil
}

// leafIn returns the last message of conversation id's path shown, read in
// tx: its CurrentLeaf when that message exists, else its newest message
// ("" when it has none).
func leafIn(tx *gorm.DB, id string) (string, error) {
	var conv Conversation
	if err := tx.Select("current_leaf").Where("id = ?", id).Take(&conv).Error; err != nil {
		return "", fmt.Errorf("read conversation %s: %w", id, err)
	}
	var ids []string
	if conv.CurrentLeaf != "" {
		if err := tx.Model(&Message{}).Where("id = ? AND conversation_id = ?", conv.CurrentLeaf, id).
			Limit(1).Pluck("id", &ids).Error; err != nil {
			return "", fmt.Errorf("find leaf of conversation %s: %w", id, err)
		}
		if len(ids) == 1 {
			return ids[0], nil
		}
	}
	if err := tx.Model(&Message{}).Where("conversation_id = ?", id).Order("id DESC").Limit(1).
		Pluck("id", &ids).Error; err != nil {
		return "", fmt.Errorf("find newest message of conversation %s: %w", id, err)
	}
	if len(ids) == 0 {
		return "", nil
	}
	return ids[0], nil
}

// setLeaf makes leaf the end of conversation id's path shown.
func setLeaf(tx *gorm.DB, id, leaf string) error {
	if err := tx.Model(&Conversation{}).Where("id = ?", id).Update("current_leaf", leaf).Error; err != nil {
		return fmt.Errorf("show message %s: %w", leaf, err)
	}
	return nil
}

// beginReply starts a transaction's write of a reply in conversation id:
// it touches the conversation, then fails with ErrBusy while a reply
// streams there and with ErrTooManyReplies when the person has rc.Max
// streaming already (full reports that instead, for callers that store the
// reply refused).
func beginReply(tx *gorm.DB, id string, rc ReplyCap) (full bool, err error) {
	if err := tx.Model(&Conversation{}).Where("id = ?", id).Update("updated_at", time.Now().UTC()).Error; err != nil {
		return false, fmt.Errorf("touch conversation: %w", err)
	}
	var n int64
	if err := tx.Model(&Message{}).Where("conversation_id = ? AND status = ?", id, MessageStreaming).
		Count(&n).Error; err != nil {
		return false, fmt.Errorf("check running replies: %w", err)
	}
	if n > 0 {
		return false, ErrBusy
	}
	return rc.reached(tx)
}

// AddReplyVersion stores reply (streaming), whose ParentID names the
// person's message it answers, as a new version beside that message's
// earlier answers, and shows it. It fails with ErrBusy while a reply
// streams in c and with ErrTooManyReplies, changing nothing, when the
// person has rc.Max replies streaming already.
func AddReplyVersion(ctx context.Context, db *gorm.DB, c *Conversation, reply *Message, rc ReplyCap) error {
	reply.Sanitize()
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		full, err := beginReply(tx, c.ID, rc)
		if err != nil {
			return err
		}
		if full {
			return ErrTooManyReplies
		}
		if err := tx.Create(reply).Error; err != nil {
			if isOneStreamingViolation(err) {
				return ErrBusy // another replica started a reply meanwhile
			}
			return fmt.Errorf("store reply: %w", err)
		}
		return setLeaf(tx, c.ID, reply.ID)
	})
}

// ShowMessage makes leaf the end of the path shown of the person's
// conversation id (leaf must be one of its messages).
func ShowMessage(ctx context.Context, db *gorm.DB, userID uint, id, leaf string) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var n int64
		if err := tx.Model(&Message{}).Where("id = ? AND conversation_id = ?", leaf, id).Count(&n).Error; err != nil {
			return fmt.Errorf("find message %s: %w", leaf, err)
		}
		if n == 0 {
			return ErrNotFound
		}
		res := tx.Model(&Conversation{}).Where("id = ? AND user_id = ?", id, userID).Update("current_leaf", leaf)
		if res.Error != nil {
			return fmt.Errorf("show message %s: %w", leaf, res.Error)
		}
		if res.RowsAffected == 0 {
			return ErrNotFound
		}
		return nil
	})
}

// DeleteBranch deletes message msgID of the person's conversation id and
// every message after it in the tree (its versions' siblings stay). When
// the path shown went through it, the newest remaining version is shown
// instead (or its parent). It fails with ErrBusy when a reply streams in
// the branch, and returns the leaf shown after.
func DeleteBranch(ctx context.Context, db *gorm.DB, userID uint, id, msgID string) (string, error) {
	var leaf string
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Model(&Conversation{}).Where("id = ? AND user_id = ?", id, userID).Update("updated_at", time.Now().UTC())
		if res.Error != nil {
			return fmt.Errorf("touch conversation: %w", res.Error)
		}
		if res.RowsAffected == 0 {
			return ErrNotFound
		}
		var msgs []Message
		if err := tx.Select("id", "parent_id", "status").Where("conversation_id = ?", id).Order("id").
			Find(&msgs).Error; err != nil {
			return fmt.Errorf("read messages of conversation %s: %w", id, err)
		}
		tree := TreeOf(msgs)
		if !tree.Has(msgID) {
			return ErrNotFound
		}
		doomed := tree.Subtree(msgID)
		gone := make(map[string]bool, len(doomed))
		for _, d := range doomed {
			gone[d] = true
		}
		for _, m := range msgs {
			if gone[m.ID] && m.Status == MessageStreaming {
				return ErrBusy
			}
		}
		current, err := leafIn(tx, id)
		if err != nil {
			return err
		}
		leaf = current
		if gone[current] {
			leaf = tree.AfterRemoving(msgID)
		}
		// In batches: a statement's bound parameters are limited (SQLite
		// 32766, PostgreSQL 65535).
		for start := 0; start < len(doomed); start += 500 {
			batch := doomed[start:min(start+500, len(doomed))]
			if err := tx.Where("conversation_id = ? AND message_id IN ?", id, batch).Delete(&Attachment{}).Error; err != nil {
				return fmt.Errorf("delete the messages' attachments: %w", err)
			}
			if err := tx.Where("conversation_id = ? AND id IN ?", id, batch).Delete(&Message{}).Error; err != nil {
				return fmt.Errorf("delete messages: %w", err)
			}
		}
		return setLeaf(tx, id, leaf)
	})
	return leaf, err
}

// copyAttachments gives message to of conversation conv a copy of each
// attachment of message from, in tx.
func copyAttachments(tx *gorm.DB, conv, from, to string) error {
	if from == "" {
		return nil
	}
	var atts []Attachment
	if err := tx.Where("conversation_id = ? AND message_id = ?", conv, from).Order("position").Find(&atts).Error; err != nil {
		return fmt.Errorf("read the attachments of message %s: %w", from, err)
	}
	for i := range atts {
		atts[i].ID, atts[i].MessageID = NewAttachmentID(), &to
		if err := tx.Create(&atts[i]).Error; err != nil {
			return fmt.Errorf("copy attachment to message %s: %w", to, err)
		}
	}
	return nil
}

// MessageOf returns message msgID and its conversation if that
// conversation is the person's, and ErrNotFound otherwise.
func MessageOf(ctx context.Context, db *gorm.DB, userID uint, msgID string) (*Message, *Conversation, error) {
	var m Message
	err := db.WithContext(ctx).Where("id = ?", msgID).Take(&m).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil, ErrNotFound
	}
	if err != nil {
		return nil, nil, fmt.Errorf("find message %s: %w", msgID, err)
	}
	c, err := ConversationOf(ctx, db, userID, m.ConversationID)
	if err != nil {
		return nil, nil, err
	}
	return &m, c, nil
}

// addMessageParents gives the messages stored before conversations were
// trees their parent — the message before them — once, in the transaction
// that adds the column, so that a crash leaves either both or neither.
func addMessageParents(db *gorm.DB) error {
	m := db.Migrator()
	if !m.HasTable(&Message{}) || m.HasColumn(&Message{}, "ParentID") {
		return nil
	}
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Migrator().AddColumn(&Message{}, "ParentID"); err != nil {
			return fmt.Errorf("add messages.parent_id: %w", err)
		}
		err := tx.Exec(`UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p
			WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id)`).Error
		if err != nil {
			return fmt.Errorf("link messages to the ones before them: %w", err)
		}
		return nil
	})
}
