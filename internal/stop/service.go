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
	"sync/atomic"
	"time"
)

// ErrUnavailable is wrapped by Request when the stop cannot be broadcast
// (Redis down) and the inference is not owned by this replica. The HTTP
// handler answers 503.
var ErrUnavailable = errors.New("stop: cannot broadcast stop")

// Options configures a Service. Zero values take the defaults.
type Options struct {
	// AckTimeout bounds how long Request waits, publishing included, for the
	// owner to acknowledge (default 2 s).
	AckTimeout time.Duration
	// CheckTimeout bounds each stop-key check: the one in Begin and the one
	// after every re-subscription (default 500 ms). A check that fails is
	// logged and skipped: broadcasts still reach the replica.
	CheckTimeout time.Duration
	// FinishedRetention is how long this replica remembers the inferences
	// it finished, so that a stop arriving just after the end is answered
	// at once instead of timing out (default 1 min; an id is kept up to a
	// quarter longer, see recentSet).
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
	// TimedOut is true when no acknowledgement came within AckTimeout: the
	// owner may be gone, the id may be unknown, or the inference has not
	// started yet (then its later start finds the stop key).
	TimedOut bool
	// Local is true when this replica owned (or had just finished) the
	// inference, so no Redis round trip was needed.
	Local bool
	// Finished is true when the inference had already ended before the
	// stop reached its owner.
	Finished bool
	// Latency is the time from Request to its answer.
	Latency time.Duration
}

// Outcome returns a short label for metrics: "acked", "finished", "timeout"
// or "error".
func (r Result) Outcome() string {
	switch {
	case r.Finished:
		return "finished"
	case r.Acked:
		return "acked"
	case r.TimedOut:
		return "timeout"
	default:
		return "error"
	}
}

// Service ties a Holder and a Bus together. Each gateway replica has one.
//
// The owner of a stream calls Begin, checks Run.Stopped per token (a map
// look-up), and after a stop ends the stream and calls Run.Ack. The stop
// endpoint, on any replica, calls Request, which returns once the owner has
// acknowledged or AckTimeout has passed.
type Service struct {
	holder *Holder
	bus    Bus
	keys   KeyStore
	opts   Options
	log    *slog.Logger
	// finished remembers inferences this replica ended recently.
	finished *recentSet

	mu   sync.Mutex
	runs map[string]*Run
	// seen holds the content chunks a person had seen when they stopped,
	// per inference, until its run ends.
	seen    map[string]int
	waiters map[string]*ackWaiter
	closed  bool
	bg      sync.WaitGroup
}

// ackWaiter is shared by all Requests waiting for the same id (a double
// click), so one ack answers them all.
type ackWaiter struct {
	done     chan struct{}
	finished bool // written before done is closed
	refs     int
}

