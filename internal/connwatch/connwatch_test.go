package connwatch

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"
)

// pair returns the server side of a fresh loopback TCP connection and the
// client side.
func pair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// fires waits up to d for the watcher's onClose.
func fires(ch chan time.Time, d time.Duration) (time.Time, bool) {
	select {
	case at := <-ch:
		return at, true
	case <-time.After(d):
		return time.Time{}, false
	}
}

func TestNoticesPeerClose(t *testing.T) {
	for _, probe := range [][]byte{nil, InterimProbe} {
		server, client := pair(t)
		closed := make(chan time.Time, 1)
		w := Watch(server, probe, func() { closed <- time.Now() })
		time.Sleep(20 * time.Millisecond)
		left := time.Now()
		client.Close()
		at, ok := fires(closed, 2*time.Second)
		w.Stop()
		if !ok {
			t.Fatalf("probe=%q: the peer's close went unnoticed", probe)
		}
		if lag := at.Sub(left); lag > 100*time.Millisecond {
			t.Errorf("probe=%q: noticed after %v", probe, lag)
		}
	}
}

// A client that sent bytes after its request (pipelined, or one stray byte)
// and then left is still noticed: the bytes used to switch the watch off.
func TestNoticesCloseAfterExtraBytes(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("only Linux tells a FIN behind unread bytes (TCP_INFO); elsewhere the answer's write notices it")
	}
	for _, probe := range [][]byte{nil, InterimProbe} {
		for _, extra := range []string{"x", "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"} {
			server, client := pair(t)
			closed := make(chan time.Time, 1)
			w := Watch(server, probe, func() { closed <- time.Now() })
			if _, err := client.Write([]byte(extra)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			select {
			case <-closed:
				t.Fatalf("probe=%q extra=%q: bytes from a live client were taken for a close", probe, extra)
			default:
			}
			client.Close()
			_, ok := fires(closed, 2*time.Second)
			w.Stop()
			if !ok {
				t.Errorf("probe=%q extra=%q: the close after extra bytes went unnoticed", probe, extra)
			}
		}
	}
}

// A client that half-closes (shuts its sending side) but still reads is not
// gone: with a probe it gets the interim answer, then the real one.
func TestHalfClosedClientThatReadsIsNotGone(t *testing.T) {
	server, client := pair(t)
	closed := make(chan time.Time, 1)
	w := Watch(server, InterimProbe, func() { closed <- time.Now() })
	if err := client.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, ok := fires(closed, 300*time.Millisecond); ok {
		t.Fatal("a half-closed client that still reads was taken for gone")
	}
	w.StopProbing()
	w.Stop()
	if _, err := server.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")); err != nil {
		t.Fatal(err)
	}
	server.Close()
	got, err := io.ReadAll(client)
	if err != nil {
		t.Fatal(err)
	}
	want := string(InterimProbe) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	if string(got) != want {
		t.Errorf("client read %q, want %q", got, want)
	}
}

// Once the answer has started (StopProbing), a FIN alone does not end the
// watch; the RST that answers the next bytes written does.
func TestAfterProbingTheAnswerIsTheProbe(t *testing.T) {
	server, client := pair(t)
	closed := make(chan time.Time, 1)
	w := Watch(server, InterimProbe, func() { closed <- time.Now() })
	defer w.Stop()
	w.StopProbing()
	client.Close()
	if _, ok := fires(closed, 200*time.Millisecond); ok {
		t.Fatal("a FIN alone ended the watch after the answer started")
	}
	if _, err := server.Write([]byte("data: x\n\n")); err != nil {
		t.Fatal(err)
	}
	if _, ok := fires(closed, 2*time.Second); !ok {
		t.Fatal("the RST that answered the written bytes went unnoticed")
	}
}

// The server's read deadline for the request does not end the watch: an
// inference often outlasts it.
func TestWatchOutlivesTheRequestReadDeadline(t *testing.T) {
	server, client := pair(t)
	server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	closed := make(chan time.Time, 1)
	w := Watch(server, nil, func() { closed <- time.Now() })
	defer w.Stop()
	time.Sleep(200 * time.Millisecond)
	client.Close()
	if _, ok := fires(closed, 2*time.Second); !ok {
		t.Fatal("the watch ended at the request's read deadline")
	}
}

