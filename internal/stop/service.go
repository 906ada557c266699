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
