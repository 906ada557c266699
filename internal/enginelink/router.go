package enginelink

import (
	"errors"

	"moonji/internal/enginelink/protocol"
)

// handle routes one valid envelope from the engine. A session's reply goes
// to that session only if it is open on this very connection; otherwise it
// is dropped and counted, never delivered anywhere else.
func (l *Link) handle(c *conn, env protocol.Envelope) {
	switch env.Type {
	case protocol.TypeGoAway:
		p, _ := protocol.Payload[protocol.GoAway](env)
		l.drain(c, p.Reason)
		return
	case protocol.TypeError:
		p, _ := protocol.Payload[protocol.Error](env)
		l.stats.engineRefusals.Add(1)
		l.log.Warn("engine refused an envelope", "ref", p.Ref, "code", p.Code, "message", p.Message, "session", env.Session)
		return
	case protocol.TypeSessionOpen, protocol.TypeChatRequest, protocol.TypeSessionCancel:
		c.refuse(&protocol.DecodeError{ID: env.ID, Code: protocol.CodeInvalid, Reason: env.Type + " is sent by the gateway only"})
		return
	}
	l.mu.Lock()
	s := l.sessions[env.Session]
	if s == nil || s.conn != c {
		l.mu.Unlock()
		if env.Type == protocol.TypeSessionClose {
			return // the engine's close of a session this side already forgot: the usual crossing
		}
		l.stats.droppedUnknown.Add(1)
		l.log.Debug("session not found: engine reply dropped", "session", env.Session, "type", env.Type, "id", env.ID)
		return
	}
	// Under l.mu, so that the session cannot end between the look-up and
	// the delivery; delivering only appends, it never waits for a reader.
	how, err := s.deliver(env, l.opts.SessionFrames, l.opts.SessionBytes)
	ended := false
	if how != keep {
		ended = l.endLocked(s, how.ending(), how.reason())
	}
	l.mu.Unlock()
	if ended && err != nil {
		if errors.Is(err, ErrSlowReader) {
			l.stats.droppedSlowReader.Add(1)
			l.log.Warn("session reader fell behind: session failed", "session", s.id, "frames", l.opts.SessionFrames, "bytes", l.opts.SessionBytes)
		} else {
			l.log.Info("session failed", "session", s.id, "err", err)
		}
	}
}

// verdict is what a delivered envelope does to its session.
type verdict int

const (
	keep           verdict = iota // the session goes on
	answered                      // the answer ended: close
	broken                        // the session failed on this side: cancel and close
	closedByEngine                // the engine closed it: nothing to tell
)

func (v verdict) ending() ending {
	switch v {
	case answered:
		return endClose
	case broken:
		return endCancel
	}
	return endQuiet
}

func (v verdict) reason() string {
	if v == broken {
		return "gateway_error"
	}
	return ""
}

// deliver applies one engine reply to s. Failures are set on s here, under
// its lock, so that its reader sees them in order after the frames before.
func (s *session) deliver(env protocol.Envelope, maxFrames, maxBytes int) (verdict, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	streaming := s.resp != nil && s.resp.Stream
	fail := func(err error, discard bool) (verdict, error) {
		s.failLocked(s.l.wrap(err), discard)
		return broken, err
	}
	switch env.Type {
	case protocol.TypeChatResponse:
		p, err := protocol.Payload[protocol.ChatResponse](env)
		if err != nil || s.resp != nil {
			return fail(protocolError("a second chat.response"), true)
		}
		s.resp = &p
		s.signal()
		if !p.Stream {
			return answered, nil
		}
		return keep, nil
	case protocol.TypeChatChunk:
		p, err := protocol.Payload[protocol.ChatChunk](env)
		if err != nil || !streaming {
			return fail(protocolError("chat.chunk outside a streamed response"), true)
		}
		if p.Seq != s.seq+1 {
			return fail(protocolError("chat.chunk seq %d after %d: a gap", p.Seq, s.seq), false)
		}
		s.seq = p.Seq
		if len(s.frames)+1 > maxFrames || s.buffered+len(p.Frame) > maxBytes {
			return fail(ErrSlowReader, true)
		}
		s.frames = append(s.frames, []byte(p.Frame))
		s.buffered += len(p.Frame)
		s.signal()
		return keep, nil
	case protocol.TypeChatDone:
		p, err := protocol.Payload[protocol.ChatDone](env)
		if err != nil || !streaming {
			return fail(protocolError("chat.done outside a streamed response"), true)
		}
		s.done = &p
		s.signal()
		return answered, nil
	case protocol.TypeChatError:
		p, _ := protocol.Payload[protocol.ChatError](env)
		err := &EngineError{Status: p.Status, Code: p.Code, Message: p.Message}
		s.failLocked(s.l.wrap(err), false)
		return answered, err
	case protocol.TypeSessionClose:
		if s.done != nil || (s.resp != nil && !s.resp.Stream) {
			return closedByEngine, nil
		}
		err := protocolError("the engine closed the session before its answer ended")
		s.failLocked(s.l.wrap(err), false)
		return closedByEngine, err
	}
	return keep, nil
}
