package models

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
)

// pathShown returns the ids of conversation id's path shown, read back.
func pathShown(t *testing.T, db *gorm.DB, id string) []string {
	t.Helper()
	msgs, err := ConversationMessages(context.Background(), db, id)
	if err != nil {
		t.Fatal(err)
	}
	var conv Conversation
	if err := db.Take(&conv, "id = ?", id).Error; err != nil {
		t.Fatal(err)
	}
	tree := TreeOf(msgs)
	return tree.Path(tree.Leaf(conv.CurrentLeaf))
}

func streamingReply(conv *Conversation, parent string) *Message {
	inf := "inf_" + NewMessageID()
	return &Message{ID: NewMessageID(), ConversationID: conv.ID, ParentID: &parent, Role: RoleAssistant,
		Status: MessageStreaming, InferenceID: &inf}
}

// Regenerating from several places at once (two tabs, two replicas) adds
// one version; the others are told the conversation is busy. The earlier
// answer stays, as the first version, and the new one is shown.
func TestAddReplyVersion(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		conv := seedConversation(t, db, 1, "again", time.Now(), "question", "answer")
		before, _ := ConversationMessages(ctx, db, conv.ID)
		question, answer := before[0].ID, before[1].ID
		const n = 6
		errs := make([]error, n)
		replies := make([]*Message, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			replies[i] = streamingReply(conv, question)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = AddReplyVersion(ctx, db, conv, replies[i], ReplyCap{})
			}()
		}
		close(start)
		wg.Wait()
		var added *Message
		for i, err := range errs {
			switch {
			case err == nil && added == nil:
				added = replies[i]
			case err == nil:
				t.Fatal("two versions added at once")
			case !errors.Is(err, ErrBusy):
				t.Fatalf("regenerate: %v", err)
			}
		}
		after, _ := ConversationMessages(ctx, db, conv.ID)
		if added == nil || len(after) != 3 || after[1].ID != answer || after[1].Content != "answer" {
			t.Fatalf("messages after regenerating: %+v", after)
		}
		if got := pathShown(t, db, conv.ID); !slices.Equal(got, []string{question, added.ID}) {
			t.Fatalf("path shown %v, want the question and the new version", got)
		}
		if v := TreeOf(after).VersionOf(added.ID); v.Index != 2 || v.Count != 2 || v.Prev != answer {
			t.Fatalf("new answer's version %+v", v)
		}
		// While it streams: busy.
		if err := AddReplyVersion(ctx, db, conv, streamingReply(conv, question), ReplyCap{}); !errors.Is(err, ErrBusy) {
			t.Errorf("while streaming: %v", err)
		}
	})
}