// NewService returns a Service over h and b. If b implements KeyStore, its
// stop keys close the races that pub/sub alone leaves open. The Service does
// not close h.
func NewService(h *Holder, b Bus, opts Options) *Service {
	opts = opts.withDefaults()
	keys, _ := b.(KeyStore)
	return &Service{
		holder:   h,
		bus:      b,
		keys:     keys,
		opts:     opts,
		log:      opts.Logger.With("component", "stop", "replica", opts.ReplicaID),
		finished: newRecentSet(opts.FinishedRetention),
		runs:     make(map[string]*Run),
		seen:     make(map[string]int),
		waiters:  make(map[string]*ackWaiter),
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
	s.mu.Unlock()
	if err := s.bus.Close(); err != nil {
		s.log.Warn("closing stop bus", "err", err)
	}
	s.bg.Wait()
	s.finished.Close()
}

// Run is one inference owned by this replica, between Begin and End.
type Run struct {
	s       *Service
	id      string
	unwatch func()
	acked   atomic.Bool
	endOnce sync.Once
}

// Begin registers inference id as running on this replica. onStop (may be
// nil) is called once when the inference is stopped, at once if it already
// is; it runs on the stopping goroutine and must not block (cancel the
// upstream context, wake the relay). Begin checks the stop key once, bounded
// by CheckTimeout, to catch a stop that raced ahead of the start; that is the
// only Redis command per inference. Call End when the inference is over.
func (s *Service) Begin(ctx context.Context, id string, onStop func()) *Run {
	r := s.register(id, onStop)
	// Registered first, checked second: a stop published after this check
	// is delivered by the bus, or, if this replica is disconnected then,
	// found by the check that follows re-subscription, which sees this run.
	if s.keys != nil && !s.holder.Stopped(id) {
		cctx, cancel := context.WithTimeout(ctx, s.opts.CheckTimeout)
		found, err := s.keys.StoppedIDs(cctx, []string{id})
		cancel()
		switch {
		case err != nil:
			s.log.Warn("could not check stop key at start; broadcasts still apply", "inference_id", id, "err", err)
		case len(found) > 0:
			s.log.Info("inference was stopped before it started", "inference_id", id)
			s.holder.Stop(id)
		}
	}
	return r
}

// BeginFresh is Begin for an id minted for this request and given to
// nobody yet (a /v1 request's, which its client first sees in the answer's
// headers): no stop can have been recorded for it, so the stop key is not
// checked, which saves a Redis round trip per request. A stop sent once the
// id is out finds the run registered, as after Begin.
func (s *Service) BeginFresh(id string, onStop func()) *Run {
	return s.register(id, onStop)
}

// register makes id's run known to this replica and watches its stop.
func (s *Service) register(id string, onStop func()) *Run {
	r := &Run{s: s, id: id, unwatch: func() {}}
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

// Ack tells the stopper that the stream has ended and nothing more will reach
// the client. Call it once the stream is closed; later calls, and calls when
// the inference was not stopped, do nothing. A Request on this replica is
// answered directly; others through the bus.
func (r *Run) Ack() {
	if !r.Stopped() || !r.acked.CompareAndSwap(false, true) {
		return
	}
	r.s.deliverAck(r.id, false)
	r.s.publishAsync(Message{Kind: KindAck, ID: r.id, From: r.s.opts.ReplicaID, Seen: -1})
}

// End unregisters the inference. If it was stopped and not yet acknowledged,
// End acknowledges it, since an ended stream sends nothing more. Safe to call
// more than once.
func (r *Run) End() {
	r.endOnce.Do(func() {
		r.unwatch()
		s := r.s
		s.mu.Lock()
		if s.runs[r.id] == r {
			delete(s.runs, r.id)
			delete(s.seen, r.id)
		}
		// Under the same lock as the removal so that a concurrent Request
		// or stop message sees the run either running or finished.
		s.finished.Add(r.id)
		s.mu.Unlock()
		r.Ack()
	})
}

// Request stops inference id wherever it runs and waits, at most AckTimeout,
// for its owner to acknowledge. If this replica owns id, it needs no Redis:
// the stop is applied here and the broadcast is only best effort (so that
// the stop key exists). Otherwise a failed broadcast returns an error
// wrapping ErrUnavailable. Stopping twice is harmless.
func (s *Service) Request(ctx context.Context, id string) (Result, error) {
	return s.RequestSeen(ctx, id, -1)
}

// RequestSeen is Request with the number of content chunks the person saw
// (-1: unknown), so that the owner keeps exactly what was shown.
func (s *Service) RequestSeen(ctx context.Context, id string, seen int) (Result, error) {
	start := time.Now()
	if id == "" {
		return Result{}, errors.New("stop: empty inference id")
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Result{}, ErrClosed
	}
	// Wait for the ack before anything can send it.
	w := s.waiters[id]
	if w == nil {
		w = &ackWaiter{done: make(chan struct{})}
		s.waiters[id] = w
	}
	w.refs++
	s.noteSeenLocked(id, seen)
	s.mu.Unlock()

	// Fires the owner's onStop if the owner is this replica.
	s.holder.Stop(id)

	s.mu.Lock()
	r := s.runs[id]
	finished := r == nil && s.finished.Has(id)
	s.mu.Unlock()
	local := r != nil || finished
	switch {
	case finished:
		s.deliverAck(id, true)
	case r != nil && r.acked.Load():
		// Already stopped and acknowledged by an earlier request.
		s.deliverAck(id, false)
	}

	msg := Message{Kind: KindStop, ID: id, From: s.opts.ReplicaID, Seen: seen}
	switch {
	case finished:
		// Nothing left to stop anywhere.
	case local:
		s.publishAsync(msg)
	default:
		if err := s.busDown(); err != nil {
			// Without a subscription the owner's ack cannot reach this
			// replica, so the stop could not be confirmed: say so now
			// rather than after AckTimeout (a down Redis can take the
			// client seconds to report). Still try to publish, so that
			// the stop takes effect if commands get through.
			s.dropWaiter(id, w)
			s.publishAsync(msg)
			return Result{Latency: time.Since(start)}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		pctx, cancel := context.WithTimeout(ctx, s.opts.AckTimeout)
		err := s.bus.Publish(pctx, msg)
		cancel()
		if err != nil {
			s.dropWaiter(id, w)
			return Result{Latency: time.Since(start)}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}

	timer := time.NewTimer(max(s.opts.AckTimeout-time.Since(start), 0))
	defer timer.Stop()
	select {
	case <-w.done:
		return Result{Acked: true, Local: local, Finished: w.finished, Latency: time.Since(start)}, nil
	case <-timer.C:
		s.dropWaiter(id, w)
		return Result{TimedOut: true, Local: local, Latency: time.Since(start)}, nil
	case <-ctx.Done():
		s.dropWaiter(id, w)
		return Result{Local: local, Latency: time.Since(start)}, fmt.Errorf("stop: waiting for ack of %s: %w", id, ctx.Err())
	}
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
		s.mu.Lock()
		s.noteSeenLocked(m.ID, m.Seen)
		s.mu.Unlock()
		s.stopArrived(m.ID)
	case KindAck:
		s.deliverAck(m.ID, false)
	case KindFinished:
		s.deliverAck(m.ID, true)
	}
}

// stopArrived applies a stop from elsewhere (a broadcast or a found key).
func (s *Service) stopArrived(id string) {
	// Fires the owning Run's onStop if it runs here; elsewhere it only
	// marks the holder, which also covers a start that comes later.
	s.holder.Stop(id)
	s.mu.Lock()
	r := s.runs[id]
	finished := r == nil && s.finished.Has(id)
	s.mu.Unlock()
	switch {
	case r != nil && r.acked.Load():
		// A repeated stop of a stream already ended: answer it again.
		s.publishAsync(Message{Kind: KindAck, ID: id, From: s.opts.ReplicaID, Seen: -1})
	case finished:
		s.publishAsync(Message{Kind: KindFinished, ID: id, From: s.opts.ReplicaID, Seen: -1})
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
	for id := range s.runs {
		if !s.holder.Stopped(id) {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	s.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.CheckTimeout)
		defer cancel()
		found, err := s.keys.StoppedIDs(ctx, ids)
		if err != nil {
			s.log.Warn("could not check stop keys after subscribing", "running", len(ids), "err", err)
			return
		}
		for _, id := range found {
			s.log.Info("found a stop missed while unsubscribed", "inference_id", id)
			s.stopArrived(id)
		}
	})
}

// deliverAck answers every Request waiting here for id.
func (s *Service) deliverAck(id string, finished bool) {
	s.mu.Lock()
	w := s.waiters[id]
	delete(s.waiters, id)
	s.mu.Unlock()
	if w != nil {
		w.finished = finished
		close(w.done)
	}
}

// dropWaiter forgets one Request's interest in id.
func (s *Service) dropWaiter(id string, w *ackWaiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.refs--
	if w.refs == 0 && s.waiters[id] == w {
		delete(s.waiters, id)
	}
}

// publishAsync publishes without holding up the caller (a stream goroutine
// or the bus receiver); failures are logged, since a waiting Request then
// times out on its own.
func (s *Service) publishAsync(m Message) {
	s.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.AckTimeout)
		defer cancel()
		if err := s.bus.Publish(ctx, m); err != nil && !errors.Is(err, ErrClosed) {
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
