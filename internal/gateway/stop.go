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

// Stopper answers stop requests. The replica that runs the inference knows
// whom it runs for, so the stop goes there first, with the caller: it ends
// the stream if the caller may, and otherwise answers like every replica
// that does not run it. Only an inference that no replica takes — finished
// a while ago, never begun, someone else's, or run by a replica the bus
// cannot reach — is looked up in storage, and only that waits for a row.
type Stopper struct {
	DB      *gorm.DB
	Stops   *stop.Service
	Metrics *metrics.Metrics
	// Running, when set, returns the row of a request this replica began
	// whose pending row is not yet in the database (ledger.Ledger.Running).
	Running func(id string) (models.Usage, bool)
	// RowWait bounds a stop that no replica took: it waits that long,
	// from its start, for the row of a request that may not be written yet
	// (one begun elsewhere: pendingAfter plus a commit) and answers 404
	// only then, so that someone else's inference and an unknown id take
	// the same time. Zero: no wait.
	RowWait time.Duration

	waiting  atomic.Int64 // stops waiting for a row now
	rowReads atomic.Int64 // look-ups of a row, for tests
}

// maxRowWaits bounds the stops that wait for a row at once: a stop that no
// replica took waits up to RowWait and queries the database every rowPoll,
// so a flood of made-up ids must not tie up goroutines and the database.
// Past it, a stop is answered from what the database has now.
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

// stopTimeoutMessage explains a stop the running replica did not confirm.
const stopTimeoutMessage = "The replica running this inference did not acknowledge the stop in time; it will stop when the signal reaches it."

// Stop stops inference id on behalf of p. seen (-1: unknown) is how many
// content chunks p had seen; the owner persists exactly those.
func (s *Stopper) Stop(ctx context.Context, p Principal, id string, seen int) (StopResult, error) {
	start := time.Now()
	by := p.stopCaller()
	if s.Stops == nil {
		return s.fromStorage(ctx, by, id, start, nil)
	}
	res := StopResult{InferenceID: id}
	r, err := s.Stops.RequestAs(ctx, id, seen, by)
	if err == nil && !r.NoOwner {
		// The time to the answer of the replica that took the stop (or to
		// giving up on it); a stop nobody took has no such answer.
		s.Metrics.StopLatency.Observe(r.Latency.Seconds())
	}
	switch {
	case errors.Is(err, stop.ErrUnavailable):
		// The others cannot be asked: storage says whether there is
		// anything to stop (503) or to answer.
		return s.fromStorage(ctx, by, id, start, fmt.Errorf("%w: %w", ErrStopUnavailable, err))
	case err != nil:
		return res, err
	case r.Finished:
		s.Metrics.Stops.WithLabelValues("finished").Inc()
		res.State, res.Acknowledged = r.Outcome, true
		if res.State == "" {
			res.State = "finished"
		}
	case r.Acked:
		result := "acked"
		if r.Local {
			result = "local"
		}
		s.Metrics.Stops.WithLabelValues(result).Inc()
		res.State, res.Acknowledged = models.OutcomeStopped, true
	case r.TimedOut && r.Local:
		s.Metrics.Stops.WithLabelValues("timeout").Inc()
		res.State, res.Message = "stopping", stopTimeoutMessage
	default:
		// Nobody took it (or a replica that heard it never answered):
		// what is stored decides, the same way for someone else's
		// inference as for an unknown one.
		return s.fromStorage(ctx, by, id, start, nil)
	}
	return res, nil
}

// stopCaller is who p is to the stop service: the usage row's rule, a
// person stops their own inferences and an administrator anyone's.
func (p Principal) stopCaller() stop.Caller {
	return stop.Caller{UserID: p.UserID, Any: p.Admin}
}

// fromStorage answers a stop that no replica took, from the inference's
// row: finished → 200 with its outcome; still pending → 202 (its replica is
// cut off from the bus, or gone; the stop key reaches it when it comes
// back), or unavailable when this replica could not ask the others;
// unknown or someone else's → ErrNotFound, only once RowWait from start has
// passed, so that the two take the same time. A row not written yet (a
// request begun elsewhere under pendingAfter ago, or one just finished) is
// waited for until then, polling every rowPoll, by at most maxRowWaits
// stops at once.
func (s *Stopper) fromStorage(ctx context.Context, by stop.Caller, id string, start time.Time, unavailable error) (StopResult, error) {
	res := StopResult{InferenceID: id}
	deadline := start.Add(s.RowWait)
	waiting := false
	defer func() {
		if waiting {
			s.waiting.Add(-1)
		}
	}()
	for {
		row, err := s.find(ctx, id)
		if err != nil && !errors.Is(err, models.ErrNotFound) {
			return res, err
		}
		mine := err == nil && by.MayStop(rowOwner(row))
		late := !time.Now().Before(deadline)
		switch {
		case mine && row.Outcome != models.OutcomePending:
			s.Metrics.Stops.WithLabelValues("finished").Inc()
			res.State, res.Acknowledged = row.Outcome, true
			return res, nil
		case mine && unavailable != nil:
			s.Metrics.Stops.WithLabelValues("unavailable").Inc()
			return res, unavailable
		case late:
			return s.unsettled(res, mine)
		}
		if !waiting {
			if !s.startWaiting() {
				return s.unsettled(res, mine)
			}
			waiting = true
		}
		next := time.Now().Add(rowPoll)
		if err == nil && !mine {
			// Someone else's: nothing more to learn, only the time to
			// match an unknown id's.
			next = deadline
		}
		if next.After(deadline) {
			next = deadline
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return res, ctx.Err()
		case <-t.C:
		}
	}
}

// unsettled is the answer when the wait for a row is over: the caller's
// pending inference is being stopped as far as anyone can tell (its
// replica finds the stop key when it is back on the bus); anything else
// is not found.
func (s *Stopper) unsettled(res StopResult, mine bool) (StopResult, error) {
	if !mine {
		s.Metrics.Stops.WithLabelValues("not_found").Inc()
		return res, ErrNotFound
	}
	s.Metrics.Stops.WithLabelValues("timeout").Inc()
	res.State, res.Message = "stopping", stopTimeoutMessage
	return res, nil
}

// rowOwner is the person a usage row belongs to (0: nobody).
func rowOwner(row *models.Usage) uint {
	if row.UserID == nil {
		return 0
	}
	return *row.UserID
}

// find returns the row of inference id: from this replica's memory while
// its pending row is deferred, else from the database.
func (s *Stopper) find(ctx context.Context, id string) (*models.Usage, error) {
	s.rowReads.Add(1)
	if s.Running != nil {
		if u, ok := s.Running(id); ok {
			return &u, nil
		}
	}
	return models.UsageByID(ctx, s.DB, id)
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
