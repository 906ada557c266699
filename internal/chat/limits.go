package chat

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"moonji/internal/gateway"
	"moonji/internal/proxy"
	"moonji/internal/ratelimit"
	"moonji/models"
)

// Limits bound what one person may hold of the chat, so that nobody fills
// the queues or the database for everyone else (0: no bound).
type Limits struct {
	// GenerationsPerPerson bounds a person's replies being written or
	// waiting for a slot at once, on every replica together.
	GenerationsPerPerson int
	// ConversationsPerMinute and ConversationsPerPerson bound how fast a
	// person creates conversations and how many they keep.
	ConversationsPerMinute int
	ConversationsPerPerson int
	// SearchesPerMinute bounds a person's history searches.
	SearchesPerMinute int
}

// Codes of the limits' refusals, as the API's error code.
const (
	CodeTooManyGenerations   = "too_many_generations"
	CodeTooManyConversations = "too_many_conversations"
	CodeTooManySearches      = "too_many_searches"
)

// LimitError is a request refused for one of the person's limits: 429
// with Code and Retry-After.
type LimitError struct {
	Code       string
	Message    string
	RetryAfter time.Duration
}

func (e *LimitError) Error() string { return e.Message }

// RetryAfterSeconds is the Retry-After header's value: whole seconds, at
// least one.
func (e *LimitError) RetryAfterSeconds() int {
	return max(1, int((e.RetryAfter+time.Second-1)/time.Second))
}

// AsLimit returns err's LimitError, if it is one.
func AsLimit(err error) (*LimitError, bool) {
	var le *LimitError
	ok := errors.As(err, &le)
	return le, ok
}

// generationRetry is the Retry-After of a reply refused for the person's
// running ones: nobody knows when one ends; a few seconds is a fair guess
// for a short answer, and a client that retries too soon is refused again
// without taking anything.
const generationRetry = 5 * time.Second

// generationRefusal words the refusal of a reply past the person's limit.
func (s *Service) generationRefusal() string {
	return fmt.Sprintf("You have %d answers being written at once, the most allowed: wait for one to end (or stop one), then retry.",
		s.o.Limits.GenerationsPerPerson)
}

// replyCap is the bound of the person's streaming replies.
func (s *Service) replyCap(p Person) models.ReplyCap {
	return models.ReplyCap{Person: p.UserID, Max: s.o.Limits.GenerationsPerPerson, Refusal: s.generationRefusal()}
}

// refuseGeneration answers reply g refused for the person's limit: its
// usage row says rejected (too_many_generations), as for any request
// refused before it reached an engine, and the gateway ends its
// registration for Stop.
func (s *Service) refuseGeneration(p Person, g *generation, model string) error {
	le := &LimitError{Code: CodeTooManyGenerations, Message: s.generationRefusal(), RetryAfter: generationRetry}
	hdr := http.Header{}
	hdr.Set("Retry-After", strconv.Itoa(le.RetryAfterSeconds()))
	s.o.Gateway.Reject(gateway.Call{ID: g.id, Start: time.Now(), Principal: p.principal(), API: proxy.APIChat, Stop: g.stopRun},
		model, http.StatusTooManyRequests, CodeTooManyGenerations, le.Message, "requests", CodeTooManyGenerations, hdr)
	return le
}

// allow counts one event of what against the person's per-minute limit
// (shared through Redis when the limiter has it).
func (s *Service) allow(ctx context.Context, p Person, what string, perMinute int, code, message string) error {
	if perMinute <= 0 || s.o.Limiter == nil {
		return nil
	}
	d, err := s.o.Limiter.AllowRequest(ctx, "chat:"+what+":user:"+strconv.FormatUint(uint64(p.UserID), 10),
		ratelimit.Limit{RequestsPerMinute: perMinute})
	if err != nil {
		return fmt.Errorf("count %s of person %d: %w", what, p.UserID, err)
	}
	if !d.Allowed {
		return &LimitError{Code: code, Message: message, RetryAfter: d.RetryAfter}
	}
	return nil
}
