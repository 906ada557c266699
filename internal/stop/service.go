package stop

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// ErrUnavailable is wrapped by RequestAs when the stop cannot be broadcast
// (Redis down) and this replica does not run the inference for the caller.
// The HTTP handler answers 503 if storage says there is something to stop.
var ErrUnavailable = errors.New("stop: cannot broadcast stop")

// Options configures a Service. Zero values take the defaults.
type Options struct {
	// AckTimeout bounds how long RequestAs waits, publishing included, for
	// the answers (default 2 s).
	AckTimeout time.Duration
	// CheckTimeout bounds each stop-key check: the one in Begin and each
	// attempt of the one after every re-subscription (default 500 ms),
	// which is tried again a few times; one that still fails is logged and
	// skipped: broadcasts still reach the replica.
	CheckTimeout time.Duration
	// FinishedRetention is how long this replica remembers the inferences
	// it finished (whose, and how they ended), so that a stop arriving just
	// after the end is answered at once from memory (default 1 min; an id
	// is kept up to a quarter longer, see recentSet).
	FinishedRetention time.Duration
	// ReplicaID names this replica in messages so that it can ignore its own
	// echoes (default: random).
	ReplicaID string
	// Logger receives warnings (default slog.Default()).
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.AckTimeout <= 0 {
		o.AckTimeout = 2 * time.Second
	}
	if o.CheckTimeout <= 0 {
		o.CheckTimeout = 500 * time.Millisecond
	}
	if o.FinishedRetention <= 0 {
		o.FinishedRetention = time.Minute
	}
	if o.ReplicaID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.ReplicaID = hex.EncodeToString(b[:])
	}
	// The wire format separates fields with '|'.
	o.ReplicaID = strings.ReplaceAll(o.ReplicaID, "|", "_")
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Result describes how a Request ended, for the HTTP answer and for metrics.
type Result struct {
	// Acked is true when the owner confirmed that no more content reaches
	// the client (including when it had already finished).
	Acked bool
	// TimedOut is true when no answer settled the request within
	// AckTimeout: the owner took the stop but did not acknowledge it, or a
	// replica that heard the stop never answered (gone, or a second
	// subscription of one replica).
	TimedOut bool
	// Local is true when this replica owned (or had just finished) the
	// inference, so no Redis round trip was needed.
	Local bool
	// Finished is true when the inference had already ended before the
	// stop reached its owner; Outcome is how, when the owner knows.
	Finished bool
	Outcome  string
	// NoOwner is true when every replica that heard the stop answered that
	// it runs no such inference for this caller: unknown, someone else's
	// (the two are one answer), finished longer ago than FinishedRetention,
	// not begun yet, or run by a replica cut off from the bus. Only
	// storage can tell more.
	NoOwner bool
	// Latency is the time from Request to its answer.
	Latency time.Duration
}

// Label returns a short label for metrics: "acked", "finished", "none",
// "timeout" or "error".
func (r Result) Label() string {
	switch {
	case r.Finished:
		return "finished"
	case r.Acked:
		return "acked"
	case r.NoOwner:
		return "none"
	case r.TimedOut:
		return "timeout"
	default:
		return "error"
	}
}

// Service ties a Holder and a Bus together. Each gateway replica has one.
//
// The owner of a stream calls Begin with the person it runs for, checks
// Run.Stopped per token (a map look-up), and after a stop ends the stream
// and calls Run.Ack. The stop endpoint, on any replica, calls RequestAs
// with its caller; the replica that runs the inference decides whether the
// caller may stop it, and RequestAs returns once that replica has
// acknowledged, every replica has said it runs no such inference for the
// caller, or AckTimeout has passed.
type Service struct {
	holder *Holder
	bus    Bus
	keys   KeyStore
	opts   Options
	log    *slog.Logger
	// finished remembers inferences this replica ended recently, with
	// their owner and outcome (packFinished).
	finished *recentSet

	mu   sync.Mutex
	runs map[string]*Run
	// seen holds the content chunks a person had seen when they stopped,
	// per inference, until its run ends.
	seen map[string]int
	// requests are this replica's stops waiting for answers from the
	// others, by their number (Message.Ref).
	requests map[uint64]*request
	nextRef  uint64
	// outcomes interns the outcomes runs end with, so that the finished
	// set keeps one in a byte; outcomeCode is its index.
	outcomes    []string
	outcomeCode map[string]uint8
	closed      bool
	quit        chan struct{} // closed by Close: background retries give up
	bg          sync.WaitGroup
}

