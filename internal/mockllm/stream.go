package mockllm

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// sse writes a Server-Sent Events answer, flushing every frame so that each
// token leaves when it is due rather than when a buffer fills.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE sends the 200 and its headers at once, as vLLM does, so that a
// client can tell "accepted, waiting for the first token" from "not
// answering". It returns nil when the client is already gone, which it
// records.
func (s *Server) startSSE(w http.ResponseWriter, rec *Record) *sse {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	s.update(rec, func(r *Record) { r.Status = http.StatusOK })
	if err := rc.Flush(); err != nil {
		s.cancelled(rec, "headers", err)
		return nil
	}
	return &sse{w: w, rc: rc}
}

// data writes one "data:" frame, the chat and completions APIs' only kind.
func (o *sse) data(payload string) error {
	return o.write("data: " + payload + "\n\n")
}

// event writes one typed event, as the Responses API streams them.
func (o *sse) event(typ, payload string) error {
	return o.write("event: " + typ + "\ndata: " + payload + "\n\n")
}

func (o *sse) write(frame string) error {
	if _, err := io.WriteString(o.w, frame); err != nil {
		return fmt.Errorf("writing SSE frame: %w", err)
	}
	if err := o.rc.Flush(); err != nil {
		return fmt.Errorf("flushing SSE frame: %w", err)
	}
	return nil
}

// generate produces steps tokens at g's pace, step i being due at
// g.pace.due(g.start, i+1), hands each to emit and counts it in
// rec.ChunksSent. A nil emit means a non-streaming answer: the tokens are
// only counted, so that cancellation and latency behave as in a stream.
//
// It applies the disconnect_after knob and, when streamErr is not nil, the
// stream_error_after one: streamErr writes the engine's error and the
// request is then complete. It reports whether every step was produced;
// when not, how the request ended is already recorded.
func (s *Server) generate(ctx context.Context, rec *Record, g gen, steps int, emit func(i int) error, streamErr func()) bool {
	for i := range steps {
		if i == g.disconnectAfter {
			s.abort(rec)
		}
		if i == g.streamErrorAfter && streamErr != nil {
			streamErr()
			s.completed(rec)
			return false
		}
		if !waitUntil(ctx, g.pace.due(g.start, i+1)) {
			phase := "streaming"
			if emit == nil {
				phase = "generating"
				if i == 0 {
					phase = "ttft"
				}
			}
			s.cancelled(rec, phase, context.Cause(ctx))
			return false
		}
		if emit != nil {
			if err := emit(i); err != nil {
				s.cancelled(rec, "streaming", err)
				return false
			}
		}
		s.update(rec, func(r *Record) { r.ChunksSent = i + 1 })
	}
	if g.disconnectAfter >= steps {
		s.abort(rec)
	}
	return true
}

// engineError writes vLLM's streaming error, an error frame and then [DONE]
// in the 200 stream, as the chat and completions APIs end when generation
// fails midway.
func (o *sse) engineError() {
	_ = o.data(`{"error":{"message":"The engine failed while generating.","type":"InternalServerError","param":null,"code":500}}`)
	_ = o.data("[DONE]")
}
