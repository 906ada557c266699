// Package chat owns the browser chat: conversations, their messages, and
// the generations that write the assistant's replies. A generation is an
// ordinary request through the gateway on behalf of the person (routing,
// rate limit, admission, usage row, Stop), run on the server: it goes on
// whoever watches it, and only Stop ends it early. It knows nothing of
// Fiber; handlers call it.
package chat

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	lru "github.com/hashicorp/golang-lru/v2"
	"gorm.io/gorm"

	"moonji/internal/attachment"
	"moonji/internal/gateway"
	"moonji/internal/money"
	"moonji/internal/ratelimit"
	"moonji/models"
)

// Limits on what a person sends.
const (
	MaxContentBytes = 32 << 10
	MaxTitleChars   = 200
	// PageSize is how many conversations a list page holds.
	PageSize = 50
	// titleChars is how much of the first message names a conversation.
	titleChars = 60
)

// Errors handlers turn into answers.
var (
	ErrNotFound     = models.ErrNotFound // unknown, or someone else's
	ErrBusy         = models.ErrBusy
	ErrUnknownModel = errors.New("unknown model")
	ErrTooLarge     = errors.New("message too large")
	ErrEmpty        = errors.New("message is empty")
	ErrTitleTooLong = errors.New("title too long")
	ErrBadCursor    = errors.New("bad cursor")
	ErrQueryTooLong = errors.New("search query too long")
	ErrClosed       = errors.New("chat is shutting down")
)

// Options wire a Service.
type Options struct {
	Gateway *gateway.Gateway
	DB      *gorm.DB
	// Replica names this replica in the messages it generates, so that a
	// dead replica's streaming messages can be closed.
	Replica string
	// ContextTokens bounds the earlier messages sent with a new one.
	ContextTokens int
	// Render turns a saved Markdown answer into HTML; default: the text
	// escaped in one paragraph.
	Render func(markdown string) string
	// Stop stops a running generation the way a person's Stop does (the
	// gateway's stop service), for deletes and shutdown; nil: they wait.
	Stop func(ctx context.Context, inferenceID string) error
	// ExtraBody adds top-level fields to every generation's request body
	// (tests steer the mock engine with its "mock" object).
	ExtraBody map[string]any
	// Keep is how long a finished generation's log stays for late viewers
	// (default one minute; the database has the text after).
	Keep time.Duration
	// Limits bound what one person may hold; Limiter counts the
	// per-minute ones (nil: those are not counted).
	Limits  Limits
	Limiter *ratelimit.Limiter
	Log     *slog.Logger
	// Currency names the unit of the cost shown under each answer.
	Currency string
	// Attachments stores the files attached to messages (nil: none may be).
	Attachments *attachment.Service
}

// Service runs the chat of one replica.
type Service struct {
	o   Options
	log *slog.Logger

	mu         sync.Mutex
	extra      map[string]any
	live       map[string]*generation // by inference id: running and recently finished
	running    map[string]*generation // by conversation id
	forgetters map[string]*time.Timer
	rendered   *lru.Cache[[32]byte, string]
	closed     bool
	quit       chan struct{}
	wg         sync.WaitGroup
}

// New returns a Service.
func New(o Options) *Service {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Render == nil {
		o.Render = func(md string) string { return "<p>" + html.EscapeString(md) + "</p>" }
	}
	if o.ContextTokens <= 0 {
		o.ContextTokens = 8192
	}
	if o.Keep <= 0 {
		o.Keep = time.Minute
	}
	return &Service{o: o, log: o.Log, extra: o.ExtraBody, live: map[string]*generation{},
		running: map[string]*generation{}, forgetters: map[string]*time.Timer{}, rendered: newRenderCache(),
		quit: make(chan struct{})}
}

// SetExtraBody replaces Options.ExtraBody for the generations started
// from now on (tests in other packages steer the mock engine with it).
func (s *Service) SetExtraBody(m map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.extra = m
}

// Person is who uses the chat.
type Person struct {
	UserID uint
	Email  string
	Admin  bool
}

func (p Person) principal() gateway.Principal {
	return gateway.Principal{UserID: p.UserID, Email: p.Email, Admin: p.Admin, Source: gateway.SourceWeb}
}

