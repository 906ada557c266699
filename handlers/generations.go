package handlers

import (
	"bufio"
	"context"
	"errors"
	"html"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/internal/keepalive"
)

// streamRetryAfter is the Retry-After of an event stream refused for the
// person's open ones: a viewer closing a tab frees one at once.
const streamRetryAfter = 5

// heartbeatEvery is the comment interval of a quiet event stream when
// stream_keepalive is 0: the comments are also how a viewer that left is
// noticed (fasthttp tells nothing until a write fails), so they never stop.
const heartbeatEvery = 15 * time.Second

// GenerationEvents serves GET /api/v1/generations/{inference_id}/events:
// the reply as Server-Sent Events. Each "chunk" event carries the next
// piece of text, HTML-escaped; the one "done" event the final message as
// HTML. Every event has its seq as id, so Last-Event-ID (or
// ?last_event_id=) resumes after it.
func (h *Handler) GenerationEvents(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	from := 0
	last, param := c.Get("Last-Event-ID"), "Last-Event-ID"
	if last == "" {
		last, param = c.Query("last_event_id"), "last_event_id"
	}
	if last != "" {
		n, err := strconv.Atoi(strings.TrimSpace(last))
		if err != nil || n < 0 {
			return apiErrorParam(c, http.StatusBadRequest, "Last-Event-ID must be a non-negative integer.", "invalid_request_error", "invalid_request", param)
		}
		from = n
	}
	f, err := h.Chat.Follow(c.UserContext(), p.UserID, strings.Clone(c.Params("id")))
	if errors.Is(err, chat.ErrNotFound) {
		return apiError(c, http.StatusNotFound, "No such generation.", "invalid_request_error", "not_found")
	}
	if err != nil {
		return h.chatError(c, err)
	}
	// One of the person's event streams on this replica, until the
	// writer below returns; ended at once if an admin disables them.
	ctx, cancel := context.WithCancel(context.Background())
	release, ok := h.Streams.Take(p.UserID, cancel)
	if !ok {
		cancel()
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(streamRetryAfter))
		return apiError(c, http.StatusTooManyRequests, "You have too many answers open at once ("+strconv.Itoa(h.Streams.Max())+
			"): close some tabs, then reload.", "requests", "too_many_streams")
	}
	c.Set(fiber.HeaderContentType, "text/event-stream; charset=utf-8")
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set("X-Accel-Buffering", "no") // nginx in front must not buffer the stream
	// The writer runs after this handler returns: only what is copied out
	// here (streamBody).
	log := h.Log
	h.streamBody(ctx, cancel, c, "event stream", func(ctx context.Context, w *bufio.Writer, flush func() error) {
		defer release()
		// A comment first, so the headers leave at once.
		if _, err := w.WriteString(": stream\n\n"); err != nil || flush() != nil {
			return
		}
		seq := from
		every := h.Keepalive
		if every <= 0 {
			every = heartbeatEvery
		}
		for {
			evs, err := f.Next(ctx, seq, every)
			if err != nil {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, chat.ErrFollowEnded) {
					log.Warn("follow generation", "err", err)
				}
				return
			}
			if len(evs) == 0 {
				_, _ = w.Write(keepalive.Comment)
			}
			done := false
			for _, ev := range evs {
				if ev.Done {
					writeEvent(w, ev.Seq, "done", ev.HTML)
					done = true
					continue
				}
				writeEvent(w, ev.Seq, "chunk", escapeChunk(ev.Text))
				seq = ev.Seq
			}
			// A failed flush is the only sign that the viewer left.
			if flush() != nil || done {
				return
			}
		}
	})
	return nil
}

// writeEvent writes one SSE event; each line of data becomes a data line
// (a viewer joins them with newlines again).
func writeEvent(w *bufio.Writer, id int, event, data string) {
	w.WriteString("id: ")
	w.WriteString(strconv.Itoa(id))
	w.WriteString("\nevent: ")
	w.WriteString(event)
	w.WriteByte('\n')
	data = strings.ReplaceAll(data, "\r\n", "\n")
	for line := range strings.SplitSeq(data, "\n") {
		w.WriteString("data: ")
		w.WriteString(strings.ReplaceAll(line, "\r", ""))
		w.WriteByte('\n')
	}
	w.WriteByte('\n')
}

// escapeChunk HTML-escapes a piece of text; a carriage return, which SSE
// would take for a line end, becomes its character reference.
func escapeChunk(s string) string {
	return strings.ReplaceAll(html.EscapeString(s), "\r", "&#13;")
}
