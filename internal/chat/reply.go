package chat

import (
	"context"
	"errors"
	"slices"

	"moonji/internal/gateway"
	"moonji/models"
)

// SetModel switches the model that writes the next replies of the person's
// conversation id.
func (s *Service) SetModel(ctx context.Context, userID uint, id, model string) error {
	if !slices.Contains(s.o.Gateway.Models(), model) {
		return ErrUnknownModel
	}
	return models.SetConversationModel(ctx, s.o.DB, userID, id, model)
}

// Models are the models a conversation may use, in configuration order.
func (s *Service) Models() []string { return s.o.Gateway.Models() }

// start creates the reply's message with store (which stores it, and the
// person's message for a Send, in one transaction) and starts its
// generation.
func (s *Service) start(ctx context.Context, p Person, conv *models.Conversation, store func(reply *models.Message) error) (Sent, error) {
	g := &generation{s: s, id: gateway.NewInferenceID(), convID: conv.ID, userID: p.UserID,
		log: NewLog(), ended: make(chan struct{})}
	// One reply at a time per conversation: this map on this replica, the
	// database's transaction (and unique index) across replicas.
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return Sent{}, ErrClosed
	case s.running[conv.ID] != nil:
		s.mu.Unlock()
		return Sent{}, ErrBusy
	}
	s.running[conv.ID] = g
	s.live[g.id] = g
	extra := s.extra
	s.mu.Unlock()

	// Registered for Stop before the id leaves here (in the reply's row,
	// then the answer to the send): a stop sent as soon as the page has
	// the id finds this replica running the reply, however far the
	// gateway has got with it. The gateway takes the registration over
	// with the call; until then it is this function's to end.
	g.stopRun = s.o.Gateway.BeginStop(g.id, p.principal())
	inf := g.id
	reply := &models.Message{ID: models.NewMessageID(), ConversationID: conv.ID, Role: models.RoleAssistant,
		Status: models.MessageStreaming, Model: conv.Model, InferenceID: &inf, Replica: s.o.Replica}
	g.msgID = reply.ID
	if err := store(reply); err != nil {
		s.mu.Lock()
		delete(s.running, conv.ID)
		delete(s.live, g.id)
		s.mu.Unlock()
		if errors.Is(err, models.ErrTooManyReplies) {
			// Refused before it took a slot or a queue place. A send's
			// messages are stored, the reply as this error.
			sent := Sent{InferenceID: g.id}
			if reply.Status == models.MessageError {
				sent.MessageID = reply.ID
			}
			return sent, s.refuseGeneration(p, g, conv.Model)
		}
		g.endStop(models.OutcomeError)
		return Sent{}, err
	}
	body, err := s.requestBody(ctx, conv, reply.ID, extra)
	if err != nil {
		// The reply exists: it must not stay streaming.
		g.finish(models.MessageEnd{Status: models.MessageError, Reason: "The conversation could not be read."})
		g.endStop(models.OutcomeError)
		s.release(g)
		return Sent{}, err
	}
	s.wg.Add(1)
	go g.run(p.principal(), body)
	return Sent{MessageID: reply.ID, InferenceID: g.id}, nil
}

// Progress is what a page shows of generation inferenceID when it is
// drawn: the text of its chunks so far and how many there are, to follow
// over events from there. live is false when the generation is not running
// on this replica (finished, or running on another): the page then shows
// the saved message.
func (s *Service) Progress(userID uint, inferenceID string) (text string, seq int, live bool) {
	s.mu.Lock()
	g := s.live[inferenceID]
	s.mu.Unlock()
	if g == nil || g.userID != userID {
		return "", 0, false
	}
	text, seq, done := g.log.Snapshot()
	if done {
		return "", 0, false
	}
	return text, seq, true
}

// Reconcile finishes this replica's streaming messages that no running
// generation writes: a final save that failed every try (the database was
// down), so that the reply does not stay streaming — and its conversation
// refuse new messages — until a restart. It returns how many it finished.
func (s *Service) Reconcile(ctx context.Context) (int, error) {
	msgs, err := models.StreamingMessagesOf(ctx, s.o.DB, s.o.Replica)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range msgs {
		end := models.MessageEnd{Status: models.MessageError, Content: m.Content, Reason: "The answer was interrupted."}
		if m.InferenceID != nil {
			s.mu.Lock()
			g := s.live[*m.InferenceID]
			s.mu.Unlock()
			if g != nil {
				_, done, final, _ := g.log.Since(g.log.Len(), 0)
				if !done {
					continue // still being written
				}
				end = models.MessageEnd{Status: final.Status, Content: final.Content, Reason: final.Reason}
			}
		}
		if err := models.FinishMessage(ctx, s.o.DB, m.ID, end); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// Last returns the person's conversation id with its last n messages: what
// a page needs after a send, without reading a long conversation whole.
func (s *Service) Last(ctx context.Context, userID uint, id string, n int) (*models.Conversation, []models.Message, error) {
	c, err := models.ConversationOf(ctx, s.o.DB, userID, id)
	if err != nil {
		return nil, nil, err
	}
	msgs, err := models.LastMessages(ctx, s.o.DB, id, n)
	if err != nil {
		return nil, nil, err
	}
	return c, msgs, nil
}

// Message returns message msgID of the person's conversation id (a page
// polling a reply that runs on another replica asks every second).
func (s *Service) Message(ctx context.Context, userID uint, id, msgID string) (*models.Message, error) {
	if _, err := models.ConversationOf(ctx, s.o.DB, userID, id); err != nil {
		return nil, err
	}
	return models.MessageIn(ctx, s.o.DB, id, msgID)
}
