package models

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Attachment is a file a person attached to a chat message: an image or a
// text file. Its bytes are in the database, so that every replica serves
// it. Uploaded first, it belongs to nobody's message until a send claims
// it (ClaimAttachments); one never sent is deleted after a while
// (DeleteOrphanAttachments), one sent goes with its conversation.
type Attachment struct {
	// ID is random ("a_" and 26 base32 characters, 128 bits): it appears in
	// URLs and must not be guessable.
	ID     string `gorm:"primaryKey;size:40"`
	UserID uint   `gorm:"not null;index:idx_attachments_user_unsent,priority:1"`
	// ConversationID and MessageID are the message that carries it; nil
	// until sent.
	ConversationID *string `gorm:"size:40;index"`
	MessageID      *string `gorm:"size:40;index:idx_attachments_message,priority:1;index:idx_attachments_user_unsent,priority:2"`
	// Position orders a message's attachments as the person gave them.
	Position int    `gorm:"index:idx_attachments_message,priority:2"`
	Kind     string `gorm:"size:16"`
	Name     string `gorm:"size:255"`
	MIME     string `gorm:"size:100"`
	Bytes    int64
	SHA256   string `gorm:"size:64"`
	Data     []byte `gorm:"not null"`
	// CreatedAt is when it was uploaded: an unsent one this old is swept.
	CreatedAt time.Time
}

// attachmentMeta is every column but the bytes.
var attachmentMeta = []string{"id", "user_id", "conversation_id", "message_id", "position", "kind", "name", "mime", "bytes", "sha256", "created_at"}

// NewAttachmentID returns "a_" and 26 characters of crypto-random base32.
func NewAttachmentID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "a_" + chatIDEncoding.EncodeToString(b[:])
}

// ErrTooManyUnsent means a person holds their maximum of attachments
// uploaded and not yet sent.
var ErrTooManyUnsent = errors.New("too many attachments not yet sent")

// CreateAttachmentWithin stores a, first deleting its person's unsent
// attachments uploaded before staleBefore, unless they still hold
// maxUnsent unsent ones (ErrTooManyUnsent; 0: no bound).
func CreateAttachmentWithin(ctx context.Context, db *gorm.DB, a *Attachment, maxUnsent int, staleBefore time.Time) error {
	a.Name = Storable(a.Name, 255)
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// A write first, for SQLite's write lock (see StartExchange).
		if err := tx.Where("user_id = ? AND message_id IS NULL AND created_at < ?", a.UserID, staleBefore.UTC()).
			Delete(&Attachment{}).Error; err != nil {
			return fmt.Errorf("delete stale attachments of person %d: %w", a.UserID, err)
		}
		if maxUnsent > 0 {
			if err := lockPerson(tx, a.UserID); err != nil {
				return err
			}
			var n int64
			if err := tx.Model(&Attachment{}).Where("user_id = ? AND message_id IS NULL", a.UserID).Count(&n).Error; err != nil {
				return fmt.Errorf("count unsent attachments of person %d: %w", a.UserID, err)
			}
			if n >= int64(maxUnsent) {
				return ErrTooManyUnsent
			}
		}
		if err := tx.Create(a).Error; err != nil {
			return fmt.Errorf("store attachment: %w", err)
		}
		return nil
	})
}

// AttachmentOf returns attachment id with its bytes if it belongs to
// userID, and ErrNotFound otherwise: someone else's looks like none.
func AttachmentOf(ctx context.Context, db *gorm.DB, userID uint, id string) (*Attachment, error) {
	var a Attachment
	err := db.WithContext(ctx).Where("id = ? AND user_id = ?", id, userID).Take(&a).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("find attachment %s: %w", id, err)
	}
	return &a, nil
}

// UnsentAttachments returns, without their bytes, those of ids that belong
// to userID and are not yet sent.
func UnsentAttachments(ctx context.Context, db *gorm.DB, userID uint, ids []string) ([]Attachment, error) {
	var out []Attachment
	if len(ids) == 0 {
		return out, nil
	}
	err := db.WithContext(ctx).Select(attachmentMeta).Where("id IN ? AND user_id = ? AND message_id IS NULL", ids, userID).
		Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("read attachments: %w", err)
	}
	return out, nil
}

// UnclaimedError names an attachment a send could not claim: unknown,
// someone else's, or sent already.
type UnclaimedError struct{ ID string }

func (e *UnclaimedError) Error() string { return "attachment " + e.ID + " is unknown or already sent" }

// ClaimAttachments makes ids (in that order) the attachments of message
// msgID of conversation convID, all or none: each must be userID's and
// unsent, else *UnclaimedError names the first that is not. A claim is a
// conditional update, so two sends racing for one attachment cannot both
// have it, on any replica.
func ClaimAttachments(ctx context.Context, db *gorm.DB, userID uint, convID, msgID string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		for i, id := range ids {
			res := tx.Model(&Attachment{}).Where("id = ? AND user_id = ? AND message_id IS NULL", id, userID).
				Updates(map[string]any{"conversation_id": convID, "message_id": msgID, "position": i})
			if res.Error != nil {
				return fmt.Errorf("claim attachment %s: %w", id, res.Error)
			}
			if res.RowsAffected == 0 {
				return &UnclaimedError{ID: id}
			}
		}
		return nil
	})
}

// ReleaseAttachments makes the attachments of message msgID unsent again:
// its send failed after they were claimed, and they stay the person's to
// send.
func ReleaseAttachments(ctx context.Context, db *gorm.DB, msgID string) error {
	err := db.WithContext(ctx).Model(&Attachment{}).Where("message_id = ?", msgID).
		Updates(map[string]any{"conversation_id": nil, "message_id": nil}).Error
	if err != nil {
		return fmt.Errorf("release attachments of message %s: %w", msgID, err)
	}
	return nil
}

// ConversationAttachments returns the attachments of conversation id
// without their bytes, by message and position.
func ConversationAttachments(ctx context.Context, db *gorm.DB, id string) ([]Attachment, error) {
	var out []Attachment
	err := db.WithContext(ctx).Select(attachmentMeta).Where("conversation_id = ?", id).
		Order("message_id, position").Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("read attachments of conversation %s: %w", id, err)
	}
	return out, nil
}

// MessageAttachments returns the attachments of messages msgIDs of
// conversation convID with their bytes, by message and position.
func MessageAttachments(ctx context.Context, db *gorm.DB, convID string, msgIDs []string) ([]Attachment, error) {
	var out []Attachment
	if len(msgIDs) == 0 {
		return out, nil
	}
	err := db.WithContext(ctx).Where("conversation_id = ? AND message_id IN ?", convID, msgIDs).
		Order("message_id, position").Find(&out).Error
	if err != nil {
		return nil, fmt.Errorf("read attachments of conversation %s: %w", convID, err)
	}
	return out, nil
}

// DeleteOrphanAttachments deletes the attachments uploaded before before
// and never sent, everyone's; it returns how many.
func DeleteOrphanAttachments(ctx context.Context, db *gorm.DB, before time.Time) (int64, error) {
	res := db.WithContext(ctx).Where("message_id IS NULL AND created_at < ?", before.UTC()).Delete(&Attachment{})
	if res.Error != nil {
		return 0, fmt.Errorf("delete unsent attachments: %w", res.Error)
	}
	return res.RowsAffected, nil
}
