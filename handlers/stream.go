package handlers

import (
	"bufio"
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/gofiber/fiber/v2"
)

// streamBody makes what write writes the response's body, sent as it is
// flushed. write runs after the handler has returned, on a *fiber.Ctx Fiber
// has reused, so it gets only what is copied out here:
//
//   - ctx, which cancel ends: when write returns, or at the server's
//     shutdown;
//   - flush, which hands what write wrote to the server under a write
//     deadline StreamWriteTimeout away, so that a client that stops reading
//     (keeping its socket open) fails a write instead of holding the stream
//     and what feeds it forever (the next request on the connection starts
//     without the deadline: web's clearWriteDeadline).
//
// write runs outside every handler, where a panic would end the process:
// here it ends this stream alone, logged with what names the stream.
func (h *Handler) streamBody(ctx context.Context, cancel context.CancelFunc, c *fiber.Ctx, what string,
	write func(ctx context.Context, w *bufio.Writer, flush func() error)) {
	serverDone := c.Context().Done()
	log := h.Log
	conn, stall := c.Context().Conn(), h.StreamWriteTimeout
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		defer func() {
			if r := recover(); r != nil {
				log.Error(what+" panicked; it alone ends", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			}
		}()
		defer cancel()
		go func() {
			select {
			case <-serverDone:
				cancel()
			case <-ctx.Done():
			}
		}()
		flush := func() error {
			if stall > 0 {
				_ = conn.SetWriteDeadline(time.Now().Add(stall))
			}
			return w.Flush()
		}
		write(ctx, w, flush)
	})
}