// request is one stop waiting for its answer.
type request struct {
	id   string
	done chan struct{}
	// The fields below are guarded by Service.mu and final once done is
	// closed.
	answered bool
	kind     Kind // KindAck, KindFinished or KindNone (nobody runs it)
	outcome  string
	// nones counts the KindNone answers; expect is how many mean that
	// nobody runs the inference for this caller (-1 until the publish
	// said how many heard the stop).
	nones  int
	expect int
}

// waiter is a stop a run took and must answer once its stream has ended:
// a request of this replica, or one of another (From, Ref).
type waiter struct {
	local *request
	from  string
	ref   uint64
}

// NewService returns a Service over h and b. If b implements KeyStore, its
// stop keys close the races that pub/sub alone leaves open. The Service does
// not close h.
func NewService(h *Holder, b Bus, opts Options) *Service {
	opts = opts.withDefaults()
	keys, _ := b.(KeyStore)
	return &Service{
		holder:      h,
		bus:         b,
		keys:        keys,
		opts:        opts,
		log:         opts.Logger.With("component", "stop", "replica", opts.ReplicaID),
		finished:    newRecentSet(opts.FinishedRetention),
		runs:        make(map[string]*Run),
		seen:        make(map[string]int),
		requests:    make(map[uint64]*request),
		outcomes:    []string{""},
		outcomeCode: map[string]uint8{"": 0},
		quit:        make(chan struct{}),
	}
}

// ReplicaID returns the name this replica uses on the bus.
func (s *Service) ReplicaID() string { return s.opts.ReplicaID }

// Holder returns the Holder the Service marks.
func (s *Service) Holder() *Holder { return s.holder }

// Running returns the number of inferences between Begin and End here.
func (s *Service) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// Start subscribes to the bus and returns once subscribed. On error the bus
// may keep trying in the background (see RedisBus.Start); local stops work
// either way.
func (s *Service) Start(ctx context.Context) error {
	err := s.bus.Start(ctx, Handler{Message: s.handleMessage, Subscribed: s.subscribed})
	if err != nil {
		return fmt.Errorf("stop: start service: %w", err)
	}
	return nil
}

// Close stops the bus and waits for background publishes. Requests still
// waiting end by their own timeout.
func (s *Service) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.quit)
	s.mu.Unlock()
	if err := s.bus.Close(); err != nil {
		s.log.Warn("closing stop bus", "err", err)
	}
	s.bg.Wait()
	s.finished.Close()
}

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

// Request stops inference id on the gateway's own behalf (System: any
// inference) and waits, at most AckTimeout, for its owner to acknowledge.
func (s *Service) Request(ctx context.Context, id string) (Result, error) {
	return s.RequestAs(ctx, id, -1, System)
}

// RequestSeen is Request with the number of content chunks the person saw
// (-1: unknown), so that the owner keeps exactly what was shown.
func (s *Service) RequestSeen(ctx context.Context, id string, seen int) (Result, error) {
	return s.RequestAs(ctx, id, seen, System)
}