func TestStopLeavesTheConnectionUsable(t *testing.T) {
	server, client := pair(t)
	fired := make(chan struct{}, 1)
	w := Watch(server, InterimProbe, func() { fired <- struct{}{} })
	time.Sleep(20 * time.Millisecond)
	w.Stop()
	w.Stop() // twice is harmless
	// The next request's bytes are read normally: nothing was consumed and
	// no deadline is left behind.
	if _, err := client.Write([]byte("GET / HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	server.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "GET / HTTP/1.1\r\n" {
		t.Fatalf("read after stop: %q %v", buf, err)
	}
	select {
	case <-fired:
		t.Error("onClose fired for a live connection")
	default:
	}
}

func TestPipelinedBytesAreNotAClose(t *testing.T) {
	server, client := pair(t)
	fired := make(chan struct{}, 1)
	w := Watch(server, InterimProbe, func() { fired <- struct{}{} })
	client.Write([]byte("x"))
	time.Sleep(50 * time.Millisecond)
	w.Stop()
	select {
	case <-fired:
		t.Error("data from the peer was taken for a close")
	default:
	}
	buf := make([]byte, 1)
	if _, err := server.Read(buf); err != nil || buf[0] != 'x' {
		t.Errorf("the peeked byte was consumed: %q %v", buf, err)
	}
}

func TestNilWatcherIsHarmless(t *testing.T) {
	var w *Watcher
	w.StopProbing()
	w.Stop()
}

// A delayed watch notices a peer that left before it started, once it
// starts, and one that leaves later as quickly as an immediate watch.
func TestDelayedWatchNoticesAPeerThatLeftBeforeIt(t *testing.T) {
	const delay = 100 * time.Millisecond
	for _, early := range []bool{true, false} {
		server, client := pair(t)
		closed := make(chan time.Time, 1)
		began := time.Now()
		w := WatchAfter(delay, server, InterimProbe, func() { closed <- time.Now() })
		if !early {
			time.Sleep(delay + 50*time.Millisecond)
		}
		client.Close()
		at, ok := fires(closed, 2*time.Second)
		w.Stop()
		if !ok {
			t.Fatalf("early=%v: the peer's close went unnoticed", early)
		}
		if early && at.Sub(began) < delay {
			t.Errorf("the watch started after %v, before its delay of %v", at.Sub(began), delay)
		}
		if lag := at.Sub(began); lag > delay+50*time.Millisecond+100*time.Millisecond {
			t.Errorf("early=%v: noticed %v after the watch was asked for", early, lag)
		}
	}
}

// Stopped before its delay, a watch never touches the socket: the read
// deadline the server had set is still the one in force, and a close that
// comes afterwards calls nothing.
func TestDelayedWatchStoppedEarlyLeavesTheSocketAlone(t *testing.T) {
	server, client := pair(t)
	server.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	fired := make(chan time.Time, 1)
	w := WatchAfter(50*time.Millisecond, server, InterimProbe, func() { fired <- time.Now() })
	w.Stop()
	client.Close()
	if _, ok := fires(fired, 200*time.Millisecond); ok {
		t.Error("a watch stopped before it started called onClose")
	}
	// The server's deadline was not cleared (a started watch clears it, and
	// Stop leaves RestoredDeadline): the read fails at once.
	buf := make([]byte, 1)
	if _, err := server.Read(buf); err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read after an unstarted watch: %v, want the server's own deadline", err)
	}
}

// Stop and a delayed start racing: Stop always returns, and the connection
// is left readable (run under -race).
func TestDelayedWatchStopRacesItsStart(t *testing.T) {
	server, client := pair(t)
	for i := range 200 {
		// Due at once: the starter hands it to its goroutine at its next
		// tick, before or after the Stop below.
		w := WatchAfter(time.Nanosecond, server, InterimProbe, func() { t.Error("onClose for a live peer") })
		time.Sleep(time.Duration(i%13) * time.Millisecond)
		done := make(chan struct{})
		go func() { w.Stop(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatalf("round %d: Stop did not return", i)
		}
	}
	if _, err := client.Write([]byte("z")); err != nil {
		t.Fatal(err)
	}
	server.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1)
	if _, err := server.Read(buf); err != nil || buf[0] != 'z' {
		t.Fatalf("read after the watches: %q %v", buf, err)
	}
}

// The starter's goroutine and ticker end once no delayed watch has waited
// for a second, and come back with the next one.
func TestStarterEndsWhenIdle(t *testing.T) {
	server, client := pair(t)
	running := func() bool {
		starter.mu.Lock()
		defer starter.mu.Unlock()
		return starter.running
	}
	w := WatchAfter(time.Hour, server, nil, func() {})
	if !running() {
		t.Fatal("no starter for a delayed watch")
	}
	w.Stop()
	deadline := time.Now().Add(3 * time.Second)
	for running() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if running() {
		t.Fatal("the starter still runs with nothing to start")
	}
	closed := make(chan time.Time, 1)
	w = WatchAfter(time.Millisecond, server, nil, func() { closed <- time.Now() })
	defer w.Stop()
	client.Close()
	if _, ok := fires(closed, 2*time.Second); !ok {
		t.Fatal("a delayed watch after the starter ended never started")
	}
}
