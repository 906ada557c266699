package enginelink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"moonji/internal/enginelink/protocol"
)

// Link is the gateway's connection to one engine backend: a connector that
// dials and redials one WebSocket, a queue for the requests made while it is
// down, and the SessionRouter that hands each reply to its own session.
type Link struct {
	opts Options
	log  *slog.Logger

	ctx    context.Context // ends at Close: the connector, its dials, its connections
	cancel context.CancelFunc
	wg     sync.WaitGroup // the connector and what it started

	startOnce sync.Once
	closeOnce sync.Once
	msgSeq    atomic.Uint64 // ids of the envelopes this side sends
	stats     counters

	// mu guards the router (sessions), the queue, the current connection
	// and each session's conn/removed fields. Lock order: mu, then a
	// session's or a connection's own lock.
	mu       sync.Mutex
	closed   bool
	current  *conn
	sessions map[string]*session
	queue    []*session // FIFO of sessions whose messages wait for a connection
	lastErr  error
}

// New returns a link that does nothing until Start.
func New(opts Options) *Link {
	opts = opts.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Link{
		opts:     opts,
		log:      opts.Log.With("backend", opts.Name),
		ctx:      ctx,
		cancel:   cancel,
		sessions: map[string]*session{},
	}
}

// Start begins dialling in the background. It does nothing after Close.
func (l *Link) Start() {
	l.startOnce.Do(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.closed {
			return
		}
		l.wg.Add(1)
		go l.connect()
	})
}

// Close stops the link: the reconnect timer and the queue are dropped, every
// open session fails with ErrClosed, and Close returns once the link's
// goroutines have ended.
func (l *Link) Close() {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		var failed []*session
		for _, s := range l.sessions {
			if l.endLocked(s, endQuiet, "") {
				failed = append(failed, s)
			}
		}
		l.mu.Unlock()
		for _, s := range failed {
			s.fail(l.wrap(ErrClosed), false)
		}
		l.cancel()
		l.wg.Wait()
	})
}

// LastError is why the last dial failed, or nil once a dial succeeded.
func (l *Link) LastError() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastErr
}

func (l *Link) nextID() string { return "g-" + strconv.FormatUint(l.msgSeq.Add(1), 10) }

// wrap names the backend in a session's error.
func (l *Link) wrap(err error) error { return fmt.Errorf("backend %s: %w", l.opts.Name, err) }

// open registers s and sends its messages on the current connection, or
// queues them while there is none (or it is draining after a goaway).
func (l *Link) open(s *session) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if _, dup := l.sessions[s.id]; dup {
		return fmt.Errorf("session %s is already open on backend %s", s.id, l.opts.Name)
	}
	if c := l.current; c != nil && !c.draining {
		l.register(s)
		s.conn = c
		c.send(s.msgs...)
		return nil
	}
	if len(l.queue) >= l.opts.QueueSize {
		l.stats.droppedQueueFull.Add(1)
		l.log.Warn("engine not connected: queue full, request refused", "session", s.id, "queued", len(l.queue))
		return ErrQueueFull
	}
	l.register(s)
	s.deadline = time.Now().Add(l.opts.MessageTTL)
	l.queue = append(l.queue, s)
	l.stats.queued.Store(int64(len(l.queue)))
	l.log.Debug("engine not connected: request queued", "session", s.id, "queued", len(l.queue))
	return nil
}

func (l *Link) register(s *session) {
	l.sessions[s.id] = s
	l.stats.sessionsOpen.Add(1)
}

// ending says what the engine is told when a session is forgotten.
type ending int

const (
	endQuiet  ending = iota // nothing: never sent, the connection is gone, or the engine closed it
	endClose                // the answer ended: session.close
	endCancel               // cut short: session.cancel, then session.close
)

// end unregisters s (once: it reports whether this call did) and fails it
// with err when err is set.
func (l *Link) end(s *session, err error, how ending, reason string) bool {
	l.mu.Lock()
	ok := l.endLocked(s, how, reason)
	l.mu.Unlock()
	if ok && err != nil {
		s.fail(err, how == endCancel)
	}
	return ok
}

// endLocked is end's part under l.mu: out of the router and the queue, and
// the engine told, on the connection that has the session.
func (l *Link) endLocked(s *session, how ending, reason string) bool {
	if s.removed {
		return false
	}
	s.removed = true
	delete(l.sessions, s.id)
	l.stats.sessionsOpen.Add(-1)
	if s.conn == nil {
		if i := slices.Index(l.queue, s); i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
			l.stats.queued.Store(int64(len(l.queue)))
		}
		return true
	}
	if how == endCancel {
		s.conn.send(l.envelope(protocol.TypeSessionCancel, s.id, protocol.SessionCancel{Reason: reason}))
	}
	if how != endQuiet {
		s.conn.send(l.envelope(protocol.TypeSessionClose, s.id, nil))
	}
	return true
}

