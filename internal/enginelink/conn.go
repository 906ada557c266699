package enginelink

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/coder/websocket"

	"moonji/internal/enginelink/protocol"
)

// conn is one WebSocket to the engine: a read loop (the connector's own
// goroutine), a writer that sends the outbox in order, and a pinger.
type conn struct {
	l      *Link
	ws     *websocket.Conn
	ctx    context.Context // ends when the connection does
	cancel context.CancelFunc

	draining bool // under l.mu: a goaway came, no new sessions here

	// The outbox: every message for this connection goes through it, so
	// that one writer keeps them in order (a session's cancel never
	// overtakes its request) and no sender blocks on the network. It needs
	// no bound of its own: it holds at most four messages per session (open,
	// request, cancel, close), sessions are bounded by the backend's
	// admission (max_concurrency) and the link's queue_size, and a request's
	// bytes are the ones its handler already holds. A writer stuck on a peer
	// that reads nothing is ended by the heartbeat: the ping waits for the
	// same socket and times out, and the connection is closed.
	outMu sync.Mutex
	out   [][]byte
	wake  chan struct{}
}

// serve runs a connection until it ends, then fails its sessions.
func (l *Link) serve(ws *websocket.Conn) {
	ctx, cancel := context.WithCancel(l.ctx)
	c := &conn{l: l, ws: ws, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1)}
	l.attach(c)
	var wg sync.WaitGroup
	wg.Go(c.writeLoop)
	wg.Go(c.pingLoop)
	err := c.readLoop()
	cancel()
	ws.CloseNow()
	l.detach(c)
	wg.Wait()
	if l.ctx.Err() == nil {
		l.log.Warn("engine connection closed", "err", err)
	}
}

// send appends messages to the outbox; it never blocks.
func (c *conn) send(msgs ...[]byte) {
	c.outMu.Lock()
	c.out = append(c.out, msgs...)
	c.outMu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) writeLoop() {
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.wake:
		}
		c.outMu.Lock()
		batch := c.out
		c.out = nil
		c.outMu.Unlock()
		for _, m := range batch {
			if err := c.ws.Write(c.ctx, websocket.MessageText, m); err != nil {
				if c.ctx.Err() == nil {
					c.l.log.Warn("engine connection: write failed, closing", "err", err)
				}
				c.ws.CloseNow()
				return
			}
		}
	}
}

// pingLoop pings every interval and closes a connection whose peer leaves a
// ping unanswered for one: a peer heard from last at a pong is thus closed
// at most two intervals later. The read loop then ends and the connector
// redials.
func (c *conn) pingLoop() {
	every := c.l.opts.PingInterval
	for {
		t := time.NewTimer(every)
		select {
		case <-c.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, every)
		err := c.ws.Ping(ctx)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.l.log.Warn("engine silent: no pong for two ping intervals, closing", "interval", every, "err", err)
			}
			c.ws.CloseNow()
			return
		}
	}
}

// readLoop reads envelopes until the connection ends. It never blocks on a
// session: routing only appends to a session's bounded buffer.
func (c *conn) readLoop() error {
	for {
		typ, data, err := c.ws.Read(c.ctx)
		if err != nil {
			return err
		}
		if typ != websocket.MessageText {
			c.refuse(&protocol.DecodeError{Code: protocol.CodeInvalid, Reason: "a binary message; envelopes are text"})
			continue
		}
		env, err := protocol.Decode(data)
		if err != nil {
			var de *protocol.DecodeError
			if !errors.As(err, &de) {
				de = &protocol.DecodeError{Code: protocol.CodeInvalid, Reason: err.Error()}
			}
			c.refuse(de)
			continue
		}
		c.l.handle(c, env)
	}
}

// refuse answers an invalid envelope with `error` naming it; nothing else
// changes.
func (c *conn) refuse(de *protocol.DecodeError) {
	l := c.l
	l.stats.droppedInvalid.Add(1)
	l.log.Warn("engine sent an invalid envelope: refused", "ref", de.ID, "code", de.Code, "reason", de.Reason)
	data, err := protocol.Encode(de.Reply(l.nextID()))
	if err != nil {
		return
	}
	c.send(data)
}
