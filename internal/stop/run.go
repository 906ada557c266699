// Runs: the inferences this replica owns, from Begin to End, and what a
// stop that reaches one does to it.

package stop

import (
	"context"
	"sync"
)

// Run is one inference owned by this replica, between Begin and End.
type Run struct {
	s     *Service
	id    string
	owner uint
	// Guarded by Service.mu: the watches of its stop to end with it
	// (Begin's onStop, Watch's), whether it has ended, whether the stream
	// has been acknowledged as ended, and the stops to answer when it is.
	unwatch func()
	ended   bool
	acked   bool
	waiting []waiter
	endOnce sync.Once
}

// Begin registers inference id as running on this replica for person owner
// (0: nobody; only a Caller with Any may then stop it). onStop (may be nil)
// is called once when the inference is stopped, at once if it already is;
// it runs on the stopping goroutine and must not block (cancel the upstream
// context, wake the relay). Begin checks the stop key once, bounded by
// CheckTimeout, to catch a stop that raced ahead of the start; that is the
// only Redis command per inference. Call End when the inference is over.
func (s *Service) Begin(ctx context.Context, id string, owner uint, onStop func()) *Run {
	r := s.register(id, owner, onStop)
	// Registered first, checked second: a stop published after this check
	// is delivered by the bus, or, if this replica is disconnected then,
	// found by the check that follows re-subscription, which sees this run.
	if s.keys != nil && !s.holder.Stopped(id) {
		cctx, cancel := context.WithTimeout(ctx, s.opts.CheckTimeout)
		found, err := s.keys.Stops(cctx, []string{id})
		cancel()
		switch {
		case err != nil:
			s.log.Warn("could not check stop key at start; broadcasts still apply", "inference_id", id, "err", err)
		case len(found) > 0 && s.applyFound(r, found[0]):
			s.log.Info("inference was stopped before it started", "inference_id", id)
		}
	}
	return r
}

// BeginFresh is Begin for an id minted for this request and given to
// nobody yet (a /v1 request's, which its client first sees in the answer's
// headers; a chat reply's, registered before its id leaves the chat): no
// stop can have been recorded for it, so the stop key is not checked, which
// saves a Redis round trip per request. A stop sent once the id is out finds
// the run registered, as after Begin.
func (s *Service) BeginFresh(id string, owner uint, onStop func()) *Run {
	return s.register(id, owner, onStop)
}

// applyFound applies the stops found in run r's stop key that their callers
// may make, and reports whether there was one. Their requests get the run's
// answer like those heard on the bus, if they still wait for one.
func (s *Service) applyFound(r *Run, found []Message) bool {
	var again []Message
	stop := false
	s.mu.Lock()
	for _, m := range found {
		if !m.By.MayStop(r.owner) {
			continue
		}
		stop = true
		switch {
		case s.runs[r.id] != r:
			// Ended meanwhile: its End has answered what it could.
		case m.From == s.opts.ReplicaID:
			// A request of this replica's own, published before the run
			// began here: answered directly if it still waits.
			if req := s.requests[m.Ref]; req != nil && req.id == r.id {
				if r.acked {
					s.completeLocked(req, KindAck, "")
				} else {
					r.waiting = append(r.waiting, waiter{local: req})
				}
			}
		case r.acked:
			again = append(again, Message{Kind: KindAck, ID: r.id, From: s.opts.ReplicaID, To: m.From, Ref: m.Ref, Seen: -1})
		default:
			r.waiting = append(r.waiting, waiter{from: m.From, ref: m.Ref})
		}
	}
	s.mu.Unlock()
	if stop {
		s.holder.Stop(r.id)
	}
	for _, m := range again {
		s.publishAsync(m)
	}
	return stop
}

// register makes id's run known to this replica and watches its stop.
func (s *Service) register(id string, owner uint, onStop func()) *Run {
	r := &Run{s: s, id: id, owner: owner, unwatch: func() {}}
	if onStop != nil {
		r.unwatch = s.holder.Watch(id, onStop)
	}
	s.mu.Lock()
	if _, dup := s.runs[id]; dup {
		s.log.Warn("inference begun twice; the later run replaces the earlier", "inference_id", id)
	}
	s.runs[id] = r
	s.mu.Unlock()
	return r
}