// expire fails s if it still waits in the queue.
func (l *Link) expire(s *session) {
	l.mu.Lock()
	queued := !s.removed && s.conn == nil
	if queued {
		l.endLocked(s, endQuiet, "")
		l.stats.droppedExpired.Add(1)
	}
	l.mu.Unlock()
	if queued {
		l.log.Warn("engine not connected: queued request expired", "session", s.id, "ttl", l.opts.MessageTTL)
		s.fail(l.wrap(ErrExpired), false)
	}
}

// attach makes c the current connection, after sending it the queue in
// order (what expired on the way is failed instead).
func (l *Link) attach(c *conn) {
	l.mu.Lock()
	now := time.Now()
	queue := l.queue
	l.queue = nil
	var expired []*session
	for _, s := range queue {
		if now.After(s.deadline) {
			l.endLocked(s, endQuiet, "")
			l.stats.droppedExpired.Add(1)
			expired = append(expired, s)
			continue
		}
		s.conn = c
		c.send(s.msgs...)
	}
	l.stats.queued.Store(0)
	l.current = c
	l.lastErr = nil
	l.stats.connected.Store(1)
	l.mu.Unlock()
	for _, s := range expired {
		s.fail(l.wrap(ErrExpired), false)
	}
	if len(queue) > 0 {
		l.log.Info("engine connected: queued requests sent", "sent", len(queue)-len(expired), "expired", len(expired))
	}
}

// detach forgets c: every session whose request went on it fails with
// ErrDisconnected (ErrClosed at shutdown). Queued sessions stay queued.
func (l *Link) detach(c *conn) {
	l.mu.Lock()
	if l.current == c {
		l.current = nil
		l.stats.connected.Store(0)
	}
	var lost []*session
	for _, s := range l.sessions {
		if s.conn == c && l.endLocked(s, endQuiet, "") {
			lost = append(lost, s)
		}
	}
	l.mu.Unlock()
	err := ErrDisconnected
	if l.ctx.Err() != nil {
		err = ErrClosed
	}
	for _, s := range lost {
		s.fail(l.wrap(err), false)
	}
	if len(lost) > 0 {
		l.log.Warn("engine connection lost: its sessions failed", "sessions", len(lost), "reason", err)
	}
}

// drain marks c as draining after a goaway: new sessions wait for the next
// connection; those on c go on.
func (l *Link) drain(c *conn, reason string) {
	l.mu.Lock()
	c.draining = true
	l.mu.Unlock()
	l.log.Info("engine goaway: no new sessions on this connection", "reason", reason)
}

// envelope encodes one of this side's messages; payloads are this package's
// own values, so encoding cannot fail.
func (l *Link) envelope(typ, session string, payload any) []byte {
	env, err := protocol.New(l.nextID(), typ, session, payload)
	if err == nil {
		var data []byte
		if data, err = protocol.Encode(env); err == nil {
			return data
		}
	}
	panic(fmt.Sprintf("enginelink: encode %s: %v", typ, err))
}

// Stats are the link's counters, for metrics.
type Stats struct {
	Connected    int64 // 1 while a connection is up
	SessionsOpen int64 // registered sessions (queued or running)
	Queued       int64 // sessions waiting for a connection
	Reconnects   int64 // connections made after the first
	// Dropped counts what was refused or thrown away, by reason.
	DroppedUnknownSession int64 // a reply for no open session of that connection
	DroppedExpired        int64 // a queued request past its TTL
	DroppedQueueFull      int64 // a request refused because the queue was full
	DroppedInvalid        int64 // an engine envelope that failed validation (the validation errors)
	DroppedSlowReader     int64 // a session failed because its reader fell behind
	EngineRefusals        int64 // `error` envelopes from the engine: it refused one of ours
}

type counters struct {
	connected, sessionsOpen, queued, reconnects                      atomic.Int64
	droppedUnknown, droppedExpired, droppedQueueFull, droppedInvalid atomic.Int64
	droppedSlowReader, engineRefusals                                atomic.Int64
}

// Stats reads the counters.
func (l *Link) Stats() Stats {
	c := &l.stats
	return Stats{
		Connected: c.connected.Load(), SessionsOpen: c.sessionsOpen.Load(), Queued: c.queued.Load(),
		Reconnects: c.reconnects.Load(), DroppedUnknownSession: c.droppedUnknown.Load(),
		DroppedExpired: c.droppedExpired.Load(), DroppedQueueFull: c.droppedQueueFull.Load(),
		DroppedInvalid: c.droppedInvalid.Load(), DroppedSlowReader: c.droppedSlowReader.Load(),
		EngineRefusals: c.engineRefusals.Load(),
	}
}

var errNoModel = errors.New("model is missing")

// Name is the engine backend's name.
func (l *Link) Name() string { return l.opts.Name }
