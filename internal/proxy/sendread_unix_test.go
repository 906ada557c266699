//go:build unix

package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// countReads counts the reads of answerReader's first wait, and those that
// found nothing, until the test ends.
func countReads(t *testing.T) (calls, empty *atomic.Int64) {
	calls, empty = new(atomic.Int64), new(atomic.Int64)
	sysRead = func(fd int, p []byte) (int, error) {
		n, err := syscall.Read(fd, p)
		calls.Add(1)
		if err == syscall.EAGAIN {
			empty.Add(1)
		}
		return n, err
	}
	t.Cleanup(func() { sysRead = syscall.Read })
	return calls, empty
}

// An engine that takes a while to answer is waited for in the poller: the
// answer's first bytes are read once, with no read before them that finds
// nothing.
func TestAnswerIsWaitedForBeforeItIsRead(t *testing.T) {
	calls, empty := countReads(t)
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(20 * time.Millisecond)
		io.WriteString(w, "late")
	})
	c := NewClient()
	for i := range 3 {
		if status, body := call(t, c, srv.URL); status != 200 || body != "late" {
			t.Fatalf("request %d: %d %q", i, status, body)
		}
	}
	if calls.Load() != 3 || empty.Load() != 0 {
		t.Errorf("3 answers: %d first reads, %d of them empty; want 3 and 0", calls.Load(), empty.Load())
	}
}

// A request larger than the socket takes at once is finished the usual
// way, and an engine that answers before it has read the whole request
// (here after its first bytes) is not missed.
func TestAnswerOfALargeRequest(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 16<<20)
	body := append(append([]byte(`{"model":"m","pad":"`), big...), `"}`...)
	for _, early := range []bool{false, true} {
		srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			if early {
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusRequestEntityTooLarge)
				io.WriteString(w, "too large")
				return
			}
			n, _ := io.Copy(io.Discard, r.Body)
			io.WriteString(w, strings.Repeat("n", int(n%7)))
		})
		c := NewClient()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := c.Post(ctx, Upstream{Name: "e", BaseURL: srv.URL + "/v1"}, APIChat, body)
		if early && err != nil {
			// The engine closed while the request was still going out:
			// a failed write is as good an end as its answer.
			cancel()
			continue
		}
		if err != nil {
			cancel()
			t.Fatalf("early=%v: %v", early, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		want, status := strings.Repeat("n", len(body)%7), 200
		if early {
			want, status = "too large", http.StatusRequestEntityTooLarge
		}
		if err != nil || resp.StatusCode != status || string(got) != want {
			t.Fatalf("early=%v: %d %q %v, want %d %q", early, resp.StatusCode, got, err, status, want)
		}
	}
}

// An engine that closes the connection without answering is an EOF, not
// a wait until the deadline.
func TestAnswerOfAnEngineThatHangsUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			conn.Read(buf)
			conn.Close()
		}
	}()
	c := NewClient()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err = c.Post(ctx, Upstream{Name: "e", BaseURL: "http://" + ln.Addr().String() + "/v1"}, APIChat, []byte(`{"model":"m"}`))
	if err == nil || ctx.Err() != nil || time.Since(start) > 2*time.Second {
		t.Fatalf("an engine that hangs up: %v after %v", err, time.Since(start))
	}
}

// Sending a request and reading its answer allocates nothing: the request's
// vector and the wait are on the stack.
func TestAnswerReaderAllocatesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, 4096)
		for {
			if _, err := conn.Read(buf); err != nil {
				return
			}
			if _, err := conn.Write(answer); err != nil {
				return
			}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := newAnswerReader(conn)
	header, body := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 2\r\n\r\n"), []byte("{}")
	got := make([]byte, len(answer))
	exchange := func() {
		if err := r.send(header, body, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, answer) {
			t.Fatalf("answer %q, %v", got, err)
		}
	}
	exchange() // the connection's first use sets up its poll descriptor
	if n := testing.AllocsPerRun(200, exchange); n != 0 {
		t.Errorf("%.1f allocations a request, want 0", n)
	}
	if r.bufs[0] != nil || r.bufs[1] != nil {
		t.Error("the reader keeps the last request's buffers")
	}
}
