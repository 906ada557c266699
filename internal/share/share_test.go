package share_test

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/share"
	"moonji/internal/testdb"
	"moonji/models"
)

// Tokens are 128 bits from crypto/rand: never the same twice, and each of
// their bits is set about half the time (a stuck or biased bit, or a
// token cut shorter, fails).
func TestNewTokenIsRandom128Bits(t *testing.T) {
	const n = 20000
	seen := make(map[string]bool, n)
	var ones [share.TokenBytes * 8]int
	for range n {
		tok := share.NewToken()
		if len(tok) != share.TokenLen || !share.ValidToken(tok) {
			t.Fatalf("token %q: not a valid token", tok)
		}
		if seen[tok] {
			t.Fatalf("token %q drawn twice", tok)
		}
		seen[tok] = true
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(raw) != share.TokenBytes {
			t.Fatalf("token %q decodes to %d bytes (%v)", tok, len(raw), err)
		}
		for i := range ones {
			if raw[i/8]&(1<<(i%8)) != 0 {
				ones[i]++
			}
		}
	}
	// Each bit is a fair coin over n draws: its share of ones is within
	// 0.5 ± 0.05, over 14 standard deviations.
	for i, k := range ones {
		if f := float64(k) / n; f < 0.45 || f > 0.55 {
			t.Errorf("bit %d is set in %.3f of the tokens", i, f)
		}
	}
}

func TestValidToken(t *testing.T) {
	good := share.NewToken()
	for _, c := range []struct {
		s  string
		ok bool
	}{
		{good, true},
		{"AAAAAAAAAAAAAAAAAAAAAA", true},
		{"_-_-_-_-_-_-_-_-_-_-_w", true},
		{"", false},
		{good[:21], false},
		{good + "A", false},
		{"AAAAAAAAAAAAAAAAAAAAAB", false}, // bits past the 128th: not canonical
		{"AAAAAAAAAAAAAAAAAAAA==", false},
		{"AAAAAAAAAAAAAAAAAAAA+/", false},
		{"AAAAAAAAAAAAAAAAAAAA.A", false},
		{"' OR 1=1 --AAAAAAAAAAA", false},
		{"AAAAAAAAAAAAAAAAAAA\x00AA", false},
		{strings.Repeat("A", 4000), false},
	} {
		if got := share.ValidToken(c.s); got != c.ok {
			t.Errorf("ValidToken(%q) = %v, want %v", c.s, got, c.ok)
		}
	}
}

// A valid token is exactly what NewToken writes for its 16 bytes.
func FuzzValidToken(f *testing.F) {
	f.Add(share.NewToken())
	f.Add("AAAAAAAAAAAAAAAAAAAAAB")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		if !share.ValidToken(s) {
			return
		}
		raw, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil || len(raw) != share.TokenBytes || base64.RawURLEncoding.EncodeToString(raw) != s {
			t.Fatalf("ValidToken accepted %q", s)
		}
	})
}

func TestCheckExpiry(t *testing.T) {
	for d, ok := range map[time.Duration]bool{0: true, time.Minute: true, time.Hour: true, share.MaxExpiry: true,
		time.Second: false, time.Minute - 1: false, share.MaxExpiry + 1: false, -time.Hour: false} {
		if got := share.CheckExpiry(d) == nil; got != ok {
			t.Errorf("CheckExpiry(%v) ok = %v, want %v", d, got, ok)
		}
	}
}