// Create starts an empty conversation with model.
func (s *Service) Create(ctx context.Context, p Person, model string) (*models.Conversation, error) {
	if !slices.Contains(s.o.Gateway.Models(), model) {
		return nil, ErrUnknownModel
	}
	lim := s.o.Limits
	if err := s.allow(ctx, p, "conversations", lim.ConversationsPerMinute, CodeTooManyConversations,
		fmt.Sprintf("You started %d conversations in the last minute, the most allowed: wait a moment.", lim.ConversationsPerMinute)); err != nil {
		return nil, err
	}
	c := &models.Conversation{ID: models.NewConversationID(), UserID: p.UserID, Model: model}
	err := models.CreateConversationWithin(ctx, s.o.DB, c, lim.ConversationsPerPerson)
	if errors.Is(err, models.ErrTooManyConversations) {
		return nil, &LimitError{Code: CodeTooManyConversations, RetryAfter: time.Minute,
			Message: fmt.Sprintf("You keep %d conversations, the most allowed: delete some first.", lim.ConversationsPerPerson)}
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Page is one page of a person's conversations; NextCursor is empty on the
// last.
type Page struct {
	Conversations []models.Conversation
	NextCursor    string
}

// List returns the person's conversations, pinned first, then last used
// first, PageSize at a time from cursor ("" for the first page, and the
// same cursors page through search results). A query keeps the
// conversations whose title or one of whose messages holds each of its
// words as a word start, in any case (full-text search:
// models.ListConversations); a query of only punctuation keeps none. It is
// at most MaxTitleChars characters (ErrQueryTooLong): a search is a few
// words, and the bound keeps its cost bounded.
func (s *Service) List(ctx context.Context, userID uint, query, cursor string) (Page, error) {
	return s.ListIn(ctx, userID, "", query, cursor)
}

// ListIn is List within folder ("": every conversation); a folder name
// that could not be stored is refused as a *SettingError of "folder".
func (s *Service) ListIn(ctx context.Context, userID uint, folder, query, cursor string) (Page, error) {
	if utf8.RuneCountInString(query) > MaxTitleChars {
		return Page{}, ErrQueryTooLong
	}
	folder, err := CheckFolder(folder)
	if err != nil {
		return Page{}, err
	}
	after, err := parseCursor(cursor)
	if err != nil {
		return Page{}, err
	}
	if query != "" {
		// A search reads the full-text index: counted, unlike the plain
		// list every page draws.
		n := s.o.Limits.SearchesPerMinute
		if err := s.allow(ctx, Person{UserID: userID}, "searches", n, CodeTooManySearches,
			fmt.Sprintf("You searched %d times in the last minute, the most allowed: wait a moment.", n)); err != nil {
			return Page{}, err
		}
	}
	rows, err := models.ListConversationsIn(ctx, s.o.DB, userID, folder, query, after, PageSize+1)
	if err != nil {
		return Page{}, err
	}
	var p Page
	if len(rows) > PageSize {
		rows = rows[:PageSize]
		p.NextCursor = formatCursor(models.CursorOf(&rows[len(rows)-1]))
	}
	p.Conversations = rows
	return p, nil
}

// A cursor is opaque to clients: base64 of "p,unix-nanos,id" after a
// pinned conversation, "u,unix-nanos,id" after another. A cursor of before
// pins ("unix-nanos,id") continues after an unpinned one, which every
// conversation then was.
func formatCursor(c models.ConversationCursor) string {
	flag := "u,"
	if c.Pinned {
		flag = "p,"
	}
	return base64.RawURLEncoding.EncodeToString([]byte(flag + strconv.FormatInt(c.UpdatedAt.UnixNano(), 10) + "," + c.ID))
}

func parseCursor(c string) (*models.ConversationCursor, error) {
	if c == "" {
		return nil, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return nil, ErrBadCursor
	}
	s, pinned := string(raw), false
	if rest, ok := strings.CutPrefix(s, "p,"); ok {
		s, pinned = rest, true
	} else {
		s = strings.TrimPrefix(s, "u,")
	}
	ns, id, ok := strings.Cut(s, ",")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return nil, ErrBadCursor
	}
	return &models.ConversationCursor{Pinned: pinned, UpdatedAt: time.Unix(0, n).UTC(), ID: id}, nil
}

// Get returns the person's conversation id with its messages.
func (s *Service) Get(ctx context.Context, userID uint, id string) (*models.Conversation, []models.Message, error) {
	c, err := models.ConversationOf(ctx, s.o.DB, userID, id)
	if err != nil {
		return nil, nil, err
	}
	msgs, err := models.ConversationMessages(ctx, s.o.DB, id)
	if err != nil {
		return nil, nil, err
	}
	return c, msgs, nil
}

// Rename sets the title of the person's conversation id.
func (s *Service) Rename(ctx context.Context, userID uint, id, title string) error {
	title = strings.TrimSpace(title)
	if utf8.RuneCountInString(title) > MaxTitleChars {
		return ErrTitleTooLong
	}
	return models.RenameConversation(ctx, s.o.DB, userID, id, title)
}

// Delete deletes the person's conversation id, stopping its running
// generation first (its final state is saved before the rows go).
func (s *Service) Delete(ctx context.Context, userID uint, id string) error {
	if _, err := models.ConversationOf(ctx, s.o.DB, userID, id); err != nil {
		return err
	}
	s.mu.Lock()
	g := s.running[id]
	s.mu.Unlock()
	if g != nil {
		s.stop(ctx, g)
	}
	return models.DeleteConversation(ctx, s.o.DB, userID, id)
}

// stop stops g and waits (bounded) until its final state is saved.
func (s *Service) stop(ctx context.Context, g *generation) {
	if s.o.Stop != nil {
		if err := s.o.Stop(ctx, g.id); err != nil {
			s.log.Warn("stop generation", "inference_id", g.id, "err", err)
		}
	}
	select {
	case <-g.ended:
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		s.log.Warn("generation did not end after its stop", "inference_id", g.id)
	}
}

// Close refuses new messages, stops the running generations (each saves
// what it has as stopped) and waits for them, at most timeout.
func (s *Service) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.quit)
	var running []*generation
	for _, g := range s.running {
		running = append(running, g)
	}
	for _, t := range s.forgetters {
		t.Stop()
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, g := range running {
		wg.Add(1)
		go func() { defer wg.Done(); s.stop(ctx, g) }()
	}
	wg.Wait()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("chat generations still running at shutdown")
	}
}

