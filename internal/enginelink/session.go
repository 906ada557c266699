package enginelink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"moonji/internal/enginelink/protocol"
)

// session is one request on the link, from ChatCompletions until it is
// unregistered: queued, then sent on a connection, then answered.
type session struct {
	l    *Link
	id   string
	msgs [][]byte // session.open and chat.request, encoded

	// Under l.mu.
	conn     *conn     // the connection its messages went to; nil while queued
	deadline time.Time // when it leaves the queue unsent
	removed  bool      // unregistered

	mu       sync.Mutex
	ready    chan struct{} // closed at the answer's start or the session's failure
	isReady  bool
	wake     chan struct{} // a frame, the end or a failure for the reader
	resp     *protocol.ChatResponse
	frames   [][]byte
	buffered int // bytes in frames
	seq      int64
	done     *protocol.ChatDone
	err      error
}

// signal wakes whoever waits on s; under s.mu.
func (s *session) signal() {
	if !s.isReady {
		s.isReady = true
		close(s.ready)
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// failLocked ends s with err unless it already ended; discard drops the
// frames not yet read (the reader gets the error at once). Under s.mu.
func (s *session) failLocked(err error, discard bool) {
	if s.err != nil || s.done != nil {
		return
	}
	s.err = err
	if discard {
		s.frames, s.buffered = nil, 0
	}
	s.signal()
}

func (s *session) fail(err error, discard bool) {
	s.mu.Lock()
	s.failLocked(err, discard)
	s.mu.Unlock()
}

// ChatCompletions runs one chat-completions body on the engine as session
// (the request's inference id) for model, with the shape of
// proxy.Client.ChatCompletions: the answer's status, Content-Type and body,
// a stream's body yielding its SSE frames byte for byte until io.EOF at
// chat.done. Errors before the answer are *proxy.UpstreamError (the
// engine's status for a chat.error, 503 when the engine was not reachable
// in time or the queue is full, 502 otherwise), or ctx's error when ctx
// ends first: the engine is then told session.cancel and session.close.
// The caller closes the body; closing it early cancels the session.
func (l *Link) ChatCompletions(ctx context.Context, session, model string, body []byte, traceparent string) (*http.Response, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := l.newSession(session, model, body, traceparent)
	if err != nil {
		return nil, err
	}
	if err := l.open(s); err != nil {
		return nil, l.upstream(err)
	}
	// Whenever ctx ends — waiting, or later while the body streams, read or
	// not — the session is cancelled on the engine and unregistered.
	stop := context.AfterFunc(ctx, func() { l.end(s, ctx.Err(), endCancel, cancelReason(ctx)) })
	ttl := time.NewTimer(l.opts.MessageTTL)
	defer ttl.Stop()
	ttlC := ttl.C
	for {
		select {
		case <-s.ready:
		case <-ctx.Done():
		case <-ttlC:
			ttlC = nil
			l.expire(s)
			continue
		}
		break
	}
	if err := ctx.Err(); err != nil {
		stop()
		l.end(s, err, endCancel, cancelReason(ctx))
		return nil, err
	}
	s.mu.Lock()
	resp, err := s.resp, s.err
	s.mu.Unlock()
	if resp == nil {
		stop()
		return nil, l.upstream(err)
	}
	h := http.Header{}
	if resp.ContentType != "" {
		h.Set("Content-Type", resp.ContentType)
	}
	out := &http.Response{
		Status:     strconv.Itoa(resp.Status) + " " + http.StatusText(resp.Status),
		StatusCode: resp.Status,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h,
	}
	if !resp.Stream {
		stop()
		out.Body = io.NopCloser(strings.NewReader(resp.Body))
		out.ContentLength = int64(len(resp.Body))
		return out, nil
	}
	out.Body = &Stream{s: s, ctx: ctx, stop: stop}
	out.ContentLength = -1
	return out, nil
}

// newSession encodes the session's two messages. The session.open is
// checked with protocol.Decode, so a bad id or model fails here rather than
// as a refusal from the engine; the body is the caller's, already checked.
func (l *Link) newSession(id, model string, body []byte, traceparent string) (*session, error) {
	if model == "" {
		return nil, fmt.Errorf("engine session %s: %w", id, errNoModel)
	}
	open := l.envelope(protocol.TypeSessionOpen, id, protocol.SessionOpen{Model: model})
	if _, err := protocol.Decode(open); err != nil {
		return nil, fmt.Errorf("engine session %q: %w", id, err)
	}
	req := l.envelope(protocol.TypeChatRequest, id, protocol.ChatRequest{Body: string(body), Traceparent: traceparent})
	return &session{
		l: l, id: id, msgs: [][]byte{open, req},
		ready: make(chan struct{}), wake: make(chan struct{}, 1),
	}, nil
}

// cancelReason is session.cancel's reason for ctx's end.
func cancelReason(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return "timeout"
	}
	return "cancelled"
}

// Stream is a streamed answer's body: the chat.chunk frames in order, byte
// for byte, then io.EOF at chat.done. It fails with the engine's chat.error,
// ErrDisconnected, ErrSlowReader, a seq gap, or ctx's error.
type Stream struct {
	s    *session
	ctx  context.Context
	stop func() bool
	cur  []byte
	// sawDone is set once the reader took the `data: [DONE]` frame: the
	// answer is complete even if chat.done has not come yet.
	sawDone bool
}

// doneGrace bounds how long a session whose reader took `data: [DONE]` and
// closed the body waits for the engine's chat.done before it is closed
// anyway. chat.done follows the last chunk at once; the wait only keeps it
// from arriving for a forgotten session.
const doneGrace = 5 * time.Second

// Read hands out the frames as they came, a frame (or what fits of it) per
// call.
func (b *Stream) Read(p []byte) (int, error) {
	s := b.s
	for {
		if err := b.ctx.Err(); err != nil {
			s.l.end(s, err, endCancel, cancelReason(b.ctx))
			return 0, err
		}
		if len(b.cur) > 0 {
			n := copy(p, b.cur)
			b.cur = b.cur[n:]
			return n, nil
		}
		s.mu.Lock()
		if len(s.frames) > 0 {
			b.cur = s.frames[0]
			s.frames[0] = nil
			s.frames = s.frames[1:]
			s.buffered -= len(b.cur)
			s.mu.Unlock()
			if bytes.HasPrefix(b.cur, doneFrame) {
				b.sawDone = true
			}
			continue
		}
		done, err := s.done, s.err
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if done != nil {
			return 0, io.EOF
		}
		select {
		case <-s.wake:
		case <-b.ctx.Done():
		}
	}
}

// doneFrame starts the SSE frame that ends a chat stream.
var doneFrame = []byte("data: [DONE]")

// Close ends the stream; before its end, the engine is told session.cancel
// and session.close. A stream whose `data: [DONE]` was read is complete:
// a relay stops reading there, usually before chat.done arrives, so the
// session stays registered until chat.done ends it (at most doneGrace)
// rather than cancel an answer that finished and drop the chat.done as
// unknown.
func (b *Stream) Close() error {
	b.stop()
	s, l := b.s, b.s.l
	if b.sawDone {
		s.mu.Lock()
		ended := s.done != nil || s.err != nil
		s.mu.Unlock()
		if !ended {
			time.AfterFunc(doneGrace, func() { l.end(s, nil, endClose, "") })
		}
		return nil
	}
	l.end(s, l.wrap(ErrBodyClosed), endCancel, "client_closed")
	return nil
}

// Done is the chat.done that ended the stream (finish reason, usage), once
// it has arrived.
func (b *Stream) Done() (protocol.ChatDone, bool) {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	if b.s.done == nil {
		return protocol.ChatDone{}, false
	}
	return *b.s.done, true
}
