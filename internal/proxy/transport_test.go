package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is an engine that counts the connections it accepted.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

func call(t *testing.T, c *Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Post(context.Background(), Upstream{Name: "e", BaseURL: url + "/v1"}, APIChat, []byte(`{"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestTransportReusesConnections(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Content-Type") != "application/json" {
				http.Error(w, "bad request line "+r.URL.Path, 400)
				return
			}
			b, _ := io.ReadAll(r.Body)
			if chunked {
				w.(http.Flusher).Flush() // no Content-Length: chunked
			}
			w.Write(b)
		})
		c := NewClient()
		for i := range 20 {
			status, body := call(t, c, srv.URL)
			if status != 200 || body != `{"model":"m"}` {
				t.Fatalf("chunked=%v request %d: %d %q", chunked, i, status, body)
			}
		}
		if n := conns.Load(); n != 1 {
			t.Errorf("chunked=%v: 20 sequential requests took %d connections, want 1", chunked, n)
		}
	}
}

// TestTransportRetriesStaleConnection: an engine that closed a kept-alive
// connection while it sat idle costs nothing: the request goes out again on
// a new one.
func TestTransportRetriesStaleConnection(t *testing.T) {
	var mu sync.Mutex
	var last net.Conn
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateIdle {
			mu.Lock()
			last = c
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	c := NewClient()
	call(t, c, srv.URL)
	waitUntil(t, func() bool { mu.Lock(); defer mu.Unlock(); return last != nil })
	mu.Lock()
	last.Close() // the engine drops the idle connection
	mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	if status, body := call(t, c, srv.URL); status != 200 || body != "ok" {
		t.Fatalf("after a stale connection: %d %q", status, body)
	}
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestTransportCancel: cancelling the context while the engine has not
// answered, or mid-body, returns at once with the context's error, and the
// engine sees its client leave.
func TestTransportCancel(t *testing.T) {
	gone := make(chan struct{}, 2)
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("body") != "" || strings.HasSuffix(r.URL.Path, "/completions") && r.Header.Get("X-Phase") == "" {
			w.Write([]byte("data: 1\n\n"))
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
		gone <- struct{}{}
	})
	c := NewClient()
	up := Upstream{Name: "e", BaseURL: srv.URL + "/v1"}

	// Before the answer's header (the engine waits before writing anything).
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.Do(ctx, up, http.MethodGet, "/models")
	if !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Fatalf("cancel before the header: %v after %v", err, time.Since(start))
	}
	select {
	case <-gone:
	case <-time.After(2 * time.Second):
		t.Fatal("the engine did not see its client leave")
	}

	// Mid-body.
	ctx, cancel = context.WithCancel(context.Background())
	resp, err := c.Post(ctx, up, APICompletions, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := resp.Body.Read(buf); err != nil || string(buf[:n]) != "data: 1\n\n" {
		t.Fatalf("first frame: %q %v", buf[:n], err)
	}
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = resp.Body.Read(buf)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("read after cancel: %v, want context.Canceled", err)
	}
	resp.Body.Close()
	select {
	case <-gone:
	case <-time.After(2 * time.Second):
		t.Fatal("the engine did not see its client leave mid-body")
	}
}

// TestTransportBodyClosedEarlyIsNotReused: a body closed before its end
// closes its connection (the engine learns its client left); the next
// request gets a new one.
func TestTransportBodyClosedEarlyIsNotReused(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strings.Repeat("x", 100000)))
	})
	c := NewClient()
	resp, err := c.Post(context.Background(), Upstream{Name: "e", BaseURL: srv.URL + "/v1"}, APIChat, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Read(make([]byte, 10))
	resp.Body.Close()
	if status, body := call(t, c, srv.URL); status != 200 || len(body) != 100000 {
		t.Fatalf("%d, %d bytes", status, len(body))
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: a half-read answer's connection must not be reused", n)
	}
}

// TestTransportHostileEngine: an endless header, a garbled status line and
// a refused connection are errors, not hangs or panics.
func TestTransportHostileEngine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	replies := []string{
		"HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("a", 2<<20) + "\r\n\r\n",
		"garbage\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		// Endless interim answers are bounded by the header limit too.
		strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n", 30000),
	}
	go func() {
		for _, reply := range replies {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				conn.Read(make([]byte, 4096))
				conn.Write([]byte(reply))
			}()
		}
	}()
	c := NewClient()
	up := Upstream{Name: "e", BaseURL: "http://" + ln.Addr().String() + "/v1"}
	for i := range replies {
		resp, err := c.Post(context.Background(), up, APIChat, []byte(`{}`))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		var ue *UpstreamError
		if err == nil || (i != 2 && !errors.As(err, &ue)) {
			t.Errorf("reply %d: err %v, want an upstream error", i, err)
		}
	}
	ln.Close()
	_, err = c.Post(context.Background(), up, APIChat, nil)
	var ue *UpstreamError
	if !errors.As(err, &ue) || ue.Status != http.StatusBadGateway {
		t.Errorf("refused connection: %v, want 502", err)
	}
	// A path or key that would split the request line or a header.
	for _, bad := range []Upstream{{Name: "e", BaseURL: up.BaseURL, APIKey: "k\r\nX-Evil: 1"}} {
		if _, err := c.Post(context.Background(), bad, APIChat, nil); err == nil {
			t.Errorf("key %q accepted", bad.APIKey)
		}
	}
	if _, err := c.Do(context.Background(), up, http.MethodGet, "/responses/a b"); err == nil {
		t.Error("a path with a space accepted")
	}
}

func TestTransportTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "secure "+r.Host)
	}))
	defer srv.Close()
	c := NewClient()
	if _, err := c.Post(context.Background(), Upstream{Name: "e", BaseURL: srv.URL + "/v1"}, APIChat, nil); err == nil {
		t.Fatal("an untrusted certificate was accepted")
	}
	resp, err := c.Post(context.Background(), Upstream{Name: "e", BaseURL: srv.URL + "/v1", RootCAs: srvPool(srv)}, APIChat, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "secure 127.0.0.1:") {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}

func srvPool(srv *httptest.Server) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(srv.Certificate())
	return p
}

// TestTransportSkipsInterimAnswers: a 103 before the answer is skipped, as
// net/http's Transport does.
func TestTransportSkipsInterimAnswers(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "final")
	})
	if status, body := call(t, NewClient(), srv.URL); status != 200 || body != "final" {
		t.Fatalf("%d %q", status, body)
	}
}

// TestTransportRetriesResetConnection: a kept-alive connection the engine
// reset (an RST, not a FIN) is retried on a new one too.
func TestTransportRetriesResetConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	first := make(chan *net.TCPConn, 1)
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					if n == 0 {
						first <- c.(*net.TCPConn)
						return
					}
				}
			}()
		}
	}()
	c := NewClient()
	url := "http://" + ln.Addr().String()
	if status, body := call(t, c, url); status != 200 || body != "ok" {
		t.Fatalf("%d %q", status, body)
	}
	conn := <-first
	conn.SetLinger(0)
	conn.Close() // an RST to the kept-alive connection
	time.Sleep(50 * time.Millisecond)
	if status, body := call(t, c, url); status != 200 || body != "ok" {
		t.Fatalf("after a reset connection: %d %q", status, body)
	}
}

// FrameBuffered is true only when a whole event came with the answer's
// header: then the gateway sends its client the header and that frame in
// one write; otherwise the header goes out at once, alone.
func TestTransportFrameBuffered(t *testing.T) {
	event := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
	for _, c := range []struct {
		name  string
		first string // written with the header, in one write
		later string // written 100 ms later
		want  bool
	}{
		{"event with the header", event, "", true},
		{"header alone, event later", "", event, false},
		{"half an event with the header", event[:20], event[20:], false},
		{"CRLF-framed event (not counted)", strings.ReplaceAll(event, "\n", "\r\n"), "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, c.first) // the first Flush sends the header and this together
				w.(http.Flusher).Flush()
				time.Sleep(100 * time.Millisecond)
				io.WriteString(w, c.later)
			}))
			defer srv.Close()
			resp, err := NewClient().Post(context.Background(), Upstream{Name: "e", BaseURL: srv.URL + "/v1"}, APIChat, []byte(`{"model":"m"}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got := resp.Body.(interface{ FrameBuffered() bool }).FrameBuffered()
			if got != c.want {
				t.Errorf("FrameBuffered = %v, want %v", got, c.want)
			}
			b, _ := io.ReadAll(resp.Body)
			if string(b) != c.first+c.later {
				t.Errorf("body %q, want %q", b, c.first+c.later)
			}
		})
	}
}

