package models

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
)

// Regenerating from several places at once (two tabs, two replicas)
// replaces the last reply once; the others are told the conversation is
// busy. A conversation without a finished reply has nothing to replace.
func TestReplaceLastReply(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		conv := seedConversation(t, db, 1, "again", time.Now(), "question", "answer")
		before, _ := ConversationMessages(ctx, db, conv.ID)
		const n = 6
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				inf := "inf_" + NewMessageID()
				reply := &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant, Status: MessageStreaming, InferenceID: &inf}
				<-start
				errs[i] = ReplaceLastReply(ctx, db, conv, reply, ReplyCap{})
			}()
		}
		close(start)
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, ErrBusy):
				t.Fatalf("replace: %v", err)
			}
		}
		after, _ := ConversationMessages(ctx, db, conv.ID)
		if ok != 1 || len(after) != 2 || after[0].ID != before[0].ID || after[1].ID == before[1].ID || after[1].Status != MessageStreaming {
			t.Fatalf("%d replaced; messages %+v", ok, after)
		}
		// While it streams: busy.
		inf := "inf_x"
		if err := ReplaceLastReply(ctx, db, conv, &Message{ID: NewMessageID(), ConversationID: conv.ID, Role: RoleAssistant,
			Status: MessageStreaming, InferenceID: &inf}, ReplyCap{}); !errors.Is(err, ErrBusy) {
			t.Errorf("while streaming: %v", err)
		}
		// Only a person's message last, or nothing: no reply to replace.
		lone := seedConversation(t, db, 1, "lone", time.Now(), "just a question")
		if err := ReplaceLastReply(ctx, db, lone, &Message{ID: NewMessageID(), ConversationID: lone.ID, Role: RoleAssistant,
			Status: MessageStreaming}, ReplyCap{}); !errors.Is(err, ErrNoReply) {
			t.Errorf("no reply: %v", err)
		}
	})
}