// RequestAs stops inference id for by, wherever it runs, and waits at most
// AckTimeout for the answer. seen (-1: unknown) is how many content chunks
// by had seen; the owner keeps exactly those.
//
// If this replica runs id and by may stop it, no Redis is needed. Otherwise
// the stop is broadcast with by, and the replica that runs id decides: it
// stops the stream and acknowledges, or answers, like every other replica,
// that it runs no such inference for by — so an inference that is not by's
// and one that does not exist get the same answer, NoOwner, after the same
// round. A failed broadcast returns an error wrapping ErrUnavailable.
// Stopping twice is harmless.
func (s *Service) RequestAs(ctx context.Context, id string, seen int, by Caller) (Result, error) {
	start := time.Now()
	if id == "" {
		return Result{}, errors.New("stop: empty inference id")
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Result{}, ErrClosed
	}
	r := s.runs[id]
	switch {
	case r != nil && by.MayStop(r.owner):
		s.noteSeenLocked(id, seen)
		if r.acked {
			// Already stopped and acknowledged by an earlier request.
			s.mu.Unlock()
			return Result{Acked: true, Local: true, Latency: time.Since(start)}, nil
		}
		req := &request{id: id, done: make(chan struct{})}
		r.waiting = append(r.waiting, waiter{local: req})
		s.mu.Unlock()
		// Fires the run's onStop.
		s.holder.Stop(id)
		return s.await(ctx, req, start, true)
	case r == nil:
		if outcome, ok := s.finishedForLocked(id, by); ok {
			s.mu.Unlock()
			return Result{Acked: true, Local: true, Finished: true, Outcome: outcome, Latency: time.Since(start)}, nil
		}
	}
	// Someone else's run here takes the same way as one this replica does
	// not have, so that its answer cannot tell them apart.
	s.mu.Unlock()

	if err := s.busDown(); err != nil {
		// Without a subscription the owner's answer cannot reach this
		// replica, so the stop could not be confirmed: say so now rather
		// than after AckTimeout (a down Redis can take the client seconds
		// to report).
		return Result{Latency: time.Since(start)}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	req := &request{id: id, done: make(chan struct{}), expect: -1}
	s.mu.Lock()
	s.nextRef++
	ref := s.nextRef
	s.requests[ref] = req
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.requests, ref)
		s.mu.Unlock()
	}()
	pctx, cancel := context.WithTimeout(ctx, s.opts.AckTimeout)
	heard, err := s.bus.Publish(pctx, Message{Kind: KindStop, ID: id, From: s.opts.ReplicaID, Ref: ref, Seen: seen, By: by})
	cancel()
	if err != nil {
		return Result{Latency: time.Since(start)}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if heard >= 0 {
		// Every subscription but this replica's own answers once; answers
		// may have come in before the count did.
		s.mu.Lock()
		req.expect = max(heard-1, 0)
		s.settleLocked(req)
		s.mu.Unlock()
	}
	return s.await(ctx, req, start, false)
}

// await waits for req's answer, at most AckTimeout from start.
func (s *Service) await(ctx context.Context, req *request, start time.Time, local bool) (Result, error) {
	timer := time.NewTimer(max(s.opts.AckTimeout-time.Since(start), 0))
	defer timer.Stop()
	select {
	case <-req.done:
		res := Result{Local: local, Latency: time.Since(start)}
		switch req.kind {
		case KindAck:
			res.Acked = true
		case KindFinished:
			res.Acked, res.Finished, res.Outcome = true, true, req.outcome
		case KindNone:
			res.NoOwner = true
		}
		return res, nil
	case <-timer.C:
		return Result{TimedOut: true, Local: local, Latency: time.Since(start)}, nil
	case <-ctx.Done():
		return Result{Local: local, Latency: time.Since(start)}, fmt.Errorf("stop: waiting for ack of %s: %w", req.id, ctx.Err())
	}
}

// settleLocked answers req as NoOwner once every replica that heard it has
// said it runs no such inference for the caller.
func (s *Service) settleLocked(req *request) {
	if req.expect >= 0 && req.nones >= req.expect {
		s.completeLocked(req, KindNone, "")
	}
}

// completeLocked gives req its answer, once.
func (s *Service) completeLocked(req *request, kind Kind, outcome string) {
	if req.answered {
		return
	}
	req.answered, req.kind, req.outcome = true, kind, outcome
	close(req.done)
}

// answer tells waiter w how the stop of id ended.
func (s *Service) answer(id string, w waiter, kind Kind, outcome string) {
	if w.local != nil {
		s.mu.Lock()
		s.completeLocked(w.local, kind, outcome)
		s.mu.Unlock()
		return
	}
	s.publishAsync(Message{Kind: kind, ID: id, From: s.opts.ReplicaID, To: w.from, Ref: w.ref, Seen: -1, Outcome: outcome})
}

// noteSeenLocked remembers a stop's seen count for a run of this replica;
// the smallest count wins when several stops say different things.
func (s *Service) noteSeenLocked(id string, seen int) {
	if seen < 0 || s.runs[id] == nil {
		return
	}
	if old, ok := s.seen[id]; !ok || seen < old {
		s.seen[id] = seen
	}
}

// Ready returns nil while stops can reach the other replicas (always with
// the in-process bus), and otherwise why not: the subscription to Redis is
// down.
func (s *Service) Ready() error { return s.busDown() }

// busDown returns why the bus cannot deliver right now, or nil if it can (or
// cannot tell).
func (s *Service) busDown() error {
	if r, ok := s.bus.(Readier); ok {
		return r.Ready()
	}
	return nil
}

