package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/enginelink/protocol"
)

// outMsg is one envelope waiting for the writer. ctx is its session's (or
// the connection's): once it is done the envelope is dropped unwritten, so
// nothing of a cancelled session leaves after its cancel was read.
type outMsg struct {
	data  []byte
	ctx   context.Context
	close bool // not an envelope: close the connection after what came before
}

// conn is one gateway's WebSocket and its sessions.
type conn struct {
	srv    *Server
	ws     *websocket.Conn
	remote string
	log    *slog.Logger

	ctx    context.Context // cancelled when the connection ends: every session's parent
	cancel context.CancelFunc
	out    chan outMsg
	ids    atomic.Int64
	wg     sync.WaitGroup // the running requests
	done   chan struct{}  // closed when serve has returned

	// inSession is set by the read loop once a session has opened here:
	// envelopes may then be protocol.MaxEnvelope, not
	// MaxEnvelopeBeforeSession. Only the read loop touches it.
	inSession bool

	mu       sync.Mutex
	sessions map[string]*session
	draining bool // goaway sent: no new sessions
}

var errStalled = errors.New("the connection took none of this session's output for too long")

func newConn(s *Server, ws *websocket.Conn, remote string) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	return &conn{srv: s, ws: ws, remote: remote, log: s.log.With("remote", remote),
		ctx: ctx, cancel: cancel, out: make(chan outMsg, s.opts.SendQueue),
		done: make(chan struct{}), sessions: map[string]*session{}}
}

// serve reads envelopes until the connection ends, then frees every
// session: their requests are cancelled and waited for.
func (c *conn) serve() {
	defer close(c.done)
	// Until a session opens, the library enforces the small limit as it
	// reads: a stranger's large envelope is never buffered.
	c.ws.SetReadLimit(MaxEnvelopeBeforeSession)
	c.log.Info("engine connection opened", "subprotocol", c.ws.Subprotocol())
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writer()
	}()
	pingerDone := make(chan struct{})
	go func() {
		defer close(pingerDone)
		c.pinger()
	}()
	err := c.readLoop()
	c.cancel()
	<-pingerDone
	c.mu.Lock()
	freed := len(c.sessions)
	for id, s := range c.sessions {
		s.cancel()
		delete(c.sessions, id)
	}
	c.mu.Unlock()
	c.wg.Wait()
	<-writerDone
	_ = c.ws.CloseNow()
	c.log.Info("engine connection closed", "sessions_freed", freed, "reason", closeReason(err))
}

// pinger pings the gateway every PingInterval and closes a connection whose
// ping goes unanswered for one interval: a gateway heard from last at a pong
// is closed at most two intervals later, which ends the read loop and frees
// every session of the connection. (Pongs are read by the read loop.)
func (c *conn) pinger() {
	every := c.srv.opts.PingInterval
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, every)
		err := c.ws.Ping(ctx)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Warn("gateway silent: no pong for two ping intervals, closing its connection", "err", err)
				_ = c.ws.CloseNow()
			}
			return
		}
	}
}

// closeReason words why the read loop ended, for the log.
func closeReason(err error) string {
	if s := websocket.CloseStatus(err); s != -1 {
		return "closed by the peer: " + s.String()
	}
	if err == nil {
		return "closed"
	}
	return err.Error()
}

