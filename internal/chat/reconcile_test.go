package chat

import (
	"context"
	"testing"

	"moonji/models"
)

// A reply left streaming in the database by a failed final save is
// finished by Reconcile: with the log's final state while the log is kept,
// as interrupted after; one still being written is left alone.
func TestReconcile(t *testing.T) {
	db, err := models.Open("sqlite://" + t.TempDir() + "/chat.db")
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	ctx := context.Background()
	s := New(Options{DB: db, Replica: "me"})
	add := func(inf, replica string) string {
		c := &models.Conversation{ID: models.NewConversationID(), UserID: 1, Model: "m"}
		if err := models.CreateConversation(ctx, db, c); err != nil {
			t.Fatal(err)
		}
		m := &models.Message{ID: models.NewMessageID(), ConversationID: c.ID, Role: models.RoleAssistant,
			Status: models.MessageStreaming, InferenceID: &inf, Replica: replica, Content: "partial"}
		if err := db.Create(m).Error; err != nil {
			t.Fatal(err)
		}
		return m.ID
	}
	ended, running, lost, other := add("inf_ended", "me"), add("inf_running", "me"), add("inf_lost", "me"), add("inf_other", "sibling")
	for id, done := range map[string]bool{"inf_ended": true, "inf_running": false} {
		g := &generation{s: s, id: id, log: NewLog()}
		g.log.Append("the whole ")
		g.log.Append("answer")
		if done {
			g.log.Finish(Final{Status: models.MessageDone, Content: "the whole answer"})
		}
		s.live[id] = g
	}
	n, err := s.Reconcile(ctx)
	if err != nil || n != 2 {
		t.Fatalf("reconciled %d, %v; want 2", n, err)
	}
	for id, want := range map[string]models.Message{
		ended:   {Status: models.MessageDone, Content: "the whole answer"},
		running: {Status: models.MessageStreaming, Content: "partial"},
		lost:    {Status: models.MessageError, Content: "partial", Reason: "The answer was interrupted."},
		other:   {Status: models.MessageStreaming, Content: "partial"},
	} {
		var m models.Message
		db.Where("id = ?", id).Take(&m)
		if m.Status != want.Status || m.Content != want.Content || m.Reason != want.Reason {
			t.Errorf("%s: %s %q %q, want %s %q %q", id, m.Status, m.Content, m.Reason, want.Status, want.Content, want.Reason)
		}
	}
}
