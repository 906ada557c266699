package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"moonji/internal/metrics"
	"moonji/internal/stop"
	"moonji/models"
)

// Stopper answers stop requests: it checks that the inference exists and
// belongs to the caller, then has the replica that owns it end the stream.
type Stopper struct {
	DB      *gorm.DB
	Stops   *stop.Service
	Metrics *metrics.Metrics
	// Running, when set, returns the row of a request this replica began
	// whose pending row is not yet in the database (ledger.Ledger.Running).
	Running func(id string) (models.Usage, bool)
	// RowWait is how long a stop waits for the row of a request another
	// replica began: it writes the pending row that long after the start
	// (plus a commit). Zero: no wait.
	RowWait time.Duration

	waiting atomic.Int64 // stops waiting for a row now
}

// maxRowWaits bounds the stops that wait for a row at once: a stop for an id
// nobody began waits RowWait and queries the database every rowPoll, so a
// flood of made-up ids must not tie up goroutines and the database. Past it,
// a stop is answered from what the database has now.
const maxRowWaits = 64

// StopResult is the answer to a stop request.
type StopResult struct {
	InferenceID string `json:"inference_id"`
	// State is the inference's outcome as far as known: "stopped", or the
	// outcome it had already finished with ("success", "error", …).
	State string `json:"state"`
	// Acknowledged is true when the owner confirmed that no further content
	// reaches the client (or the inference had already ended).
	Acknowledged bool `json:"acknowledged"`
	// Message explains an unacknowledged stop.
	Message string `json:"message,omitempty"`
}

// ErrNotFound is returned for an unknown inference and for someone else's:
// the two must look the same, or ids could be probed.
var ErrNotFound = errors.New("no such inference")

// ErrStopUnavailable wraps failures to reach other replicas (Redis down).
var ErrStopUnavailable = errors.New("stop unavailable")

// Stop stops inference id on behalf of p. seen (-1: unknown) is how many
// content chunks p had seen; the owner persists exactly those.
func (s *Stopper) Stop(ctx context.Context, p Principal, id string, seen int) (StopResult, error) {
	res := StopResult{InferenceID: id}
	row, err := s.find(ctx, id)
	if errors.Is(err, models.ErrNotFound) {
		s.Metrics.Stops.WithLabelValues("not_found").Inc()
		return res, ErrNotFound
	}
	if err != nil {
		return res, err
	}
	if !p.Admin && (row.UserID == nil || *row.UserID != p.UserID) {
		s.Metrics.Stops.WithLabelValues("not_found").Inc()
		return res, ErrNotFound
	}
	if row.Outcome != models.OutcomePending {
		s.Metrics.Stops.WithLabelValues("finished").Inc()
		res.State, res.Acknowledged = row.Outcome, true
		return res, nil
	}
	r, err := s.Stops.RequestSeen(ctx, id, seen)
	s.Metrics.StopLatency.Observe(r.Latency.Seconds())
	switch {
	case errors.Is(err, stop.ErrUnavailable):
		s.Metrics.Stops.WithLabelValues("unavailable").Inc()
		return res, fmt.Errorf("%w: %w", ErrStopUnavailable, err)
	case err != nil:
		return res, err
	case r.Finished:
		s.Metrics.Stops.WithLabelValues("finished").Inc()
		res.State, res.Acknowledged = "finished", true
	case r.Acked:
		result := "acked"
		if r.Local {
			result = "local"
		}
		s.Metrics.Stops.WithLabelValues(result).Inc()
		res.State, res.Acknowledged = models.OutcomeStopped, true
	default:
		s.Metrics.Stops.WithLabelValues("timeout").Inc()
		res.State = "stopping"
		res.Message = "The replica running this inference did not acknowledge the stop in time; it will stop when the signal reaches it."
	}
	return res, nil
}

// find returns the row of inference id: from this replica's memory while its
// pending row is deferred, else from the database, where a request another
// replica began appears within RowWait.
func (s *Stopper) find(ctx context.Context, id string) (*models.Usage, error) {
	deadline := time.Now().Add(s.RowWait)
	waiting := false
	defer func() {
		if waiting {
			s.waiting.Add(-1)
		}
	}()
	for {
		if s.Running != nil {
			if u, ok := s.Running(id); ok {
				return &u, nil
			}
		}
		row, err := models.UsageByID(ctx, s.DB, id)
		if !errors.Is(err, models.ErrNotFound) || !time.Now().Before(deadline) {
			return row, err
		}
		if !waiting {
			if !s.startWaiting() {
				return row, err
			}
			waiting = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(rowPoll):
		}
	}
}

// startWaiting takes one of the maxRowWaits places, if one is free. The
// count never goes past the bound, not even for a moment (an Add then a
// step back would show 65 to whoever reads it meanwhile).
func (s *Stopper) startWaiting() bool {
	for {
		n := s.waiting.Load()
		if n >= maxRowWaits {
			return false
		}
		if s.waiting.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// rowPoll is how often a stop looks again for a row not yet written.
const rowPoll = 100 * time.Millisecond