// TestPostSentRunsWhileTheEngineWorks: PostSent's sent runs once the
// request is written and before its answer is waited for — here the engine
// answers only after sent ran — for a small request, one larger than the
// socket takes at once, and over TLS; and not at all for a request that
// could not be written.
func TestPostSentRunsWhileTheEngineWorks(t *testing.T) {
	ran := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		select {
		case <-ran:
			fmt.Fprintf(w, "%d", n)
		case <-time.After(5 * time.Second):
			http.Error(w, "sent never ran", http.StatusInternalServerError)
		}
	})
	plain := httptest.NewServer(h)
	defer plain.Close()
	tls := httptest.NewTLSServer(h)
	defer tls.Close()

	for _, c := range []struct {
		name, url string
		roots     *x509.CertPool
		size      int
	}{
		{"small", plain.URL, nil, 100},
		{"larger than the socket", plain.URL, nil, 8 << 20},
		{"tls", tls.URL, srvPool(tls), 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(`{"model":"` + strings.Repeat("m", c.size) + `"}`)
			calls := 0
			resp, err := NewClient().PostSent(context.Background(), Upstream{Name: "e", BaseURL: c.url + "/v1", RootCAs: c.roots}, APIChat, body, func() {
				calls++
				ran <- struct{}{}
			})
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(got) != strconv.Itoa(len(body)) || calls != 1 {
				t.Fatalf("%d %q, sent ran %d times; want 200 %d, once", resp.StatusCode, got, calls, len(body))
			}
		})
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { // an engine that takes the connection and drops it
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}
	}()
	defer ln.Close()
	calls := 0
	_, err = NewClient().PostSent(context.Background(), Upstream{Name: "e", BaseURL: "http://" + ln.Addr().String() + "/v1"}, APIChat,
		bytes.Repeat([]byte("x"), 8<<20), func() { calls++ })
	if err == nil || calls != 0 {
		t.Fatalf("a request to an engine that drops it: err %v, sent ran %d times; want an error and none", err, calls)
	}
}

