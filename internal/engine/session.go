package engine

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"moonji/internal/enginelink/protocol"
)

// session is one gateway session: its model and settings, and the context
// its request runs under.
type session struct {
	id       string
	model    Model
	settings map[string]string // kept for the session's life; no upstream reads them yet
	ctx      context.Context   // cancelled by session.cancel, session.close, a stalled output, the connection's end
	cancel   context.CancelFunc
	started  bool // a chat.request came; guarded by conn.mu
}

// dispatch acts on one valid envelope from the gateway.
func (c *conn) dispatch(env protocol.Envelope) {
	switch env.Type {
	case protocol.TypeSessionOpen:
		c.open(env)
	case protocol.TypeChatRequest:
		c.request(env)
	case protocol.TypeSessionCancel:
		c.stop(env, false)
	case protocol.TypeSessionClose:
		c.stop(env, true)
	case protocol.TypeError:
		// The gateway refused one of ours; nothing to undo, but worth seeing.
		p, _ := protocol.Payload[protocol.Error](env)
		c.log.Warn("gateway refused an envelope", "ref", p.Ref, "code", p.Code, "message", p.Message)
	default:
		c.replyError(env.ID, env.Session, protocol.CodeInvalid, fmt.Sprintf("%s is sent by engines, not to them", env.Type))
	}
}

// open starts a session, or refuses it: a duplicate of a live one with an
// `error`, an unknown model or a draining connection with chat.error.
func (c *conn) open(env protocol.Envelope) {
	p, err := protocol.Payload[protocol.SessionOpen](env)
	if err != nil {
		c.replyError(env.ID, env.Session, protocol.CodeInvalid, err.Error())
		return
	}
	m, known := c.srv.models[p.Model]
	c.mu.Lock()
	_, live := c.sessions[env.Session]
	draining, full := c.draining, len(c.sessions) >= c.srv.opts.MaxSessions
	opened := !live && !draining && !full && known
	if opened {
		s := &session{id: env.Session, model: m, settings: p.Settings}
		s.ctx, s.cancel = context.WithCancel(c.ctx)
		c.sessions[env.Session] = s
	}
	c.mu.Unlock()
	if opened {
		// Called by the read loop, the field's only user.
		c.inSession = true
	}
	switch {
	case live:
		c.replyError(env.ID, env.Session, protocol.CodeInvalid, fmt.Sprintf("session %s is already open on this connection", env.Session))
	case draining:
		c.chatError(c.ctx, env.Session, 503, "engine_shutting_down", "This engine is shutting down and opens no new sessions; use another connection.")
	case full:
		c.chatError(c.ctx, env.Session, 503, "too_many_sessions", fmt.Sprintf("This connection already has %d sessions open; close some first.", c.srv.opts.MaxSessions))
	case !known:
		// OpenAI's (and vLLM's) wording, so that the gateway can pass it on.
		c.chatError(c.ctx, env.Session, 404, "model_not_found", fmt.Sprintf("The model `%s` does not exist.", p.Model))
	}
}

// request starts the session's chat request in a goroutine of its own. A
// session runs one request.
func (c *conn) request(env protocol.Envelope) {
	p, err := protocol.Payload[protocol.ChatRequest](env)
	if err != nil {
		c.replyError(env.ID, env.Session, protocol.CodeInvalid, err.Error())
		return
	}
	c.mu.Lock()
	s := c.sessions[env.Session]
	already := s != nil && s.started
	if s != nil && !already {
		s.started = true
		// Added under the lock by the read loop, the only caller: serve
		// waits only after the read loop has ended.
		c.wg.Add(1)
	}
	c.mu.Unlock()
	switch {
	case s == nil:
		c.replyError(env.ID, env.Session, protocol.CodeUnknownSession, fmt.Sprintf("no session %s on this connection", env.Session))
		return
	case already:
		c.replyError(env.ID, env.Session, protocol.CodeInvalid, fmt.Sprintf("session %s already has its request; a session runs one", env.Session))
		return
	}
	c.srv.requestStarted()
	go func() {
		defer c.wg.Done()
		defer c.srv.requestEnded()
		c.run(s, []byte(p.Body), traceparent(p.Traceparent))
	}()
}

// stop cancels a session's request (session.cancel) and, for
// session.close, forgets the session. Closing a session the engine does not
// know is not an error: it may have been refused at its open.
func (c *conn) stop(env protocol.Envelope, forget bool) {
	c.mu.Lock()
	s := c.sessions[env.Session]
	if forget {
		delete(c.sessions, env.Session)
	}
	c.mu.Unlock()
	if s == nil {
		if !forget {
			c.replyError(env.ID, env.Session, protocol.CodeUnknownSession, fmt.Sprintf("no session %s on this connection", env.Session))
		}
		return
	}
	s.cancel()
}

// sendSession sends one of the session's envelopes. A session whose output
// the connection has not taken for SendTimeout is cancelled: the others
// go on.
func (c *conn) sendSession(s *session, typ string, payload any) error {
	env, err := protocol.New(c.nextID(), typ, s.id, payload)
	if err != nil {
		return err
	}
	err = c.send(s.ctx, env)
	if errors.Is(err, errStalled) {
		c.log.Warn("engine session cancelled: its output is not being taken", "session", s.id, "model", s.model.Name)
		s.cancel()
	}
	return err
}

// chatError ends a session's answer (or refuses its open) with chat.error.
func (c *conn) chatError(ctx context.Context, session string, status int, code, message string) {
	env, err := protocol.New(c.nextID(), protocol.TypeChatError, session,
		protocol.ChatError{Status: status, Code: code, Message: clip(message)})
	if err != nil {
		c.log.Error("engine chat.error envelope", "err", err)
		return
	}
	if err := c.send(ctx, env); err != nil && ctx.Err() == nil {
		c.log.Warn("engine chat.error dropped", "session", session, "err", err)
	}
}

// clip bounds a message to the protocol's 1,024 characters.
func clip(s string) string {
	if utf8.RuneCountInString(s) <= 1024 {
		return s
	}
	r := []rune(s)
	return string(r[:1023]) + "…"
}
