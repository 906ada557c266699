package chat

import (
	"context"
	"errors"
	"time"

	"moonji/models"
)

// Event is one thing a viewer of a generation is told: a chunk of text
// (Seq 1, 2, …), or, last, Done with the final message as HTML.
type Event struct {
	Seq  int
	Text string
	Done bool
	HTML string
}

// maxBatch bounds the chunks one Next returns.
const maxBatch = 256

// pollEvery is how often a viewer of a generation running on another
// replica looks at its message in the database.
const pollEvery = time.Second

// Follower reads one generation for one viewer.
type Follower struct {
	s     *Service
	id    string
	gen   *generation // nil: not live on this replica
	final *Final      // set once known for a generation followed through the database
}

// Follow lets the person userID read generation inferenceID: live from
// this replica's log, or, when it runs elsewhere or has finished, from its
// message in the database. Someone else's generation is ErrNotFound.
func (s *Service) Follow(ctx context.Context, userID uint, inferenceID string) (*Follower, error) {
	s.mu.Lock()
	g := s.live[inferenceID]
	s.mu.Unlock()
	if g != nil {
		if g.userID != userID {
			return nil, ErrNotFound
		}
		return &Follower{s: s, id: inferenceID, gen: g}, nil
	}
	m, owner, err := models.MessageByInference(ctx, s.o.DB, inferenceID)
	if err != nil {
		return nil, err
	}
	if owner != userID {
		return nil, ErrNotFound
	}
	f := &Follower{s: s, id: inferenceID}
	f.note(m)
	return f, nil
}

func (f *Follower) note(m *models.Message) {
	if m.Status != models.MessageStreaming {
		f.final = &Final{Status: m.Status, Content: m.Content, Reason: m.Reason,
			PromptTokens: m.PromptTokens, CompletionTokens: m.CompletionTokens, Cost: m.Cost}
	}
}

// ErrFollowEnded means the viewer should stop: the service is closing.
var ErrFollowEnded = errors.New("follow ended")

// Next returns the events after seq from. It waits until there is at
// least one, or wait has passed (then none: time for a heartbeat), or ctx
// is done. The last event of a generation is its Done event.
func (f *Follower) Next(ctx context.Context, from int, wait time.Duration) ([]Event, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	if f.gen != nil {
		for {
			chunks, done, final, changed := f.gen.log.Since(from, maxBatch)
			if len(chunks) > 0 || done {
				evs := make([]Event, 0, len(chunks)+1)
				for i, c := range chunks {
					evs = append(evs, Event{Seq: from + i + 1, Text: c})
				}
				if done && len(chunks) < maxBatch {
					evs = append(evs, Event{Seq: from + len(chunks), Done: true, HTML: f.s.RenderFinal(final)})
				}
				return evs, nil
			}
			select {
			case <-changed:
			case <-timer.C:
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-f.s.quit:
				return nil, ErrFollowEnded
			}
		}
	}
	// Not live here: the generation ran or runs on another replica (or
	// finished and its log was dropped). Its text arrives with its end.
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for f.final == nil {
		select {
		case <-tick.C:
		case <-timer.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-f.s.quit:
			return nil, ErrFollowEnded
		}
		m, _, err := models.MessageByInference(ctx, f.s.o.DB, f.id)
		if err != nil {
			return nil, err // deleted meanwhile, or the database failed
		}
		f.note(m)
	}
	return []Event{{Seq: max(from, 0), Done: true, HTML: f.s.RenderFinal(*f.final)}}, nil
}