// TestTransportKeepsConnectionWhoseEndComesLate: engines write the end of
// a chunked body apart from the stream's last frame (Go's net/http when the
// handler returns, uvicorn's h11), so it often arrives after the relay has
// read [DONE] and closed the body. The connection is kept all the same and
// the end read when it is next taken; a stream closed before its last frame
// still closes its connection (the engine learns its client left), and a
// connection whose end never comes is not reused.
func TestTransportKeepsConnectionWhoseEndComesLate(t *testing.T) {
	frames := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" + "data: [DONE]\n\n"
	// relay reads one stream through a Stream up to its last frame and
	// closes it as the gateway does.
	relay := func(t *testing.T, c *Client, url string) {
		t.Helper()
		resp, err := c.Post(context.Background(), Upstream{Name: "e", BaseURL: url + "/v1"}, APIChat, []byte(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		s := NewStream(bufio.NewReaderSize(resp.Body, 1<<10), RelayOptions{API: APIChat})
		got, err := io.ReadAll(s)
		if err != nil || string(got) != frames {
			t.Fatalf("relayed %q, %v; want %q", got, err, frames)
		}
		if !s.Result().Ended {
			t.Fatal("the stream's [DONE] was read, but Ended is false")
		}
		if err := CloseAnswer(resp.Body, s.Result().Ended); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("end after the last frame", func(t *testing.T) {
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, frames)
			w.(http.Flusher).Flush()
			time.Sleep(5 * time.Millisecond) // the body's end comes after the relay is over
		})
		c := NewClient()
		for range 5 {
			relay(t, c, srv.URL)
			time.Sleep(20 * time.Millisecond) // and before the next request
		}
		if n := conns.Load(); n != 1 {
			t.Errorf("5 streams took %d connections, want 1", n)
		}
	})

	t.Run("closed before the last frame", func(t *testing.T) {
		gone := make(chan struct{}, 1)
		srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, frames[:len(frames)-len("data: [DONE]\n\n")])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			gone <- struct{}{}
		})
		c := NewClient()
		resp, err := c.Post(context.Background(), Upstream{Name: "e", BaseURL: srv.URL + "/v1"}, APIChat, []byte(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		s := NewStream(bufio.NewReaderSize(resp.Body, 1<<10), RelayOptions{API: APIChat})
		s.Read(make([]byte, 1<<10))
		if s.Result().Ended {
			t.Fatal("Ended before the last frame")
		}
		CloseAnswer(resp.Body, s.Result().Ended)
		select {
		case <-gone:
		case <-time.After(2 * time.Second):
			t.Fatal("the engine did not see its client leave")
		}
		if n := conns.Load(); n != 1 {
			t.Errorf("%d connections", n)
		}
	})

	t.Run("end that never comes", func(t *testing.T) {
		url, accepted, closed := endlessEngine(t, frames)
		c := NewClient()
		relay(t, c, url)
		start := time.Now()
		relay(t, c, url)
		if d := time.Since(start); d > time.Second {
			t.Errorf("the second stream took %v", d)
		}
		if n := accepted.Load(); n != 2 {
			t.Errorf("%d connections, want 2: a connection whose answer never ended must not be reused", n)
		}
		select {
		case <-closed:
		case <-time.After(2 * time.Second):
			t.Fatal("the connection whose answer never ended was not closed")
		}
	})

	t.Run("many ends that never come", func(t *testing.T) {
		// Five such connections in the pool cost the next request one
		// wait, not five.
		defer func(w time.Duration) { endWait = w }(endWait)
		endWait = 300 * time.Millisecond
		url, accepted, closed := endlessEngine(t, frames)
		c := NewClient()
		var bodies []io.Closer
		for range 5 { // open at once: five connections
			resp, err := c.Post(context.Background(), Upstream{Name: "e", BaseURL: url + "/v1"}, APIChat, []byte(`{"model":"m"}`))
			if err != nil {
				t.Fatal(err)
			}
			s := NewStream(bufio.NewReaderSize(resp.Body, 1<<10), RelayOptions{API: APIChat})
			if _, err := io.ReadAll(s); err != nil || !s.Result().Ended {
				t.Fatalf("stream: %v, ended %v", err, s.Result().Ended)
			}
			bodies = append(bodies, resp.Body)
		}
		for _, b := range bodies {
			CloseAnswer(b, true)
		}
		start := time.Now()
		relay(t, c, url)
		if d := time.Since(start); d > 2*endWait {
			t.Errorf("the next stream took %v: more than one wait of %v for the pool's connections", d, endWait)
		}
		if n := accepted.Load(); n != 6 {
			t.Errorf("%d connections, want 6", n)
		}
		for i := range 5 {
			select {
			case <-closed:
			case <-time.After(2 * time.Second):
				t.Fatalf("%d of the 5 connections whose answers never ended were closed", i)
			}
		}
	})
}

