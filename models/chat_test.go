package models

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

func TestStorableText(t *testing.T) {
	for in, want := range map[string]string{
		"plain\nlines\tand tabs": "plain\nlines\tand tabs",
		"a\x00b":                 "ab",
		"bad \xff byte":          "bad \uFFFD byte",
		"é😀":                     "é😀",
	} {
		if got := StorableText(in); got != want {
			t.Errorf("StorableText(%q) = %q, want %q", in, got, want)
		}
	}
}

// Message ids sort in creation order, however fast they are made.
func TestMessageIDsSort(t *testing.T) {
	var ids []string
	for range 1000 {
		ids = append(ids, NewMessageID())
	}
	if !slices.IsSorted(ids) {
		t.Fatal("message ids are not in creation order")
	}
	if len(ids[0]) > 40 || !strings.HasPrefix(ids[0], "m_") {
		t.Fatalf("id %q", ids[0])
	}
}

// Streaming messages of this replica's previous life and of silent
// replicas are closed; a live sibling's and finished ones are not.
func TestCloseUnfinishedMessages(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		now := time.Now().UTC()
		if err := Heartbeat(ctx, db, "sibling", now); err != nil {
			t.Fatal(err)
		}
		db.Create(&Replica{ID: "gone", StartedAt: now.Add(-time.Hour), SeenAt: now.Add(-10 * time.Minute)})
		add := func(inf, replica, status string) {
			// One conversation each: a conversation has one streaming message at most.
			conv := &Conversation{ID: NewConversationID(), UserID: 7, Model: "m1"}
			if err := CreateConversation(ctx, db, conv); err != nil {
				t.Fatal(err)
			}
			id := inf
			if err := db.Create(&Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: status,
				InferenceID: &id, Replica: replica, Content: "so far"}).Error; err != nil {
				t.Fatal(err)
			}
		}
		add("inf_me", "me", MessageStreaming)
		add("inf_gone", "gone", MessageStreaming)
		add("inf_sibling", "sibling", MessageStreaming)
		add("inf_done", "me", MessageDone)
		n, err := CloseUnfinishedMessages(ctx, db, "me", now.Add(-time.Minute))
		if err != nil || n != 2 {
			t.Fatalf("closed %d, %v; want 2", n, err)
		}
		for inf, want := range map[string]string{"inf_me": MessageError, "inf_gone": MessageError, "inf_sibling": MessageStreaming, "inf_done": MessageDone} {
			m, owner, err := MessageByInference(ctx, db, inf)
			if err != nil || owner != 7 {
				t.Fatalf("%s: owner %d, %v", inf, owner, err)
			}
			if m.Status != want || m.Content != "so far" || (want == MessageError && m.Reason != "gateway_restart") {
				t.Errorf("%s: %+v", inf, m)
			}
		}
		// A replica alive now leaves its own running messages alone.
		if n, _ := CloseUnfinishedMessages(ctx, db, "", now.Add(-time.Minute)); n != 0 {
			t.Errorf("closed %d of live replicas", n)
		}
	})
}

// What a person sends is stored whatever its bytes; a second reply cannot
// start while one streams.
func TestStartExchange(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		conv := &Conversation{ID: NewConversationID(), UserID: 1, Model: "m1\x00"}
		if err := CreateConversation(ctx, db, conv); err != nil {
			t.Fatal(err)
		}
		inf := "inf_1"
		user := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleUser, Content: "hi\x00 \xff", Status: MessageDone}
		reply := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: MessageStreaming, InferenceID: &inf}
		if err := StartExchange(ctx, db, conv, user, reply, "a title\x1b"); err != nil {
			t.Fatal(err)
		}
		inf2 := "inf_2"
		again := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleUser, Content: "x", Status: MessageDone}
		reply2 := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: MessageStreaming, InferenceID: &inf2}
		if err := StartExchange(ctx, db, conv, again, reply2, ""); err != ErrBusy {
			t.Fatalf("second exchange while streaming: %v", err)
		}
		msgs, err := ConversationMessages(ctx, db, conv.ID)
		if err != nil || len(msgs) != 2 || msgs[0].Content != "hi \uFFFD" || msgs[1].InferenceID == nil {
			t.Fatalf("messages %+v, %v", msgs, err)
		}
		got, err := ConversationOf(ctx, db, 1, conv.ID)
		if err != nil || got.Title != "a title" || got.Model != "m1" {
			t.Fatalf("conversation %+v, %v", got, err)
		}
		if _, err := ConversationOf(ctx, db, 2, conv.ID); err != ErrNotFound {
			t.Errorf("someone else's conversation: %v", err)
		}
	})
}