// readLoop reads and dispatches envelopes, one at a time, until the
// connection ends.
func (c *conn) readLoop() error {
	raised := false
	for {
		typ, r, err := c.ws.Reader(c.ctx)
		if err != nil {
			return err
		}
		data, err := io.ReadAll(io.LimitReader(r, protocol.MaxEnvelope+1))
		if errors.Is(err, websocket.ErrMessageTooBig) {
			c.log.Warn("engine connection closing: an envelope over the limit before its first session",
				"limit_bytes", MaxEnvelopeBeforeSession)
			return err
		}
		if err != nil {
			return err
		}
		if len(data) > protocol.MaxEnvelope {
			// Drained, not kept: Decode refuses it by its size alone.
			if _, err := io.Copy(io.Discard, r); err != nil {
				return err
			}
		}
		if typ != websocket.MessageText {
			c.reply((&protocol.DecodeError{Code: protocol.CodeInvalid, Reason: "a binary message; envelopes are text messages"}).Reply(c.nextID()))
			continue
		}
		env, err := protocol.Decode(data)
		if err != nil {
			var de *protocol.DecodeError
			if !errors.As(err, &de) {
				de = &protocol.DecodeError{Code: protocol.CodeInvalid, Reason: err.Error()}
			}
			c.reply(de.Reply(c.nextID()))
			continue
		}
		c.dispatch(env)
		if c.inSession && !raised {
			// The envelope bound is now checked above, not by the
			// library: it would close the connection, and an envelope too
			// large from a gateway deserves only an `error` answer. (The
			// library reads its limit as each message starts: this holds
			// from the next one.)
			c.ws.SetReadLimit(-1)
			raised = true
		}
	}
}

// nextID returns the id of the next envelope this engine sends.
func (c *conn) nextID() string {
	return "e-" + strconv.FormatInt(c.ids.Add(1), 10)
}

// writer writes the queued envelopes one at a time, so that frames never
// interleave. A write that does not finish in time ends the connection.
func (c *conn) writer() {
	for {
		var m outMsg
		select {
		case m = <-c.out:
		case <-c.ctx.Done():
			return
		}
		if m.close {
			// Everything queued before has been written.
			_ = c.ws.Close(websocket.StatusGoingAway, "engine shutting down")
			return
		}
		if m.ctx.Err() != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.srv.opts.WriteTimeout)
		err := c.ws.Write(ctx, websocket.MessageText, m.data)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Warn("engine connection write failed; closing it", "err", err)
			}
			_ = c.ws.CloseNow()
			return
		}
	}
}

// send queues an envelope for ctx's session (or, with the connection's
// context, for the connection). It waits for room at most SendTimeout.
func (c *conn) send(ctx context.Context, env protocol.Envelope) error {
	data, err := protocol.Encode(env)
	if err != nil {
		return err
	}
	if len(data) > protocol.MaxEnvelope {
		return fmt.Errorf("%s envelope of %d bytes, more than the protocol's %d", env.Type, len(data), protocol.MaxEnvelope)
	}
	m := outMsg{data: data, ctx: ctx}
	select {
	case c.out <- m:
		return nil
	default:
	}
	t := time.NewTimer(c.srv.opts.SendTimeout)
	defer t.Stop()
	select {
	case c.out <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return c.ctx.Err()
	case <-t.C:
		return errStalled
	}
}

// reply sends an envelope of the connection's own (an `error`, a refusal).
func (c *conn) reply(env protocol.Envelope) {
	if err := c.send(c.ctx, env); err != nil && c.ctx.Err() == nil {
		c.log.Warn("engine reply dropped", "type", env.Type, "err", err)
	}
}

// replyError answers the envelope ref with an `error` envelope.
func (c *conn) replyError(ref, session, code, message string) {
	env, err := protocol.New(c.nextID(), protocol.TypeError, session, protocol.Error{Ref: ref, Code: code, Message: message})
	if err != nil {
		c.log.Error("engine error envelope", "err", err)
		return
	}
	c.reply(env)
}

// goAway tells the gateway to open no new sessions here.
func (c *conn) goAway(reason string) {
	c.mu.Lock()
	c.draining = true
	c.mu.Unlock()
	env, err := protocol.New(c.nextID(), protocol.TypeGoAway, "", protocol.GoAway{Reason: reason})
	if err == nil {
		c.reply(env)
	}
}

// closeGracefully closes the connection after what is queued has been
// written, or at once when graceful is false or the queue has no room.
func (c *conn) closeGracefully(graceful bool) {
	if graceful {
		select {
		case c.out <- outMsg{close: true}:
			return
		default:
		}
	}
	c.cancel()
	_ = c.ws.CloseNow()
}