// endlessEngine is a raw engine that answers every request on its
// connection with a chunked stream of frames and never sends the body's
// end, holding the connection open; closed gets a value for each
// connection the client closes.
func endlessEngine(t *testing.T, frames string) (url string, accepted *atomic.Int64, closed chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int64)
	closed = make(chan struct{}, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(frames), frames)
				if _, err := br.ReadByte(); err != nil { // held until the client closes it
					closed <- struct{}{}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String(), accepted, closed
}

// A request larger than the socket takes at once is written whole, and an
// engine that answers before it has read the whole request (here after its
// first bytes) ends the request, with its answer or a failed write.
func TestTransportLargeRequest(t *testing.T) {
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
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := NewClient().Post(ctx, Upstream{Name: "e", BaseURL: srv.URL + "/v1"}, APIChat, body)
		if early && err != nil {
			// The engine closed while the request was still going out:
			// a failed write is as good an end as its answer.
			if ctx.Err() != nil {
				t.Fatalf("early: the failed write waited for the deadline: %v", err)
			}
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

// An engine that closes the connection without answering is an error at
// once, not a wait until the deadline.
func TestTransportEngineHangsUp(t *testing.T) {
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
			conn.Read(make([]byte, 4096))
			conn.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = NewClient().Post(ctx, Upstream{Name: "e", BaseURL: "http://" + ln.Addr().String() + "/v1"}, APIChat, []byte(`{"model":"m"}`))
	var ue *UpstreamError
	if !errors.As(err, &ue) || ue.Status != http.StatusBadGateway || ctx.Err() != nil {
		t.Fatalf("an engine that hangs up: %v (context: %v), want a 502 before the deadline", err, ctx.Err())
	}
}

// Writing a request and reading its answer's bytes on a kept connection
// allocates nothing: the request's vector is the connection's.
func TestTransportWriteAllocatesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok")
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		// Raw reads: the engine must not allocate either, as allocations
		// are counted for the whole program. A request comes in one writev.
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
	tr := newTransport()
	tg, err := tr.target("http://"+ln.Addr().String()+"/v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := tr.dial(context.Background(), tg)
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Conn.Close()
	header := requestHeader(nil, http.MethodPost, tg, "/chat/completions", "", "", 2)
	body := []byte("{}")
	got := make([]byte, len(answer))
	exchange := func() {
		if err := ec.write(header, body); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(ec.br, got); err != nil || !bytes.Equal(got, answer) {
			t.Fatalf("answer %q, %v", got, err)
		}
	}
	exchange() // the connection's first use sets up its poll descriptor
	if n := testing.AllocsPerRun(200, exchange); n != 0 {
		t.Errorf("%.1f allocations a request, want 0", n)
	}
	if ec.outBufs[0] != nil || ec.outBufs[1] != nil || ec.out != nil {
		t.Error("the connection keeps the last request's buffers")
	}
}
