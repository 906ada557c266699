package handlers

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
)

// A streamed body's writer runs outside every handler: what it flushed
// reaches the client, its context ends when it returns, and a panic in it
// ends that stream alone instead of the process.
func TestStreamBody(t *testing.T) {
	h := &Handler{Log: slog.New(slog.DiscardHandler), StreamWriteTimeout: time.Minute}
	for _, c := range []struct {
		name  string
		panic bool
	}{{"returns", false}, {"panics", true}} {
		t.Run(c.name, func(t *testing.T) {
			ended := make(chan struct{})
			app := fiber.New()
			app.Get("/s", func(fc *fiber.Ctx) error {
				ctx, cancel := context.WithCancel(context.Background())
				h.streamBody(ctx, cancel, fc, "test stream", func(ctx context.Context, w *bufio.Writer, flush func() error) {
					context.AfterFunc(ctx, func() { close(ended) })
					_, _ = w.WriteString("first\n")
					if err := flush(); err != nil {
						t.Errorf("flush: %v", err)
					}
					_, _ = w.WriteString("second\n")
					if c.panic {
						panic("a bug in the stream's writer")
					}
					_ = flush()
				})
				return nil
			})
			resp, err := app.Test(httptest.NewRequest("GET", "/s", nil), -1)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			// The server flushes what was written when the writer ends,
			// however it ends.
			if want := "first\nsecond\n"; string(body) != want {
				t.Errorf("body %q, want %q", body, want)
			}
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("the writer's context did not end with it")
			}
		})
	}
}
