package web_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/models"
)

// rawEngine answers every request on its connection with answer(n), n
// counting the requests, then closes the connection when close is set.
func rawEngine(t *testing.T, answer func(n int) (reply string, close bool)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// Connections are served on goroutines of their own: the count is
	// shared between them.
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					reply, closing := answer(int(n.Add(1)))
					if _, err := io.WriteString(c, reply); err != nil || closing {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/v1"
}

// A non-streamed answer is read to its Content-Length and passed on byte
// for byte, whatever its size; one that ends before its length is a
// failure of the engine's (502, upstream_read_failed), not a short answer.
func TestNonStreamedAnswerIsReadToItsLength(t *testing.T) {
	content := strings.Repeat("word ", 1200) // a 6 KB answer: several times the 512 bytes a reader starts with
	whole := fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","model":"m1","choices":[{"index":0,`+
		`"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":3,"completion_tokens":1200,"total_tokens":1203}}`, content)
	short := `{"id":"chatcmpl-2","object":"chat.co`
	url := rawEngine(t, func(n int) (string, bool) {
		if n == 1 {
			return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
				fmt.Sprint(len(whole)) + "\r\n\r\n" + whole, false
		}
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n" + short, true
	})
	e := startWithConfig(t, &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/m.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends:    []config.Backend{{Name: "raw", URL: url, MaxConcurrency: 4, MaxQueue: 4, QueueTimeout: 5 * time.Second}},
		Models:      []config.Model{{Name: "m1", Backend: "raw"}},
	}, nil, "")
	const body = `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`

	resp := e.post(body)
	got := readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || got != whole {
		t.Fatalf("status %d, %d bytes; want 200 and the engine's %d bytes as sent", resp.StatusCode, len(got), len(whole))
	}
	if u := e.final(resp.Header.Get("X-Inference-Id")); u.Outcome != models.OutcomeSuccess || u.CompletionTokens != 1200 {
		t.Fatalf("row %+v; want success with the engine's 1200 completion tokens", u)
	}

	resp = e.post(body)
	got = readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(got, "upstream_read_failed") || strings.Contains(got, "chatcmpl-2") {
		t.Fatalf("status %d: %s; want 502 upstream_read_failed and none of the cut answer", resp.StatusCode, got)
	}
	if u := e.final(resp.Header.Get("X-Inference-Id")); u.Outcome != models.OutcomeError || u.Reason != "upstream_read_failed" {
		t.Fatalf("row %+v; want error upstream_read_failed", u)
	}
}