// A send follows the path shown; an edit forks beside the message edited;
// showing a version shows the conversation that followed it; deleting a
// branch takes what follows it and shows the newest version left.
func TestConversationTree(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		conv := seedConversation(t, db, 7, "tree", time.Now())
		send := func(text string) (user, reply *Message) {
			t.Helper()
			user = &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleUser, Content: text, Status: MessageDone}
			reply = streamingReply(conv, "")
			if err := StartExchange(ctx, db, conv, user, reply, ""); err != nil {
				t.Fatalf("send %q: %v", text, err)
			}
			if err := FinishMessage(ctx, db, reply.ID, MessageEnd{Status: MessageDone, Content: "re: " + text}); err != nil {
				t.Fatal(err)
			}
			return user, reply
		}
		u1, a1 := send("one")
		u2, a2 := send("two")
		if u1.ParentID != nil || *a1.ParentID != u1.ID || *u2.ParentID != a1.ID || *a2.ParentID != u2.ID {
			t.Fatalf("parents: u1 %v a1 %v u2 %v a2 %v", u1.ParentID, *a1.ParentID, *u2.ParentID, *a2.ParentID)
		}
		// Edit the first message: a sibling of u1, answered, shown alone.
		e1 := &Message{ID: NewMessageID(), ConversationID: conv.ID, ParentID: u1.ParentID, Role: RoleUser, Content: "one, better", Status: MessageDone}
		ea := streamingReply(conv, "")
		if err := StartEdit(ctx, db, conv, e1, ea, ReplyCap{}, u1.ID); err != nil {
			t.Fatal(err)
		}
		if got := pathShown(t, db, conv.ID); !slices.Equal(got, []string{e1.ID, ea.ID}) {
			t.Fatalf("after the edit the path is %v", got)
		}
		if err := FinishMessage(ctx, db, ea.ID, MessageEnd{Status: MessageDone, Content: "better"}); err != nil {
			t.Fatal(err)
		}
		// A send now follows the edited branch.
		u3, a3 := send("three")
		if *u3.ParentID != ea.ID {
			t.Fatalf("send after an edit follows %s, want %s", *u3.ParentID, ea.ID)
		}
		// Show the first version again: the conversation that followed it.
		msgs, _ := ConversationMessages(ctx, db, conv.ID)
		if err := ShowMessage(ctx, db, 7, conv.ID, TreeOf(msgs).Newest(u1.ID)); err != nil {
			t.Fatal(err)
		}
		if got := pathShown(t, db, conv.ID); !slices.Equal(got, []string{u1.ID, a1.ID, u2.ID, a2.ID}) {
			t.Fatalf("first version's path %v", got)
		}
		// Someone else's conversation, or a message of another: not found.
		if err := ShowMessage(ctx, db, 8, conv.ID, a1.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("someone else shows a version: %v", err)
		}
		other := seedConversation(t, db, 7, "other", time.Now(), "x")
		if err := ShowMessage(ctx, db, 7, other.ID, a1.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("a message of another conversation shown: %v", err)
		}
		if _, err := DeleteBranch(ctx, db, 8, conv.ID, u1.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("someone else deletes a branch: %v", err)
		}
		// Delete the shown branch: its four messages go, the edited
		// version (and what followed it) is shown.
		leaf, err := DeleteBranch(ctx, db, 7, conv.ID, u1.ID)
		if err != nil {
			t.Fatal(err)
		}
		if leaf != a3.ID {
			t.Fatalf("leaf after deleting the shown branch %s, want %s", leaf, a3.ID)
		}
		left, _ := ConversationMessages(ctx, db, conv.ID)
		if len(left) != 4 {
			t.Fatalf("%d messages left, want 4", len(left))
		}
		if got := pathShown(t, db, conv.ID); !slices.Equal(got, []string{e1.ID, ea.ID, u3.ID, a3.ID}) {
			t.Fatalf("path after deleting a branch %v", got)
		}
		// A branch with a reply streaming in it stays.
		u4 := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleUser, Content: "four", Status: MessageDone}
		if err := StartExchange(ctx, db, conv, u4, streamingReply(conv, ""), ""); err != nil {
			t.Fatal(err)
		}
		if _, err := DeleteBranch(ctx, db, 7, conv.ID, u3.ID); !errors.Is(err, ErrBusy) {
			t.Errorf("deleting a branch that streams: %v", err)
		}
	})
}

// Conversations stored before messages had parents get them once, in
// order, when the column is added.
func TestMessageParentsBackfilled(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		conv := seedConversation(t, db, 3, "old", time.Now(), "a", "b", "c")
		two := seedConversation(t, db, 3, "old2", time.Now(), "x", "y")
		if err := db.Exec("ALTER TABLE messages DROP COLUMN parent_id").Error; err != nil {
			t.Fatal(err)
		}
		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		for _, c := range []*Conversation{conv, two} {
			msgs, _ := ConversationMessages(context.Background(), db, c.ID)
			for i, m := range msgs {
				want := ""
				if i > 0 {
					want = msgs[i-1].ID
				}
				got := ""
				if m.ParentID != nil {
					got = *m.ParentID
				}
				if got != want {
					t.Fatalf("message %d of %s has parent %q, want %q", i, c.Title, got, want)
				}
			}
		}
	})
}
