// Package share makes share links: a URL with a 128-bit random token that
// opens a read-only copy of a conversation as it was shown when the link
// was made. The copy is taken at once and kept apart from the
// conversation, so what the conversation becomes later is not shared. A
// link ends when it is revoked, when it expires, when its conversation is
// deleted, or while its owner is disabled; an ended link is answered like
// one that never existed. It knows nothing of Fiber; handlers call it.
package share

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"gorm.io/gorm"

	"moonji/models"
)

// Bounds of a share link.
const (
	// TokenBytes is the token's randomness: 128 bits, too many to guess.
	TokenBytes = 16
	// TokenLen is the token's length in URL-safe base64 without padding.
	TokenLen = 22
	// MinExpiry and MaxExpiry bound a link's lifetime when it has one.
	MinExpiry = time.Minute
	MaxExpiry = 365 * 24 * time.Hour
	// DefaultMaxPerPerson is how many links a person may keep.
	DefaultMaxPerPerson = 1000
	// MaxSnapshotBytes bounds the copy one link keeps; a longer
	// conversation is refused (ErrTooLarge) rather than cut, so that a
	// link never shows part of a conversation as if it were all of it.
	MaxSnapshotBytes = 8 << 20
)

// Errors handlers turn into answers.
var (
	ErrNotFound  = models.ErrNotFound // unknown, revoked, expired, or someone else's
	ErrTooMany   = errors.New("too many share links")
	ErrEmpty     = errors.New("nothing to share yet")
	ErrTooLarge  = errors.New("conversation too large to share")
	ErrBadExpiry = fmt.Errorf("expires_in must be from %d seconds to %d seconds (a year)", int(MinExpiry.Seconds()), int(MaxExpiry.Seconds()))
)

// Options wire a Service.
type Options struct {
	DB *gorm.DB
	// Shown returns a person's conversation and the messages of the path
	// its page shows (chat.Service.Shown).
	Shown func(ctx context.Context, userID uint, id string) (*models.Conversation, []models.Message, error)
	// Render turns an answer's Markdown into sanitized HTML
	// (markdown.Render); default: the text escaped in one paragraph.
	Render func(markdown string) string
	// MaxPerPerson bounds the links a person keeps (0: DefaultMaxPerPerson).
	MaxPerPerson int
	// Now is the clock expiry is judged by (default time.Now); tests move it.
	Now func() time.Time
	Log *slog.Logger
}

// Service makes, lists, opens and revokes share links.
type Service struct {
	o        Options
	rendered *lru.Cache[string, []Message]
}

// renderCacheEntries bounds the shares whose rendered answers are kept: a
// public link opened by many people is rendered once, not per visit.
const renderCacheEntries = 128

// maxCachedSnapshot is the largest snapshot whose rendering is cached, so
// that the cache holds at most a few tens of MB.
const maxCachedSnapshot = 256 << 10

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.MaxPerPerson <= 0 {
		o.MaxPerPerson = DefaultMaxPerPerson
	}
	if o.Render == nil {
		o.Render = func(md string) string { return "<p>" + html.EscapeString(md) + "</p>" }
	}
	cache, _ := lru.New[string, []Message](renderCacheEntries) // fails only for a size <= 0
	return &Service{o: o, rendered: cache}
}