// Sent is what Send started.
type Sent struct {
	MessageID     string // the assistant's reply
	InferenceID   string
	UserMessageID string // the person's message, for a send or an edit
}

// Send adds the person's message to conversation id, with the attachments
// attachmentIDs (attachments.go), and starts the assistant's reply, which
// runs on its own; it returns once the reply's message exists (status
// streaming).
func (s *Service) Send(ctx context.Context, p Person, id, content string, attachmentIDs ...string) (Sent, error) {
	if len(content) > MaxContentBytes {
		return Sent{}, ErrTooLarge
	}
	content = models.StorableText(content)
	if strings.TrimSpace(content) == "" && len(attachmentIDs) == 0 {
		return Sent{}, ErrEmpty
	}
	conv, err := models.ConversationOf(ctx, s.o.DB, p.UserID, id)
	if err != nil {
		return Sent{}, err
	}
	att, err := s.prepareAttachments(ctx, p, conv, attachmentIDs)
	if err != nil {
		return Sent{}, err
	}
	user := &models.Message{ID: models.NewMessageID(), ConversationID: conv.ID, Role: models.RoleUser,
		Content: content, Status: models.MessageDone}
	sent, err := s.start(ctx, p, conv, func(reply *models.Message) error {
		return att.around(ctx, conv.ID, user.ID, func() error {
			return models.StartExchangeWithin(ctx, s.o.DB, conv, user, reply, att.title(content), s.replyCap(p))
		})
	})
	if sent.MessageID != "" {
		sent.UserMessageID = user.ID
	}
	return sent, err
}

// titleOf names a conversation after its first message: the first
// non-blank line, cut to titleChars characters.
func titleOf(content string) string {
	line := ""
	for l := range strings.SplitSeq(content, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			line = l
			break
		}
	}
	if utf8.RuneCountInString(line) <= titleChars {
		return line
	}
	r := []rune(line)
	return strings.TrimSpace(string(r[:titleChars-1])) + "…"
}

// release marks g's conversation free for the next message and drops its
// log after Keep (late viewers find the text in the database after that).
func (s *Service) release(g *generation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[g.convID] == g {
		delete(s.running, g.convID)
	}
	if s.closed {
		delete(s.live, g.id)
		return
	}
	s.forgetters[g.id] = time.AfterFunc(s.o.Keep, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.live, g.id)
		delete(s.forgetters, g.id)
	})
}

// RenderFinal renders a finished assistant message as the HTML the page
// shows: the rendered answer in an element whose data-status is the
// message's status, with the reason of an error, then what it was billed
// for.
func (s *Service) RenderFinal(f Final) string {
	if len(f.Content) > maxCachedRender {
		return s.renderFinal(f)
	}
	key := renderKey(f)
	if out, ok := s.rendered.Get(key); ok {
		return out
	}
	out := s.renderFinal(f)
	s.rendered.Add(key, out)
	return out
}

// renderFinal is RenderFinal without the cache.
func (s *Service) renderFinal(f Final) string {
	var b strings.Builder
	b.WriteString(`<div class="answer" data-status="`)
	b.WriteString(html.EscapeString(f.Status))
	b.WriteString(`">`)
	if f.Content != "" {
		b.WriteString(s.o.Render(f.Content))
	}
	if f.Status == models.MessageError {
		reason := f.Reason
		if reason == "" {
			reason = "The answer failed."
		}
		b.WriteString(`<p class="error">`)
		b.WriteString(html.EscapeString(reason))
		b.WriteString(`</p>`)
	}
	b.WriteString(`</div>`)
	if f.PromptTokens > 0 || f.CompletionTokens > 0 {
		// What the answer was billed for, as its usage row says: beside
		// the answer, not in it (Copy and the answer's text leave it out).
		fmt.Fprintf(&b, `<p class="usage-note" data-cost="%d">%d tokens in · %d out`, f.Cost, f.PromptTokens, f.CompletionTokens)
		if f.Cost > 0 { // a free model's answers cost nothing: no price to show
			fmt.Fprintf(&b, ` · %s %s`, money.FormatShort(f.Cost), html.EscapeString(s.o.Currency))
		}
		b.WriteString(`</p>`)
	}
	return b.String()
}