// Watch adds onStop to a run begun without it, for whoever takes the run
// over: the chat registers a reply before its id leaves the chat, and the
// gateway that then runs the request watches it. onStop is called once when
// the inference is stopped, at once if it already is, on Begin's terms (it
// must not block). Call it before End; once the run has ended, nothing stays
// watched.
func (r *Run) Watch(onStop func()) {
	s := r.s
	unwatch := s.holder.Watch(r.id, onStop)
	s.mu.Lock()
	ended := r.ended
	if !ended {
		prev := r.unwatch
		r.unwatch = func() { prev(); unwatch() }
	}
	s.mu.Unlock()
	if ended {
		unwatch()
	}
}

// ID returns the inference id.
func (r *Run) ID() string { return r.id }

// Seen returns how many content chunks the person who stopped the inference
// had seen, when their stop said so.
func (r *Run) Seen() (int, bool) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	n, ok := r.s.seen[r.id]
	return n, ok
}

// Stopped reports whether the inference has been stopped: an in-memory look-up
// with no I/O, meant to be called for every token.
func (r *Run) Stopped() bool { return r.s.holder.Stopped(r.id) }

// Ack tells the stoppers that the stream has ended and nothing more will
// reach the client. Call it once the stream is closed; later calls, and
// calls when the inference was not stopped, do nothing. A Request on this
// replica is answered directly; others through the bus.
func (r *Run) Ack() {
	if !r.Stopped() {
		return
	}
	s := r.s
	s.mu.Lock()
	if r.acked {
		s.mu.Unlock()
		return
	}
	r.acked = true
	ws := r.waiting
	r.waiting = nil
	s.mu.Unlock()
	for _, w := range ws {
		s.answer(r.id, w, KindAck, "")
	}
}

// End unregisters the inference. If it was stopped and not yet acknowledged,
// End acknowledges it, since an ended stream sends nothing more. Safe to call
// more than once.
func (r *Run) End() { r.EndWith("") }

// EndWith is End for an inference that ended with outcome ("success",
// "stopped", …): a stop that arrives in the next FinishedRetention is
// answered with it.
func (r *Run) EndWith(outcome string) {
	r.endOnce.Do(func() {
		s := r.s
		s.mu.Lock()
		// Unwatched first, and under the lock Watch takes: no onStop of
		// the run is called after this, and a later Watch leaves nothing.
		r.ended = true
		r.unwatch()
		if s.runs[r.id] == r {
			delete(s.runs, r.id)
			delete(s.seen, r.id)
		}
		// Under the same lock as the removal so that a concurrent Request
		// or stop message sees the run either running or finished.
		s.finished.Add(r.id, s.packFinishedLocked(r.owner, outcome))
		ws := r.waiting
		r.waiting = nil
		r.acked = true
		s.mu.Unlock()
		// A stop taken just before the end may not have marked the holder
		// yet: the stream then ended on its own.
		kind := KindFinished
		if r.Stopped() {
			kind = KindAck
		}
		for _, w := range ws {
			s.answer(r.id, w, kind, outcome)
		}
	})
}

// ownerBits is how many bits of a finished entry hold the owner; the low
// byte holds the outcome's code.
const ownerBits = 56

// packFinishedLocked is the finished set's value for a run of owner that
// ended with outcome. An owner too large for ownerBits is kept as nobody,
// so that only a Caller with Any can be told about it.
func (s *Service) packFinishedLocked(owner uint, outcome string) uint64 {
	code, ok := s.outcomeCode[outcome]
	if !ok && len(s.outcomes) <= 0xff {
		code = uint8(len(s.outcomes))
		s.outcomes = append(s.outcomes, outcome)
		s.outcomeCode[outcome] = code
	}
	o := uint64(owner)
	if o >= 1<<ownerBits {
		o = 0
	}
	return o<<8 | uint64(code)
}

// unpackFinishedLocked reverses packFinishedLocked.
func (s *Service) unpackFinishedLocked(v uint64) (owner uint, outcome string) {
	return uint(v >> 8), s.outcomes[uint8(v)]
}

// finishedForLocked returns the outcome of id if this replica finished it
// recently and by may know.
func (s *Service) finishedForLocked(id string, by Caller) (outcome string, ok bool) {
	v, ok := s.finished.Get(id)
	if !ok {
		return "", false
	}
	owner, outcome := s.unpackFinishedLocked(v)
	if !by.MayStop(owner) {
		return "", false
	}
	return outcome, true
}