// NewToken returns a new token: TokenBytes from crypto/rand in URL-safe
// base64 without padding.
func NewToken() string {
	var b [TokenBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ValidToken reports whether s is a token as NewToken writes them (the
// canonical encoding only), so that anything else is refused before the
// database is asked.
func ValidToken(s string) bool {
	if len(s) != TokenLen {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	return err == nil && len(b) == TokenBytes
}

// CheckExpiry checks a link's lifetime: 0 (none) or MinExpiry to MaxExpiry.
func CheckExpiry(d time.Duration) error {
	if d == 0 || (d >= MinExpiry && d <= MaxExpiry) {
		return nil
	}
	return ErrBadExpiry
}

// Request is what a new link is made with.
type Request struct {
	// ExpiresIn is the link's lifetime; 0: until revoked.
	ExpiresIn time.Duration
	// ShowAuthor names the person on the shared page.
	ShowAuthor bool
}

// Message is one shared message, as the snapshot keeps it.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	Status  string `json:"status"`
	Model   string `json:"model,omitempty"`
	// HTML is an answer rendered from Content when the page is shown; not
	// stored, so that the renderer's sanitizing of today applies to links
	// made before it.
	HTML string `json:"-"`
}

// Snapshot is what a link copies of the messages shown: the person's
// messages, and the answers that finished (done, or stopped by the
// person) with some text. An answer still being written is not shared
// half-way, and a failed one is left out: its text is partial, and its
// reason may name the person (a budget's refusal does).
func Snapshot(msgs []models.Message) []Message {
	out := make([]Message, 0, len(msgs))
	for _, m := range msgs {
		switch {
		case m.Role == models.RoleUser:
		case m.Role == models.RoleAssistant && (m.Status == models.MessageDone || m.Status == models.MessageStopped) &&
			strings.TrimSpace(m.Content) != "":
		default:
			continue
		}
		out = append(out, Message{Role: m.Role, Content: m.Content, Status: m.Status, Model: m.Model})
	}
	return out
}

// Create makes a link to the person's conversation id as shown now.
// Someone else's conversation is ErrNotFound: never shareable.
func (s *Service) Create(ctx context.Context, userID uint, id string, r Request) (*models.Share, error) {
	if err := CheckExpiry(r.ExpiresIn); err != nil {
		return nil, err
	}
	conv, msgs, err := s.o.Shown(ctx, userID, id)
	if err != nil {
		return nil, err
	}
	snap := Snapshot(msgs)
	if len(snap) == 0 {
		return nil, ErrEmpty
	}
	raw, err := json.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	if len(raw) > MaxSnapshotBytes {
		return nil, ErrTooLarge
	}
	now := s.o.Now().UTC()
	sh := &models.Share{Token: NewToken(), UserID: userID, ConversationID: conv.ID, Title: conv.Title, Snapshot: string(raw),
		ShowAuthor: r.ShowAuthor, CreatedAt: now}
	if r.ExpiresIn > 0 {
		at := now.Add(r.ExpiresIn)
		sh.ExpiresAt = &at
	}
	switch err := models.CreateShareWithin(ctx, s.o.DB, sh, s.o.MaxPerPerson); {
	case errors.Is(err, models.ErrTooManyShares):
		return nil, ErrTooMany
	case err != nil:
		return nil, err
	}
	s.o.Log.Info("share link created", "user", userID, "conversation", conv.ID, "messages", len(snap),
		"expires_in", r.ExpiresIn.String(), "show_author", r.ShowAuthor)
	return sh, nil
}

// MaxPerPerson is how many links a person may keep.
func (s *Service) MaxPerPerson() int { return s.o.MaxPerPerson }

// Link is one of a person's links as their list shows it.
type Link struct {
	Token          string
	ConversationID string
	Title          string
	ShowAuthor     bool
	Created        time.Time
	Expires        *time.Time
	// Expired links stay listed until revoked, so the person sees why
	// one stopped working.
	Expired bool
}

// List returns the person's links, newest first.
func (s *Service) List(ctx context.Context, userID uint) ([]Link, error) {
	rows, err := models.SharesOf(ctx, s.o.DB, userID, s.o.MaxPerPerson)
	if err != nil {
		return nil, err
	}
	now := s.o.Now()
	out := make([]Link, 0, len(rows))
	for _, r := range rows {
		out = append(out, Link{Token: r.Token, ConversationID: r.ConversationID, Title: r.Title, ShowAuthor: r.ShowAuthor,
			Created: r.CreatedAt, Expires: r.ExpiresAt, Expired: r.ExpiresAt != nil && !r.ExpiresAt.After(now)})
	}
	return out, nil
}

// Revoke deletes the person's link token: it answers 404 from now on.
// Someone else's is ErrNotFound, as is a malformed token.
func (s *Service) Revoke(ctx context.Context, userID uint, token string) error {
	if !ValidToken(token) {
		return ErrNotFound
	}
	if err := models.DeleteShare(ctx, s.o.DB, userID, token); err != nil {
		return err
	}
	s.rendered.Remove(token)
	s.o.Log.Info("share link revoked", "user", userID)
	return nil
}

// Shared is what a link's page shows.
type Shared struct {
	Title   string
	Created time.Time
	// Author names the person when they chose so ("" otherwise): their
	// name, else their email.
	Author   string
	Messages []Message
}

// Open returns what link token shows, or ErrNotFound when it is malformed,
// unknown, revoked or expired, all alike.
func (s *Service) Open(ctx context.Context, token string) (*Shared, error) {
	if !ValidToken(token) {
		return nil, ErrNotFound
	}
	row, err := models.OpenShare(ctx, s.o.DB, token, s.o.Now())
	if err != nil {
		return nil, err
	}
	out := &Shared{Title: row.Title, Created: row.CreatedAt}
	if row.ShowAuthor {
		out.Author = Author(row.OwnerName, row.OwnerEmail)
	}
	if msgs, ok := s.rendered.Get(token); ok {
		out.Messages = msgs
		return out, nil
	}
	if err := json.Unmarshal([]byte(row.Snapshot), &out.Messages); err != nil {
		return nil, fmt.Errorf("decode snapshot of a share of conversation %s: %w", row.ConversationID, err)
	}
	for i := range out.Messages {
		if m := &out.Messages[i]; m.Role == models.RoleAssistant {
			m.HTML = s.o.Render(m.Content)
		}
	}
	if len(row.Snapshot) <= maxCachedSnapshot {
		s.rendered.Add(token, out.Messages)
	}
	return out, nil
}

// Author is what a page would name the person by if they chose to be
// named: their name, else their email.
func Author(name, email string) string {
	if name != "" {
		return name
	}
	return email
}