// The snapshot keeps the person's messages and the answers that ended
// with text (done or stopped); not one still streaming, failed or empty.
func TestSnapshot(t *testing.T) {
	msgs := []models.Message{
		{ID: "1", Role: models.RoleUser, Content: "Q1", Status: models.MessageDone},
		{ID: "2", Role: models.RoleAssistant, Content: "A1", Status: models.MessageDone, Model: "m1", Reason: "x"},
		{ID: "3", Role: models.RoleUser, Content: "Q2", Status: models.MessageDone},
		{ID: "4", Role: models.RoleAssistant, Content: "partial", Status: models.MessageError, Reason: `person "ann@example.com" over budget`},
		{ID: "5", Role: models.RoleUser, Content: "Q3", Status: models.MessageDone},
		{ID: "6", Role: models.RoleAssistant, Content: "A3 cut", Status: models.MessageStopped, Model: "m1"},
		{ID: "7", Role: models.RoleUser, Content: "Q4", Status: models.MessageDone},
		{ID: "8", Role: models.RoleAssistant, Content: "  ", Status: models.MessageStopped},
		{ID: "9", Role: models.RoleUser, Content: "Q5", Status: models.MessageDone},
		{ID: "10", Role: models.RoleAssistant, Content: "so far", Status: models.MessageStreaming},
	}
	var got []string
	for _, m := range share.Snapshot(msgs) {
		got = append(got, m.Role+":"+m.Content+":"+m.Status)
	}
	want := "user:Q1:done assistant:A1:done user:Q2:done user:Q3:done assistant:A3 cut:stopped user:Q4:done user:Q5:done"
	if strings.Join(got, " ") != want {
		t.Fatalf("snapshot\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
}

// clock is a movable time for expiry.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }
func newClock(t time.Time) *clock    { c := &clock{}; c.ns.Store(t.UnixNano()); return c }
func shown(db *gorm.DB) func(context.Context, uint, string) (*models.Conversation, []models.Message, error) {
	return func(ctx context.Context, userID uint, id string) (*models.Conversation, []models.Message, error) {
		c, err := models.ConversationOf(ctx, db, userID, id)
		if err != nil {
			return nil, nil, err
		}
		msgs, err := models.ConversationMessages(ctx, db, id)
		return c, msgs, err
	}
}

// conversation stores a conversation of user with one question answered.
func conversation(t *testing.T, db *gorm.DB, user uint, title string) string {
	t.Helper()
	ctx := context.Background()
	c := &models.Conversation{ID: models.NewConversationID(), UserID: user, Model: "m1", Title: title}
	if err := models.CreateConversation(ctx, db, c); err != nil {
		t.Fatal(err)
	}
	addMessages(t, db, c.ID, "What is a lighthouse?", "A tower with a light.")
	return c.ID
}

func addMessages(t *testing.T, db *gorm.DB, conv, question, answer string) {
	t.Helper()
	for _, m := range []models.Message{
		{ID: models.NewMessageID(), ConversationID: conv, Role: models.RoleUser, Content: question, Status: models.MessageDone},
		{ID: models.NewMessageID(), ConversationID: conv, Role: models.RoleAssistant, Content: answer, Status: models.MessageDone, Model: "m1"},
	} {
		if err := db.Create(&m).Error; err != nil {
			t.Fatal(err)
		}
	}
}

func person(t *testing.T, db *gorm.DB, email string) uint {
	t.Helper()
	u, err := models.EnsureUser(context.Background(), db, email)
	if err != nil {
		t.Fatal(err)
	}
	return u.ID
}

// The service on each database: a link opens a copy that later messages
// do not change; it expires by the service's clock, is revoked by its
// owner only, ends with its conversation and while its owner is disabled;
// a person keeps at most MaxPerPerson, parallel creates included.
func TestServiceOnDatabases(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { models.Close(db) })
		ctx := context.Background()
		clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
		svc := share.New(share.Options{DB: db, Shown: shown(db), Now: clk.now, MaxPerPerson: 3, Log: slog.New(slog.DiscardHandler)})
		ann, bob := person(t, db, "ann@example.com"), person(t, db, "bob@example.com")
		conv := conversation(t, db, ann, "Lighthouses")

		sh, err := svc.Create(ctx, ann, conv, share.Request{})
		if err != nil || sh.ExpiresAt != nil || !share.ValidToken(sh.Token) {
			t.Fatalf("create: %+v %v", sh, err)
		}
		addMessages(t, db, conv, "And a second question?", "A second answer.")
		if err := db.Model(&models.Conversation{}).Where("id = ?", conv).Update("title", "Renamed").Error; err != nil {
			t.Fatal(err)
		}
		got, err := svc.Open(ctx, sh.Token)
		if err != nil || got.Title != "Lighthouses" || got.Author != "" || len(got.Messages) != 2 ||
			got.Messages[0].Content != "What is a lighthouse?" || got.Messages[1].HTML != "<p>A tower with a light.</p>" {
			t.Fatalf("open: %+v %v", got, err)
		}

		// Expiry, by the service's clock.
		clk.add(time.Minute)
		later, err := svc.Create(ctx, ann, conv, share.Request{ExpiresIn: time.Hour, ShowAuthor: true})
		if err != nil || later.ExpiresAt == nil || !later.ExpiresAt.Equal(clk.now().Add(time.Hour)) {
			t.Fatalf("create expiring: %+v %v", later, err)
		}
		clk.add(59 * time.Minute)
		if got, err := svc.Open(ctx, later.Token); err != nil || got.Author != "ann@example.com" || len(got.Messages) != 4 {
			t.Fatalf("before expiry: %+v %v", got, err)
		}
		clk.add(time.Minute)
		if _, err := svc.Open(ctx, later.Token); !errors.Is(err, share.ErrNotFound) {
			t.Fatalf("at expiry: %v", err)
		}
		links, err := svc.List(ctx, ann)
		if err != nil || len(links) != 2 || links[0].Token != later.Token || !links[0].Expired || links[1].Expired {
			t.Fatalf("list: %+v %v", links, err)
		}

		// The bound, and someone else's.
		if _, err := svc.Create(ctx, ann, conv, share.Request{}); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Create(ctx, ann, conv, share.Request{}); !errors.Is(err, share.ErrTooMany) {
			t.Fatalf("a fourth link: %v", err)
		}
		if _, err := svc.Create(ctx, bob, conv, share.Request{}); !errors.Is(err, share.ErrNotFound) {
			t.Fatalf("someone else's conversation: %v", err)
		}
		if err := svc.Revoke(ctx, bob, sh.Token); !errors.Is(err, share.ErrNotFound) {
			t.Fatalf("someone else's revoke: %v", err)
		}
		if err := svc.Revoke(ctx, ann, later.Token); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Create(ctx, ann, conv, share.Request{}); err != nil {
			t.Fatalf("after a revoke: %v", err)
		}
		if _, err := svc.Create(ctx, ann, conv, share.Request{ExpiresIn: time.Second}); !errors.Is(err, share.ErrBadExpiry) {
			t.Fatalf("a second's expiry: %v", err)
		}
		empty := &models.Conversation{ID: models.NewConversationID(), UserID: bob, Model: "m1"}
		if err := models.CreateConversation(ctx, db, empty); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Create(ctx, bob, empty.ID, share.Request{}); !errors.Is(err, share.ErrEmpty) {
			t.Fatalf("an empty conversation: %v", err)
		}

		// A disabled owner's links do not open; enabled again, they do.
		at := time.Now()
		db.Model(&models.User{}).Where("id = ?", ann).Update("disabled_at", &at)
		if _, err := svc.Open(ctx, sh.Token); !errors.Is(err, share.ErrNotFound) {
			t.Fatalf("a disabled owner's link: %v", err)
		}
		db.Model(&models.User{}).Where("id = ?", ann).Update("disabled_at", nil)
		if _, err := svc.Open(ctx, sh.Token); err != nil {
			t.Fatalf("enabled again: %v", err)
		}

		// Deleting the conversation deletes its links.
		if err := models.DeleteConversation(ctx, db, ann, conv); err != nil {
			t.Fatal(err)
		}
		var left int64
		db.Model(&models.Share{}).Where("conversation_id = ?", conv).Count(&left)
		if _, err := svc.Open(ctx, sh.Token); !errors.Is(err, share.ErrNotFound) || left != 0 {
			t.Fatalf("after the conversation's delete: %v, %d rows left", err, left)
		}

		// Parallel creates by one person keep to the bound, from different
		// conversations too (each create locks its conversation's row, but
		// only the person's lock makes those take turns).
		var convs []string
		for range 10 {
			convs = append(convs, conversation(t, db, bob, "Bob's"))
		}
		var wg sync.WaitGroup
		var made, refused atomic.Int32
		for _, c := range convs {
			wg.Go(func() {
				_, err := svc.Create(ctx, bob, c, share.Request{})
				switch {
				case err == nil:
					made.Add(1)
				case errors.Is(err, share.ErrTooMany):
					refused.Add(1)
				default:
					t.Errorf("parallel create: %v", err)
				}
			})
		}
		wg.Wait()
		if made.Load() != 3 || refused.Load() != 7 {
			t.Fatalf("parallel creates: %d made, %d refused; want 3 and 7", made.Load(), refused.Load())
		}
	})
}