// handleMessage is the bus callback.
func (s *Service) handleMessage(m Message) {
	if m.From == s.opts.ReplicaID {
		// Our own echo: already acted on locally.
		return
	}
	switch m.Kind {
	case KindStop:
		s.stopArrived(m)
	default:
		if m.To == s.opts.ReplicaID {
			s.answered(m)
		}
	}
}

// stopArrived decides a stop broadcast by another replica: this replica
// answers it unless it runs the inference for a caller that may stop it,
// in which case it stops the run and answers once the stream has ended.
func (s *Service) stopArrived(m Message) {
	reply := Message{Kind: KindNone, ID: m.ID, From: s.opts.ReplicaID, To: m.From, Ref: m.Ref, Seen: -1}
	s.mu.Lock()
	r := s.runs[m.ID]
	switch {
	case r != nil && m.By.MayStop(r.owner):
		s.noteSeenLocked(m.ID, m.Seen)
		if r.acked {
			// A repeated stop of a stream already ended: answer it again.
			reply.Kind = KindAck
			break
		}
		r.waiting = append(r.waiting, waiter{from: m.From, ref: m.Ref})
		s.mu.Unlock()
		// Fires the run's onStop; the run answers when it acks or ends.
		s.holder.Stop(m.ID)
		return
	case r == nil:
		if outcome, ok := s.finishedForLocked(m.ID, m.By); ok {
			reply.Kind, reply.Outcome = KindFinished, outcome
		}
	}
	s.mu.Unlock()
	s.publishAsync(reply)
}

// answered takes another replica's answer to one of this replica's stops.
func (s *Service) answered(m Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req := s.requests[m.Ref]
	if req == nil || req.id != m.ID {
		return // the request has given up, or it is not this one's
	}
	switch m.Kind {
	case KindAck, KindFinished:
		s.completeLocked(req, m.Kind, m.Outcome)
	case KindNone:
		req.nones++
		s.settleLocked(req)
	}
}

// subscribed runs after every (re)subscription. Stops published while this
// replica was not subscribed were lost on the channel but their keys remain,
// so check the keys of every running inference once, in one pipeline. The
// runs are those of the moment the subscription was confirmed: a run begun
// after it hears its stops on the channel (and Begin checks its own key),
// so it is not checked again — before, a check that started late took in
// runs begun meanwhile, a Redis command each.
func (s *Service) subscribed() {
	if s.keys == nil {
		return
	}
	s.mu.Lock()
	ids := make([]string, 0, len(s.runs))
	runs := make([]*Run, 0, len(s.runs))
	for id, r := range s.runs {
		if !s.holder.Stopped(id) {
			ids = append(ids, id)
			runs = append(runs, r)
		}
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	s.goBackground(func() {
		found, err := s.checkKeys(ids)
		if err != nil {
			s.log.Warn("could not check stop keys after subscribing", "running", len(ids), "err", err)
			return
		}
		for i, stops := range found {
			if s.applyFound(runs[i], stops) {
				s.log.Info("found a stop missed while unsubscribed", "inference_id", ids[i])
			}
		}
	})
}

// checkAttempts bounds the key check after a re-subscription; its waits
// double from 50 ms, so it gives up after about 3 s (plus the attempts).
const checkAttempts = 7

// checkKeys reads the stop keys of ids, trying again while it fails and the
// subscription holds: the only record of a stop published while this
// replica was deaf is its key, and the first command after an outage may
// well fail (a pooled connection a NAT dropped silently takes a read
// timeout to find out). Before, one failure lost such a stop for good.
func (s *Service) checkKeys(ids []string) ([][]Message, error) {
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.CheckTimeout)
		found, err := s.keys.Stops(ctx, ids)
		cancel()
		if err == nil || attempt == checkAttempts || s.busDown() != nil {
			// Lost again: the next subscription checks again.
			return found, err
		}
		select {
		case <-s.quit:
			return nil, err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// publishAsync publishes without holding up the caller (a stream goroutine
// or the bus receiver); failures are logged, since a waiting Request then
// times out on its own.
func (s *Service) publishAsync(m Message) {
	s.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.AckTimeout)
		defer cancel()
		if _, err := s.bus.Publish(ctx, m); err != nil && !errors.Is(err, ErrClosed) {
			s.log.Warn("stop bus publish failed", "kind", m.Kind, "inference_id", m.ID, "err", err)
		}
	})
}

// goBackground runs f on a goroutine that Close waits for; after Close it
// does nothing.
func (s *Service) goBackground(f func()) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.bg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.bg.Done()
		f()
	}()
}
